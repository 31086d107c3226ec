"""The sans-I/O client core against a scripted server, rule by rule (C1-C13).

The test plays both peers: `Link` sends server frames into a `Session` with a
fake clock and collects what the session sends (each frame checked against the
protocol models), and the test plays the adapter by reporting how runs end.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from clienttools import protocol
from clienttools.session import (
    CALL_TRANSITIONS,
    COMPLETED_CACHE_SIZE,
    CallEvent,
    CallState,
    CancelTool,
    ChatFrameReceived,
    LocalProtocolError,
    ReplaceConnection,
    RunTool,
    Session,
    ToolCall,
    ToolsAcknowledged,
    backoff,
    next_call_state,
)
from clienttools.tools import ToolContext, ToolError, ToolRegistry
from tests.support.imports import IO_MODULES, imports_of, io_imports_reachable

PACKAGE = Path(__file__).resolve().parents[2] / "client" / "clienttools"


class Point(BaseModel):
    x: int
    y: int


def make_registry() -> ToolRegistry:
    registry = ToolRegistry()

    @registry.tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @registry.tool
    async def slow(seconds: float, ctx: ToolContext) -> str:
        """Pretend to work."""
        return "done"

    @registry.tool(timeout=2.0)
    async def limited(seconds: float) -> str:
        """Has its own time limit."""
        return "done"

    @registry.tool
    def point(x: int, y: int) -> Point:
        """Return a model."""
        return Point(x=x, y=y)

    @registry.tool
    def anything(size: int) -> Any:
        """Return whatever the test reports."""
        return None

    return registry


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


class Link:
    """A Session joined to a scripted server, in the manner of h11's ConnectionPair."""

    def __init__(self, session: Session, clock: Clock) -> None:
        self.session = session
        self.clock = clock

    def open(self) -> list[dict[str, Any]]:
        self.session.connection_opened(self.clock.now)
        return self.sent()

    def drop(self) -> None:
        self.session.connection_lost(self.clock.now)

    def send(self, type: str, **fields: Any) -> None:
        self.session.receive_frame(json.dumps({"type": type, **fields}), self.clock.now)

    def send_raw(self, data: str | bytes) -> None:
        self.session.receive_frame(data, self.clock.now)

    def invoke(self, request_id: str, tool: str, input: dict[str, Any], **extra: Any) -> None:
        self.send(
            "cf_agent_client_tool_invoke",
            requestId=request_id,
            toolCallId=f"call-{request_id}",
            toolName=tool,
            input=input,
            **extra,
        )

    def ack(self, request_id: str, outcome: str = "applied") -> None:
        self.send("cf_agent_client_tool_result_ack", requestId=request_id, outcome=outcome)

    def sent(self) -> list[dict[str, Any]]:
        """What the session sent since last asked; every frame must be a valid client frame."""
        frames = []
        for text in self.session.frames_to_send():
            protocol.parse_client_frame(text)
            frames.append(json.loads(text))
        return frames

    def results(self) -> list[dict[str, Any]]:
        return [f for f in self.sent() if f["type"] == "cf_agent_client_tool_result"]

    def runs(self) -> list[RunTool]:
        return [e for e in self.session.events() if isinstance(e, RunTool)]


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def session() -> Session:
    return Session(make_registry(), client_id="page-1")


@pytest.fixture
def link(session: Session, clock: Clock) -> Link:
    link = Link(session, clock)
    link.open()
    return link


def run_sync(run: RunTool) -> Any:
    return run.tool.call(run.arguments, run.context(None))


# --- C1: the tools frame ---------------------------------------------------------------


def test_first_frame_after_every_open_is_the_tools_frame(session: Session, clock: Clock) -> None:
    link = Link(session, clock)
    first = link.open()
    assert first[0]["type"] == "cf_agent_client_tools"
    assert first[0]["protocol"] == 1 and first[0]["clientId"] == "page-1"
    assert {t["name"] for t in first[0]["tools"]} == {"add", "slow", "limited", "point", "anything"}
    limited = next(t for t in first[0]["tools"] if t["name"] == "limited")
    assert limited["timeoutMs"] == 2000
    link.drop()
    assert link.open()[0]["type"] == "cf_agent_client_tools"


