"""A chat's response across server processes on one PostgreSQL ledger (real processes).

The run streams from the process that owns it; a page's chat socket on any
other process resumes it there (``resume``, with or without ``lastSequence``)
from the shared chunk log, and gets the chunks with the owner's sequence
numbers, live, to ``finish``. ``abort`` there aborts the run on its owner, and
a second ``send`` for the chat there is refused as on the owner. The page's
tools live on the run's process (or reach it through a proxy, as a load
balancer would): routing calls between processes is not what these tests try.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from clienttools.client import ToolClient
from clienttools.native import NativeConnector
from clienttools_server.app import running_server
from clienttools_server.cluster.shared_streams import ChunkStore
from clienttools_server.config import ServerConfig
from clienttools_server.ledger.postgres import PostgresLedger
from tests.reliability.harness import ChatPeer, prompt_for, transcript_of
from tests.server.server_harness import Response, settled
from tests.server.test_leases import AGENT, GatedPage, model_requests, run_of, taken_over
from tests.support.chunks import normalized
from tests.support.cluster import reader
from tests.support.faultproxy import FaultProxy
from tests.support.postgres import PostgresServer
from tests.support.server_process import ServerProcess, running
from tests.support.wait import wait_until

# Most of its tests start the server as OS processes: the file is not in `make check`.
pytestmark = pytest.mark.process

LEASE = 2.0
TIMEOUT = 60.0
PROMPT = prompt_for("t", [1, 2])


@contextlib.asynccontextmanager
async def processes(
    url: str, tmp_path: Path, **leases: float
) -> AsyncIterator[list[ServerProcess]]:
    """One server process per name, each with its own lease, started one after the other."""
    env = {
        "LEASE_AGENT_REQUESTS": str(tmp_path / "requests.jsonl"),
        "LEASE_AGENT_HOLD": str(tmp_path / "hold"),  # the model waits while it exists
    }
    servers = [
        ServerProcess(
            ["--db", url, "--agent", AGENT, "--lease", f"{lease:g}", "--log-level", "info"],
            log=tmp_path / f"server-{name}.log",
            env=env,
        )
        for name, lease in leases.items()
    ]
    async with running(servers):
        yield servers


async def resume(chat: ChatPeer, chat_id: str, last_sequence: int | None = None) -> str:
    """Send a ``resume``; the request id, once its ``start`` (or ``no-active``) came."""
    request_id = f"resume-{time.monotonic_ns()}"
    frame: dict[str, Any] = {"type": "resume", "requestId": request_id, "id": chat_id}
    if last_sequence is not None:
        frame["lastSequence"] = last_sequence
    await chat.browser.send(frame)
    return request_id


async def send_again(chat: ChatPeer, request_id: str, message_id: str) -> None:
    """A second ``send`` for chat ``c1``, while its first response may still stream."""
    message = {"id": message_id, "role": "user", "parts": [{"type": "text", "text": "hi"}]}
    await chat.browser.send(
        {
            "type": "send",
            "requestId": request_id,
            "id": "c1",
            "trigger": "submit-message",
            "messages": [message],
        }
    )


async def started(chat: ChatPeer, request_id: str) -> None:
    await chat.browser.expect("start", TIMEOUT, requestId=request_id)


async def undisturbed(server: ServerProcess, prompt: str) -> Response:
    """The one-process transcript: the same chat on one process, nothing in the way."""
    gate = asyncio.Event()
    gate.set()
    page = await GatedPage.open(server.ws_url("undisturbed"), gate)
    try:
        chat = await ChatPeer.open(server.ws_url("undisturbed"))
        response = await chat.browser.chat(prompt, "undisturbed", TIMEOUT)
        await chat.close()
    finally:
        await page.close()
    return response


def first_request(prompt: str) -> tuple[str, int]:
    """The key `model_requests` counts a run's first model request of `prompt` under."""
    return (prompt.splitlines()[0], 0)


