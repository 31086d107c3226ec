"""S2, S7, S8 at the edges: calls with no live page, resumes after the end, stale resolves.

Each test names the rule it checks; the browser end-to-end versions of these
are in tests/browser/test_durability.py.
"""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from typing import Any

from server_harness import (
    ChunkCollector,
    FakeBrowser,
    GatedModel,
    first_step_input,
    settled,
    tool_spec,
)

from clienttools_server.agent.runs import RunRequest
from clienttools_server.app import RunningServer, running_server
from clienttools_server.canonical import canonical_json
from clienttools_server.config import ServerConfig
from clienttools_server.ledger import SqliteLedger
from tests.support.wait import wait_until

ROOT = Path(__file__).resolve().parents[2]


def _resume(request_id: str, chat_id: str, last_sequence: int | None = None) -> dict[str, Any]:
    frame: dict[str, Any] = {
        "type": "resume", "requestId": request_id, "id": chat_id, "headers": {}, "body": {},
    }  # fmt: skip
    if last_sequence is not None:
        frame["lastSequence"] = last_sequence
    return frame


# -- S2: a call to a tool the session knows, with no live page, waits ----------------------


async def test_known_tool_without_a_live_page_waits_and_is_delivered_later(
    server: RunningServer, open_browser: Any
) -> None:
    first = await open_browser(server)
    await first.register([tool_spec("t", description="the t tool")])
    await first.close()
    # Only a chat connection is live; it registers no tools.
    chat = await open_browser(server)
    menu = await chat.chat("hello", chat_id="chat-menu")
    assert menu.text.startswith("I can call these tools: server_time, t.")
    request_id = await chat.start_chat('call t {"n": 1}', chat_id="chat-k")
    await wait_until(lambda: server.hub.stats()["pending_calls"] == 1, 5)
    ledger = server.app.state.ledger
    [execution] = [e for e in await ledger.executions() if e.status == "running"]
    step = (await ledger.steps(execution.id))[1]
    # Pending, resolution client, and never delivered: nothing went out yet.
    assert (step.name, step.resolution, step.state, step.attempts) == ("t", "client", "pending", 0)
    await chat.chunk(request_id, "tool-input-available")
    assert not [c for c in chat.chunks[request_id] if c["type"].startswith("tool-output")]
    # A page that registers the tool gets the call (first delivery: attempt 1).
    second = await open_browser(server)
    await second.register([tool_spec("t")])
    invoke = await second.expect("cf_agent_client_tool_invoke")
    assert (invoke["requestId"], invoke["attempt"]) == (step.request_id, 1)
    await second.send_result(invoke["requestId"], output="late but fine")
    assert (await second.ack_for(invoke["requestId"]))["outcome"] == "applied"
    assert (await chat.response(request_id)).text == 't -> "late but fine"'
    await settled(server.hub)


async def test_a_tool_the_session_never_registered_is_unknown(
    server: RunningServer, open_browser: Any
) -> None:
    other_session = await open_browser(server, "another-session")
    await other_session.register([tool_spec("t")])
    chat = await open_browser(server)
    response = await chat.chat("call t {}\ncall nope {}", chat_id="chat-u")
    assert response.text == (
        "t failed: unknown_tool: there is no tool named 't'\n"
        "nope failed: unknown_tool: there is no tool named 'nope'"
    )
    assert other_session.invokes == []
    await settled(server.hub)


async def test_remembered_spec_keeps_needs_approval(
    server: RunningServer, open_browser: Any
) -> None:
    page = await open_browser(server)
    await page.register([tool_spec("risky", needsApproval=True)])
    await page.close()
    remembered = server.hub.remembered_tool("s1", "risky")
    assert remembered is not None and remembered.needs_approval is True
    chat = await open_browser(server)
    request_id = await chat.start_chat("call risky {}", chat_id="chat-ap")
    # With no page live, the remembered spec decides: the call asks for approval first,
    # where a spec without needsApproval would wait for a page (pending_calls == 1).
    approval = await chat.chunk(request_id, "tool-approval-request")
    [given] = [c for c in chat.chunks[request_id] if c["type"] == "tool-input-available"]
    assert given["toolName"] == "risky" and approval["toolCallId"] == given["toolCallId"]
    assert server.hub.stats()["pending_calls"] == 0
    await chat.send({"type": "abort", "requestId": request_id})
    await chat.response(request_id)
    await settled(server.hub)


# -- S7: a page that was following a response still gets its end -------------------------