def test_registry_change_resends_the_tools_frame_only_when_connected(link: Link) -> None:
    def echo(text: str) -> str:
        return text

    link.session.registry.add(echo)
    link.session.registry_changed()
    [frame] = link.sent()
    assert frame["type"] == "cf_agent_client_tools"
    assert "echo" in {t["name"] for t in frame["tools"]}
    link.drop()
    link.session.registry_changed()
    assert link.sent() == []


def test_tools_ack_is_surfaced(link: Link) -> None:
    link.send(
        "cf_agent_client_tools_ack",
        accepted=["add"],
        rejected=[{"name": "slow", "reason": "too slow"}],
    )
    [event] = link.session.events()
    assert isinstance(event, ToolsAcknowledged)
    assert event.accepted == ("add",)
    assert event.rejected[0].name == "slow" and event.rejected[0].reason == "too slow"


# --- C2, C3: validation and unknown tools ----------------------------------------------


def test_valid_invoke_starts_a_run_and_the_result_goes_out(link: Link) -> None:
    link.invoke("r1", "add", {"a": 2, "b": 3})
    [run] = link.runs()
    assert run.arguments == {"a": 2, "b": 3} and run.tool.name == "add"
    assert link.session.call_state("r1") is CallState.RUNNING
    link.session.tool_returned("r1", run_sync(run))
    assert link.results() == [
        {"type": "cf_agent_client_tool_result", "requestId": "r1", "output": 5}
    ]
    assert link.session.call_state("r1") is None


def test_invalid_input_is_refused_and_the_tool_does_not_run(link: Link) -> None:
    link.invoke("r1", "add", {"a": "two", "b": 3})
    assert link.runs() == []
    [result] = link.results()
    assert result["error"]["code"] == "invalid_input"
    assert result["error"]["data"], "the validation errors travel in data"


def test_unknown_tool(link: Link) -> None:
    link.invoke("r1", "nope", {})
    assert link.runs() == []
    [result] = link.results()
    assert result["error"]["code"] == "unknown_tool"
    assert "nope" in result["error"]["message"]


# --- C4: many calls at once ------------------------------------------------------------


def test_many_calls_run_at_once_and_finish_in_any_order(link: Link) -> None:
    for i in range(5):
        link.invoke(f"r{i}", "slow", {"seconds": 1})
    runs = link.runs()
    assert [r.request_id for r in runs] == [f"r{i}" for i in range(5)]
    assert sorted(link.session.running_request_ids()) == [f"r{i}" for i in range(5)]
    for i in (3, 0, 4, 1, 2):
        link.session.tool_returned(f"r{i}", f"done {i}")
    assert [r["requestId"] for r in link.results()] == ["r3", "r0", "r4", "r1", "r2"]


# --- C5: output serialization ----------------------------------------------------------


def test_model_output_is_serialized(link: Link) -> None:
    link.invoke("r1", "point", {"x": 1, "y": 2})
    [run] = link.runs()
    link.session.tool_returned("r1", run_sync(run))
    assert link.results()[0]["output"] == {"x": 1, "y": 2}


@pytest.mark.parametrize("value", [object(), float("nan"), {1, 2}.__iter__()])
def test_unserializable_output_is_invalid_output(link: Link, value: object) -> None:
    link.invoke("r1", "anything", {"size": 0})
    link.runs()
    link.session.tool_returned("r1", value)
    [result] = link.results()
    assert result["error"]["code"] == "invalid_output"


def test_output_over_the_limit_is_output_too_large(clock: Clock) -> None:
    link = Link(Session(make_registry(), client_id="p", max_result_bytes=100), clock)
    link.open()
    link.invoke("r1", "anything", {"size": 0})
    link.runs()
    link.session.tool_returned("r1", "x" * 99)
    [result] = link.results()
    assert result["error"]["code"] == "output_too_large"
    link.invoke("r2", "anything", {"size": 0})
    link.runs()
    link.session.tool_returned("r2", "x" * 98)  # 98 chars + 2 quotes = exactly 100 bytes
    assert link.results()[0]["output"] == "x" * 98


def test_null_output_is_sent_as_output(link: Link) -> None:
    link.invoke("r1", "anything", {"size": 0})
    link.runs()
    link.session.tool_returned("r1", None)
    assert link.results() == [
        {"type": "cf_agent_client_tool_result", "requestId": "r1", "output": None}
    ]


# --- C6: exceptions --------------------------------------------------------------------


