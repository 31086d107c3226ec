"""The part of webmcp.py without I/O: descriptors, the registration plan, results, the runners.

The runners are the code a call from the browser's agent goes through; here they run
on CPython against the same tools as a server's call would (tests/browser/test_webmcp.py
runs them in Chromium, through the polyfill).
"""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import pytest

from clienttools import ToolClient, ToolContext, ToolError, mpy
from clienttools.rules import MAX_RESULT_BYTES
from clienttools.session import Session
from clienttools.tools import ToolRegistry
from clienttools.webmcp import (
    ModelContextMirror,
    WebMCPUnavailable,
    error_result,
    main_thread_document,
    model_context_tool,
    output_result,
    plan,
    result_of,
    tool_runner,
)


def test_the_descriptor_comes_from_the_wire_spec() -> None:
    registry = ToolRegistry()

    @registry.tool(read_only=True)
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @registry.tool
    def bare() -> None:
        pass

    tool = registry.get("add")
    assert tool is not None and tool.read_only is True
    assert "readOnly" not in json.dumps(tool.wire_spec)  # not a wire field
    descriptor = model_context_tool(tool.wire_spec, tool.read_only)
    assert descriptor == {
        "name": "add",
        "description": "Add two integers.",
        "inputSchema": tool.wire_spec["inputSchema"],
        "annotations": {"readOnlyHint": True},
    }
    assert "outputSchema" not in descriptor
    bare_tool = registry.get("bare")
    assert bare_tool is not None
    assert model_context_tool(bare_tool.wire_spec, False)["description"] == "bare"


def test_plan_aborts_what_went_or_changed_and_registers_what_is_new_or_changed() -> None:
    assert plan({}, [("a", "1")]) == ([], ["a"])
    assert plan({"a": "1"}, [("a", "1")]) == ([], [])
    assert plan({"a": "1"}, []) == (["a"], [])
    assert plan({"a": "1", "b": "1"}, [("a", "2"), ("b", "1"), ("c", "1")]) == (["a"], ["a", "c"])


@pytest.mark.parametrize(
    ("output", "text", "structured"),
    [
        ("5", "5", None),
        ('"hi"', "hi", None),
        ("null", "null", None),
        ("[1,2]", "[1,2]", None),
        ('{"a":[1]}', '{"a":[1]}', {"a": [1]}),
        ('"\\u00e9\\n"', "\u00e9\n", None),
    ],
)
def test_an_output_is_a_call_tool_result(output: str, text: str, structured: Any) -> None:
    result = json.loads(output_result(output))
    assert result["content"] == [{"type": "text", "text": text}]
    assert result["isError"] is False
    assert result.get("structuredContent") == structured


def test_an_error_is_a_readable_call_tool_result() -> None:
    result = json.loads(error_result("invalid_input", "bad", [{"loc": ["a"]}]))
    error = {"code": "invalid_input", "message": "bad", "data": [{"loc": ["a"]}]}
    assert result == {
        "content": [{"type": "text", "text": json.dumps(error, separators=(",", ":"))}],
        "structuredContent": {"error": error},
        "isError": True,
    }
    huge = json.loads(error_result("tool_error", "x" * 10_000, {"blob": "y" * MAX_RESULT_BYTES}))
    assert huge["structuredContent"]["error"]["message"].endswith("... (error data too large)")
    assert "data" not in huge["structuredContent"]["error"]
    assert json.loads(result_of((None, ("timeout", "late", None))))["isError"] is True
    assert json.loads(result_of(("3", None)))["content"][0]["text"] == "3"


def _registry() -> ToolRegistry:
    registry = ToolRegistry()

    @registry.tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @registry.tool
    def refuse(message: str) -> int:
        """Raise."""
        raise ToolError(message, data={"retry": False})

    @registry.tool
    def big(size: int) -> str:
        """Big."""
        return "x" * size

    @registry.tool
    async def context(steps: int, ctx: ToolContext) -> dict[str, Any]:
        """Report progress."""
        for step in range(1, steps + 1):
            await ctx.progress(step)
        with pytest.raises(ValueError, match="strictly greater"):
            await ctx.progress(1)
        return {"id": ctx.request_id, "attempt": ctx.attempt, "last": ctx.last_progress}

    @registry.tool(timeout=0.05)
    async def slow() -> None:
        """Never ends."""
        await asyncio.sleep(10)

    return registry


