"""Browser tools as proxies: timeouts, acks, routing, disconnects, approvals, limits (S1-S6)."""

from __future__ import annotations

from typing import Any

from server_harness import FakeBrowser, settled, tool_spec

from clienttools_server.app import RunningServer
from tests.support.clock import ManualClock
from tests.support.wait import wait_until


async def test_timeout_cancels_and_a_late_result_is_stale(
    start_server: Any, open_browser: Any
) -> None:
    server = await start_server()
    tab = await open_browser(server)
    await tab.register([tool_spec("slow", timeoutMs=150)])
    request_id = await tab.start_chat("call slow {}")
    invoke = await tab.expect("cf_agent_client_tool_invoke")
    cancel = await tab.expect("cf_agent_client_tool_cancel", requestId=invoke["requestId"])
    assert cancel["reason"] == "timeout"
    response = await tab.response(request_id)
    assert response.text.startswith("slow failed: timeout: the tool 'slow' ran past its time limit")
    await tab.send_result(invoke["requestId"], output="late")
    ack = await tab.ack_for(invoke["requestId"])
    assert ack["outcome"] == "stale"
    await settled(server.hub)


async def _progress(
    tab: FakeBrowser, clock: ManualClock, rid: str, step: int, idle_timeout: float
) -> None:
    """Send progress and wait until the server restarted the call's idle clock."""
    await tab.send({"type": "cf_agent_client_tool_progress", "requestId": rid, "progress": step})
    restarted = clock.now() + idle_timeout
    await wait_until(lambda: restarted in clock.deadlines(), 5, "the idle clock to restart")


async def test_progress_restarts_the_idle_clock(start_server: Any, open_browser: Any) -> None:
    clock = ManualClock()
    server = await start_server(tool_timeout=10, max_tool_timeout=100, clock=clock)
    tab = await open_browser(server)
    await tab.register([tool_spec("busy")])
    request_id = await tab.start_chat("call busy {}")
    invoke = await tab.expect("cf_agent_client_tool_invoke")
    rid = invoke["requestId"]
    for step in range(1, 6):  # 30 s in all, three times the idle timeout
        clock.advance(6)
        await _progress(tab, clock, rid, step, idle_timeout=10)
    await tab.send_result(rid, output="ok")
    assert (await tab.ack_for(rid))["outcome"] == "applied"
    assert (await tab.response(request_id)).text == 'busy -> "ok"'
    assert not [f for f in tab.inbox if f["type"] == "cf_agent_client_tool_cancel"]
    await settled(server.hub)


async def test_hard_maximum_applies_despite_progress(start_server: Any, open_browser: Any) -> None:
    clock = ManualClock()
    server = await start_server(tool_timeout=10, max_tool_timeout=25, clock=clock)
    tab = await open_browser(server)
    await tab.register([tool_spec("busy", timeoutMs=60_000)])  # capped by the maximum
    request_id = await tab.start_chat("call busy {}")
    invoke = await tab.expect("cf_agent_client_tool_invoke")
    assert invoke["timeoutMs"] == 25_000
    rid = invoke["requestId"]
    for step in range(1, 5):  # progress every 6 s: the idle clock (25 s too) never runs out
        clock.advance(6)
        await _progress(tab, clock, rid, step, idle_timeout=25)
    assert server.hub.stats()["pending_calls"] == 1  # 24 s: still running
    clock.advance(1)  # 25 s: the hard maximum
    await tab.expect("cf_agent_client_tool_cancel", requestId=rid, reason="timeout")
    assert "timeout" in (await tab.response(request_id)).text
    await settled(server.hub)


async def test_duplicate_result(server: RunningServer, tab: FakeBrowser) -> None:
    await tab.register([tool_spec("t")])
    request_id = await tab.start_chat("call t {}")
    invoke = await tab.expect("cf_agent_client_tool_invoke")
    await tab.send_result(invoke["requestId"], output=1)
    await tab.send_result(invoke["requestId"], output=2)
    assert (await tab.ack_for(invoke["requestId"]))["outcome"] == "applied"
    assert (await tab.ack_for(invoke["requestId"]))["outcome"] == "duplicate"
    assert (await tab.response(request_id)).text == "t -> 1"
    # Long after the run: still a duplicate, not stale.
    await tab.send_result(invoke["requestId"], error={"code": "tool_error", "message": "x"})
    assert (await tab.ack_for(invoke["requestId"]))["outcome"] == "duplicate"
    await settled(server.hub)