def test_exception_becomes_tool_error_with_its_type_name(link: Link) -> None:
    link.invoke("r1", "slow", {"seconds": 1})
    link.runs()
    link.session.tool_raised("r1", ZeroDivisionError("division by zero"))
    [result] = link.results()
    assert result["error"] == {
        "code": "tool_error",
        "message": "division by zero",
        "data": {"exception": "ZeroDivisionError"},
    }


def test_tool_error_carries_its_own_data(link: Link) -> None:
    link.invoke("r1", "slow", {"seconds": 1})
    link.invoke("r2", "slow", {"seconds": 1})
    link.runs()
    link.session.tool_raised("r1", ToolError("city not found", {"city": "Atlantis"}))
    odd = ToolError("odd data")
    odd.data = {"when": object()}  # type: ignore[dict-item]  # ToolError checks only at init
    link.session.tool_raised("r2", odd)
    first, second = link.results()
    assert first["error"] == {
        "code": "tool_error",
        "message": "city not found",
        "data": {"city": "Atlantis"},
    }
    assert second["error"]["code"] == "tool_error" and "data" not in second["error"]


def test_huge_exception_message_is_cut_to_fit(link: Link) -> None:
    link.invoke("r1", "slow", {"seconds": 1})
    link.runs()
    link.session.tool_raised("r1", RuntimeError("x" * 2_000_000))
    [result] = link.results()
    assert len(result["error"]["message"]) < 5000


# --- C7: exactly once ------------------------------------------------------------------


def test_duplicate_invoke_while_running_is_ignored(link: Link) -> None:
    link.invoke("r1", "slow", {"seconds": 1})
    assert len(link.runs()) == 1
    link.invoke("r1", "slow", {"seconds": 1}, attempt=2)
    assert link.runs() == [] and link.sent() == []
    link.session.tool_returned("r1", "done")
    assert len(link.results()) == 1


def test_invoke_after_completion_resends_the_stored_result(link: Link) -> None:
    link.invoke("r1", "add", {"a": 1, "b": 1})
    [run] = link.runs()
    link.session.tool_returned("r1", run_sync(run))
    [first] = link.results()
    link.ack("r1")
    link.invoke("r1", "add", {"a": 1, "b": 1}, attempt=2)
    assert link.runs() == []
    assert link.results() == [first]
    assert "r1" in link.session.outbox(), "a re-sent result waits for its ack again"


def test_an_unacked_result_is_never_forgotten(clock: Clock) -> None:
    link = Link(Session(make_registry(), client_id="p", completed_cache_size=3), clock)
    link.open()
    for i in range(3):
        link.invoke(f"r{i}", "anything", {"size": 0})
        link.runs()
        link.session.tool_returned(f"r{i}", i)
        if i:
            link.ack(f"r{i}")
    link.invoke("r3", "anything", {"size": 0})
    link.runs()
    link.session.tool_returned("r3", 3)  # pushes r0 out of the cache of completed results
    link.sent()
    link.invoke("r0", "anything", {"size": 0}, attempt=2)
    assert link.runs() == [] and link.results()[0]["output"] == 0


def test_at_least_the_last_thousand_results_are_remembered(link: Link) -> None:
    assert COMPLETED_CACHE_SIZE >= 1000
    for i in range(COMPLETED_CACHE_SIZE + 1):
        link.invoke(f"r{i}", "anything", {"size": 0})
        link.runs()
        link.session.tool_returned(f"r{i}", i)
        link.ack(f"r{i}")
    link.sent()
    link.invoke("r1", "anything", {"size": 0})
    assert link.runs() == [] and link.results()[0]["output"] == 1
    link.invoke("r0", "anything", {"size": 0})  # the oldest one fell out of the cache
    assert len(link.runs()) == 1


# --- C8: cancel ------------------------------------------------------------------------


def test_cancel_asks_the_adapter_to_cancel_and_no_result_follows(link: Link) -> None:
    link.invoke("r1", "slow", {"seconds": 1})
    link.runs()
    link.send("cf_agent_client_tool_cancel", requestId="r1", reason="aborted")
    assert link.session.events() == [CancelTool("r1", "aborted")]
    assert link.session.call_state("r1") is CallState.CANCELLED
    link.send("cf_agent_client_tool_cancel", requestId="r1", reason="aborted")
    assert link.session.events() == [], "a repeated cancel is ignored"
    link.session.tool_cancelled("r1")
    assert link.sent() == [] and link.session.outbox() == {}
    assert link.session.call_state("r1") is None