def _run(run: Any, name: str, arguments: Any) -> tuple[Any, Any]:
    outcome = run(name, arguments, "webmcp-1")
    if not isinstance(outcome, tuple):
        outcome = asyncio.run(outcome)
    return outcome  # type: ignore[no-any-return]


def test_the_pyodide_runner_goes_through_the_servers_validation_and_errors() -> None:
    registry = _registry()
    run = tool_runner(registry, 100)
    assert _run(run, "add", {"a": 1, "b": 2}) == ("3", None)
    assert _run(run, "add", {"a": "1", "b": 2}) == ("3", None)  # lax, as for the server
    output, error = _run(run, "add", {"a": "one", "b": 2})
    assert output is None and error[0] == "invalid_input"
    assert [e["loc"] for e in error[2]] == [["a"]]
    assert _run(run, "add", [1, 2])[1][0] == "invalid_input"
    assert _run(run, "refuse", {"message": "no"}) == (None, ("tool_error", "no", {"retry": False}))
    assert _run(run, "nope", {})[1][0] == "unknown_tool"
    too_large = _run(run, "big", {"size": 200})[1]
    assert too_large[0] == "output_too_large" and too_large[2] == {"size": 202}
    output, _ = _run(run, "context", {"steps": 3})
    assert json.loads(output) == {"id": "webmcp-1", "attempt": 1, "last": 3}
    assert _run(run, "slow", {})[1][0] == "timeout"


def test_the_pyodide_runner_says_what_the_session_says() -> None:
    """The same outcome as a result frame, for each way a call ends."""
    registry = _registry()
    run = tool_runner(registry, 100)
    session = Session(registry, client_id="page", max_result_bytes=100)
    session.connection_opened(0.0)
    session.frames_to_send()
    cases = [("add", {"a": "one", "b": 2}), ("refuse", {"message": "no"}), ("big", {"size": 200})]
    for index, (name, arguments) in enumerate(cases):
        frame = {
            "type": "cf_agent_client_tool_invoke",
            "requestId": f"r{index}",
            "toolCallId": "c",
            "toolName": name,
            "input": arguments,
        }
        session.receive_frame(json.dumps(frame), 0.0)
        for event in session.events():
            try:
                session.tool_returned(event.request_id, event.tool.call(event.arguments, None))
            except ToolError as exc:
                session.tool_raised(event.request_id, exc)
        [sent] = session.frames_to_send()
        wire = json.loads(sent)["error"]
        code, message, data = _run(run, name, arguments)[1]
        assert {"code": code, "message": message, **({"data": data} if data else {})} == wire


def test_the_micropython_runner_uses_the_declared_schemas() -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    }

    def add(a: int, b: int) -> int:
        return a + b

    def refuse() -> None:
        raise ToolError("no", data={"retry": False})

    async def slow() -> None:
        await asyncio.sleep(10)

    tools = {
        "add": mpy.Tool(add, description="Add.", schema=schema, read_only=True),
        "refuse": mpy.Tool(refuse),
        "slow": mpy.Tool(slow, timeout=0.05),
    }
    run = tool_runner(tools, 100)
    assert _run(run, "add", {"a": 1, "b": 2}) == ("3", None)
    assert _run(run, "add", {"a": "1", "b": 2})[1][0] == "invalid_input"  # strict here
    assert _run(run, "add", [1, 2])[1][0] == "invalid_input"
    assert _run(run, "refuse", {}) == (None, ("tool_error", "no", {"retry": False}))
    assert _run(run, "slow", {})[1][0] == "timeout"
    assert model_context_tool(tools["add"].spec(), tools["add"].read_only)["annotations"] == {
        "readOnlyHint": True
    }


def test_no_page_main_thread_no_mirror() -> None:
    worker_globals = SimpleNamespace(console=None)  # a worker's globalThis has no document
    with pytest.raises(WebMCPUnavailable, match="not in a worker"):
        main_thread_document(worker_globals)
    with pytest.raises(WebMCPUnavailable, match="not in a worker"):
        ModelContextMirror(list, tool_runner(ToolRegistry(), 100), js=worker_globals)
    with pytest.raises(WebMCPUnavailable, match="needs a browser page"):
        ToolClient("ws://127.0.0.1:1/agents/chat/x", webmcp=True)  # CPython: no js at all


def test_a_client_without_a_url_must_say_webmcp() -> None:
    with pytest.raises(ValueError, match="needs the server's url"):
        ToolClient()
