"""Run ownership with a lease: real server processes on one PostgreSQL ledger.

Each running execution has one owner process, which renews its lease every
third of ``--lease``. Another process takes a run over only once its lease
lapsed (the owner died, or was paused past it), and resumes it by replay; the
process that lost it writes nothing more for it (the generation fences every
write). The model is the scripted one, counting its requests in a file shared
by the processes (tests/server/lease_agents.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from clienttools.client import ToolClient
from clienttools.native import NativeConnector
from clienttools_server.agent.runs import RunRequest
from clienttools_server.ledger import Execution
from clienttools_server.ledger.postgres import PostgresLedger
from tests.reliability.harness import ChatPeer, prompt_for
from tests.support.cluster import all_completed, final_text, reader, tool_outcomes
from tests.support.faultproxy import FaultProxy
from tests.support.postgres import PostgresServer
from tests.support.server_process import ServerProcess, running
from tests.support.wait import wait_until

# Each test starts the server as OS processes: not in `make check`.
pytestmark = pytest.mark.process

AGENT = "tests.server.lease_agents:counted"


class GatedPage:
    """A page whose `work` tool counts its runs and returns only once the gate opens."""

    def __init__(self, url: str, gate: asyncio.Event) -> None:
        self.client = ToolClient(
            url, connector=NativeConnector(compression=None), connect_timeout=10.0
        )
        self.executions: Counter[tuple[str, int]] = Counter()
        self.running: set[tuple[str, int]] = set()
        self.cancelled: set[tuple[str, int]] = set()

        @self.client.tool(name="work")
        async def work(n: int, tag: str = "") -> dict[str, int]:
            """Count this run, wait for the gate, return n and its square."""
            key = (tag, n)
            self.executions[key] += 1
            self.running.add(key)
            try:
                await gate.wait()
            except asyncio.CancelledError:
                self.cancelled.add(key)
                raise
            finally:
                self.running.discard(key)
            return {"n": n, "sq": n * n}

    @classmethod
    async def open(cls, url: str, gate: asyncio.Event) -> GatedPage:
        page = cls(url, gate)
        await page.client.connect()
        return page

    def outbox_empty(self) -> bool:
        return not self.client.session.outbox()

    async def close(self) -> None:
        await self.client.close()


@contextlib.asynccontextmanager
async def processes(
    url: str, tmp_path: Path, lease: float, *names: str
) -> AsyncIterator[list[ServerProcess]]:
    env = {"LEASE_AGENT_REQUESTS": str(tmp_path / "requests.jsonl")}
    servers = [
        ServerProcess(
            ["--db", url, "--agent", AGENT, "--lease", f"{lease:g}", "--log-level", "info"],
            log=tmp_path / f"server-{name}.log",
            env=env,
        )
        for name in names
    ]
    async with running(servers):
        yield servers


def model_requests(tmp_path: Path) -> Counter[tuple[str, int]]:
    """(first line of the prompt, model answers before) of every model request so far."""
    path = tmp_path / "requests.jsonl"
    if not path.exists():
        return Counter()
    return Counter(tuple(json.loads(line)) for line in path.read_text().splitlines())


async def run_of(ledger: PostgresLedger, chat_id: str) -> Execution:
    [execution] = [
        e
        for e in await ledger.executions()
        if RunRequest.from_json(e.request_json).chat_id == chat_id
    ]
    return execution


async def taken_over(ledger: PostgresLedger, chat_id: str) -> bool:
    """Whether the chat's run has a second owner now."""
    return (await run_of(ledger, chat_id)).generation == 2