def test_a_late_return_after_cancel_is_dropped(link: Link) -> None:
    link.invoke("r1", "slow", {"seconds": 1})
    link.runs()
    link.send("cf_agent_client_tool_cancel", requestId="r1", reason="superseded")
    link.session.events()
    link.session.tool_returned("r1", "done anyway")
    assert link.sent() == []


def test_cancel_for_unknown_or_finished_request_is_ignored(link: Link) -> None:
    link.send("cf_agent_client_tool_cancel", requestId="ghost", reason="aborted")
    link.invoke("r1", "add", {"a": 1, "b": 1})
    [run] = link.runs()
    link.session.tool_returned("r1", run_sync(run))
    link.sent()
    link.send("cf_agent_client_tool_cancel", requestId="r1", reason="aborted")
    assert link.session.events() == [] and link.sent() == []


def test_shutdown_cancels_runs_without_answering_them(link: Link) -> None:
    link.invoke("r1", "slow", {"seconds": 1})
    link.runs()
    link.session.shutdown()
    assert link.session.events() == [CancelTool("r1", "shutdown")]
    link.session.tool_cancelled("r1")
    assert link.sent() == [] and link.session.outbox() == {}
    link.invoke("r1", "slow", {"seconds": 1}, attempt=2)
    assert len(link.runs()) == 1, "never answered, so a re-delivery runs it"


# --- C9: time limits -------------------------------------------------------------------


def test_timeout_ms_is_enforced_by_the_client(link: Link, clock: Clock) -> None:
    link.invoke("r1", "slow", {"seconds": 10}, timeoutMs=1500)
    link.runs()
    assert link.session.next_deadline() == pytest.approx(clock.now + 1.5)
    link.session.tick(clock.advance(1.4))
    assert link.session.events() == [] and link.sent() == []
    link.session.tick(clock.advance(0.1))
    assert link.session.events() == [CancelTool("r1", "timeout")]
    [result] = link.results()
    assert result["error"]["code"] == "timeout"
    assert link.session.call_state("r1") is CallState.TIMED_OUT
    link.session.tool_cancelled("r1")
    assert link.sent() == [] and link.session.call_state("r1") is None
    link.invoke("r1", "slow", {"seconds": 10}, timeoutMs=1500, attempt=2)
    assert link.runs() == [] and link.results()[0]["error"]["code"] == "timeout"


@pytest.mark.parametrize(
    ("tool", "timeout_ms", "expected"),
    [
        ("limited", None, 2.0),
        ("limited", 5000, 2.0),
        ("limited", 500, 0.5),
        ("slow", None, None),
        ("slow", 0, None),
    ],
)
def test_the_smaller_time_limit_applies(
    link: Link, clock: Clock, tool: str, timeout_ms: int | None, expected: float | None
) -> None:
    extra = {} if timeout_ms is None else {"timeoutMs": timeout_ms}
    link.invoke("r1", tool, {"seconds": 1}, **extra)
    link.runs()
    call_deadline = [
        c.deadline
        for c in link.session._calls.values()  # a peek inside, to keep liveness out of the way
    ]
    assert call_deadline == [None if expected is None else pytest.approx(clock.now + expected)]


# --- C10: progress ---------------------------------------------------------------------


def test_progress_is_strictly_increasing_and_stops_after_the_result(link: Link) -> None:
    link.invoke("r1", "slow", {"seconds": 1})
    link.runs()
    link.session.report_progress("r1", 1, 3, "one")
    link.session.report_progress("r1", 2.5)
    with pytest.raises(ValueError, match="increase strictly"):
        link.session.report_progress("r1", 2.5)
    with pytest.raises(ValueError, match="finite"):
        link.session.report_progress("r1", float("inf"))
    frames = link.sent()
    assert [(f["progress"], f.get("total"), f.get("message")) for f in frames] == [
        (1, 3, "one"),
        (2.5, None, None),
    ]
    link.session.tool_returned("r1", "done")
    link.session.report_progress("r1", 9)
    assert [f["type"] for f in link.sent()] == ["cf_agent_client_tool_result"]


