"""The protocol core's cases (core.py), in the subset both interpreters run.

Plain functions named `case_*` over the core (and what both ToolClients share around
it: supervisor.py, outbox.py) with real MicroPython-flavour tools
(mpy.Tool: declared schemas, no pydantic); each check goes through `check`, which
counts. `run_all()` runs every case and returns (cases, checks): tests/unit/test_core.py
runs them under CPython (each as a pytest test too) and on real MicroPython 1.27 under
Node.js (tests/node/core_cases.mjs), and holds the two counts equal.
No `from __future__`, `typing` or pytest here: MicroPython imports this file as it is.
"""

import json

from clienttools import outcomes, supervisor
from clienttools.context import ToolError
from clienttools.core import (
    CancelTool,
    Rejection,
    ReplaceConnection,
    RunTool,
    Session,
    ToolsAcknowledged,
)
from clienttools.errors import ConnectionFailed, ToolsRejected
from clienttools.mpy import Tool, ToolTable
from clienttools.outbox import OutboxWriter, StorageOutbox
from clienttools.rules import CallState, LocalProtocolError
from clienttools.supervisor import ClientEvent
from clienttools.worker import MemoryStorage

CHECKS = [0]


def check(condition: object, what: object = "") -> None:
    """assert, counted: both interpreters must make the same checks."""
    CHECKS[0] += 1
    if not condition:
        raise AssertionError(what)


def raises(kind: "type[BaseException]", call: "object", *args: object) -> BaseException:
    """The exception `call(*args)` raised; it must be a `kind` (a counted check)."""
    try:
        call(*args)  # type: ignore[operator]
    except kind as exc:
        check(True)
        return exc
    check(False, f"{kind.__name__} was not raised")
    raise AssertionError("unreachable")


# --- a page: tools, a session, a clock ----------------------------------------------------

AB = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
}


def add(a: int, b: int) -> int:
    return a + b


def big(size: int) -> str:
    return "x" * size


def nan() -> float:
    return float("nan")


async def slow() -> str:
    return "done"


def fail(message: str) -> None:
    raise ToolError(message, data={"retry": False})


def make_session(**options: "object") -> Session:
    tools = ToolTable()
    tools.add(Tool(add, description="Add.", schema=AB))
    tools.add(Tool(big, schema={"type": "object", "properties": {"size": {"type": "integer"}}}))
    tools.add(Tool(nan))
    tools.add(Tool(slow, timeout=2.0))
    tools.add(Tool(fail, schema={"type": "object", "properties": {"message": {"type": "string"}}}))
    session = Session(tools, client_id="page", **options)  # type: ignore[arg-type]
    session.connection_opened(0.0)
    session.frames_to_send()
    return session


def invoke(
    session: Session, request_id: str, tool: str, arguments: object, **extra: object
) -> None:
    frame = {
        "type": "cf_agent_client_tool_invoke",
        "requestId": request_id,
        "toolCallId": "call-" + request_id,
        "toolName": tool,
        "input": arguments,
    }
    frame.update(extra)
    session.receive_frame(json.dumps(frame), 0.1)


def sent(session: Session) -> "list[dict[str, object]]":
    return [json.loads(text) for text in session.frames_to_send()]


def run_one(session: Session) -> RunTool:
    events = session.events()
    check(len(events) == 1 and isinstance(events[0], RunTool), events)
    run: RunTool = events[0]
    return run


def error_of(frame: "dict[str, object]") -> "dict[str, object]":
    error = frame["error"]
    assert isinstance(error, dict)
    return error


# --- C1: the tools frame ------------------------------------------------------------------


def case_the_tools_frame_comes_first_then_the_outbox() -> None:
    session = make_session()
    invoke(session, "r1", "add", {"a": 1, "b": 2})
    run = run_one(session)
    session.connection_lost(0.2)
    session.tool_returned("r1", run.tool.call(run.arguments, None))
    check(session.frames_to_send() == [], "nothing goes out while disconnected")
    session.connection_opened(0.3)
    frames = sent(session)
    check([f["type"] for f in frames] == ["cf_agent_client_tools", "cf_agent_client_tool_result"])
    tools = frames[0]["tools"]
    assert isinstance(tools, list)
    check(frames[0]["protocol"] == 1 and frames[0]["clientId"] == "page")
    check([t["name"] for t in tools] == ["add", "big", "nan", "slow", "fail"])
    check(tools[3]["timeoutMs"] == 2000 and tools[0]["description"] == "Add.")


