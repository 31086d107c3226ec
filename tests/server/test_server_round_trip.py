"""`--client-tools round-trip` and the scripted model's latency flags, end to end.

Round trip is the AI SDK's client-tool pattern, kept for comparison: the
response ends at a page tool's call, and the page's continuation `send`
carries the output in its last assistant message.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

import pytest
from server_harness import FakeBrowser, Response, settled, tool_spec

from clienttools_server.__main__ import config_from_args
from clienttools_server.app import RunningServer
from clienttools_server.config import ServerConfig
from tests.support.clock import ManualClock


async def never(tool_input: dict[str, Any]) -> Any:
    raise AssertionError("round trip must not invoke a page tool over the socket")


def _assistant_with_outputs(
    response: Response, message_id: str, outputs: dict[str, Any]
) -> dict[str, Any]:
    """The assistant message the AI SDK's chat holds after addToolOutput, as it sends it."""
    parts: list[dict[str, Any]] = [{"type": "step-start"}]
    for call in response.of_type("tool-input-available"):
        parts.append(
            {
                "type": f"tool-{call['toolName']}",
                "toolCallId": call["toolCallId"],
                "state": "output-available",
                "input": call["input"],
                "output": outputs[call["toolCallId"]],
            }
        )
    return {"id": message_id, "role": "assistant", "parts": parts}


async def _send(tab: FakeBrowser, messages: list[dict[str, Any]]) -> Response:
    request_id = "req-" + secrets.token_hex(6)
    await tab.send(
        {
            "type": "send",
            "requestId": request_id,
            "id": "chat-rt",
            "trigger": "submit-message",
            "messageId": None,
            "messages": messages,
            "headers": {},
            "body": {},
        }
    )
    return await tab.response(request_id)


async def test_round_trip_ends_at_the_call_and_continues_with_the_output(
    start_server: Any, open_browser: Any
) -> None:
    server = await start_server(client_tools="round-trip")
    tab = await open_browser(server)
    await tab.register([tool_spec("add"), tool_spec("upper")], handlers={"add": never})
    user = {
        "id": "u1",
        "role": "user",
        "parts": [{"type": "text", "text": 'call add {"a": 2, "b": 3}\ncall upper {"s": "x"}'}],
    }
    first = await _send(tab, [user])
    assert first.final["type"] == "end"
    assert first.types == [
        "start", "start-step",
        "tool-input-start", "tool-input-available",
        "tool-input-start", "tool-input-available",
        "finish-step", "finish",
    ]  # fmt: skip
    assert first.chunks[-1] == {"type": "finish", "finishReason": "tool-calls"}
    assert tab.invokes == []
    await settled(server.hub)

    message_id = first.chunks[0]["messageId"]
    add, upper = first.of_type("tool-input-available")
    outputs = {add["toolCallId"]: 5, upper["toolCallId"]: "X"}
    assistant = _assistant_with_outputs(first, message_id, outputs)
    second = await _send(tab, [user, assistant])
    assert second.final["type"] == "end"
    # The continuation builds the same assistant message, as the AI SDK's servers do.
    assert second.chunks[0] == {"type": "start", "messageId": message_id}
    assert second.text == 'add -> 5\nupper -> "X"'
    assert second.chunks[-1] == {"type": "finish", "finishReason": "stop"}
    assert "tool-input-available" not in second.types
    assert tab.invokes == []
    await settled(server.hub)


async def test_round_trip_still_runs_server_tools_inline(
    start_server: Any, open_browser: Any
) -> None:
    server = await start_server(client_tools="round-trip")
    tab = await open_browser(server)
    await tab.register([tool_spec("add")], handlers={"add": never})
    user = {
        "id": "u1",
        "role": "user",
        "parts": [{"type": "text", "text": "call server_time {}\ncall add {}"}],
    }
    first = await _send(tab, [user])
    [output] = first.of_type("tool-output-available")
    server_call, page_call = first.of_type("tool-input-available")
    assert output["toolCallId"] == server_call["toolCallId"]
    assert page_call["toolName"] == "add"
    assert first.chunks[-1] == {"type": "finish", "finishReason": "tool-calls"}
    await settled(server.hub)


async def test_rpc_mode_keeps_one_response(server: RunningServer, tab: FakeBrowser) -> None:
    async def add(tool_input: dict[str, Any]) -> Any:
        return tool_input["a"] + tool_input["b"]

    await tab.register([tool_spec("add")], handlers={"add": add})
    response = await tab.chat('call add {"a": 2, "b": 3}')
    assert response.text == "add -> 5"
    assert response.chunks[-1] == {"type": "finish", "finishReason": "stop"}
    assert len(tab.invokes) == 1
    await settled(server.hub)


async def test_scripted_latency_delays_first_chunk_and_spaces_the_rest(
    start_server: Any, open_browser: Any
) -> None:
    server = await start_server(first_chunk_delay=0.3, chunk_delay=0.05)
    tab = await open_browser(server)
    started = time.monotonic()
    request_id = await tab.start_chat("hello")
    await tab.chunk(request_id, "text-delta", timeout=5.0)
    first_at = time.monotonic() - started
    response = await tab.response(request_id, timeout=10.0)
    total = time.monotonic() - started
    deltas = len(response.of_type("text-delta"))
    assert first_at >= 0.3
    assert total >= 0.3 + 0.05 * (deltas - 1)
    await settled(server.hub)


def test_cli_flags_reach_the_config() -> None:
    config = config_from_args(
        ["--client-tools", "round-trip", "--first-chunk-delay", "0.5", "--chunk-delay", "0.02",
         "--agent", "examples.agent:agent", "--model", "test"]
    )  # fmt: skip
    assert (config.client_tools, config.first_chunk_delay, config.chunk_delay) == (
        "round-trip", 0.5, 0.02,
    )  # fmt: skip
    assert (config.agent, config.model) == ("examples.agent:agent", "test")
    defaults = config_from_args([])
    assert (defaults.client_tools, defaults.first_chunk_delay, defaults.chunk_delay) == (
        "rpc", 0.0, 0.0,
    )  # fmt: skip
    with pytest.raises(SystemExit):
        config_from_args(["--client-tools", "later"])
    with pytest.raises(SystemExit):
        config_from_args(["--chunk-delay", "-1"])
    with pytest.raises(ValueError):
        ServerConfig(client_tools="later")  # type: ignore[arg-type]


async def test_nothing_pending_after_a_round_trip(start_server: Any, open_browser: Any) -> None:
    """The call handed to the page leaves no pending call, timer or run behind."""
    clock = ManualClock()
    server = await start_server(client_tools="round-trip", tool_timeout=0.2, clock=clock)
    tab = await open_browser(server)
    await tab.register([tool_spec("add")], handlers={"add": never})
    response = await tab.chat("call add {}")
    assert response.chunks[-1]["finishReason"] == "tool-calls"
    clock.advance(ServerConfig().max_tool_timeout + 1)  # past every timeout a call can have
    # A response sent after the timers fired: a cancel they sent would arrive before it.
    await tab.chat("hello", chat_id="after")
    assert "cf_agent_client_tool_cancel" not in [f["type"] for f in tab.inbox]
    await settled(server.hub)