def test_progress_from_the_tool_context_reaches_the_wire(link: Link) -> None:
    link.invoke("r1", "slow", {"seconds": 1})
    [run] = link.runs()
    context = run.context(lambda p, t, m: link.session.report_progress("r1", p, t, m))
    assert (context.request_id, context.tool_call_id, context.attempt) == ("r1", "call-r1", 1)
    coroutine = context.progress(1, 2)
    with pytest.raises(StopIteration):
        while True:
            coroutine.send(None)
    assert link.sent()[0]["type"] == "cf_agent_client_tool_progress"


# --- C11: outbox -----------------------------------------------------------------------


def test_results_wait_in_the_outbox_until_acked(link: Link) -> None:
    link.invoke("r1", "slow", {"seconds": 1})
    link.invoke("r2", "slow", {"seconds": 1})
    link.runs()
    link.session.tool_returned("r1", "one")
    link.drop()
    link.session.tool_returned("r2", "two")  # finishes while disconnected
    assert link.sent() == []
    frames = link.open()
    assert [f["type"] for f in frames] == ["cf_agent_client_tools"] + [
        "cf_agent_client_tool_result"
    ] * 2
    assert [f["requestId"] for f in frames[1:]] == ["r1", "r2"]
    link.ack("r1", "applied")
    link.ack("r2", "stale")  # any outcome settles it
    assert link.session.outbox() == {}
    link.drop()
    assert len(link.open()) == 1


def test_each_reconnect_resends_whatever_is_still_unacked(link: Link) -> None:
    link.invoke("r1", "slow", {"seconds": 1})
    link.runs()
    link.session.tool_returned("r1", "one")
    for _ in range(3):
        link.drop()
        frames = link.open()
        assert [f.get("requestId") for f in frames] == [None, "r1"]


def test_outbox_survives_a_page_reload(link: Link, clock: Clock) -> None:
    link.invoke("r1", "add", {"a": 1, "b": 2})
    [run] = link.runs()
    link.session.tool_returned("r1", run_sync(run))
    revision = link.session.outbox_revision
    stored = link.session.export_outbox()
    json.loads(stored)
    reloaded = Link(Session(make_registry(), client_id="page-2"), clock)
    assert reloaded.session.restore_outbox(stored) == 1
    frames = reloaded.open()
    assert [f["type"] for f in frames] == ["cf_agent_client_tools", "cf_agent_client_tool_result"]
    assert frames[1]["output"] == 3
    reloaded.invoke("r1", "add", {"a": 1, "b": 2}, attempt=2)
    assert reloaded.runs() == [], "the restored result answers the re-delivery; no second run"
    assert reloaded.results()[0]["output"] == 3
    reloaded.ack("r1")
    assert (
        reloaded.session.export_outbox() == Session(make_registry(), client_id="x").export_outbox()
    )
    assert revision > 0


@pytest.mark.parametrize(
    "stored",
    [
        "",
        "not json",
        "[]",
        '{"version": 99, "results": []}',
        '{"version": 1, "results": {}}',
        '{"version": 1, "results": [1, {"requestId": "a"}, {"requestId": "a", "frame": "{}"}]}',
        json.dumps(
            {
                "version": 1,
                "results": [{"requestId": "b", "frame": '{"type":"cf_agent_pong","t":1}'}],
            }
        ),
    ],
)
def test_a_damaged_stored_outbox_is_ignored(stored: str) -> None:
    session = Session(make_registry(), client_id="p")
    assert session.restore_outbox(stored) == 0
    assert session.outbox() == {}


# --- C12: liveness ---------------------------------------------------------------------


def test_ping_is_answered_with_pong(link: Link) -> None:
    link.send("cf_agent_ping", t=42.5)
    assert link.sent() == [{"type": "cf_agent_pong", "t": 42.5}]


def test_silent_connection_is_replaced(link: Link, clock: Clock) -> None:
    assert link.session.next_deadline() == pytest.approx(clock.now + 37.5)
    link.session.tick(clock.advance(30))
    link.send("cf_agent_ping", t=1)  # anything that arrives counts
    link.session.tick(clock.advance(30))
    assert link.session.events() == []
    link.session.tick(clock.advance(7.5))
    [event] = link.session.events()
    assert isinstance(event, ReplaceConnection)
    link.session.tick(clock.advance(100))
    assert link.session.events() == [], "asked once per connection"
    assert link.session.next_deadline() is None
    link.drop()
    link.open()
    assert link.session.next_deadline() == pytest.approx(clock.now + 37.5)