def case_a_registry_change_sends_the_tools_frame_again() -> None:
    session = make_session()
    session.registry.add(Tool(add, name="plus", schema=AB))
    session.registry_changed()
    frames = sent(session)
    check(len(frames) == 1 and frames[0]["type"] == "cf_agent_client_tools")
    session.connection_lost(1.0)
    session.registry_changed()
    check(session.frames_to_send() == [])


def case_the_tools_ack_is_an_event() -> None:
    session = make_session()
    ack = {
        "type": "cf_agent_client_tools_ack",
        "accepted": ["add"],
        "rejected": [{"name": "big", "reason": "too big"}],
    }
    session.receive_frame(json.dumps(ack), 0.1)
    events = session.events()
    check(events == [ToolsAcknowledged(("add",), (Rejection("big", "too big"),))], events)
    check(events[0].rejected[0].name == "big" and events[0].rejected[0].reason == "too big")
    session.receive_frame(json.dumps({"type": "cf_agent_client_tools_ack", "accepted": [1]}), 0.2)
    check(session.events() == [] and session.frames_to_send() == [])


# --- C2-C6: a call, start to end ----------------------------------------------------------


def case_a_returned_value_is_the_result() -> None:
    session = make_session()
    invoke(session, "r1", "add", {"a": 1, "b": 2})
    run = run_one(session)
    check(run.arguments == {"a": 1, "b": 2} and run.tool.name == "add" and run.attempt == 1)
    check(session.call_state("r1") is CallState.RUNNING)
    session.tool_returned("r1", run.tool.call(run.arguments, run.context(None)))
    text = session.frames_to_send()
    check(text == ['{"type":"cf_agent_client_tool_result","requestId":"r1","output":3}'], text)
    check(session.call_state("r1") is None and session.running_request_ids() == [])


def case_an_unknown_tool_is_answered_at_once() -> None:
    session = make_session()
    invoke(session, "r1", "nope", {})
    frames = sent(session)
    check(session.events() == [] and len(frames) == 1)
    check(
        error_of(frames[0])
        == {"code": "unknown_tool", "message": "no tool named 'nope' on this client"}
    )


def case_invalid_input_names_each_field() -> None:
    session = make_session()
    invoke(session, "r1", "add", {"a": "one"})
    frames = sent(session)
    error = error_of(frames[0])
    check(session.events() == [] and error["code"] == "invalid_input")
    data = error["data"]
    assert isinstance(data, list)
    check([e["loc"] for e in data] == [["a"], ["b"]], data)
    check(str(error["message"]).startswith("invalid input for tool 'add': a: "))


def case_a_malformed_invoke_with_a_readable_id_gets_invalid_request() -> None:
    session = make_session()
    invoke(session, "r1", "add", "1+2")
    error = error_of(sent(session)[0])
    check(error["code"] == "invalid_request" and "input" in str(error["message"]), error)
    invoke(session, "x" * 300, "add", {})
    check(session.frames_to_send() == [], "a requestId too long to echo cannot be answered")
    invoke(session, "r2", "add", {"a": 1, "b": 2}, attempt=0)
    check(error_of(sent(session)[0])["code"] == "invalid_request")


def case_a_malformed_invoke_does_not_disturb_a_running_call() -> None:
    session = make_session()
    invoke(session, "r1", "slow", {})
    run_one(session)
    session.receive_frame('{"type": "cf_agent_client_tool_invoke", "requestId": "r1"}', 0.2)
    check(session.frames_to_send() == [] and session.call_state("r1") is CallState.RUNNING)