async def test_resume_with_last_sequence_gets_the_tail_of_a_response_that_ended(
    server: RunningServer, open_browser: Any
) -> None:
    tools = await open_browser(server)
    await tools.register([tool_spec("hold")])
    chat = await open_browser(server)
    request_id = await chat.start_chat("call hold {}", chat_id="chat-t")
    invoke = await tools.expect("cf_agent_client_tool_invoke")
    await chat.chunk(request_id, "tool-input-available")
    seen = len(chat.chunks[request_id])
    await chat.close()  # the chat's socket drops while the tool runs...
    await tools.send_result(invoke["requestId"], output="done")  # ...and the run ends meanwhile
    await settled(server.hub)
    back = await open_browser(server)
    await back.send(_resume("tail", "chat-t", last_sequence=seen - 1))
    await back.expect("start", requestId="tail")
    tail = await back.response("tail")
    assert tail.final["type"] == "end"
    assert tail.types[0] == "tool-output-available" and tail.types[-1] == "finish"
    assert tail.text == 'hold -> "done"'
    # Without lastSequence a resume asks what streams now: nothing does.
    await back.send(_resume("now", "chat-t"))
    await back.expect("no-active", requestId="now")
    # Only the session that ran it can reach it: another is refused (H5), told nothing.
    stranger = await open_browser(server, "s-other")
    await stranger.send(_resume("x", "chat-t", last_sequence=0))
    refused = await stranger.expect("cf_agent_protocol_error", requestId="x")
    assert "hold" not in str(refused)
    await stranger.nothing("start")
    await settled(server.hub)


async def test_no_grace_means_no_active(start_server: Any, open_browser: Any) -> None:
    server = await start_server(resume_grace=0.0)
    chat = await open_browser(server)
    await chat.chat("hello", chat_id="chat-g")
    await chat.send(_resume("late", "chat-g", last_sequence=0))
    await chat.expect("no-active", requestId="late")
    await settled(server.hub)


# -- S8: resolve applies only to pending client/approval entries --------------------------


def _config(db: Path, **overrides: Any) -> ServerConfig:
    options: dict[str, Any] = {"port": 0, "log_level": "warning", "db": str(db)}
    options.update(overrides)
    return ServerConfig(**options)


async def test_duplicate_resolve_keeps_the_first_value(
    tmp_path: Path, chunk_collector: ChunkCollector
) -> None:
    async with running_server(_config(tmp_path / "l.sqlite3")) as server:
        tab = await FakeBrowser.connect(server.ws_url("s1"), chunk_collector)
        await tab.register([tool_spec("t")])
        request_id = await tab.start_chat("call t {}")
        invoke = await tab.expect("cf_agent_client_tool_invoke")
        ledger = server.app.state.ledger
        step = await ledger.step_by_request_id(invoke["requestId"])
        first = await server.hub.resolve(step.execution_id, step.seq, {"v": 1})
        second = await server.hub.resolve(step.execution_id, step.seq, {"v": 2})
        again = await server.hub.reject(step.execution_id, step.seq, "tool_error", "too late")
        assert first.ok and first.reason == "applied"
        assert (second.ok, second.reason) == (False, "not_pending")
        assert (again.ok, again.reason) == (False, "not_pending")
        assert "already applied" in second.message
        assert (await ledger.get_step(step.execution_id, step.seq)).result() == {"v": 1}
        cancel = await tab.expect("cf_agent_client_tool_cancel", requestId=invoke["requestId"])
        assert cancel["reason"] == "superseded"
        assert (await tab.response(request_id)).text == 't -> {"v":1}'
        # The page's own result comes too late: the call was settled from outside.
        await tab.send_result(invoke["requestId"], output={"v": 3})
        assert (await tab.ack_for(invoke["requestId"]))["outcome"] == "stale"
        assert (await ledger.get_step(step.execution_id, step.seq)).result() == {"v": 1}
        await tab.close()
        await settled(server.hub)