def test_liveness_follows_the_ping_interval(clock: Clock) -> None:
    link = Link(Session(make_registry(), client_id="p", ping_interval=2.0), clock)
    link.open()
    assert link.session.next_deadline() == pytest.approx(clock.now + 5.0)


# --- C13: bad frames -------------------------------------------------------------------

BAD_FRAMES: list[str | bytes] = [
    b'{"type": "cf_agent_ping", "t": 1}',
    "",
    "not json",
    "[1, 2]",
    "null",
    '{"no": "type"}',
    '{"type": 7}',
    '{"type": "cf_agent_unknown"}',
    '{"type": "cf_agent_ping", "t": "soon"}',
    '{"type": "cf_agent_client_tool_cancel", "requestId": "r1", "reason": "bored"}',
    '{"type": "cf_agent_client_tool_result_ack", "requestId": 5, "outcome": "applied"}',
    '{"type": "cf_agent_client_tools_ack", "accepted": "add"}',
    '{"type": "chunk", "requestId": "q", "sequence": -1, "chunk": {}}',
    '{"type": "cf_agent_client_tool_invoke", "requestId": 17, "toolName": "add"}',
    '{"type": "cf_agent_client_tool_invoke", "toolName": "add", "input": {}}',
    "[" * 100_000 + "]" * 100_000,
    json.dumps({"type": "cf_agent_ping", "t": 1, "pad": "x" * protocol.MAX_FRAME_BYTES}),
]


@pytest.mark.parametrize("frame", BAD_FRAMES, ids=range(len(BAD_FRAMES)))
def test_bad_frames_are_logged_and_ignored(
    link: Link, frame: str | bytes, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="clienttools"):
        link.send_raw(frame)
    assert link.sent() == [] and link.session.events() == []
    assert any(r.name == "clienttools" for r in caplog.records)


def test_malformed_invoke_with_readable_request_id_gets_invalid_request(link: Link) -> None:
    link.send("cf_agent_client_tool_invoke", requestId="r1", toolName="add", input="1+2")
    assert link.runs() == []
    [result] = link.results()
    assert result["requestId"] == "r1" and result["error"]["code"] == "invalid_request"
    link.send("cf_agent_client_tool_invoke", requestId="x" * 300, toolName="add")
    assert link.sent() == [], "a requestId too long to echo cannot be answered"


def test_malformed_invoke_does_not_disturb_a_running_call(link: Link) -> None:
    link.invoke("r1", "slow", {"seconds": 1})
    link.runs()
    link.send("cf_agent_client_tool_invoke", requestId="r1")
    assert link.sent() == [] and link.session.call_state("r1") is CallState.RUNNING


def test_protocol_error_from_the_server_is_logged(
    link: Link, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="clienttools"):
        link.send("cf_agent_protocol_error", message="bad frame", requestId="r9")
    assert "bad frame" in caplog.text and link.sent() == []


def test_chat_frames_pass_through_untouched(link: Link) -> None:
    chunk = {
        "type": "chunk",
        "requestId": "q1",
        "sequence": 0,
        "chunk": {"type": "text-delta", "id": "t", "delta": "hi", "extra": [1]},
    }
    link.send_raw(json.dumps(chunk))
    [event] = link.session.events()
    assert isinstance(event, ChatFrameReceived)
    assert isinstance(event.frame, protocol.ChunkFrame)
    assert json.loads(protocol.dump_frame(event.frame)) == chunk  # nothing lost, nothing added


def test_chat_layer_frames_go_out_only_when_connected(link: Link) -> None:
    assert link.session.send_frame(protocol.AbortFrame(request_id="q1"))
    assert link.sent() == [{"type": "abort", "requestId": "q1"}]
    link.drop()
    assert not link.session.send_frame(protocol.AbortFrame(request_id="q1"))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=20,
)
VALID_INVOKE: dict[str, Any] = {
    "type": "cf_agent_client_tool_invoke",
    "requestId": "r1",
    "toolCallId": "c1",
    "toolName": "add",
    "input": {"a": 1, "b": 2},
    "timeoutMs": 100,
    "attempt": 1,
}
VALID_FRAMES: list[dict[str, Any]] = [
    VALID_INVOKE,
    {"type": "cf_agent_client_tool_cancel", "requestId": "r1", "reason": "aborted"},
    {"type": "cf_agent_client_tool_result_ack", "requestId": "r1", "outcome": "applied"},
    {"type": "cf_agent_client_tools_ack", "accepted": ["add"], "rejected": []},
    {"type": "cf_agent_ping", "t": 1},
    {"type": "chunk", "requestId": "q", "sequence": 0, "chunk": {"type": "start"}},
]