def case_raised_errors_say_what_happened() -> None:
    session = make_session()
    invoke(session, "r1", "fail", {"message": "no"})
    run = run_one(session)
    try:
        run.tool.call(run.arguments, None)
    except ToolError as exc:
        session.tool_raised("r1", exc)
    check(
        error_of(sent(session)[0])
        == {"code": "tool_error", "message": "no", "data": {"retry": False}}
    )
    invoke(session, "r2", "add", {"a": 1, "b": 2})
    run_one(session)
    session.tool_raised("r2", KeyError("k"))
    error = error_of(sent(session)[0])
    check(error["code"] == "tool_error" and error["data"] == {"exception": "KeyError"}, error)


def case_unusable_values_are_invalid_output_or_too_large() -> None:
    session = make_session(max_result_bytes=100)
    invoke(session, "r1", "nan", {})
    run = run_one(session)
    session.tool_returned("r1", run.tool.call(run.arguments, None))
    error = error_of(sent(session)[0])
    check(error["code"] == "invalid_output" and "NaN" in str(error["message"]), error)
    invoke(session, "r2", "big", {"size": 200})
    run = run_one(session)
    session.tool_returned("r2", run.tool.call(run.arguments, None))
    error = error_of(sent(session)[0])
    check(error["code"] == "output_too_large" and error["data"] == {"size": 202}, error)


def case_a_run_the_session_never_started_is_a_local_error() -> None:
    session = make_session()
    raises(LocalProtocolError, session.tool_returned, "nobody", 1)
    raises(LocalProtocolError, session.tool_cancelled, "nobody")


# --- C7: exactly once ---------------------------------------------------------------------


def case_a_redelivered_invoke_gets_the_stored_result() -> None:
    session = make_session()
    invoke(session, "r1", "add", {"a": 1, "b": 2})
    run = run_one(session)
    session.tool_returned("r1", 3)
    first = session.frames_to_send()
    invoke(session, "r1", "add", {"a": 1, "b": 2}, attempt=2)
    check(session.events() == [], "the tool does not run again")
    check(session.frames_to_send() == first)
    check(run.request_id == "r1")


def case_a_running_call_delivered_again_is_ignored() -> None:
    session = make_session()
    invoke(session, "r1", "slow", {})
    run_one(session)
    invoke(session, "r1", "slow", {}, attempt=2)
    check(session.events() == [] and session.frames_to_send() == [])


def case_the_memory_of_results_is_bounded() -> None:
    session = make_session(completed_cache_size=2)
    for index in range(3):
        rid = "r" + str(index)
        invoke(session, rid, "add", {"a": index, "b": 0})
        run_one(session)
        session.tool_returned(rid, index)
        ack = {"type": "cf_agent_client_tool_result_ack", "requestId": rid, "outcome": "applied"}
        session.receive_frame(json.dumps(ack), 0.2)
    session.frames_to_send()
    invoke(session, "r0", "add", {"a": 0, "b": 0})
    check(len(session.events()) == 1, "a forgotten request runs again")
    invoke(session, "r2", "add", {"a": 2, "b": 0})
    check(session.events() == [], "a remembered one does not")


# --- C8, C9: cancel and timeouts ----------------------------------------------------------


def case_a_cancel_cancels_the_run_and_its_late_end_is_dropped() -> None:
    session = make_session()
    invoke(session, "r1", "slow", {})
    run_one(session)
    cancel = {"type": "cf_agent_client_tool_cancel", "requestId": "r1", "reason": "aborted"}
    session.receive_frame(json.dumps(cancel), 0.2)
    check(session.events() == [CancelTool("r1", "aborted")])
    check(session.call_state("r1") is CallState.CANCELLED)
    session.receive_frame(json.dumps(cancel), 0.3)
    check(session.events() == [], "a second cancel is ignored")
    session.tool_returned("r1", "done")
    check(session.frames_to_send() == [] and session.call_state("r1") is None)
    bad = {"type": "cf_agent_client_tool_cancel", "requestId": "r1", "reason": "bored"}
    session.receive_frame(json.dumps(bad), 0.4)
    check(session.events() == [] and session.frames_to_send() == [])


def case_a_call_past_its_deadline_times_out() -> None:
    session = make_session()
    invoke(session, "r1", "slow", {}, timeoutMs=500)
    run_one(session)
    check(session.next_deadline() == 0.6, session.next_deadline())
    session.tick(0.5)
    check(session.events() == [] and session.frames_to_send() == [])
    session.tick(0.6)
    check(session.events() == [CancelTool("r1", "timeout")])
    error = error_of(sent(session)[0])
    check(error["code"] == "timeout" and "slow" in str(error["message"]))
    session.tool_cancelled("r1")
    check(session.frames_to_send() == [] and session.running_request_ids() == [])


