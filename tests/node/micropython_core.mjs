// Runs the MicroPython flavour's pure modules (the shared ones, the core, mpy.py's tools)
// on real MicroPython 1.27 (the npm interpreter PyScript uses), so "imports no pydantic,
// runs on MicroPython too" is checked, not assumed. Used by tests/unit/test_mpy_session.py
// (the core's own cases run through tests/node/core_cases.mjs); prints
// "micropython core: ok" when every assert held.
import fs from "node:fs";
import { loadMicroPython } from "../../node_modules/@micropython/micropython-webassembly-pyscript/micropython.mjs";

const client = new URL("../../client/clienttools/", import.meta.url);
const mp = await loadMicroPython({
  heapsize: 8 * 1024 * 1024,
  stdout: (line) => process.stdout.write(line + "\n"),
  stderr: (line) => process.stderr.write(line + "\n"),
});
mp.FS.mkdirTree("/lib/clienttools");
for (const name of ["rules.py", "context.py", "errors.py", "input_schema.py", "portable.py", "jspump.py", "events.py", "outcomes.py", "recent.py", "core.py", "supervisor.py", "outbox.py", "webmcp.py", "worker.py", "mpy_tools.py", "mpy.py"]) {
  mp.FS.writeFile("/lib/clienttools/" + name, fs.readFileSync(new URL(name, client), "utf8"));
}

const script = String.raw`
import json
from clienttools import rules
from clienttools.context import ToolError, json_problem
from clienttools.input_schema import input_errors
from clienttools.core import CancelTool
from clienttools.mpy import Session, Tool, ToolTable

assert rules.next_call_state(rules.CallState.RUNNING, rules.CallEvent.CANCEL) == rules.CallState.CANCELLED
try:
    rules.next_call_state(rules.CallState.COMPLETED, rules.CallEvent.CANCEL)
    raise AssertionError("a final state took an event")
except rules.LocalProtocolError:
    pass
delays = rules.backoff()
assert all(0 <= next(delays) < 30 for _ in range(50))
assert rules.is_tool_name("read_text") and not rules.is_tool_name("9x")
assert json_problem({"a": [1, None]}) is None and json_problem(float("nan")) is not None
try:
    ToolError("x", data={"k": object()})
    raise AssertionError("ToolError took data that is not JSON")
except TypeError:
    pass

schema = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 1}},
          "required": ["a"], "additionalProperties": False}
assert input_errors(schema, {"a": 1}) == []
kinds = [e["type"] for e in input_errors(schema, {"a": True, "z": 1})]
assert kinds == ["int_type", "extra_forbidden"], kinds
assert [e["type"] for e in input_errors(schema, {"a": 0})] == ["greater_than_equal"]
assert [e["type"] for e in input_errors(schema, {})] == ["missing"]

def add(a, b):
    return a + b

tools = ToolTable()
tools.add(Tool(add, description="Add.", schema={"type": "object", "properties": {
    "a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}))
session = Session(tools, client_id="page")
session.connection_opened(0.0)
first = json.loads(session.frames_to_send()[0])
assert first["type"] == "cf_agent_client_tools" and first["tools"][0]["name"] == "add"

def invoke(request_id, arguments, **extra):
    frame = {"type": "cf_agent_client_tool_invoke", "requestId": request_id,
             "toolCallId": "c", "toolName": "add", "input": arguments}
    frame.update(extra)
    session.receive_frame(json.dumps(frame), 0.1)

invoke("r1", {"a": 1, "b": 2})
[run] = session.events()
session.tool_returned("r1", run.tool.call(run.arguments, None))
assert session.frames_to_send() == ['{"type":"cf_agent_client_tool_result","requestId":"r1","output":3}']
invoke("r1", {"a": 1, "b": 2}, attempt=2)
assert session.events() == [] and len(session.frames_to_send()) == 1
invoke("r2", {"a": "one"})
error = json.loads(session.frames_to_send()[0])["error"]
assert error["code"] == "invalid_input" and [e["loc"] for e in error["data"]] == [["a"], ["b"]]
invoke("r3", {"a": 1, "b": 2}, timeoutMs=100)
session.events()
session.tick(0.3)
assert session.events() == [CancelTool("r3", "timeout")]
assert json.loads(session.frames_to_send()[0])["error"]["code"] == "timeout"
session.tool_cancelled("r3")
assert session.frames_to_send() == []
invoke("r4", {"a": 1, "b": 2})
session.events()
session.tool_returned("r4", float("nan"))
assert json.loads(session.frames_to_send()[0])["error"]["code"] == "invalid_output"
for junk in ["not json", "[]", "{}", '{"type": 5}', '{"type": "cf_agent_nonsense"}',
             '{"type": "cf_agent_client_tool_cancel", "requestId": 7}', '{"type": "cf_agent_ping"}',
             b"binary", "x" * 1100000]:
    session.receive_frame(junk, 0.4)
assert session.frames_to_send() == [] and session.events() == []
restored = Session(tools, client_id="again")
assert restored.restore_outbox(session.export_outbox()) == len(session.outbox()) == 4

# webmcp.py: its part without I/O, the MicroPython runner, and no page here (as in a worker).
import asyncio
import js
from clienttools import webmcp
assert webmcp.plan({"a": "1", "b": "1"}, [("b", "2"), ("c", "1")]) == (["a", "b"], ["b", "c"])
assert json.loads(webmcp.output_result('{"a":1}'))["structuredContent"] == {"a": 1}
assert json.loads(webmcp.output_result('"hi"'))["content"][0]["text"] == "hi"
failed = json.loads(webmcp.error_result("tool_error", "boom", {"k": 1}))
assert failed["isError"] is True and json.loads(failed["content"][0]["text"])["data"] == {"k": 1}
run = webmcp.tool_runner(tools, 1000)
assert run("add", {"a": 1, "b": 2}, "webmcp-1") == ("3", None)
assert run("add", {"a": "1", "b": 2}, "webmcp-2")[1][0] == "invalid_input"
assert run("add", [1, 2], "webmcp-3")[1][0] == "invalid_input"
assert run("nope", {}, "webmcp-4")[1][0] == "unknown_tool"
try:
    webmcp.main_thread_document(js)
    raise AssertionError("a global scope without a document passed for a page")
except webmcp.WebMCPUnavailable as exc:
    assert "not in a worker" in str(exc)

# The WebAssembly build collects after every 16 KiB allocated, which cost more than the
# invokes did: a client raises the threshold, never lowers it, keeps -1 (disabled).
import gc
from clienttools import mpy
before = gc.threshold()
for chosen, expected in ((16384, mpy.GC_THRESHOLD), (4 << 20, 4 << 20), (-1, -1)):
    gc.threshold(chosen)
    mpy._raise_gc_threshold()
    assert gc.threshold() == expected, (chosen, gc.threshold())
gc.threshold(before)
print("micropython core: ok")
`;
try {
  await mp.runPythonAsync(script);
} catch (error) {
  console.log(`FAILED: ${error.type}: ${error.message}`);
  process.exit(1);
}
