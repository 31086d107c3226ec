"""The protocol core over MicroPython's tools (mpy.Tool) against it over the Pyodide ones.

Both flavours' Sessions are the core (core.py); their tools differ (declared JSON
schemas against pydantic models from annotations). Both get the same frames, the same
clock and the same run outcomes; what they send must be the same JSON. The last test
runs the shared modules and mpy.py on real MicroPython 1.27 (the npm interpreter
under Node.js); tests/unit/test_core.py runs the core's own cases on both interpreters.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from clienttools import mpy
from clienttools.session import CancelTool, RunTool, Session
from clienttools.tools import ToolContext, ToolError, ToolRegistry
from tests.support.frames import MALFORMED_FRAMES

ROOT = Path(__file__).resolve().parents[2]
ADD_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
}


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def slow(seconds: float, ctx: ToolContext) -> str:
    """Pretend to work."""
    return "done"


def fail(message: str) -> int:
    """Raise."""
    raise ToolError(message, data={"retry": False})


class Pair:
    """One core of each flavour, fed alike; `run` carries out both sides' run events."""

    def __init__(self) -> None:
        registry = ToolRegistry()
        registry.add(add)
        registry.add(slow, timeout=1.0)
        registry.add(fail)
        self.pyodide = Session(registry, client_id="page")
        seconds = {"type": "object", "properties": {"seconds": {"type": "number"}}}
        message = {"type": "object", "properties": {"message": {"type": "string"}}}
        tools = mpy.ToolTable()
        tools.add(mpy.Tool(add, description="Add two integers.", schema=ADD_SCHEMA))
        tools.add(mpy.Tool(slow, schema=seconds, timeout=1.0, context=True))
        tools.add(mpy.Tool(fail, schema=message))
        self.micropython = mpy.Session(tools, client_id="page")
        self.now = 0.0

    def open(self) -> tuple[list[Any], list[Any]]:
        self.pyodide.connection_opened(self.now)
        self.micropython.connection_opened(self.now)
        return self.sent()

    def feed(self, frame: object) -> tuple[list[Any], list[Any]]:
        text = frame if isinstance(frame, str | bytes) else json.dumps(frame)
        self.pyodide.receive_frame(text, self.now)
        self.micropython.receive_frame(text, self.now)
        return self.sent()

    def tick(self, now: float) -> tuple[list[Any], list[Any]]:
        self.now = now
        self.pyodide.tick(now)
        self.micropython.tick(now)
        return self.sent()

    def run_sync(self) -> None:
        """Carry out the run events of both: call the tool, report how it ended."""
        for event in self.pyodide.events():
            if isinstance(event, RunTool):
                try:
                    value = event.tool.call(event.arguments, event.context(None))
                except Exception as exc:
                    self.pyodide.tool_raised(event.request_id, exc)
                else:
                    self.pyodide.tool_returned(event.request_id, value)
        for event in self.micropython.events():
            if isinstance(event, RunTool):
                request_id, tool, arguments = event.request_id, event.tool, event.arguments
                try:
                    value = tool.call(arguments, None)
                except Exception as exc:
                    self.micropython.tool_raised(request_id, exc)
                else:
                    self.micropython.tool_returned(request_id, value)

    def sent(self) -> tuple[list[Any], list[Any]]:
        return (
            [json.loads(t) for t in self.pyodide.frames_to_send()],
            [json.loads(t) for t in self.micropython.frames_to_send()],
        )


def invoke(request_id: str, tool: str, arguments: dict[str, Any], **extra: Any) -> dict[str, Any]:
    frame = {
        "type": "cf_agent_client_tool_invoke",
        "requestId": request_id,
        "toolCallId": f"call-{request_id}",
        "toolName": tool,
        "input": arguments,
    }
    return {**frame, **extra}


def test_the_tools_frame_comes_first_and_says_the_same() -> None:
    pair = Pair()
    pyodide, micropython = pair.open()
    assert len(pyodide) == len(micropython) == 1
    assert micropython[0]["type"] == "cf_agent_client_tools"
    assert micropython[0]["protocol"] == 1 and micropython[0]["clientId"] == "page"
    ours = {tool["name"]: tool for tool in micropython[0]["tools"]}
    theirs = {tool["name"]: tool for tool in pyodide[0]["tools"]}
    assert ours["add"]["inputSchema"]["required"] == theirs["add"]["inputSchema"]["required"]
    assert ours["add"]["description"] == theirs["add"]["description"]
    assert ours["slow"]["timeoutMs"] == theirs["slow"]["timeoutMs"] == 1000


@pytest.mark.parametrize(
    "arguments",
    [{"a": 1, "b": 2}, {"a": 1}, {"a": [], "b": 2}, {"a": 1, "b": 2, "c": 3}, {}],
)
def test_results_and_invalid_input_match(arguments: dict[str, Any]) -> None:
    pair = Pair()
    pair.open()
    pyodide, micropython = pair.feed(invoke("r1", "add", arguments))  # invalid: answered at once
    pair.run_sync()
    more = pair.sent()
    assert pyodide + more[0] == micropython + more[1]
    assert len(pyodide + more[0]) == 1