async def test_unknown_request_is_stale(server: RunningServer, tab: FakeBrowser) -> None:
    await tab.send_result("f" * 32, output=1)
    ack = await tab.ack_for("f" * 32)
    assert ack["outcome"] == "stale"


async def test_result_from_another_connection_or_session_is_invalid(
    server: RunningServer, open_browser: Any
) -> None:
    tab = await open_browser(server, "s1")
    same_session = await open_browser(server, "s1")
    other_session = await open_browser(server, "s2")
    await tab.register([tool_spec("t")])
    await same_session.register([], client_id="another-page")
    request_id = await tab.start_chat("call t {}")
    invoke = await tab.expect("cf_agent_client_tool_invoke")
    rid = invoke["requestId"]
    await same_session.send_result(rid, output="forged")
    assert (await same_session.ack_for(rid))["outcome"] == "invalid"
    await other_session.send_result(rid, output="forged")
    assert (await other_session.ack_for(rid))["outcome"] == "invalid"
    # The call is unaffected: the real result still applies.
    await tab.send_result(rid, output="real")
    assert (await tab.ack_for(rid))["outcome"] == "applied"
    assert (await tab.response(request_id)).text == 't -> "real"'
    await settled(server.hub)


async def test_output_schema_violation_is_invalid(server: RunningServer, tab: FakeBrowser) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    await tab.register([tool_spec("typed", outputSchema=schema)])
    request_id = await tab.start_chat("call typed {}")
    invoke = await tab.expect("cf_agent_client_tool_invoke")
    await tab.send_result(invoke["requestId"], output={"n": "one"})
    ack = await tab.ack_for(invoke["requestId"])
    assert ack["outcome"] == "invalid" and "outputSchema" in ack["message"]
    text = (await tab.response(request_id)).text
    assert text.startswith("typed failed: invalid_output: the result does not match outputSchema")
    await settled(server.hub)


async def test_oversize_result_is_invalid(server: RunningServer, tab: FakeBrowser) -> None:
    await tab.register([tool_spec("big")])
    request_id = await tab.start_chat("call big {}")
    invoke = await tab.expect("cf_agent_client_tool_invoke")
    await tab.send_result(invoke["requestId"], output="x" * 1_000_000)  # 1,000,002 bytes as JSON
    ack = await tab.ack_for(invoke["requestId"])
    assert ack["outcome"] == "invalid" and "1,000,002" in ack["message"]
    assert (await tab.response(request_id)).text.startswith("big failed: output_too_large:")
    await settled(server.hub)


async def test_invoke_goes_to_the_newest_registration(
    server: RunningServer, open_browser: Any
) -> None:
    old = await open_browser(server)
    new = await open_browser(server)
    await old.register([tool_spec("where")], handlers={"where": _const("old")})
    await new.register([tool_spec("where")], handlers={"where": _const("new")})
    assert (await old.chat("call where {}")).text == 'where -> "new"'
    assert not old.invokes and len(new.invokes) == 1
    await settled(server.hub)


def _const(value: Any) -> Any:
    async def run(tool_input: dict[str, Any]) -> Any:
        return value

    return run


async def test_disconnect_policy_fail(start_server: Any, open_browser: Any) -> None:
    server = await start_server(disconnect_policy="fail")
    chat = await open_browser(server)
    tools = await open_browser(server)
    await tools.register([tool_spec("t")])
    request_id = await chat.start_chat("call t {}")
    await tools.expect("cf_agent_client_tool_invoke")
    await tools.close()
    text = (await chat.response(request_id)).text
    assert text == "t failed: disconnected: the browser disconnected while the tool ran"
    await settled(server.hub)