async def published(url: str, chat_id: str, count: int) -> bool:
    """Whether the chunks table holds `count` chunks for the chat's execution (its end one)."""
    async with reader(url) as ledger:
        execution = await run_of(ledger, chat_id)
        _, chunks = await ChunkStore(ledger).read(execution.id, -1)
    return len(chunks) == count


async def test_a_response_started_on_one_process_is_resumed_on_another_and_goes_on_live(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    url = postgres.fresh_url()
    gate = asyncio.Event()
    async with processes(url, tmp_path, a=LEASE, b=LEASE) as (a, b):
        base = await undisturbed(a, PROMPT)
        page = await GatedPage.open(a.ws_url("s"), gate)
        try:
            on_a = await ChatPeer.open(a.ws_url("s"))
            request_id = await on_a.browser.start_chat(PROMPT, "c1")
            await wait_until(lambda: len(page.running) == 2, TIMEOUT, "both tools to run")
            seen = len(on_a.browser.chunks[request_id])
            # The page's chat socket lands on B: it resumes there, twice (a page
            # that knows nothing, one that has all but the last two chunks).
            on_b = await ChatPeer.open(b.ws_url("s"))
            whole = await resume(on_b, "c1")
            tail = await resume(on_b, "c1", seen - 3)
            await started(on_b, whole)
            await started(on_b, tail)
            await wait_until(
                lambda: len(on_b.browser.chunks.get(whole, [])) == seen,
                TIMEOUT,
                "B to replay what A streamed",
            )
            # The two resumes are answered one after the other: wait for the tail too.
            await wait_until(
                lambda: len(on_b.browser.chunks.get(tail, [])) >= 2, TIMEOUT, "the tail"
            )
            assert len(on_b.browser.chunks[tail]) == 2
            gate.set()  # from here on the response goes on live, on A and on B
            from_a = await on_a.response(request_id)
            from_b = await on_b.response(whole)
            tail_b = await on_b.response(tail)
            await on_a.close()
            await on_b.close()
        finally:
            await page.close()
    assert from_a.final["type"] == from_b.final["type"] == tail_b.final["type"] == "end"
    assert from_b.chunks == from_a.chunks
    assert tail_b.chunks == from_a.chunks[seen - 2 :]
    assert normalized(from_a.chunks) == normalized(base.chunks)
    assert transcript_of(from_b) == transcript_of(base)
    assert not on_a.violations and not on_b.violations  # each sequence in order, from its start
    assert page.executions == {("t", 1): 1, ("t", 2): 1}


async def test_a_resume_just_after_the_end_on_another_process_gets_the_tail(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    url = postgres.fresh_url()
    gate = asyncio.Event()
    gate.set()
    async with processes(url, tmp_path, a=LEASE, b=LEASE) as (a, b):
        page = await GatedPage.open(a.ws_url("s"), gate)
        try:
            on_a = await ChatPeer.open(a.ws_url("s"))
            response = await on_a.browser.chat(PROMPT, "c1", TIMEOUT)
            await on_a.close()
            on_b = await ChatPeer.open(b.ws_url("s"))
            last = len(response.chunks) - 3
            tail = await resume(on_b, "c1", last)
            tail_b = await on_b.response(tail)
            # Without lastSequence a resume asks what streams now: nothing does.
            nothing = await resume(on_b, "c1")
            await on_b.browser.expect("no-active", TIMEOUT, requestId=nothing)
            await on_b.close()
        finally:
            await page.close()
    assert tail_b.final["type"] == "end"
    assert tail_b.chunks == response.chunks[last + 1 :]
    assert [c["type"] for c in tail_b.chunks][-1] == "finish"
    assert not on_b.violations


async def test_an_abort_on_another_process_stops_the_run_on_its_owner(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    url = postgres.fresh_url()
    gate = asyncio.Event()
    async with processes(url, tmp_path, a=LEASE, b=LEASE) as (a, b):
        page = await GatedPage.open(a.ws_url("s"), gate)
        try:
            on_a = await ChatPeer.open(a.ws_url("s"))
            request_id = await on_a.browser.start_chat(prompt_for("x", [7]), "c1")
            await wait_until(lambda: ("x", 7) in page.running, TIMEOUT, "the tool to run")
            on_b = await ChatPeer.open(b.ws_url("s"))
            followed = await resume(on_b, "c1")
            await started(on_b, followed)
            await on_b.browser.send({"type": "abort", "requestId": followed})
            from_a = await on_a.response(request_id)
            from_b = await on_b.response(followed)
            await wait_until(lambda: ("x", 7) in page.cancelled, TIMEOUT, "the tool's cancel")
            async with reader(url) as ledger:
                execution = await run_of(ledger, "c1")
            await on_a.close()
            await on_b.close()
        finally:
            await page.close()
    assert [c["type"] for c in from_a.chunks][-1] == "abort"
    assert from_b.chunks == from_a.chunks
    assert (execution.status, execution.error) == ("error", "aborted")


async def test_a_send_on_another_process_while_the_chat_streams_is_refused(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    url = postgres.fresh_url()
    gate = asyncio.Event()
    async with processes(url, tmp_path, a=LEASE, b=LEASE) as (a, b):
        page = await GatedPage.open(a.ws_url("s"), gate)
        try:
            on_a = await ChatPeer.open(a.ws_url("s"))
            request_id = await on_a.browser.start_chat(prompt_for("y", [3]), "c1")
            await wait_until(lambda: ("y", 3) in page.running, TIMEOUT, "the tool to run")
            on_b = await ChatPeer.open(b.ws_url("s"))
            refused = "send-on-b"
            await send_again(on_b, refused, "u2")
            error = await on_b.browser.expect("error", TIMEOUT, requestId=refused)
            # The same refusal as on the process that streams it.
            again = "send-on-a"
            await send_again(on_a, again, "u3")
            error_a = await on_a.browser.expect("error", TIMEOUT, requestId=again)
            gate.set()
            done = await on_a.response(request_id)
            # Once it ended, the chat is free on any process.
            after = await on_b.browser.chat("hello", "c1", TIMEOUT)
            await on_a.close()
            await on_b.close()
        finally:
            await page.close()
    assert (
        error["errorText"]
        == error_a["errorText"]
        == ("a response is already streaming for this chat")
    )
    assert done.final["type"] == "end" and after.final["type"] == "end"
    assert page.executions == {("y", 3): 1}


async def test_a_run_taken_over_after_its_owner_died_is_resumed_on_a_third_process(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    url = postgres.fresh_url()
    gate = asyncio.Event()
    # B's long lease: its take-over rounds are rare, so C (short lease) takes the run.
    async with (
        processes(url, tmp_path, a=LEASE, b=30.0, c=LEASE) as (a, b, c),
        FaultProxy("127.0.0.1", a.port) as proxy,  # the page's load balancer
    ):
        base = await undisturbed(c, PROMPT)
        page = await GatedPage.open(proxy.url("/agents/chat/s"), gate)
        try:
            on_a = await ChatPeer.open(a.ws_url("s"))
            request_id = await on_a.browser.start_chat(PROMPT, "c1")
            await wait_until(lambda: len(page.running) == 2, TIMEOUT, "both tools to run")
            seen = len(on_a.browser.chunks[request_id])
            await wait_until(lambda: published(url, "c1", seen), TIMEOUT, "A to publish")
            proxy.upstream_port = c.port
            await asyncio.to_thread(a.kill)
            # The page's chat socket went with A; it resumes on B.
            on_b = await ChatPeer.open(b.ws_url("s"))
            rest = await resume(on_b, "c1", seen - 1)
            await started(on_b, rest)
            gate.set()
            from_b = await on_b.response(rest)
            async with reader(url) as ledger:
                execution = await run_of(ledger, "c1")
                owners = {(await run_of(ledger, "undisturbed")).owner}
            await on_b.close()
        finally:
            await page.close()
        assert not proxy.errors, proxy.errors
    whole = on_a.browser.chunks[request_id] + from_b.chunks
    assert from_b.final["type"] == "end"
    assert normalized(whole) == normalized(base.chunks)
    assert not on_b.violations  # B's sequence numbers went on from A's
    assert execution.generation == 2 and execution.owner in owners  # taken over by C
    assert page.executions == {("t", 1): 1, ("t", 2): 1}


async def test_a_run_taken_over_before_its_page_is_back_offers_the_model_the_pages_tools(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    # A dies while its model answers, and the page's socket with it. B takes the run
    # over and asks the model again before the page is back anywhere. The model is
    # still offered the page's tool (the ledger kept the session's tools), so its call
    # waits for the page instead of failing as unknown, and goes to it once it is back.
    url = postgres.fresh_url()
    gate = asyncio.Event()
    gate.set()
    hold = tmp_path / "hold"
    prompt = prompt_for("k", [4])
    async with (
        processes(url, tmp_path, a=LEASE, b=LEASE) as (a, b),
        FaultProxy("127.0.0.1", a.port) as proxy,  # the page's load balancer
    ):
        base = await undisturbed(b, prompt)
        asked = first_request(prompt)
        before = model_requests(tmp_path)[asked]
        page = await GatedPage.open(proxy.url("/agents/chat/s"), gate)
        try:
            hold.touch()
            on_a = await ChatPeer.open(a.ws_url("s"))
            await on_a.browser.start_chat(prompt, "c1")
            await wait_until(
                lambda: model_requests(tmp_path)[asked] == before + 1, TIMEOUT, "A's model"
            )
            await asyncio.to_thread(a.kill)  # the proxy still points at A: no page is back
            hold.unlink()
            async with reader(url) as ledger:
                await wait_until(lambda: taken_over(ledger, "c1"), TIMEOUT, "B's take-over")
                await wait_until(
                    lambda: call_waits(ledger, "c1"), TIMEOUT, "B's call, before the page is back"
                )
            proxy.upstream_port = b.port
            on_b = await ChatPeer.open(b.ws_url("s"))
            rest = await resume(on_b, "c1")
            await started(on_b, rest)
            from_b = await on_b.response(rest)
            await on_b.close()
        finally:
            await page.close()
    assert model_requests(tmp_path)[asked] == before + 2  # A's and B's
    assert from_b.final["type"] == "end"
    assert normalized(from_b.chunks) == normalized(base.chunks)
    assert not on_b.violations
    assert page.executions == {("k", 4): 1}


async def call_waits(ledger: PostgresLedger, chat_id: str) -> bool:
    """Whether the chat's run has a call of `work` waiting for a page."""
    execution = await run_of(ledger, chat_id)
    return any(s.name == "work" and s.state == "pending" for s in await ledger.steps(execution.id))


class GatesPage:
    """A page whose `work` tool returns only once the gate of its `n` opens."""

    def __init__(self, url: str, numbers: list[int]) -> None:
        self.client = ToolClient(
            url, connector=NativeConnector(compression=None), connect_timeout=10.0
        )
        self.gates = {n: asyncio.Event() for n in numbers}
        self.executions: Counter[int] = Counter()
        self.running: set[int] = set()

        @self.client.tool(name="work")
        async def work(n: int, tag: str = "") -> dict[str, int]:
            """Count this run, wait for the gate of n, return n and its square."""
            self.executions[n] += 1
            self.running.add(n)
            try:
                await self.gates[n].wait()
            finally:
                self.running.discard(n)
            return {"n": n, "sq": n * n}


def output_of(chunks: list[dict[str, Any]], n: int) -> int | None:
    """The index of the output chunk of the call with input n, if it came."""
    calls = {
        c["toolCallId"]: c["input"]["n"] for c in chunks if c["type"] == "tool-input-available"
    }
    for index, chunk in enumerate(chunks):
        if chunk["type"] == "tool-output-available" and calls.get(chunk["toolCallId"]) == n:
            return index
    return None


async def test_a_replay_keeps_the_numbering_the_pages_saw(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    # Parallel calls: 3 then 2 complete on A, 1 is still running when A dies. The
    # replay on C gives the outputs of 2 and 3 in its own order; a page that had
    # seen up to 3's output resumes on C and gets 2's and then 1's, once each.
    url = postgres.fresh_url()
    async with (
        processes(url, tmp_path, a=LEASE, c=LEASE) as (a, c),
        FaultProxy("127.0.0.1", a.port) as proxy,
    ):
        page = GatesPage(proxy.url("/agents/chat/s"), [1, 2, 3])
        await page.client.connect()
        try:
            on_a = await ChatPeer.open(a.ws_url("s"))
            request_id = await on_a.browser.start_chat(prompt_for("r", [1, 2, 3]), "c1")
            await wait_until(lambda: len(page.running) == 3, TIMEOUT, "the three tools to run")
            page.gates[3].set()
            await wait_until(
                lambda: output_of(on_a.browser.chunks[request_id], 3) is not None,
                TIMEOUT,
                "the output of 3",
            )
            seen = on_a.browser.chunks[request_id][:]  # the page's chat socket drops here
            await on_a.close()
            page.gates[2].set()
            await wait_until(lambda: published(url, "c1", len(seen) + 1), TIMEOUT, "2's output")
            proxy.upstream_port = c.port
            await asyncio.to_thread(a.kill)
            on_c = await ChatPeer.open(c.ws_url("s"))
            async with reader(url) as ledger:
                await wait_until(
                    lambda: taken_over(ledger, "c1"), TIMEOUT, "C to take the run over"
                )
            rest = await resume(on_c, "c1", len(seen) - 1)
            await started(on_c, rest)
            page.gates[1].set()
            from_c = await on_c.response(rest)
            await on_c.close()
        finally:
            await page.client.close()
        assert not proxy.errors, proxy.errors
    whole = seen + from_c.chunks
    assert not on_c.violations
    assert [output_of(whole, n) is not None for n in (1, 2, 3)] == [True] * 3
    outputs = [c for c in whole if c["type"] == "tool-output-available"]
    assert len(outputs) == 3  # each once: none replayed twice, none skipped
    assert output_of(whole, 3) < output_of(whole, 2) < output_of(whole, 1)  # type: ignore[operator]
    assert from_c.final["type"] == "end"
    assert page.executions == {1: 1, 2: 1, 3: 1}


async def test_a_chat_on_a_process_that_lost_the_run_follows_the_new_owner(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    url = postgres.fresh_url()
    gate = asyncio.Event()
    async with (
        processes(url, tmp_path, stale=LEASE, new=LEASE) as (stale, new),
        FaultProxy("127.0.0.1", stale.port) as proxy,
    ):
        assert stale.process is not None
        base = await undisturbed(new, prompt_for("p", [5]))
        page = await GatedPage.open(proxy.url("/agents/chat/s"), gate)
        try:
            chat = await ChatPeer.open(stale.ws_url("s"))
            request_id = await chat.browser.start_chat(prompt_for("p", [5]), "c1")
            await wait_until(lambda: ("p", 5) in page.running, TIMEOUT, "the tool to run")
            async with reader(url) as ledger:
                # Paused past its lease: the other process takes the run over.
                os.kill(stale.process.pid, signal.SIGSTOP)
                proxy.upstream_port = new.port
                proxy.cut_all()
                await wait_until(lambda: taken_over(ledger, "c1"), TIMEOUT, "the take-over")
            os.kill(stale.process.pid, signal.SIGCONT)
            log = tmp_path / "server-stale.log"
            await wait_until(lambda: "lease lost" in log.read_text(), TIMEOUT, "the stale one")
            gate.set()
            # The chat socket on the stale process gets the rest of the response.
            response = await chat.response(request_id)
            await chat.close()
        finally:
            await page.close()
    assert response.final["type"] == "end"
    assert normalized(response.chunks) == normalized(base.chunks)
    assert not chat.violations
    assert page.executions == {("p", 5): 1}


async def test_a_chat_on_a_process_that_lost_the_run_mid_answer_sees_only_the_recorded_one(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    # The stale process stops while its model answers. The new owner asks the model
    # again (no answer was recorded), and the call it gets has an id of its own. Once
    # the stale process goes on, its model's answer can no longer be recorded: the
    # chat socket there must not see that answer's call, only the new owner's.
    url = postgres.fresh_url()
    gate = asyncio.Event()
    gate.set()
    hold = tmp_path / "hold"
    async with (
        processes(url, tmp_path, stale=LEASE, new=LEASE) as (stale, new),
        FaultProxy("127.0.0.1", stale.port) as proxy,
    ):
        assert stale.process is not None
        prompt = prompt_for("h", [5])
        base = await undisturbed(new, prompt)
        asked = first_request(prompt)
        before = model_requests(tmp_path)[asked]
        page = await GatedPage.open(proxy.url("/agents/chat/s"), gate)
        try:
            hold.touch()
            chat = await ChatPeer.open(stale.ws_url("s"))
            request_id = await chat.browser.start_chat(prompt, "c1")
            await wait_until(
                lambda: model_requests(tmp_path)[asked] == before + 1, TIMEOUT, "the model"
            )
            async with reader(url) as ledger:
                os.kill(stale.process.pid, signal.SIGSTOP)
                hold.unlink()
                proxy.upstream_port = new.port
                proxy.cut_all()
                await wait_until(lambda: taken_over(ledger, "c1"), TIMEOUT, "the take-over")
                ended = len(base.chunks) + 1  # and the row of its end
                await wait_until(lambda: published(url, "c1", ended), TIMEOUT, "the end")
            os.kill(stale.process.pid, signal.SIGCONT)
            response = await chat.response(request_id)
            await chat.close()
        finally:
            await page.close()
    assert model_requests(tmp_path)[asked] == before + 2  # the stale process's, the new one's
    assert response.final["type"] == "end"
    assert normalized(response.chunks) == normalized(base.chunks)
    assert not chat.violations
    assert page.executions == {("h", 5): 1}


async def test_no_socket_of_a_session_needs_the_process_of_its_run(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    # The run on A, its page on B (the call routed there), its chat socket resumed on C.
    url = postgres.fresh_url()
    gate = asyncio.Event()
    async with processes(url, tmp_path, a=LEASE, b=LEASE, c=LEASE) as (a, b, c):
        base = await undisturbed(a, PROMPT)
        page = await GatedPage.open(b.ws_url("s"), gate)
        try:
            on_a = await ChatPeer.open(a.ws_url("s"))
            request_id = await on_a.browser.start_chat(PROMPT, "c1")
            await wait_until(lambda: len(page.running) == 2, TIMEOUT, "both tools to run on B")
            seen = len(on_a.browser.chunks[request_id])
            await on_a.close()  # the chat socket drops; the page's chat lands on C
            on_c = await ChatPeer.open(c.ws_url("s"))
            rest = await resume(on_c, "c1", seen - 1)
            await started(on_c, rest)
            gate.set()
            from_c = await on_c.response(rest)
            await on_c.close()
        finally:
            await page.close()
    whole = on_a.browser.chunks[request_id] + from_c.chunks
    assert from_c.final["type"] == "end"
    assert normalized(whole) == normalized(base.chunks)
    assert not on_c.violations
    assert page.executions == {("t", 1): 1, ("t", 2): 1}


async def test_an_ended_response_leaves_no_writer_or_follower_behind(
    postgres: PostgresServer,
) -> None:
    url = postgres.fresh_url()
    config = ServerConfig(port=0, db=url, log_level="warning")
    gate = asyncio.Event()
    gate.set()
    async with running_server(config) as owner, running_server(config) as other:
        page = await GatedPage.open(owner.ws_url("s"), gate)
        try:
            chat = await ChatPeer.open(owner.ws_url("s"))
            response = await chat.browser.chat(PROMPT, "c1", TIMEOUT)
            elsewhere = await ChatPeer.open(other.ws_url("s"))
            tail = await elsewhere.response(await resume(elsewhere, "c1", 0))
            await chat.close()
            await elsewhere.close()
        finally:
            await page.close()
        await settled(owner.hub)
        await settled(other.hub)
    assert tail.chunks == response.chunks[1:]