def case_the_tool_timeout_counts_when_the_server_gives_none() -> None:
    session = make_session()
    invoke(session, "r1", "slow", {}, timeoutMs=0)
    run_one(session)
    check(session.next_deadline() == 2.1, session.next_deadline())


def case_shutdown_cancels_every_run_without_a_result() -> None:
    session = make_session()
    invoke(session, "r1", "slow", {})
    invoke(session, "r2", "slow", {})
    session.events()
    session.shutdown()
    check(session.events() == [CancelTool("r1", "shutdown"), CancelTool("r2", "shutdown")])
    session.tool_cancelled("r1")
    session.tool_cancelled("r2")
    check(session.frames_to_send() == [] and session.outbox() == {})


# --- C10: progress ------------------------------------------------------------------------


def case_progress_goes_out_while_running_and_only_upwards() -> None:
    session = make_session()
    invoke(session, "r1", "slow", {})
    run_one(session)
    session.report_progress("r1", 1, 4, "one")
    frames = sent(session)
    check(
        frames
        == [
            {
                "type": "cf_agent_client_tool_progress",
                "requestId": "r1",
                "progress": 1.0,
                "total": 4.0,
                "message": "one",
            }
        ],
        frames,
    )
    raises(ValueError, session.report_progress, "r1", 1)
    raises(ValueError, session.report_progress, "r1", float("nan"))
    session.report_progress("r1", 2)
    check(
        sent(session)
        == [{"type": "cf_agent_client_tool_progress", "requestId": "r1", "progress": 2.0}]
    )
    session.tool_returned("r1", "done")
    session.frames_to_send()
    session.report_progress("r1", 3)
    check(session.frames_to_send() == [], "progress after the end is dropped")


# --- C11: the outbox ----------------------------------------------------------------------


def case_results_wait_in_the_outbox_until_acked() -> None:
    session = make_session()
    invoke(session, "r1", "add", {"a": 1, "b": 2})
    run_one(session)
    revision = session.outbox_revision
    session.tool_returned("r1", 3)
    check(session.outbox_size == 1 and session.outbox_added == 1)
    check(session.outbox_revision != revision and list(session.outbox()) == ["r1"])
    ack = {"type": "cf_agent_client_tool_result_ack", "requestId": "r1", "outcome": "applied"}
    session.receive_frame(json.dumps(ack), 0.2)
    check(session.outbox() == {} and session.outbox_added == 1)


def case_the_outbox_survives_a_reload() -> None:
    session = make_session()
    for rid in ("r1", "r2"):
        invoke(session, rid, "add", {"a": 1, "b": 2})
        run_one(session)
        session.tool_returned(rid, 3)
    stored = session.export_outbox()
    check(json.loads(stored)["version"] == 1)
    reloaded = make_session()
    check(reloaded.restore_outbox(stored) == 2)
    check(reloaded.outbox() == session.outbox())
    invoke(reloaded, "r1", "add", {"a": 1, "b": 2})
    check(reloaded.events() == [], "a restored result answers its re-delivered invoke")
    check(reloaded.restore_outbox(stored) == 0, "nothing twice")


def case_a_bad_store_is_ignored_entry_by_entry() -> None:
    session = make_session()
    check(session.restore_outbox("not json") == 0)
    check(session.restore_outbox('{"version": 99, "results": []}') == 0)
    good = '{"type":"cf_agent_client_tool_result","requestId":"r1","output":1}'
    entries = [
        {"requestId": "r1", "frame": good},
        {"requestId": "r2", "frame": good},  # requestId does not match
        {"requestId": "r3", "frame": '{"type":"cf_agent_pong","t":1}'},
        {"requestId": "r4"},
        {
            "requestId": "r5",
            "frame": '{"type":"cf_agent_client_tool_result","requestId":"r5",'
            '"error":{"code":"bogus","message":"m"}}',
        },
        "junk",
    ]
    text = json.dumps({"version": 1, "results": entries})
    check(session.restore_outbox(text) == 1 and list(session.outbox()) == ["r1"])


