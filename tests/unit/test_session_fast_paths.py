"""The shortcuts Session takes on the per-invoke path give what the general code gives."""

from __future__ import annotations

import json

from clienttools.session import LIVENESS_FACTOR, OUTBOX_FORMAT_VERSION, Session
from clienttools.tools import ToolRegistry


def _session() -> Session:
    registry = ToolRegistry()

    @registry.tool
    def add(a: int, b: int) -> int:
        return a + b

    @registry.tool(timeout=5.0)
    def slow(a: int) -> int:
        return a

    return Session(registry, client_id="page", ping_interval=2.0)


def _invoke(request_id: str, tool: str = "add", **extra: object) -> str:
    frame = {
        "type": "cf_agent_client_tool_invoke",
        "requestId": request_id,
        "toolCallId": f"call-{request_id}",
        "toolName": tool,
        "input": {"a": 1, "b": 2} if tool == "add" else {"a": 1},
        **extra,
    }
    return json.dumps(frame)


def test_next_deadline_without_calls_is_the_liveness_limit() -> None:
    session = _session()
    assert session.next_deadline() is None  # not connected
    session.connection_opened(now=10.0)
    assert session.next_deadline() == 10.0 + LIVENESS_FACTOR * 2.0
    session.receive_frame('{"type": "cf_agent_ping", "t": 1}', now=11.0)
    assert session.next_deadline() == 11.0 + LIVENESS_FACTOR * 2.0
    session.tick(now=11.0 + LIVENESS_FACTOR * 2.0)  # silent too long: replace requested
    assert session.next_deadline() is None
    session.connection_lost(now=20.0)
    assert session.next_deadline() is None


def test_next_deadline_with_calls_still_counts_their_deadlines() -> None:
    session = _session()
    session.connection_opened(now=0.0)
    session.receive_frame(_invoke("r1", "slow"), now=1.0)
    assert session.next_deadline() == 1.0 + 5.0  # the call's limit, before liveness at 5.0+
    [run] = session.events()
    session.tool_returned(run.request_id, 1)
    assert session.next_deadline() == 1.0 + LIVENESS_FACTOR * 2.0


def test_export_of_an_empty_outbox_is_the_general_format() -> None:
    session = _session()
    empty = {"version": OUTBOX_FORMAT_VERSION, "results": []}
    assert session.export_outbox() == json.dumps(empty)
    session.connection_opened(now=0.0)
    session.receive_frame(_invoke("r1"), now=0.0)
    [run] = session.events()
    session.tool_returned(run.request_id, 3)
    assert json.loads(session.export_outbox())["results"][0]["requestId"] == "r1"
    session.receive_frame(
        '{"type": "cf_agent_client_tool_result_ack", "requestId": "r1", "outcome": "applied"}',
        now=0.1,
    )
    assert session.export_outbox() == json.dumps(empty)
    assert _session().restore_outbox(session.export_outbox()) == 0