async def test_the_runs_of_a_killed_owner_complete_on_the_survivor(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    lease, chats = 3.0, 4
    url = postgres.fresh_url()
    gate = asyncio.Event()
    async with (
        processes(url, tmp_path, lease, "owner", "survivor") as (owner, survivor),
        FaultProxy("127.0.0.1", owner.port) as proxy,  # the pages' load balancer
    ):
        pages = [await GatedPage.open(proxy.url(f"/agents/chat/s{i}"), gate) for i in range(chats)]
        try:
            for i in range(chats):
                chat = await ChatPeer.open(owner.ws_url(f"s{i}"))
                await chat.browser.start_chat(prompt_for(f"k{i}", [1, 2]), f"c{i}")
                await chat.close()  # the run goes on without its chat socket
            await wait_until(
                lambda: all(len(page.running) == 2 for page in pages), 30.0, "every tool to run"
            )
            async with reader(url) as ledger:
                owners = {(await run_of(ledger, f"c{i}")).owner for i in range(chats)}
            before = model_requests(tmp_path)
            first_lines = [prompt_for(f"k{i}", [1, 2]).splitlines()[0] for i in range(chats)]
            assert before == Counter((line, 0) for line in first_lines)
            # The owner dies in the middle of every call; the balancer sends the pages on.
            proxy.upstream_port = survivor.port
            await asyncio.to_thread(owner.kill)
            killed = time.monotonic()
            gate.set()
            async with reader(url) as ledger:
                await wait_until(
                    lambda: all_completed(ledger),
                    lease + 30.0,
                    "every run to complete on the survivor",
                )
                elapsed = time.monotonic() - killed
                runs = [await run_of(ledger, f"c{i}") for i in range(chats)]
                steps = [await ledger.steps(run.id) for run in runs]
            # The undisturbed twin: the same calls on the survivor, nothing killed.
            base = await ChatPeer.open(survivor.ws_url("s0"))
            base_response = await base.ask(prompt_for("base", [1, 2]))
            await base.close()
        finally:
            for page in pages:
                await page.close()
        assert not proxy.errors, proxy.errors
    assert elapsed <= lease + 5.0, f"the runs completed {elapsed:.1f} s after the kill"
    assert len(owners) == 1 and None not in owners
    for run, run_steps in zip(runs, steps, strict=True):
        assert run.generation == 2 and run.owner not in owners  # taken over, once
        assert tool_outcomes(run_steps) == [{"n": 1, "sq": 1}, {"n": 2, "sq": 4}]
        assert final_text(run_steps) == base_response.text
    # Each tool ran once; each model step was requested once, the recorded ones
    # (the calls, before the kill) not again by the survivor.
    for i, page in enumerate(pages):
        assert {k: n for k, n in page.executions.items() if k[0] == f"k{i}"} == {
            (f"k{i}", 1): 1,
            (f"k{i}", 2): 1,
        }
    requests = model_requests(tmp_path)
    assert set(requests.values()) == {1}, requests
    assert len(requests) == 2 * chats + 2  # two steps a chat, and the base chat's two


async def test_a_stale_owner_writes_nothing_for_the_run_it_lost(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    lease = 2.0
    url = postgres.fresh_url()
    gate = asyncio.Event()
    async with (
        processes(url, tmp_path, lease, "stale", "new") as (stale, new),
        FaultProxy("127.0.0.1", stale.port) as proxy,
    ):
        assert stale.process is not None
        page = await GatedPage.open(proxy.url("/agents/chat/paused"), gate)
        try:
            chat = await ChatPeer.open(stale.ws_url("paused"))
            await chat.browser.start_chat(prompt_for("p", [5]), "p1")
            await wait_until(lambda: ("p", 5) in page.running, 30.0, "the tool to run")
            async with reader(url) as ledger:

                async def delivered_again() -> bool:
                    tools = [s for s in await ledger.steps(first.id) if s.kind == "tool"]
                    return [s.attempts for s in tools] == [2]

                async def completed() -> bool:
                    return (await run_of(ledger, "p1")).status == "completed"

                first = await run_of(ledger, "p1")
                # Paused past its lease: the page moves to the other process, which
                # takes the run over once the lease lapsed and delivers the call again.
                os.kill(stale.process.pid, signal.SIGSTOP)
                proxy.upstream_port = new.port
                proxy.cut_all()
                await wait_until(lambda: taken_over(ledger, "p1"), lease + 30.0, "the take-over")
                await wait_until(delivered_again, 30.0, "the call to be delivered again")
                taken = await run_of(ledger, "p1")
                steps_taken = await ledger.steps(first.id)
                # Back: the stale process finds out at its next renewal, and stops the run.
                os.kill(stale.process.pid, signal.SIGCONT)
                log = tmp_path / "server-stale.log"
                await wait_until(lambda: "lease lost" in log.read_text(), 30.0, "the stale one")
                after = await run_of(ledger, "p1")
                steps_after = await ledger.steps(first.id)
                gate.set()
                await wait_until(completed, 30.0, "the run to complete")
                done = await run_of(ledger, "p1")
                steps_done = await ledger.steps(first.id)
            await chat.close()
        finally:
            await page.close()
        assert not proxy.errors, proxy.errors
    assert (first.generation, taken.generation) == (1, 2) and taken.owner != first.owner
    # Nothing written by the stale process: not the step (no "cancelled" error, no
    # attempt), not the execution (its owner, generation, status, updated time);
    # only the new owner's renewals moved the lease on.
    assert steps_after == steps_taken
    same = ("status", "owner", "generation", "updated_at", "error")
    assert [getattr(after, f) for f in same] == [getattr(taken, f) for f in same]
    assert page.cancelled == set()  # the page was not told to abort the tool
    assert page.executions == {("p", 5): 1}
    assert (done.status, done.generation, done.owner) == ("completed", 2, taken.owner)
    assert tool_outcomes(steps_done) == [{"n": 5, "sq": 25}]


async def test_a_process_starting_beside_a_live_one_leaves_its_runs_alone(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    lease = 2.0
    url = postgres.fresh_url()
    gate = asyncio.Event()
    async with processes(url, tmp_path, lease, "live") as (live,):
        page = await GatedPage.open(live.ws_url("busy"), gate)
        try:
            chat = await ChatPeer.open(live.ws_url("busy"))
            request_id = await chat.browser.start_chat(prompt_for("b", [3]), "b1")
            await wait_until(lambda: ("b", 3) in page.running, 30.0, "the tool to run")
            other = ServerProcess(
                ["--db", url, "--agent", AGENT, "--lease", f"{lease:g}"],
                log=tmp_path / "server-other.log",
                env={"LEASE_AGENT_REQUESTS": str(tmp_path / "requests.jsonl")},
            )
            await asyncio.to_thread(other.start)
            try:
                async with reader(url) as ledger:
                    first = await run_of(ledger, "b1")
                    # Several of the newcomer's take-over rounds (one every lease / 3),
                    # each finding the live owner's lease renewed.
                    for _ in range(6):
                        await asyncio.sleep(lease / 3)
                        now = await run_of(ledger, "b1")
                        assert (now.owner, now.generation) == (first.owner, 1)
                    gate.set()
                    response = await chat.response(request_id)
                    done = await run_of(ledger, "b1")
            finally:
                await asyncio.to_thread(other.stop)
            await chat.close()
        finally:
            await page.close()
    [output] = response.of_type("tool-output-available")
    assert output["output"] == {"n": 3, "sq": 9}
    assert (done.status, done.owner, done.generation) == ("completed", first.owner, 1)
    assert page.executions == {("b", 3): 1}
    assert set(model_requests(tmp_path).values()) == {1}