@st.composite
def broken_frames(draw: st.DrawFn) -> str | bytes:
    """Valid frames with a field dropped or replaced, plus random JSON, text and bytes."""
    kind = draw(st.sampled_from(["mutate", "json", "text", "bytes", "deep", "huge"]))
    if kind == "json":
        return json.dumps(draw(json_values))
    if kind == "text":
        return draw(st.text(max_size=200))
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    if kind == "deep":
        depth = draw(st.integers(1, 50_000))
        return "[" * depth + "]" * draw(st.integers(0, depth))
    if kind == "huge":
        return json.dumps({**VALID_INVOKE, "toolName": "x" * draw(st.integers(0, 2_000_000))})
    frame: dict[str, Any] = dict(draw(st.sampled_from(VALID_FRAMES)))
    for key in draw(st.lists(st.sampled_from(sorted(frame)), max_size=3)):
        if draw(st.booleans()):
            frame.pop(key, None)
        else:
            frame[key] = draw(json_values)
    return json.dumps(frame)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(frames=st.lists(broken_frames(), min_size=1, max_size=5))
def test_no_frame_crashes_the_core(frames: list[str | bytes]) -> None:
    link = Link(Session(make_registry(), client_id="p"), Clock())
    link.open()
    for data in frames:
        link.send_raw(data)  # must not raise
        sent, events = link.sent(), link.session.events()
        try:
            protocol.parse_server_frame(data)
        except protocol.FrameError as exc:
            # A refused frame yields nothing, or invalid_request for a readable invoke id.
            assert events == []
            for frame in sent:
                assert frame["type"] == "cf_agent_client_tool_result"
                assert frame["error"]["code"] == "invalid_request"
                assert exc.frame_type == "cf_agent_client_tool_invoke"
                assert frame["requestId"] == exc.request_id
        for run in events:
            if isinstance(run, RunTool):
                link.session.tool_returned(run.request_id, run_sync(run))
        link.sent()
    link.session.tick(link.clock.advance(1000))


# --- the call lifecycle table ----------------------------------------------------------


S, E = CallState, CallEvent
#: The call lifecycle as the protocol describes it, written out independently of
#: CALL_TRANSITIONS: every step a call may take, and where it lands.
LIFECYCLE: dict[tuple[CallState, CallEvent], CallState] = {
    (S.RECEIVED, E.ACCEPT): S.RUNNING,
    (S.RECEIVED, E.REJECT): S.FAILED,
    (S.RUNNING, E.RETURN): S.COMPLETED,
    (S.RUNNING, E.RETURN_UNUSABLE): S.FAILED,
    (S.RUNNING, E.RAISE): S.FAILED,
    (S.RUNNING, E.RUN_CANCELLED): S.FAILED,
    (S.RUNNING, E.CANCEL): S.CANCELLED,
    (S.RUNNING, E.EXPIRE): S.TIMED_OUT,
    **{
        (answered, event): answered
        for answered in (S.CANCELLED, S.TIMED_OUT)
        for event in (E.RETURN, E.RETURN_UNUSABLE, E.RAISE, E.RUN_CANCELLED, E.CANCEL)
    },
}


@pytest.mark.parametrize("state", list(CallState))
@pytest.mark.parametrize("event", list(CallEvent))
def test_every_step_of_the_lifecycle(state: CallState, event: CallEvent) -> None:
    call = ToolCall("r1", tool_call_id="c1", tool_name="add", attempt=1, state=state)
    expected = LIFECYCLE.get((state, event))
    if expected is None:
        with pytest.raises(LocalProtocolError):
            next_call_state(state, event)
        with pytest.raises(LocalProtocolError):
            call.step(event)
        assert call.state is state  # a refused step changes nothing
    else:
        assert next_call_state(state, event) is expected
        assert call.step(event) is expected and call.state is expected


def test_final_states_have_no_exits_and_nothing_returns_to_received() -> None:
    assert CALL_TRANSITIONS[CallState.COMPLETED] == {}
    assert CALL_TRANSITIONS[CallState.FAILED] == {}
    targets = {t for table in CALL_TRANSITIONS.values() for t in table.values()}
    assert CallState.RECEIVED not in targets
    for state in (CallState.CANCELLED, CallState.TIMED_OUT):
        assert set(CALL_TRANSITIONS[state].values()) == {state}, "no way back once answered"


