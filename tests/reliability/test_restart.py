"""Server SIGKILL and restart on the same ledger (SQLite, PostgreSQL), calls in flight (S8, C11).

The server is a real OS process (killed like a crash: no shutdown code runs).
The page (a ToolClient behind the fault proxy) keeps running its tool, keeps
the result in its outbox, reconnects once the server is back and re-sends it;
the restarted server replays the run. The transcript is read from the ledger
once the server is stopped: the last model step's text and each tool step's
outcome, compared with an undisturbed run of the same calls.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from clienttools_server.agent.runs import RunRequest
from clienttools_server.app import open_ledger
from tests.reliability.harness import ChatPeer, Page, Spy, prompt_for, spy_first
from tests.reliability.results import Scenario
from tests.support.faultproxy import FaultProxy
from tests.support.server_process import ServerProcess
from tests.support.wait import wait_until

pytestmark = pytest.mark.soak

SESSION = "crash"


@dataclass
class Stack:
    server: ServerProcess
    db: str  # a SQLite file or a PostgreSQL URL, as --db takes it
    proxy: FaultProxy
    page: Page
    spy: Spy


@pytest.fixture(params=["sqlite", "postgres"])
async def stack(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Stack]:
    if request.param == "postgres":
        db = request.getfixturevalue("postgres").fresh_url()
    else:
        db = str(tmp_path / "ledger.sqlite3")
    # A short lease: the restarted process takes over the killed one's runs once it lapses.
    server = ServerProcess(["--db", db, "--lease", "2"], log=tmp_path / "server.log")
    await asyncio.to_thread(server.start)
    try:
        async with FaultProxy("127.0.0.1", server.port) as proxy:
            spy = Spy()
            spy_first(proxy.rules, spy)
            page = await Page.open(proxy.url(f"/agents/chat/{SESSION}"))
            try:
                yield Stack(server, db, proxy, page, spy)
            finally:
                await page.close()
            assert not proxy.errors, proxy.errors
    finally:
        await asyncio.to_thread(server.stop)


async def wait_finished(stack: Stack, chat_id: str) -> None:
    """Resume the chat on the (restarted) server until its response has ended.

    On PostgreSQL the restarted process takes the run over only once the killed
    one's lease lapsed (``--lease``): until then there is nothing to resume.
    """
    while not await resume_to_end(stack, chat_id):
        await asyncio.sleep(0.2)


async def execution_status(db: str, chat_id: str) -> str:
    ledger = await open_ledger(db)
    try:
        [status] = [
            e.status
            for e in await ledger.executions()
            if RunRequest.from_json(e.request_json).chat_id == chat_id
        ]
        return status
    finally:
        await ledger.close()


async def resume_to_end(stack: Stack, chat_id: str) -> bool:
    """Resume the chat and read its response to the end; False if the run is not here yet."""
    chat = await ChatPeer.open(stack.server.ws_url(SESSION))
    try:
        await chat.browser.send(
            {"type": "resume", "requestId": f"resume-{chat_id}", "id": chat_id,
             "headers": {}, "body": {}}
        )  # fmt: skip
        rid = f"resume-{chat_id}"

        def answered() -> bool:
            return any(
                f["type"] in ("start", "no-active") and f.get("requestId") == rid
                for f in chat.browser.inbox
            )

        await wait_until(answered, what=f"an answer to resuming {chat_id}")
        if any(f["type"] == "start" and f.get("requestId") == rid for f in chat.browser.inbox):
            await chat.response(rid)
            return True
    finally:
        await chat.close()
    return await execution_status(stack.db, chat_id) not in ("running", "paused")


async def ledger_transcript(db: str, chat_id: str) -> tuple[str, list[Any], list[int], str]:
    """(final text, tool outcomes in seq order, tool attempts, execution status) of a chat."""
    ledger = await open_ledger(db)
    try:
        [execution] = [
            e
            for e in await ledger.executions()
            if RunRequest.from_json(e.request_json).chat_id == chat_id
        ]
        steps = await ledger.steps(execution.id)
        assert all(step.state != "pending" for step in steps), steps
        model_steps = [s for s in steps if s.kind == "model"]
        events = model_steps[-1].result()
        assert isinstance(events, dict)
        text = "".join(e.get("text", "") for e in events["events"])
        tools = [s for s in steps if s.kind == "tool"]
        outcomes: list[Any] = [
            s.result() if s.state == "applied" else f"error: {(s.error() or {}).get('code')}"
            for s in tools
        ]
        return text, outcomes, [s.attempts for s in tools], execution.status
    finally:
        await ledger.close()


@pytest.mark.parametrize("moment", ["while_the_tool_runs", "as_the_result_leaves"])
async def test_server_sigkill_and_restart(
    stack: Stack, scenario: Scenario, soak_factor: int, moment: str
) -> None:
    scenario.describe("restart", f"server SIGKILL {moment.replace('_', ' ')}, then restart")
    rounds = 1 * soak_factor
    chats: list[tuple[str, str, str, list[int]]] = []
    for index in range(rounds):
        numbers = [index * 10 + 1, index * 10 + 2]
        base_chat = await ChatPeer.open(stack.server.ws_url(SESSION))
        base_id = f"base-{index}"
        await base_chat.browser.start_chat(prompt_for(base_id, numbers), base_id)
        await wait_finished(stack, base_id)
        await base_chat.close()

        tag = f"{moment}-{index}"
        chat = await ChatPeer.open(stack.server.ws_url(SESSION))
        slow = {numbers[0]: 600, numbers[1]: 900}
        await chat.browser.start_chat(prompt_for(tag, numbers, ms=slow.__getitem__), tag)
        first = (tag, numbers[0])
        if moment == "while_the_tool_runs":
            await wait_until(lambda k=first: k in stack.page.running, what="the tool to run")
        else:
            await wait_until(lambda k=first: k in stack.page.finished, what="the first result")
        await asyncio.to_thread(stack.server.kill)
        scenario.faults += 1
        await chat.close()
        await asyncio.to_thread(stack.server.start)
        await stack.page.settle(timeout=60.0)
        await wait_finished(stack, tag)
        chats.append((base_id, tag, moment, numbers))
        scenario.iterations += 1
    await asyncio.to_thread(stack.server.stop)  # the ledger is read with the server gone
    for base_id, tag, _, numbers in chats:
        base_text, base_outcomes, _, base_status = await ledger_transcript(stack.db, base_id)
        text, outcomes, attempts, status = await ledger_transcript(stack.db, tag)
        assert base_status == status == "completed"
        equal = (text, outcomes) == (base_text, base_outcomes)
        scenario.add_transcript(equal)
        for n, outcome in zip(numbers, outcomes, strict=True):
            scenario.add_call(
                settlements=1 if outcome != "missing" else 0,
                executions=stack.page.executions[(tag, n)],
            )
        assert [stack.page.executions[(tag, n)] for n in numbers] == [1, 1]
        assert equal, ((text, outcomes), (base_text, base_outcomes))
        scenario.note(f"re-deliveries after restart: attempts {attempts}")
    assert not stack.spy.applied_twice()
    assert json.dumps(scenario.as_json())  # the figures are JSON for the report
