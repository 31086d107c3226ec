"""Hostile peers the server tests do not already cover (see references.py for those).

- a connection that opens and never registers must be closed after a timeout;
- a tool that returns 50 MB: the page refuses to send it (output_too_large) and goes on;
- a result for a requestId forged by another tab of the same session, even one that
  copies the page's clientId, or while the real page is reconnecting: `invalid`,
  and the real call is unaffected;
- huge and absurdly nested inputSchemas: refused in the ack or as a protocol error.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from clienttools_server.app import RunningServer, running_server
from clienttools_server.config import ServerConfig
from tests.reliability.harness import (
    ChatPeer,
    Page,
    Spy,
    prompt_for,
    report_of,
    spy_first,
)
from tests.reliability.results import Scenario
from tests.server.server_harness import ChunkCollector, FakeBrowser, settled, tool_spec
from tests.support.faultproxy import FaultProxy
from tests.support.wait import wait_until

pytestmark = pytest.mark.soak


@pytest.fixture
async def server() -> AsyncIterator[RunningServer]:
    config = ServerConfig(port=0, log_level="warning", ping_interval=0.2, idle_timeout=1.0)
    async with running_server(config) as s:
        yield s


async def test_idle_connection_that_never_registers_is_closed(
    server: RunningServer, scenario: Scenario
) -> None:
    scenario.describe("abuse", "idle connection that never registers: closed after a timeout")
    scenario.cases = 2
    async with (
        connect(server.ws_url("idle"), compression=None) as idle,
        connect(server.ws_url("idle"), compression=None) as page,
    ):
        await page.send(
            json.dumps(
                {"type": "cf_agent_client_tools", "protocol": 1, "clientId": "p", "tools": []}
            )
        )
        # Pings keep arriving, but the idle peer never registers: closed after idle_timeout (1 s).
        async with asyncio.timeout(5.0):
            with contextlib.suppress(ConnectionClosed):
                async for _ in idle:
                    pass
        assert idle.close_code == 1008
        # The page that registered is still served.
        await page.send(json.dumps({"type": "cf_agent_pong", "t": 1}))
        async with asyncio.timeout(2.0):
            while json.loads(await page.recv())["type"] != "cf_agent_ping":
                pass


async def test_a_tool_returning_50_mb(server: RunningServer, scenario: Scenario) -> None:
    scenario.describe("abuse", "a tool that returns 50 MB: output_too_large, page goes on")
    page = await Page.open(server.ws_url("big"))

    @page.client.tool(name="huge")
    async def huge() -> str:
        """Return 50 MB of text."""
        return "x" * 50_000_000

    await wait_until(lambda: page.client.connected, what="re-registration")
    chat = await ChatPeer.open(server.ws_url("big"))
    try:
        # The registry change is announced (C1); wait until the server offers the tool.
        async def offered() -> bool:
            return await server.hub.find_peer("big", "huge") is not None

        await wait_until(offered, what="the huge tool to be registered")
        response = await chat.ask("call huge {}")
        assert response.text.startswith("huge failed: output_too_large:"), response.text
        scenario.add_call(settlements=len(response.of_type("tool-output-error")), executions=1)
        # The page keeps working.
        response = await chat.ask(prompt_for("after", [7]))
        report = report_of(response, page, "after")
        assert report.transcript.outcomes == [("work", {"n": 7, "sq": 49})]
        call = report.calls[0]
        scenario.add_call(settlements=call.settlements, executions=call.executions)
        scenario.cases = 1
        await page.settle()
        await settled(server.hub)
    finally:
        await chat.close()
        await page.close()


async def test_forged_results_from_another_tab_of_the_same_session(
    server: RunningServer, scenario: Scenario, soak_factor: int
) -> None:
    scenario.describe(
        "abuse", "result for a requestId forged by another tab (same session, even same clientId)"
    )
    async with FaultProxy("127.0.0.1", server.port) as proxy:
        spy = Spy()
        spy_first(proxy.rules, spy)
        page = await Page.open(proxy.url("/agents/chat/tabs"), client_id="page-1")
        chat = await ChatPeer.open(server.ws_url("tabs"))
        collector = ChunkCollector()
        copycat = await FakeBrowser.connect(server.ws_url("tabs"), collector)
        stranger = await FakeBrowser.connect(server.ws_url("tabs"), collector)
        try:
            await copycat.register([tool_spec("other")], client_id="page-1")  # copies the clientId
            await stranger.register([], client_id="page-2")
            for index in range(3 * soak_factor):
                tag = f"forge-{index}"
                request_id = await chat.start(prompt_for(tag, [index], ms=lambda _: 400))
                await wait_until(lambda k=(tag, index): k in page.running, what="the tool to run")
                [rid] = page.client.session.running_request_ids()
                outcomes: list[str] = []
                for forger in (copycat, stranger):
                    await forger.send_result(rid, output="forged")
                    outcomes.append((await forger.ack_for(rid))["outcome"])
                # Now while the real page is cut off and reconnecting.
                scenario.faults += proxy.cut_all()
                await stranger.send_result(rid, output="forged while away")
                outcomes.append((await stranger.ack_for(rid))["outcome"])
                scenario.cases += len(outcomes)
                response = await chat.response(request_id)
                await page.settle()
                report = report_of(response, page, tag)
                equal = report.transcript.outcomes == [("work", {"n": index, "sq": index * index})]
                scenario.add_call(
                    settlements=report.calls[0].settlements,
                    executions=report.calls[0].executions,
                    transcript_equal=equal,
                )
                scenario.iterations += 1
                assert outcomes == ["invalid"] * 3, outcomes
                assert equal, report.transcript
            assert not spy.applied_twice()
            await settled(server.hub)
        finally:
            for browser in (copycat, stranger):
                await browser.close()
            await chat.close()
            await page.close()


def _nested_schema(depth: int) -> str:
    # Built as text: json.dumps itself cannot nest this deep.
    return '{"type":"object","properties":{"a":' * depth + '{"type":"object"}' + "}}" * depth


def _wide_schema(count: int) -> str:
    properties = {f"p{i}": {"type": "string", "description": "x" * 80} for i in range(count)}
    return json.dumps({"type": "object", "properties": properties})


@pytest.mark.parametrize(
    ("label", "schema"),
    [
        ("900 KB of properties", _wide_schema(8000)),
        ("nested 5,000 deep", _nested_schema(5000)),
        ("nested 200 deep", _nested_schema(200)),
    ],
)  # fmt: skip
async def test_huge_schemas_are_refused_and_harmless(
    server: RunningServer, scenario: Scenario, label: str, schema: str
) -> None:
    scenario.describe("abuse", f"huge inputSchema ({label}): refused, connection usable")
    tab = await FakeBrowser.connect(server.ws_url("schemas"), ChunkCollector())
    try:
        frame = {
            "type": "cf_agent_client_tools",
            "protocol": 1,
            "clientId": "page-s",
            "tools": [tool_spec("fat", inputSchema="SCHEMA"), tool_spec("thin")],
        }
        text = json.dumps(frame).replace('"SCHEMA"', schema, 1)
        assert len(text.encode()) < 1_048_576, "the case must test the schema, not the frame limit"
        await tab.send_raw(text)
        await wait_until(
            lambda: any(
                f["type"] in ("cf_agent_client_tools_ack", "cf_agent_protocol_error")
                for f in tab.inbox
            ),
            what="an ack or a protocol error",
        )
        reply = next(
            f for f in tab.inbox
            if f["type"] in ("cf_agent_client_tools_ack", "cf_agent_protocol_error")
        )  # fmt: skip
        if reply["type"] == "cf_agent_client_tools_ack":
            # A spec this large is not offered to the model; the small one next to it is.
            assert "fat" not in reply["accepted"] and "thin" in reply["accepted"], reply
            reasons = [r["reason"] for r in reply["rejected"] if r["name"] == "fat"]
            scenario.note(f"ack rejects it: {reasons[0][:80]}")
        else:
            scenario.note(f"protocol error: {reply['message'][:80]}")
        scenario.cases += 1
        # The connection, and the server, go on.
        assert (await tab.chat("hi", chat_id="after")).final["type"] == "end"
        await settled(server.hub)
    finally:
        await tab.close()