def case_a_full_outbox_drops_the_oldest() -> None:
    session = make_session(completed_cache_size=2)
    for index in range(3):
        rid = "r" + str(index)
        invoke(session, rid, "add", {"a": index, "b": 0})
        run_one(session)
        session.tool_returned(rid, index)
    check(list(session.outbox()) == ["r1", "r2"], session.outbox())


# --- C12, C13: liveness and what the server may send --------------------------------------


def case_a_silent_connection_is_replaced_once() -> None:
    session = make_session(ping_interval=10.0)
    check(session.next_deadline() == 25.0)
    session.receive_frame('{"type": "cf_agent_ping", "t": 1}', 4.0)
    check(sent(session) == [{"type": "cf_agent_pong", "t": 1.0}])
    check(session.next_deadline() == 29.0)
    session.tick(28.9)
    check(session.events() == [])
    session.tick(29.0)
    events = session.events()
    check(len(events) == 1 and isinstance(events[0], ReplaceConnection), events)
    check(events[0].reason == "nothing received for 25.0 s", events[0].reason)
    session.tick(40.0)
    check(session.events() == [] and session.next_deadline() is None)
    session.connection_lost(40.0)
    session.receive_frame('{"type": "cf_agent_ping", "t": 2}', 41.0)
    check(session.frames_to_send() == [], "no pong while disconnected")
    session.connection_opened(42.0)
    check(session.next_deadline() == 67.0)


def case_junk_from_the_server_is_ignored() -> None:
    session = make_session()
    junk: list[str | bytes] = [
        "not json",
        "[]",
        "{}",
        '{"type": 5}',
        '{"type": "cf_agent_nonsense"}',
        '{"type": "cf_agent_client_tool_cancel", "requestId": 7}',
        '{"type": "cf_agent_ping"}',
        '{"type": "cf_agent_ping", "t": true}',
        '{"type": "cf_agent_client_tool_result_ack"}',
        '{"type": "cf_agent_protocol_error"}',
        "[" * 10000 + "]" * 10000,
        b"binary",
        '{"type": "cf_agent_ping", "t": 1, "pad": "' + "x" * 1100000 + '"}',
    ]
    for frame in junk:
        session.receive_frame(frame, 0.5)
        check(session.frames_to_send() == [] and session.events() == [], frame[:40])


def case_chat_frames_and_protocol_errors_make_nothing_here() -> None:
    session = make_session()
    chunk = {"type": "chunk", "requestId": "q1", "sequence": 0, "chunk": {"type": "text-delta"}}
    session.receive_frame(json.dumps(chunk), 0.2)
    refused = {"type": "cf_agent_protocol_error", "message": "bad frame", "requestId": "q1"}
    session.receive_frame(json.dumps(refused), 0.3)
    check(session.events() == [] and session.frames_to_send() == [])
    check(session.send_frame('{"type":"abort","requestId":"q1"}'))
    check(session.frames_to_send() == ['{"type":"abort","requestId":"q1"}'])
    session.connection_lost(0.4)
    check(not session.send_frame('{"type":"abort","requestId":"q1"}'))


# --- the plain parts ----------------------------------------------------------------------


def case_events_are_values() -> None:
    check(CancelTool("r1", "timeout") == CancelTool("r1", "timeout"))
    check(CancelTool("r1", "timeout") != CancelTool("r1", "aborted"))
    check(CancelTool("r1", "x") != ReplaceConnection("r1"))
    check(repr(CancelTool("r1", "x")) == "CancelTool(request_id='r1', reason='x')")
    check(len({Rejection("a", "b"), Rejection("a", "b")}) == 1)


def case_bad_options_are_refused() -> None:
    raises(ValueError, lambda: Session(ToolTable(), client_id="p", ping_interval=0))
    raises(ValueError, lambda: Session(ToolTable(), client_id="p", completed_cache_size=0))