def test_misused_api_raises_local_protocol_error(link: Link) -> None:
    with pytest.raises(LocalProtocolError):
        link.session.tool_returned("never-started", 1)
    link.invoke("r1", "slow", {"seconds": 1})
    link.runs()
    link.session.tool_returned("r1", "done")
    with pytest.raises(LocalProtocolError):
        link.session.tool_raised("r1", RuntimeError("twice"))


OPERATIONS = st.lists(
    st.tuples(
        st.sampled_from(
            ["invoke", "cancel", "return", "raise", "cancelled", "tick", "drop", "open", "ack"]
        ),
        st.sampled_from(["r1", "r2", "r3"]),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(operations=OPERATIONS)
def test_random_lifecycles_keep_exactly_once(
    operations: list[tuple[str, str]],
) -> None:
    clock = Clock()
    link = Link(Session(make_registry(), client_id="p"), clock)
    link.open()
    alive: set[str] = set()  # runs the "adapter" owns
    results: dict[str, set[str]] = {}
    for op, rid in operations:
        if op == "invoke":
            link.invoke(rid, "slow", {"seconds": 1}, timeoutMs=1000)
        elif op == "cancel":
            link.send("cf_agent_client_tool_cancel", requestId=rid, reason="aborted")
        elif op == "tick":
            link.session.tick(clock.advance(0.6))
        elif op == "drop":
            link.drop()
        elif op == "open":
            link.open()
        elif op == "ack":
            link.ack(rid)
        elif rid in alive:
            alive.discard(rid)
            if op == "return":
                link.session.tool_returned(rid, "ok")
            elif op == "raise":
                link.session.tool_raised(rid, RuntimeError("no"))
            else:
                link.session.tool_cancelled(rid)
        for event in link.session.events():
            if isinstance(event, RunTool):
                assert event.request_id not in alive, "C7: never two runs of one request"
                assert event.request_id not in results, "C7: never run again once answered"
                alive.add(event.request_id)
        for frame in link.sent():
            if frame["type"] == "cf_agent_client_tool_result":
                results.setdefault(frame["requestId"], set()).add(json.dumps(frame))
        assert set(link.session.running_request_ids()) == alive
    for rid, distinct in results.items():
        assert len(distinct) == 1, f"{rid}: every copy of a result is the same result"


# --- backoff ---------------------------------------------------------------------------


def test_backoff_first_try_within_a_second_and_capped() -> None:
    class Highest(random.Random):
        def random(self) -> float:
            return 0.999999

    delays = backoff(rng=Highest())
    first = [next(delays) for _ in range(10)]
    assert first[0] < 1.0
    assert first[:6] == pytest.approx([1, 2, 4, 8, 16, 30], rel=1e-5)
    assert max(first) < 30.0


def test_backoff_is_full_jitter() -> None:
    rng = random.Random(7)
    samples = [d for _ in range(200) for d in _take(backoff(rng=rng), 8)]
    late = [d for i, d in enumerate(samples) if i % 8 == 7]  # the 8th delay: ceiling 30 s
    assert min(late) < 3.0 and max(late) > 27.0, "spread over [0, ceiling), not bunched near it"
    assert all(0 <= d < 30 for d in samples)


def _take(delays: Iterator[float], n: int) -> list[float]:
    return [next(delays) for _ in range(n)]


# --- import purity ---------------------------------------------------------------------


@pytest.mark.parametrize("module", ["clienttools.session", "clienttools.protocol"])
def test_core_modules_do_no_io(module: str) -> None:
    roots = {name.split(".")[0] for name in imports_of(module)}
    assert not roots & IO_MODULES


def test_session_reaches_asyncio_only_through_the_tool_context() -> None:
    """context.py may import asyncio (ToolContext.progress yields to the loop); nothing else may."""
    found = io_imports_reachable("clienttools.session", {"clienttools.context": {"asyncio"}})
    assert {module: roots for module, roots in found.items() if roots} == {}
    reached = {"clienttools.session", "clienttools.protocol", "clienttools.tools"}
    assert reached | {"clienttools.context", "clienttools.rules"} <= set(found)