async def test_stale_resolve_after_expiry_and_after_a_timeout(
    tmp_path: Path, chunk_collector: ChunkCollector
) -> None:
    config = _config(tmp_path / "l.sqlite3", ttl=0.3, expiry_interval=0.05)
    async with running_server(config) as server:
        ledger = server.app.state.ledger
        chat = await FakeBrowser.connect(server.ws_url("s1"), chunk_collector)
        tools = await FakeBrowser.connect(server.ws_url("s1"), chunk_collector)
        await tools.register([tool_spec("t"), tool_spec("slow", timeoutMs=100)])
        # A call that expired:
        expiring = await chat.start_chat("call t {}", chat_id="chat-x")
        invoke = await tools.expect("cf_agent_client_tool_invoke")
        step = await ledger.step_by_request_id(invoke["requestId"])
        await tools.close()
        response = await chat.response(expiring)
        assert response.of_type("error")[0]["errorText"] == (
            "this run waited longer than its time to live and expired"
        )
        stale = await server.hub.resolve(step.execution_id, step.seq, "too late")
        assert (stale.ok, stale.reason) == (False, "not_pending")
        assert "already expired" in stale.message
        assert (await ledger.get_step(step.execution_id, step.seq)).state == "expired"
        assert (await ledger.get_execution(step.execution_id)).status == "expired"
        # A call that timed out (the run went on without it):
        tools = await FakeBrowser.connect(server.ws_url("s1"), chunk_collector)
        await tools.register([tool_spec("slow", timeoutMs=100)])
        timing_out = await chat.start_chat("call slow {}", chat_id="chat-y")
        invoke = await tools.expect("cf_agent_client_tool_invoke")
        text = (await chat.response(timing_out)).text
        assert text.startswith("slow failed: timeout: ")
        step = await ledger.step_by_request_id(invoke["requestId"])
        stale = await server.hub.reject(step.execution_id, step.seq, "tool_error", "too late")
        assert (stale.ok, stale.reason) == (False, "not_pending")
        assert (await ledger.get_step(step.execution_id, step.seq)).error()["code"] == "timeout"
        await tools.send_result(invoke["requestId"], output=1)
        assert (await tools.ack_for(invoke["requestId"]))["outcome"] == "stale"
        await chat.close()
        await tools.close()
        await settled(server.hub)


async def test_resolve_refuses_steps_the_server_settles_itself(
    start_server: Any, open_browser: Any
) -> None:
    model = GatedModel()
    server = await start_server(model_object=model)
    tab = await open_browser(server)
    request_id = await tab.start_chat("hello")
    await asyncio.wait_for(model.entered.wait(), 5)
    [execution] = await server.app.state.ledger.executions()
    for outcome in (
        await server.hub.resolve(execution.id, 0, {"events": [{"text": "forged"}]}),
        await server.hub.reject(execution.id, 0, "tool_error", "forged"),
    ):
        assert (outcome.ok, outcome.reason) == (False, "invalid")
        assert "only client and approval steps can be resolved" in outcome.message
    model.release.set()
    assert (await tab.response(request_id)).text.startswith("I can call these tools")
    await settled(server.hub)


# -- S8: replay divergence ------------------------------------------------------------------


async def test_divergent_tool_name_stops_the_run_before_any_invoke(
    tmp_path: Path, chunk_collector: ChunkCollector
) -> None:
    db = tmp_path / "ledger.sqlite3"
    text = 'call t {"a": 1}'
    request = RunRequest("chat-div", [{"id": "u", "role": "user", "parts": [
        {"type": "text", "text": text},
    ]}])  # fmt: skip
    async with SqliteLedger(db) as ledger:
        run = await ledger.start_execution("s1", request.to_json(), now=time.time())
        step_input = first_step_input(text)
        await ledger.record_step(
            run.id, 0, "model", "scripted", step_input, "server", now=time.time()
        )
        call = {"toolCallId": "c1", "toolName": "t", "input": {"a": 1}}
        answer = canonical_json({"events": [{"toolCall": call}]})
        await ledger.resolve(run.id, 0, answer, time.time())
        # The record at seq 1 says another tool was called (same input).
        await ledger.record_step(
            run.id, 1, "tool", "u", '{"a": 1}', "client", time.time(), "r" * 32
        )
    async with running_server(_config(db)) as server:
        ledger = server.app.state.ledger
        page = await FakeBrowser.connect(server.ws_url("s1"), chunk_collector)
        await page.register([tool_spec("t"), tool_spec("u")])
        # The run may have failed already; lastSequence reaches it either way.
        await page.send(_resume("r", "chat-div", last_sequence=0))
        await page.expect("start", requestId="r")
        response = await page.response("r")
        [error] = response.of_type("error")
        assert error["errorText"] == (
            "the run diverged from its record at step 1 (recorded 'u', asked 't') and was stopped"
        )
        assert page.invokes == []
        execution = await ledger.get_execution(run.id)
        assert execution.status == "error" and "step 1" in (execution.error or "")
        # The record is not rewritten; its pending entry is closed, so a resolve is stale.
        recorded = await ledger.get_step(run.id, 1)
        assert (recorded.name, recorded.state) == ("u", "error")
        assert (await server.hub.resolve(run.id, 1, 1)).reason == "not_pending"
        await page.close()
        await settled(server.hub)


# -- docs/durability.md: its example runs as written ----------------------------------------


async def test_the_resolve_example_in_the_docs_runs(tmp_path: Path, monkeypatch: Any) -> None:
    doc = (ROOT / "docs" / "durability.md").read_text()
    [code] = re.findall(r"```python\n# example: resolve\n(.*?)```", doc, re.S)
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {"__name__": "durability_example"}
    exec(compile(code, "docs/durability.md", "exec"), namespace)
    output = await namespace["main"]()
    assert output == 'get_location -> {"lat":52.52,"lon":13.4}'
