"""Chat frames (start/chunk/end, resume, abort) and the scripted model, end to end."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from server_harness import FakeBrowser, settled, tool_spec

from clienttools_server.app import RunningServer
from tests.support.wait import wait_until


async def echo(tool_input: dict[str, Any]) -> Any:
    return tool_input


async def test_plain_text_lists_tools(server: RunningServer, tab: FakeBrowser) -> None:
    response = await tab.chat("hello")
    assert response.final["type"] == "end"
    assert response.text == (
        "I can call these tools: server_time. Write `call NAME {json}` on a line to call one."
    )
    assert response.types[:3] == ["start", "start-step", "text-start"]
    assert response.types[-3:] == ["text-end", "finish-step", "finish"]
    deltas = response.of_type("text-delta")
    assert len(deltas) > 5 and all(d["delta"].strip() for d in deltas)
    await settled(server.hub)


async def test_browser_tool_in_one_response(server: RunningServer, tab: FakeBrowser) -> None:
    ack = await tab.register([tool_spec("echo")], handlers={"echo": echo})
    assert ack["accepted"] == ["echo"] and ack["rejected"] == []
    response = await tab.chat('call echo {"x": [1, "é"]}')
    assert response.final["type"] == "end"
    assert response.text == 'echo -> {"x":[1,"é"]}'
    kinds = response.types
    assert kinds.index("tool-input-available") < kinds.index("tool-output-available")
    assert kinds.index("tool-output-available") < kinds.index("text-delta")
    assert kinds.count("start-step") == 2 and kinds[-1] == "finish"
    [invoke] = tab.invokes
    assert invoke["attempt"] == 1 and invoke["input"] == {"x": [1, "é"]}
    assert len(invoke["requestId"]) >= 32
    assert tab.acks[invoke["requestId"]] == ["applied"]
    await settled(server.hub)


async def test_parallel_browser_calls_in_one_step(server: RunningServer, tab: FakeBrowser) -> None:
    release = asyncio.Event()
    started: list[str] = []

    def gated(name: str) -> Any:
        async def run(tool_input: dict[str, Any]) -> Any:
            started.append(name)
            await release.wait()
            return {"tool": name, **tool_input}

        return run

    await tab.register(
        [tool_spec("a"), tool_spec("b")], handlers={"a": gated("a"), "b": gated("b")}
    )
    request_id = await tab.start_chat('call a {"n": 1}\ncall b {"n": 2}')
    await wait_until(lambda: len(started) == 2, 3, "both calls to start")
    # Both calls are out before either has a result: they run concurrently.
    assert sorted(started) == ["a", "b"]
    release.set()
    response = await tab.response(request_id)
    assert response.text == 'a -> {"n":1,"tool":"a"}\nb -> {"n":2,"tool":"b"}'
    assert response.types.count("start-step") == 2  # one step for both calls, one for the answer
    await settled(server.hub)


async def test_server_and_browser_tools_mix(server: RunningServer, tab: FakeBrowser) -> None:
    await tab.register([tool_spec("echo")], handlers={"echo": echo})
    response = await tab.chat('call server_time {}\ncall echo {"y": true}\ncall nope {}')
    first, second, third = response.text.split("\n")
    assert first.startswith("server_time -> ") and json.loads(first.split(" -> ")[1])["unix"] > 0
    assert second == 'echo -> {"y":true}'
    assert third == "nope failed: unknown_tool: there is no tool named 'nope'"
    assert len(tab.invokes) == 1
    errors = response.of_type("tool-output-error")
    assert [e["errorText"] for e in errors] == ["unknown_tool: there is no tool named 'nope'"]
    await settled(server.hub)


async def test_browser_tool_error_reaches_the_model(
    server: RunningServer, tab: FakeBrowser
) -> None:
    from server_harness import ToolFailed

    async def boom(tool_input: dict[str, Any]) -> Any:
        raise ToolFailed("tool_error", "kaboom")

    await tab.register([tool_spec("boom")], handlers={"boom": boom})
    response = await tab.chat("call boom")
    assert response.text == "boom failed: tool_error: kaboom"
    await settled(server.hub)


async def test_follow_up_turn_uses_history(server: RunningServer, tab: FakeBrowser) -> None:
    # The transport sends the whole history; only the last user message drives the model.
    request_id = "req-history"
    await tab.send(
        {
            "type": "send",
            "requestId": request_id,
            "id": "chat-h",
            "trigger": "submit-message",
            "messages": [
                {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "call x {}"}]},
                {
                    "id": "a1",
                    "role": "assistant",
                    "parts": [
                        {
                            "type": "tool-x",
                            "toolCallId": "c1",
                            "state": "output-available",
                            "input": {},
                            "output": 1,
                        },
                        {"type": "text", "text": "x -> 1"},
                    ],
                },
                {"id": "u2", "role": "user", "parts": [{"type": "text", "text": "thanks"}]},
            ],
            "headers": {},
            "body": {},
            "metadata": None,
        }
    )
    response = await tab.response(request_id)
    assert response.text.startswith("I can call these tools: server_time.")
    await settled(server.hub)


async def test_resume_replays_then_follows_live(
    server: RunningServer, tab: FakeBrowser, open_browser: Any
) -> None:
    await tab.register([tool_spec("hold")])
    request_id = await tab.start_chat("call hold {}", chat_id="chat-r")
    invoke = await tab.expect("cf_agent_client_tool_invoke")
    other = await open_browser(server)
    # A second page of the session resumes: everything from sequence 0, then live.
    await other.send(
        {"type": "resume", "requestId": "res-1", "id": "chat-r", "headers": {}, "body": {}}
    )
    await other.expect("start", requestId="res-1")
    # ...and one that has seen the first 3 chunks gets the rest only.
    await other.send(
        {
            "type": "resume",
            "requestId": "res-2",
            "id": "chat-r",
            "lastSequence": 2,
            "headers": {},
            "body": {},
        }
    )
    await other.expect("start", requestId="res-2")
    await tab.send_result(invoke["requestId"], output="done")
    original = await tab.response(request_id)
    full = await other.response("res-1")
    tail = await other.response("res-2")
    assert full.chunks == original.chunks
    assert tail.chunks == original.chunks[3:]
    assert original.text == 'hold -> "done"'
    # Nothing streams any more.
    await other.send(
        {"type": "resume", "requestId": "res-3", "id": "chat-r", "headers": {}, "body": {}}
    )
    await other.expect("no-active", requestId="res-3")
    await settled(server.hub)


async def test_abort_cancels_browser_calls(server: RunningServer, tab: FakeBrowser) -> None:
    await tab.register([tool_spec("hold")])
    request_id = await tab.start_chat("call hold {}", chat_id="chat-a")
    invoke = await tab.expect("cf_agent_client_tool_invoke")
    await tab.send({"type": "abort", "requestId": request_id})
    cancel = await tab.expect("cf_agent_client_tool_cancel", requestId=invoke["requestId"])
    assert cancel["reason"] == "aborted"
    response = await tab.response(request_id)
    assert response.final["type"] == "end" and response.types[-1] == "abort"
    await tab.send_result(invoke["requestId"], output=1)
    assert (await tab.ack_for(invoke["requestId"]))["outcome"] == "stale"
    await settled(server.hub)
    [execution] = await server.app.state.ledger.executions()
    assert execution.status == "error" and execution.error == "aborted"


async def test_second_send_while_streaming_is_refused(
    server: RunningServer, tab: FakeBrowser
) -> None:
    await tab.register([tool_spec("hold")])
    first = await tab.start_chat("call hold {}", chat_id="chat-b")
    invoke = await tab.expect("cf_agent_client_tool_invoke")
    await tab.send(
        {
            "type": "send", "requestId": "second", "id": "chat-b", "trigger": "submit-message",
            "messages": [], "headers": {}, "body": {},
        }
    )  # fmt: skip
    error = await tab.expect("error", requestId="second")
    assert "already streaming" in error["errorText"]
    await tab.send_result(invoke["requestId"], output=None)
    assert (await tab.response(first)).text == "hold -> null"
    await settled(server.hub)


async def test_chat_page_may_leave_while_the_run_goes_on(
    server: RunningServer, open_browser: Any
) -> None:
    tools = await open_browser(server)
    await tools.register([tool_spec("hold")])
    chat = await open_browser(server)
    await chat.start_chat("call hold {}", chat_id="chat-l")
    invoke = await tools.expect("cf_agent_client_tool_invoke")
    await chat.close()
    await tools.send_result(invoke["requestId"], output=[1])
    back = await open_browser(server)
    await back.send(
        {"type": "resume", "requestId": "again", "id": "chat-l", "headers": {}, "body": {}}
    )
    started = await asyncio.wait_for(_first_of(back, "start", "no-active", request_id="again"), 5)
    if started == "start":
        response = await back.response("again")
        assert response.text == "hold -> [1]"
    await settled(server.hub)
    [execution] = await server.app.state.ledger.executions()
    assert execution.status == "completed"


async def _first_of(tab: FakeBrowser, *kinds: str, request_id: str) -> str:
    while True:
        for frame in tab.inbox:
            if frame["type"] in kinds and frame.get("requestId") == request_id:
                return str(frame["type"])
        await asyncio.sleep(0.01)