async def test_disconnect_policy_wait_redelivers(server: RunningServer, open_browser: Any) -> None:
    chat = await open_browser(server)
    tools = await open_browser(server)
    await tools.register([tool_spec("t")], client_id="page-1")
    request_id = await chat.start_chat("call t {}")
    first = await tools.expect("cf_agent_client_tool_invoke")
    await tools.close()
    # The call is parked, its timers stopped, until a page registers the tool again.
    await wait_until(lambda: server.hub.stats()["timers"] == 0, 5, "the timers to stop")
    assert server.hub.stats()["pending_calls"] == 1
    again = await open_browser(server)
    await again.register([tool_spec("t")], client_id="page-1")
    second = await again.expect("cf_agent_client_tool_invoke")
    assert second["requestId"] == first["requestId"]
    assert (first["attempt"], second["attempt"]) == (1, 2)
    await again.send_result(second["requestId"], output="second try")
    assert (await chat.response(request_id)).text == 't -> "second try"'
    await settled(server.hub)


async def test_result_resent_from_the_reconnected_page_applies(
    server: RunningServer, open_browser: Any
) -> None:
    # C11: a page re-sends unacknowledged results after reconnecting, maybe
    # before it registers again; the same clientId in the same session is accepted.
    chat = await open_browser(server)
    tools = await open_browser(server)
    await tools.register([tool_spec("t")], client_id="page-9")
    request_id = await chat.start_chat("call t {}")
    invoke = await tools.expect("cf_agent_client_tool_invoke")
    await tools.close()
    again = await open_browser(server)
    await again.register([], client_id="page-9")
    await again.send_result(invoke["requestId"], output="kept")
    assert (await again.ack_for(invoke["requestId"]))["outcome"] == "applied"
    assert (await chat.response(request_id)).text == 't -> "kept"'
    await settled(server.hub)


async def test_approval_granted(server: RunningServer, tab: FakeBrowser) -> None:
    await tab.register([tool_spec("guarded", needsApproval=True)], handlers={"guarded": _const(7)})
    request_id = await tab.start_chat("call guarded {}")
    request = await tab.chunk(request_id, "tool-approval-request")
    assert not tab.invokes  # nothing runs before the human says yes
    await tab.send(
        {"type": "cf_agent_tool_approval", "toolCallId": request["toolCallId"], "approved": True}
    )
    response = await tab.response(request_id)
    assert response.text == "guarded -> 7"
    kinds = response.types
    assert kinds.index("tool-approval-request") < kinds.index("tool-output-available")
    await settled(server.hub)


async def test_approval_denied(server: RunningServer, tab: FakeBrowser) -> None:
    await tab.register([tool_spec("guarded", needsApproval=True)], handlers={"guarded": _const(7)})
    request_id = await tab.start_chat("call guarded {}")
    call_id = (await tab.chunk(request_id, "tool-approval-request"))["toolCallId"]
    await tab.send(
        {
            "type": "cf_agent_tool_approval",
            "toolCallId": call_id,
            "approved": False,
            "reason": "not now",
        }
    )
    response = await tab.response(request_id)
    assert response.of_type("tool-output-denied") == [
        {"type": "tool-output-denied", "toolCallId": call_id}
    ]
    assert response.text == "guarded failed: denied: not now"
    assert not tab.invokes
    # An approval nobody waits for is a protocol error, not a crash.
    await tab.send({"type": "cf_agent_tool_approval", "toolCallId": call_id, "approved": True})
    assert "no approval is pending" in (await tab.expect("cf_agent_protocol_error"))["message"]
    await settled(server.hub)


async def test_registration_limits_in_the_ack(server: RunningServer, tab: FakeBrowser) -> None:
    big = tool_spec("big", description="x" * 70_000)
    tools = [tool_spec("dup"), tool_spec("dup"), tool_spec("server_time"), big]
    tools += [tool_spec(f"t{i}") for i in range(130)]
    ack = await tab.register(tools)
    reasons = {r["name"]: r["reason"] for r in ack["rejected"]}
    assert "already" in reasons["dup"]
    assert "server tool" in reasons["server_time"]
    assert "65,536" in reasons["big"]
    assert len(ack["accepted"]) == 128
    assert "at most 128" in reasons["t127"]
