"""Several server processes on one PostgreSQL ledger (``--db postgresql://...``), on real sockets.

What is shared today is the ledger: each process serves its own pages and
chats, and what one process recorded, every other one reads. A process takes
over the unfinished runs whose lease lapsed, at start-up and at every heartbeat:
so a run whose process was SIGKILLed goes on in another process, with its page
reconnected there and its pending call re-delivered (tests/server/test_leases.py
has the rest of run ownership).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from clienttools_server.agent.runs import RunRequest
from clienttools_server.app import open_ledger
from tests.reliability.harness import ChatPeer, Page, prompt_for
from tests.server.server_harness import Response
from tests.support.faultproxy import FaultProxy
from tests.support.postgres import PostgresServer
from tests.support.server_process import ServerProcess
from tests.support.wait import wait_until

# Each test starts the server as OS processes: not in `make check`.
pytestmark = pytest.mark.process


@contextlib.asynccontextmanager
async def processes(
    url: str, count: int, log_dir: Path, *args: str
) -> AsyncIterator[list[ServerProcess]]:
    servers = [
        ServerProcess(["--db", url, *args], log=log_dir / f"server-{index}.log")
        for index in range(count)
    ]
    try:
        # Started together, before any chat: each resumes what it finds at start-up.
        await asyncio.gather(*(asyncio.to_thread(server.start) for server in servers))
        yield servers
    finally:
        await asyncio.gather(*(asyncio.to_thread(server.stop) for server in servers))


async def ask_until_served(
    server: ServerProcess, session: str, prompt: str, timeout: float = 30.0
) -> Response:
    """Ask in a new chat until the server answers instead of closing with 1013."""
    deadline = time.monotonic() + timeout
    while True:
        chat = await ChatPeer.open(server.ws_url(session))
        try:
            return await chat.ask(prompt)
        except AssertionError:
            if chat.browser.close_code != 1013 or time.monotonic() > deadline:
                raise
        finally:
            await chat.close()
        await asyncio.sleep(0.2)


async def ledger_runs(url: str) -> list[tuple[str, str, str, list[object]]]:
    """(session, chat id, status, tool outcomes in seq order) of every run in the ledger.

    A tool's outcome is its result once applied, else its state ("pending", "error").
    """
    ledger = await open_ledger(url)
    try:
        runs: list[tuple[str, str, str, list[object]]] = []
        for execution in await ledger.executions():
            chat_id = RunRequest.from_json(execution.request_json).chat_id
            tools = [s for s in await ledger.steps(execution.id) if s.kind == "tool"]
            outcomes = [s.result() if s.state == "applied" else s.state for s in tools]
            runs.append((execution.session, chat_id, execution.status, outcomes))
        return sorted(runs, key=str)
    finally:
        await ledger.close()


async def test_three_processes_share_one_ledger(postgres: PostgresServer, tmp_path: Path) -> None:
    url = postgres.fresh_url()
    async with processes(url, 3, tmp_path) as servers:
        pages = [await Page.open(server.ws_url(f"s{i}")) for i, server in enumerate(servers)]
        try:
            for i, server in enumerate(servers):
                chat = await ChatPeer.open(server.ws_url(f"s{i}"))
                response = await chat.ask(prompt_for(f"t{i}", [i + 1]))
                await chat.close()
                assert response.of_type("tool-output-available"), response.types
            assert all(page.executions == {(f"t{i}", i + 1): 1} for i, page in enumerate(pages))
        finally:
            for page in pages:
                await page.close()
        # One ledger holds the runs of all three.
        assert await ledger_runs(url) == [
            (f"s{n - 1}", f"chat-1-s{n - 1}", "completed", [{"n": n, "sq": n * n}])
            for n in (1, 2, 3)
        ]


async def test_a_run_of_a_killed_process_goes_on_where_another_starts(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    url = postgres.fresh_url()
    # The page reaches the servers through a proxy, as it would through a load balancer.
    async with (
        processes(url, 2, tmp_path) as (first, second),
        FaultProxy("127.0.0.1", first.port) as proxy,
    ):
        page = await Page.open(proxy.url("/agents/chat/moved"))
        try:
            chat = await ChatPeer.open(first.ws_url("moved"))
            slow = {7: 1500}
            await chat.browser.start_chat(prompt_for("moved", [7], ms=slow.__getitem__), "m1")
            await wait_until(lambda: ("moved", 7) in page.running, what="the tool to run")
            await asyncio.to_thread(first.kill)
            await chat.close()
            # The balancer sends the page to the other process, which (re)starts
            # and, once the killed one's lease lapsed, takes the run over from the
            # shared ledger with its call pending.
            proxy.upstream_port = second.port
            await asyncio.to_thread(second.stop)
            await asyncio.to_thread(second.start)
            await page.settle(timeout=60.0)

            async def completed() -> bool:
                return (await ledger_runs(url))[0][2] == "completed"

            await wait_until(completed, 60.0, "the run to complete")
        finally:
            await page.close()
        assert not proxy.errors, proxy.errors
    assert page.executions == {("moved", 7): 1}  # delivered again, yet run once
    assert await ledger_runs(url) == [("moved", "m1", "completed", [{"n": 7, "sq": 49}])]


async def test_a_call_in_flight_waits_for_the_database(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    """The result of a call that meets no database is not acknowledged: the page keeps it,
    reconnects and sends it again until the database is back; then the run completes."""
    url = postgres.fresh_url()
    async with processes(url, 1, tmp_path) as (server,):
        page = await Page.open(server.ws_url("away"))
        try:
            chat = await ChatPeer.open(server.ws_url("away"))
            slow = {5: 500}
            request_id = await chat.browser.start_chat(
                prompt_for("away", [5], ms=slow.__getitem__), "a1"
            )
            await wait_until(lambda: ("away", 5) in page.running, what="the tool to run")
            await asyncio.to_thread(postgres.stop)
            try:
                await wait_until(lambda: ("away", 5) in page.finished, what="the tool to end")
                # The result cannot be recorded: the server closes the page's socket
                # (1013), and the page keeps the result in its outbox.
                await asyncio.sleep(2.0)
                assert not page.outbox_empty()
            finally:
                await asyncio.to_thread(postgres.start_again)
            await page.settle(timeout=60.0)
            response = await chat.response(request_id)
            await chat.close()
        finally:
            await page.close()
        log = (tmp_path / "server-0.log").read_text()
    assert "closing" in log and "1013" in log and "unreachable" in log, log[-2000:]
    [output] = response.of_type("tool-output-available")
    assert output["output"] == {"n": 5, "sq": 25}
    assert page.executions == {("away", 5): 1}
    assert await ledger_runs(url) == [("away", "a1", "completed", [{"n": 5, "sq": 25}])]


async def test_a_timeout_the_database_cannot_record_does_not_happen(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    """The call's timer fires while the database is away: the timeout is not recorded,
    so the tool is not cancelled either, and its late result is taken once the database
    is back."""
    url = postgres.fresh_url()
    log = tmp_path / "server-0.log"
    async with processes(url, 1, tmp_path, "--tool-timeout", "1") as (server,):
        page = await Page.open(server.ws_url("late"))
        try:
            chat = await ChatPeer.open(server.ws_url("late"))
            slow = {3: 3000}
            request_id = await chat.browser.start_chat(
                prompt_for("late", [3], ms=slow.__getitem__), "l1"
            )
            await wait_until(lambda: ("late", 3) in page.running, what="the tool to run")
            await asyncio.to_thread(postgres.stop)
            try:
                await wait_until(
                    lambda: "_time_out" in log.read_text(), 30.0, "the timeout to fail"
                )
                await wait_until(lambda: ("late", 3) in page.finished, what="the tool to end")
            finally:
                await asyncio.to_thread(postgres.start_again)
            await page.settle(timeout=60.0)
            response = await chat.response(request_id)
            await chat.close()
        finally:
            await page.close()
    assert page.cancelled == set()
    [output] = response.of_type("tool-output-available")
    assert output["output"] == {"n": 3, "sq": 9}
    assert await ledger_runs(url) == [("late", "l1", "completed", [{"n": 3, "sq": 9}])]


async def test_a_chat_started_while_the_database_is_away_is_refused(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    url = postgres.fresh_url()
    async with processes(url, 1, tmp_path) as (server,):
        chat = await ChatPeer.open(server.ws_url("refused"))
        await asyncio.to_thread(postgres.stop)
        try:
            # No response starts: the socket closes with 1013 (try again later).
            with pytest.raises(AssertionError, match=r"socket closed \(1013\) before a start"):
                await chat.browser.start_chat("hello", "r1")
        finally:
            await asyncio.to_thread(postgres.start_again)
        await chat.close()
        # Nothing was recorded, and the same process serves again once the database is back.
        response = await ask_until_served(server, "refused", "hello")
    assert response.text
    assert [run[2] for run in await ledger_runs(url)] == ["completed"]
