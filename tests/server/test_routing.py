"""Browser calls routed between real server processes on one PostgreSQL ledger.

A chat's run lives on the process its chat socket reached; the page whose tool
it calls may be connected to another one. The call travels there and back over
the ledger's LISTEN/NOTIFY bus (clienttools_server.cluster.routing), with every rule of
one process kept: S2 across the cluster, S5's acks, S3's clocks, S4 and C7.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from clienttools.client import ToolClient
from clienttools.context import ToolContext
from clienttools.native import NativeConnector
from tests.reliability.harness import ChatPeer, Page, prompt_for, transcript_of
from tests.server.server_harness import ChunkCollector, FakeBrowser
from tests.support.cluster import all_completed, reader
from tests.support.faultproxy import FaultProxy
from tests.support.http import http_json
from tests.support.postgres import PostgresServer
from tests.support.server_process import ServerProcess, running
from tests.support.wait import wait_until

# Each test starts the server as OS processes: not in `make check`.
pytestmark = pytest.mark.process

WORK_SPEC: dict[str, Any] = {
    "name": "work",
    "description": "n and its square",
    "inputSchema": {
        "type": "object",
        "properties": {"n": {"type": "integer"}, "tag": {"type": "string"}},
        "required": ["n"],
    },
}


@contextlib.asynccontextmanager
async def processes(
    url: str, tmp_path: Path, *names: str, args: tuple[str, ...] = ()
) -> AsyncIterator[list[ServerProcess]]:
    servers = [
        ServerProcess(
            ["--db", url, "--lease", "3", "--log-level", "info", *args],
            log=tmp_path / f"server-{name}.log",
        )
        for name in names
    ]
    async with running(servers):
        yield servers


class ProgressPage:
    """A page with `slow` (reports progress while it runs) and `sleepy` (no progress)."""

    def __init__(self, url: str) -> None:
        self.client = ToolClient(
            url, connector=NativeConnector(compression=None), connect_timeout=10.0
        )
        self.runs: Counter[str] = Counter()
        self.cancelled: set[str] = set()
        self.running: set[str] = set()

        @self.client.tool(name="slow")
        async def slow(ctx: ToolContext, steps: int, every_ms: int) -> dict[str, int]:
            """Report progress `steps` times, `every_ms` apart; return how many."""
            self.runs["slow"] += 1
            for step in range(1, steps + 1):
                await asyncio.sleep(every_ms / 1000)
                await ctx.progress(step, steps)
            return {"steps": steps}

        @self.client.tool(name="sleepy")
        async def sleepy(seconds: float) -> dict[str, float]:
            """Sleep without a word; cancelled if the server gives up."""
            self.runs["sleepy"] += 1
            self.running.add("sleepy")
            try:
                await asyncio.sleep(seconds)
            except asyncio.CancelledError:
                self.cancelled.add("sleepy")
                raise
            finally:
                self.running.discard("sleepy")
            return {"slept": seconds}

    async def close(self) -> None:
        await self.client.close()


async def fake_page(url: str, client_id: str | None = None) -> FakeBrowser:
    """A page socket that registers `work` and answers nothing by itself."""
    page = await FakeBrowser.connect(url, ChunkCollector())
    await page.register([WORK_SPEC], client_id=client_id)
    return page


async def test_a_chat_on_one_process_calls_a_tool_on_a_page_on_another(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    url = postgres.fresh_url()
    async with processes(url, tmp_path, "a", "b") as (a, b):
        page = await Page.open(b.ws_url("s1"))
        try:
            chat = await ChatPeer.open(a.ws_url("s1"))
            routed = await chat.ask(prompt_for("routed", [1, 2, 3]))
            await chat.close()
            # The undisturbed twin: chat and page on one process.
            local = await ChatPeer.open(b.ws_url("s1"))
            one_process = await local.ask(prompt_for("local", [1, 2, 3]))
            await local.close()
            await page.settle()
        finally:
            await page.close()
    assert routed.final["type"] == "end" and not chat.violations
    assert transcript_of(routed) == transcript_of(one_process)
    assert [o for _, o in transcript_of(routed).outcomes] == [
        {"n": 1, "sq": 1},
        {"n": 2, "sq": 4},
        {"n": 3, "sq": 9},
    ]
    assert page.executions == Counter(
        {(tag, n): 1 for tag in ("routed", "local") for n in (1, 2, 3)}
    )


async def test_progress_from_the_pages_process_keeps_a_long_call_alive(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    url = postgres.fresh_url()
    async with processes(url, tmp_path, "a", "b", args=("--tool-timeout", "1")) as (a, b):
        page = ProgressPage(b.ws_url("p"))
        await page.client.connect()
        try:
            chat = await ChatPeer.open(a.ws_url("p"))
            # 3 s in all, 4x the idle timeout, progress every 0.3 s.
            response = await chat.ask('call slow {"steps": 10, "every_ms": 300}')
            await chat.close()
        finally:
            await page.close()
    [output] = response.of_type("tool-output-available")
    assert output["output"] == {"steps": 10}
    assert page.runs == Counter({"slow": 1})


async def test_a_timeout_on_the_runs_process_cancels_the_tool_on_the_pages(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    url = postgres.fresh_url()
    async with processes(url, tmp_path, "a", "b", args=("--tool-timeout", "1")) as (a, b):
        page = ProgressPage(b.ws_url("t"))
        await page.client.connect()
        try:
            chat = await ChatPeer.open(a.ws_url("t"))
            response = await chat.ask('call sleepy {"seconds": 30}')
            await chat.close()
            await wait_until(lambda: "sleepy" in page.cancelled, 10.0, "the cancel to arrive")
        finally:
            await page.close()
    [error] = response.of_type("tool-output-error")
    assert "time limit" in error["errorText"]
    assert response.final["type"] == "end"


async def test_an_abort_on_the_runs_process_cancels_the_tool_on_the_pages(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    url = postgres.fresh_url()
    async with processes(url, tmp_path, "a", "b") as (a, b):
        page = ProgressPage(b.ws_url("ab"))
        await page.client.connect()
        try:
            chat = await ChatPeer.open(a.ws_url("ab"))
            request_id = await chat.browser.start_chat('call sleepy {"seconds": 30}', "ab1")
            await wait_until(lambda: "sleepy" in page.running, 20.0, "the tool to run")
            await chat.browser.send({"type": "abort", "requestId": request_id})
            await wait_until(lambda: "sleepy" in page.cancelled, 10.0, "the cancel to arrive")
            await chat.close()
        finally:
            await page.close()
    assert page.runs == Counter({"sleepy": 1})


async def test_the_newest_registration_wins_whatever_its_process(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    url = postgres.fresh_url()
    async with processes(url, tmp_path, "a", "b", "c") as (a, b, c):
        older = await Page.open(a.ws_url("s2"), client_id="older")
        newer = await Page.open(b.ws_url("s2"), client_id="newer")
        newest: Page | None = None
        try:
            chat = await ChatPeer.open(c.ws_url("s2"))
            await chat.ask(prompt_for("first", [1]))
            # A page on the chat's own process registers later still: it wins now.
            newest = await Page.open(c.ws_url("s2"), client_id="newest")
            await chat.ask(prompt_for("second", [2]))
            await newest.close()  # gone: the next newest, on another process, again
            await chat.ask(prompt_for("third", [3]))
            await chat.close()
        finally:
            for page in (older, newer, newest):
                if page is not None:
                    await page.close()
    assert older.executions == Counter()
    assert newer.executions == Counter({("first", 1): 1, ("third", 3): 1})
    assert newest is not None and newest.executions == Counter({("second", 2): 1})


async def test_results_are_judged_as_in_one_process(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    """S5: invalid from a connection the invoke did not go to, on any process; the same
    page's new connection (same clientId) on a third process applied; then duplicate."""
    url = postgres.fresh_url()
    async with processes(url, tmp_path, "a", "b", "c") as (a, b, c):
        target = await fake_page(b.ws_url("s5"), client_id="the-page")
        chat = await ChatPeer.open(a.ws_url("s5"))
        request_id = await chat.browser.start_chat(prompt_for("s5", [7]), "s5")
        invoke = await target.expect("cf_agent_client_tool_invoke", timeout=20.0)
        call = invoke["requestId"]
        assert invoke["attempt"] == 1 and invoke["input"] == {"n": 7, "tag": "s5"}
        elsewhere = await fake_page(c.ws_url("s5"), client_id="another-page")
        beside = await fake_page(b.ws_url("s5"), client_id="a-third-page")
        for intruder in (elsewhere, beside):
            await intruder.send_result(call, output={"n": 7, "sq": 0})
            assert (await intruder.ack_for(call, timeout=10.0))["outcome"] == "invalid"
            await intruder.close()  # else S4 would deliver the call to the newest of them
        # The page leaves B before answering and comes back on C with its result.
        await target.close()
        again = await FakeBrowser.connect(c.ws_url("s5"), ChunkCollector())
        await again.register([WORK_SPEC], client_id="the-page")
        await again.send_result(call, output={"n": 7, "sq": 49})
        assert (await again.ack_for(call, timeout=10.0))["outcome"] == "applied"
        response = await chat.response(request_id, timeout=30.0)
        await again.send_result(call, output={"n": 7, "sq": 49})
        assert (await again.ack_for(call, timeout=10.0))["outcome"] == "duplicate"
        await again.close()
        await chat.close()
    [output] = response.of_type("tool-output-available")
    assert output["output"] == {"n": 7, "sq": 49}