def case_the_error_result_keeps_code_and_message_when_data_is_too_large() -> None:
    text = outcomes.error_result("r1", "tool_error", "boom", {"blob": "x" * 1100000})
    frame = json.loads(text)
    check(error_of(frame) == {"code": "tool_error", "message": "boom (error data too large)"})
    check(
        error_of(json.loads(outcomes.error_result("r1", "tool_error", "m" * 5000)))["message"]
        == "m" * 4000 + "..."
    )


# --- around the core: what both ToolClients share ------------------------------------------


def case_the_client_status_moves_by_the_table() -> None:
    check(supervisor.next_status("idle", ClientEvent.CONNECT) == "connecting")
    check(supervisor.next_status("connecting", ClientEvent.OPENED) == "open")
    check(supervisor.next_status("open", ClientEvent.LOST) == "reconnecting")
    check(supervisor.next_status("reconnecting", ClientEvent.CLOSED) == "closed")
    error = raises(LocalProtocolError, supervisor.next_status, "closed", ClientEvent.LOST)
    check(str(error) == "a client that is closed cannot be lost", str(error))
    raises(RuntimeError, supervisor.check_connect, "open", "ws://h/x")
    raises(RuntimeError, supervisor.check_connect, "idle", "")
    raises(ValueError, supervisor.check_options, "ws://h/x", 0, False)
    raises(ValueError, supervisor.check_options, None, 1.0, False)
    check(supervisor.check_options(None, 1.0, True) == "")


def case_the_tools_ack_decides_the_connect() -> None:
    url = "ws://h/agents/chat/s?token=secret"
    failed = supervisor.registration_error(url, "the server closed the connection", True)
    check(isinstance(failed, ConnectionFailed) and "secret" not in str(failed), str(failed))
    refused = ToolsAcknowledged(("add",), (Rejection("big", "too big"),))
    rejected = supervisor.registration_error(url, refused, True)
    check(isinstance(rejected, ToolsRejected) and rejected.rejected[0].name == "big")
    check(
        str(rejected) == "cannot connect to ws://h/agents/chat/s?token=***: "
        "the server rejected tools: 'big': too big",
        str(rejected),
    )
    check(supervisor.registration_error(url, refused, False) is None, "a reconnect goes on")
    check(supervisor.registration_error(url, ToolsAcknowledged(("add",), ()), True) is None)


def case_the_outbox_writer_stores_a_result_before_it_leaves() -> None:
    session = make_session()
    storage = MemoryStorage()
    timers: list[object] = []

    class Timer:
        def __init__(self, callback: "object") -> None:
            self.callback = callback
            self.cancelled = False

        def cancel(self) -> None:
            self.cancelled = True

    def schedule(delay: float, callback: "object") -> Timer:
        timers.append(Timer(callback))
        return timers[-1]  # type: ignore[return-value]

    writer = OutboxWriter(session, StorageOutbox("ws://h/x", storage), schedule)
    writer.restore()
    invoke(session, "r1", "add", {"a": 1, "b": 2})
    run_one(session)
    session.tool_returned("r1", 3)
    writer.save_soon()
    stored = storage.getItem("clienttools:outbox:ws://h/x")
    check(stored is not None and timers == [], "a new result is written at once")
    ack = {"type": "cf_agent_client_tool_result_ack", "requestId": "r1", "outcome": "applied"}
    session.receive_frame(json.dumps(ack), 0.2)
    writer.save_soon()
    check(len(timers) == 1 and storage.getItem("clienttools:outbox:ws://h/x") == stored)
    timers[0].callback()  # type: ignore[attr-defined]
    check(storage.getItem("clienttools:outbox:ws://h/x") == session.export_outbox())
    reloaded = make_session()
    check(OutboxWriter(reloaded, StorageOutbox("ws://h/x", storage), schedule) is not None)
    check(reloaded.restore_outbox(str(storage.getItem("clienttools:outbox:ws://h/x"))) == 0)


def cases() -> "list[object]":
    """Every case function of this module, in a stable order."""
    found = [(name, value) for name, value in globals().items() if name.startswith("case_")]
    return [value for _, value in sorted(found)]


def run_all() -> "tuple[int, int]":
    """Run every case; (how many cases, how many checks)."""
    CHECKS[0] = 0
    functions = cases()
    for function in functions:
        function()  # type: ignore[operator]
    return len(functions), CHECKS[0]