def test_unknown_tool_errors_and_exactly_once_match() -> None:
    pair = Pair()
    pair.open()
    pyodide, micropython = pair.feed(invoke("r1", "nope", {}))
    assert pyodide == micropython and micropython[0]["error"]["code"] == "unknown_tool"
    pair.feed(invoke("r2", "fail", {"message": "no"}))
    pair.run_sync()
    pyodide, micropython = pair.sent()
    assert pyodide == micropython
    assert micropython[0]["error"] == {
        "code": "tool_error",
        "message": "no",
        "data": {"retry": False},
    }
    # C7: the same request again gets the stored result; the tool does not run.
    pyodide, micropython = pair.feed(invoke("r2", "fail", {"message": "no"}, attempt=2))
    assert pair.pyodide.events() == [] and pair.micropython.events() == []
    assert pyodide == micropython and len(micropython) == 1


def test_cancel_timeout_and_late_outcomes_match() -> None:
    pair = Pair()
    pair.open()
    pair.feed(invoke("r1", "slow", {"seconds": 5}))
    pair.feed(invoke("r2", "slow", {"seconds": 5}, timeoutMs=200))
    assert [type(e).__name__ for e in pair.pyodide.events()] == ["RunTool", "RunTool"]
    assert [type(e).__name__ for e in pair.micropython.events()] == ["RunTool", "RunTool"]
    cancel = {"type": "cf_agent_client_tool_cancel", "requestId": "r1", "reason": "aborted"}
    assert pair.feed(cancel) == ([], [])
    assert pair.pyodide.events() == [CancelTool("r1", "aborted")]
    assert pair.micropython.events() == [CancelTool("r1", "aborted")]
    pyodide, micropython = pair.tick(0.25)
    assert pyodide == micropython and micropython[0]["error"]["code"] == "timeout"
    assert pair.pyodide.events() == [CancelTool("r2", "timeout")]
    assert pair.micropython.events() == [CancelTool("r2", "timeout")]
    for request_id in ("r1", "r2"):  # the runs end late: no second result
        pair.pyodide.tool_cancelled(request_id)
        pair.micropython.tool_cancelled(request_id)
    assert pair.sent() == ([], [])


def test_malformed_frames_are_survived_alike() -> None:
    pair = Pair()
    pair.open()
    junk = [*MALFORMED_FRAMES, "x" * 1_100_000]
    for frame in junk:
        assert pair.feed(frame) == ([], []), frame
    pyodide, micropython = pair.feed(
        {"type": "cf_agent_client_tool_invoke", "requestId": "bad-1", "toolName": 3}
    )
    assert [f["error"]["code"] for f in pyodide] == ["invalid_request"]
    assert [f["error"]["code"] for f in micropython] == ["invalid_request"]
    assert pair.feed({"type": "cf_agent_ping", "t": 5}) == (
        [{"type": "cf_agent_pong", "t": 5.0}],
        [{"type": "cf_agent_pong", "t": 5.0}],
    )


def test_outbox_liveness_and_reconnect_match() -> None:
    pair = Pair()
    pair.open()
    pair.feed(invoke("r1", "add", {"a": 2, "b": 3}))
    pair.run_sync()
    pair.sent()
    assert pair.micropython.next_deadline() == pair.pyodide.next_deadline() == 37.5
    pair.tick(40.0)
    assert [type(e).__name__ for e in pair.pyodide.events()] == ["ReplaceConnection"]
    assert [type(e).__name__ for e in pair.micropython.events()] == ["ReplaceConnection"]
    pair.pyodide.connection_lost(40.0)
    pair.micropython.connection_lost(40.0)
    pyodide, micropython = pair.open()  # C11: the tools frame, then the unacknowledged result
    assert [f["type"] for f in micropython] == [f["type"] for f in pyodide]
    assert micropython[1] == pyodide[1]
    # The outbox texts are interchangeable: one flavour can restore the other's.
    restored = mpy.Session(mpy.ToolTable(), client_id="x")
    assert restored.restore_outbox(pair.pyodide.export_outbox()) == 1
    ack = {"type": "cf_agent_client_tool_result_ack", "requestId": "r1", "outcome": "applied"}
    pair.feed(ack)
    assert pair.micropython.outbox() == {} and pair.pyodide.outbox() == {}


@pytest.mark.node
@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_the_shared_modules_and_the_core_run_on_micropython(tmp_path: Path) -> None:
    interpreter = ROOT / "node_modules/@micropython/micropython-webassembly-pyscript"
    if not (interpreter / "micropython.mjs").is_file():
        pytest.skip("node_modules is missing: run `make bootstrap`")
    script = ROOT / "tests" / "node" / "micropython_core.mjs"
    done = subprocess.run(
        ["node", str(script)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.strip().endswith("micropython core: ok"), done.stdout[-3000:]