async def test_a_result_on_the_pages_process_is_judged_there(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    """The relayed call's own connection: applied, then duplicate; a tool error counts too."""
    url = postgres.fresh_url()
    async with processes(url, tmp_path, "a", "b") as (a, b):
        page = await fake_page(b.ws_url("rel"))
        chat = await ChatPeer.open(a.ws_url("rel"))
        request_id = await chat.browser.start_chat(prompt_for("rel", [4, 5]), "rel")
        first = await page.expect("cf_agent_client_tool_invoke", timeout=20.0)
        second = await page.expect("cf_agent_client_tool_invoke", timeout=20.0)
        await page.send_result(first["requestId"], output={"n": 4, "sq": 16})
        await page.send_result(
            second["requestId"], error={"code": "tool_error", "message": "no five today"}
        )
        for call in (first, second):
            assert (await page.ack_for(call["requestId"], timeout=10.0))["outcome"] == "applied"
        response = await chat.response(request_id, timeout=30.0)
        await page.send_result(first["requestId"], output={"n": 4, "sq": 16})
        assert (await page.ack_for(first["requestId"], timeout=10.0))["outcome"] == "duplicate"
        await page.close()
        await chat.close()
    assert response.final["type"] == "end"
    assert [c["output"] for c in response.of_type("tool-output-available")] == [{"n": 4, "sq": 16}]
    [error] = response.of_type("tool-output-error")
    assert "no five today" in error["errorText"]


async def test_the_pages_process_killed_the_call_is_delivered_again_elsewhere(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    url = postgres.fresh_url()
    async with (
        processes(url, tmp_path, "a", "b", "c") as (a, b, c),
        FaultProxy("127.0.0.1", b.port) as proxy,  # the pages' load balancer
    ):
        page = await Page.open(proxy.url("/agents/chat/k"))
        try:
            chat = await ChatPeer.open(a.ws_url("k"))
            request_id = await chat.browser.start_chat(
                prompt_for("k", [1, 2], ms=lambda n: 1500), "k1"
            )
            await wait_until(lambda: len(page.running) == 2, 20.0, "both tools to run")
            proxy.upstream_port = c.port
            await asyncio.to_thread(b.kill)
            response = await chat.response(request_id, timeout=60.0)
            await page.settle()
            await chat.close()
        finally:
            await page.close()
        assert not proxy.errors, proxy.errors
    assert [o for _, o in transcript_of(response).outcomes] == [
        {"n": 1, "sq": 1},
        {"n": 2, "sq": 4},
    ]
    assert page.executions == Counter({("k", 1): 1, ("k", 2): 1})


async def test_a_resolve_over_http_on_a_third_process_wakes_the_run(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    url = postgres.fresh_url()
    async with processes(url, tmp_path, "a", "b", "c") as (a, b, c):
        page = await fake_page(b.ws_url("h"))
        chat = await ChatPeer.open(a.ws_url("h"))
        request_id = await chat.browser.start_chat(prompt_for("h", [6]), "h1")
        invoke = await page.expect("cf_agent_client_tool_invoke", timeout=20.0)
        async with reader(url) as ledger:
            step = await ledger.step_by_request_id(invoke["requestId"])
        assert step is not None
        reply = await http_json(
            "127.0.0.1", c.port, "POST",
            f"/executions/{step.execution_id}/steps/{step.seq}/resolve",
            {"output": {"n": 6, "sq": 36}},
        )  # fmt: skip
        assert reply.status == 200, reply.json
        response = await chat.response(request_id, timeout=30.0)
        # The page that had the invoke is told the call was settled without it.
        cancel = await page.expect("cf_agent_client_tool_cancel", timeout=10.0)
        assert cancel == {
            "type": "cf_agent_client_tool_cancel",
            "requestId": invoke["requestId"],
            "reason": "superseded",
        }
        await page.send_result(invoke["requestId"], output={"n": 6, "sq": 36})
        assert (await page.ack_for(invoke["requestId"], timeout=10.0))["outcome"] == "stale"
        await page.close()
        await chat.close()
    [output] = response.of_type("tool-output-available")
    assert output["output"] == {"n": 6, "sq": 36}


async def test_a_routed_call_outlives_a_restart_of_postgresql(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    """The database goes away while the page on B runs the tool of a run on A, and comes
    back: the buses reconnect and resync, the result reaches the ledger, the run ends."""
    url = postgres.fresh_url()
    async with processes(url, tmp_path, "a", "b") as (a, b):
        page = await Page.open(b.ws_url("db"))
        try:
            chat = await ChatPeer.open(a.ws_url("db"))
            request_id = await chat.browser.start_chat(
                prompt_for("db", [8], ms=lambda n: 2000), "db1"
            )
            await wait_until(lambda: ("db", 8) in page.running, 20.0, "the tool to run")
            postgres.stop()
            try:
                # The tool finishes while the database is away: the result waits in
                # the page's outbox (its socket closed with 1013, C11 sends it again).
                await wait_until(lambda: ("db", 8) in page.finished, 20.0, "the tool to end")
                await asyncio.sleep(1.0)
            finally:
                postgres.start_again()
            response = await chat.response(request_id, timeout=60.0)
            await page.settle(timeout=60.0)
            await chat.close()
        finally:
            await page.close()
        logs = (tmp_path / "server-a.log").read_text() + (tmp_path / "server-b.log").read_text()
    assert [o for _, o in transcript_of(response).outcomes] == [{"n": 8, "sq": 64}]
    assert page.executions == Counter({("db", 8): 1})
    assert logs.count("bus: listening again") == 2


async def test_the_runs_of_a_killed_owner_complete_with_their_pages_elsewhere(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    """A dies while its runs' calls run on a page on B; the page answers B before anyone
    owns the runs again (B's word to A is lost). The process that takes them over
    finds the results in the ledger and goes on; each tool ran once."""
    url = postgres.fresh_url()
    async with processes(url, tmp_path, "a", "b", "c") as (a, b, _c):
        page = await Page.open(b.ws_url("o"))
        try:
            chat = await ChatPeer.open(a.ws_url("o"))
            for i in range(3):
                await chat.browser.start_chat(prompt_for(f"o{i}", [i], ms=lambda n: 1000), f"o{i}")
            await wait_until(lambda: len(page.running) == 3, 20.0, "the tools to run")
            await asyncio.to_thread(a.kill)
            async with reader(url) as ledger:
                await wait_until(
                    lambda: all_completed(ledger), 30.0, "every run to complete elsewhere"
                )
                runs = await ledger.executions()
                steps = [await ledger.steps(run.id) for run in runs]
            await page.settle()
        finally:
            await page.close()
    assert len(runs) == 3 and all(run.generation == 2 for run in runs)
    for run_steps in steps:
        [tool] = [s for s in run_steps if s.kind == "tool"]
        n = json.loads(tool.input_json)["n"]
        assert tool.state == "applied" and tool.result() == {"n": n, "sq": n * n}
    assert page.executions == Counter({(f"o{i}", i): 1 for i in range(3)})


async def test_with_policy_fail_a_closed_page_on_another_process_fails_the_call(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    url = postgres.fresh_url()
    policy = ("--disconnect-policy", "fail")
    async with processes(url, tmp_path, "a", "b", args=policy) as (a, b):
        page = await fake_page(b.ws_url("f"))
        chat = await ChatPeer.open(a.ws_url("f"))
        request_id = await chat.browser.start_chat(prompt_for("f", [1]), "f1")
        await page.expect("cf_agent_client_tool_invoke", timeout=20.0)
        await page.close()
        response = await chat.response(request_id, timeout=30.0)
        await chat.close()
    [error] = response.of_type("tool-output-error")
    assert error["errorText"].startswith("disconnected")


async def test_a_dead_pages_process_is_noticed_at_the_heartbeat(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    """B dies with the invoke and nobody comes back: once B's row lapsed (the lease),
    A's heartbeat treats the call as disconnected (here: policy fail)."""
    url = postgres.fresh_url()
    policy = ("--disconnect-policy", "fail")
    async with processes(url, tmp_path, "a", "b", args=policy) as (a, b):
        page = await fake_page(b.ws_url("d"))
        chat = await ChatPeer.open(a.ws_url("d"))
        request_id = await chat.browser.start_chat(prompt_for("d", [1]), "d1")
        await page.expect("cf_agent_client_tool_invoke", timeout=20.0)
        await asyncio.to_thread(b.kill)
        response = await chat.response(request_id, timeout=30.0)
        await page.close()
        await chat.close()
    [error] = response.of_type("tool-output-error")
    assert error["errorText"].startswith("disconnected")


async def test_an_approval_answered_on_another_process_lets_the_call_run(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    url = postgres.fresh_url()
    guarded = {"name": "guarded", "inputSchema": {"type": "object"}, "needsApproval": True}

    async def seven(_: Any) -> int:
        return 7

    async with processes(url, tmp_path, "a", "b", "c") as (a, b, c):
        page = await FakeBrowser.connect(b.ws_url("ap"), ChunkCollector())
        await page.register([guarded], handlers={"guarded": seven})
        chat = await ChatPeer.open(a.ws_url("ap"))
        request_id = await chat.browser.start_chat("call guarded {}", "ap1")
        request = await chat.browser.chunk(request_id, "tool-approval-request", timeout=20.0)
        assert not page.invokes  # nothing runs before the human says yes
        answer = {"type": "cf_agent_tool_approval", "toolCallId": request["toolCallId"]}
        # A socket of another session cannot answer it.
        stranger = await FakeBrowser.connect(c.ws_url("elsewhere"), ChunkCollector())
        await stranger.send({**answer, "approved": False})
        await stranger.expect("cf_agent_protocol_error", timeout=10.0)
        # The answer comes from a socket of the session on a third process.
        other = await FakeBrowser.connect(c.ws_url("ap"), ChunkCollector())
        await other.send({**answer, "approved": True})
        response = await chat.response(request_id, timeout=30.0)
        await other.send({**answer, "approved": True})  # nobody waits for it any more
        error = await other.expect("cf_agent_protocol_error", timeout=10.0)
        for peer in (page, other, stranger):
            await peer.close()
        await chat.close()
    assert response.text == "guarded -> 7"
    assert len(page.invokes) == 1
    assert "no approval is pending" in error["message"]


async def test_the_pages_process_checks_the_output_schema_the_call_was_made_with(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    """The relayed call's outputSchema, as its step was recorded on the run's process:
    an output that breaks it is refused on the page's process, one that fits applied."""
    url = postgres.fresh_url()
    shaped = {
        **WORK_SPEC,
        "outputSchema": {
            "type": "object",
            "properties": {"sq": {"type": "integer"}},
            "required": ["sq"],
        },
    }
    async with processes(url, tmp_path, "a", "b") as (a, b):
        page = await FakeBrowser.connect(b.ws_url("os"), ChunkCollector())
        await page.register([shaped])
        chat = await ChatPeer.open(a.ws_url("os"))
        request_id = await chat.browser.start_chat(prompt_for("os", [3, 4]), "os")
        first = await page.expect("cf_agent_client_tool_invoke", timeout=20.0)
        second = await page.expect("cf_agent_client_tool_invoke", timeout=20.0)
        await page.send_result(first["requestId"], output={"n": 3, "sq": "nine"})
        await page.send_result(second["requestId"], output={"n": 4, "sq": 16})
        refused = await page.ack_for(first["requestId"], timeout=10.0)
        applied = await page.ack_for(second["requestId"], timeout=10.0)
        response = await chat.response(request_id, timeout=30.0)
        await page.close()
        await chat.close()
    assert (refused["outcome"], applied["outcome"]) == ("invalid", "applied")
    assert "outputSchema" in refused["message"]
    [error] = response.of_type("tool-output-error")
    assert error["errorText"].startswith("invalid_output")
    assert [c["output"] for c in response.of_type("tool-output-available")] == [{"n": 4, "sq": 16}]


async def test_a_call_too_large_for_a_notification_goes_by_its_ids(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    """An input and an output larger than a notification carries: the page's process
    reads the step, the run's process reads the result, and the call completes."""
    url = postgres.fresh_url()
    tag = "t" * 9_000
    async with processes(url, tmp_path, "a", "b") as (a, b):
        page = await fake_page(b.ws_url("big"))
        chat = await ChatPeer.open(a.ws_url("big"))
        request_id = await chat.browser.start_chat(prompt_for(tag, [6]), "big")
        invoke = await page.expect("cf_agent_client_tool_invoke", timeout=20.0)
        output = {"n": 6, "sq": 36, "echo": invoke["input"]["tag"] * 2}
        await page.send_result(invoke["requestId"], output=output)
        assert (await page.ack_for(invoke["requestId"], timeout=10.0))["outcome"] == "applied"
        response = await chat.response(request_id, timeout=30.0)
        await page.close()
        await chat.close()
    assert invoke["input"] == {"n": 6, "tag": tag}
    assert [c["output"] for c in response.of_type("tool-output-available")] == [output]
