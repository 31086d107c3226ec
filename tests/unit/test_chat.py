"""The sans-I/O chat core and its asyncio facade (rule C14)."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import MISSING

from clienttools import protocol
from clienttools.chat import (
    TOOL_STATE_ORDER,
    TOOL_TRANSITIONS,
    ChatResponseError,
    ChatState,
    MessageBuilder,
    TextPart,
    ToolPart,
    ToolPartState,
    UIMessage,
    chunk_type,
)
from clienttools.chatclient import Chat
from clienttools.partial_json import parse_partial_json
from clienttools.rules import LocalProtocolError
from tests.support.imports import io_imports_reachable

CORPUS = Path(__file__).resolve().parents[1] / "chat_streams"


def corpus(name: str) -> list[dict[str, Any]]:
    chunks: list[dict[str, Any]] = json.loads((CORPUS / f"{name}.json").read_text())["chunks"]
    return chunks


def counter(prefix: str = "id") -> Callable[[], str]:
    numbers = itertools.count(1)
    return lambda: f"{prefix}-{next(numbers)}"


def from_server(frame: dict[str, Any]) -> protocol.ChatServerFrame:
    """A chat frame from the server, parsed as `Session` hands it to the chat."""
    parsed = protocol.parse_server_frame(json.dumps(frame))
    assert isinstance(parsed, protocol.ChatServerFrame)
    return parsed


def wire(frame: protocol.WireModel) -> dict[str, Any]:
    """A frame the chat sends, as the JSON that goes out."""
    sent: dict[str, Any] = json.loads(protocol.dump_frame(frame))
    return sent


def chunk_frame(request_id: str, sequence: int, chunk: dict[str, Any]) -> protocol.ChatServerFrame:
    return from_server(
        {"type": "chunk", "requestId": request_id, "sequence": sequence, "chunk": chunk}
    )


def read(value: str) -> str:
    """Reads a property again after a mutation, past mypy's narrowing of the earlier read."""
    return value


def build(chunks: list[dict[str, Any]], message_id: str = "m") -> MessageBuilder:
    builder = MessageBuilder(message_id)
    for chunk in chunks:
        builder.apply(chunk)
    return builder


# --------------------------------------------------------------------------
# The transition table.

ALL_STATES: tuple[ToolPartState, ...] = tuple(TOOL_STATE_ORDER)
SELF_LOOPS = {
    ("input-streaming", "tool-input-delta"),
    ("output-available", "tool-output-available"),
}


def test_table_covers_every_state() -> None:
    assert set(TOOL_TRANSITIONS) == {None, *ALL_STATES}


def test_table_never_moves_backwards() -> None:
    for state, events in TOOL_TRANSITIONS.items():
        for event, target in events.items():
            if state is None:
                continue
            rank, new_rank = TOOL_STATE_ORDER[state], TOOL_STATE_ORDER[target]
            if (state, event) in SELF_LOOPS:
                assert target == state
            else:
                assert new_rank > rank, (state, event, target)


def test_outputs_are_terminal() -> None:
    assert TOOL_TRANSITIONS["output-error"] == {}
    assert TOOL_TRANSITIONS["output-denied"] == {}
    assert dict(TOOL_TRANSITIONS["output-available"]) == {
        "tool-output-available": "output-available"
    }


TIA = {"type": "tool-input-available", "toolCallId": "c", "toolName": "t", "input": {"x": 1}}
REQUEST = {"type": "tool-approval-request", "approvalId": "a", "toolCallId": "c"}
GRANT = {"type": "tool-approval-response", "approvalId": "a", "approved": True}
DENY = {"type": "tool-approval-response", "approvalId": "a", "approved": False}

#: A chunk sequence that leaves tool call "c" in each state.
REACH: dict[ToolPartState, list[dict[str, Any]]] = {
    "input-streaming": [{"type": "tool-input-start", "toolCallId": "c", "toolName": "t"}],
    "input-available": [TIA],
    "approval-requested": [TIA, REQUEST],
    "approval-responded": [TIA, REQUEST, GRANT],
    "output-available": [TIA, {"type": "tool-output-available", "toolCallId": "c", "output": 1}],
    "output-error": [TIA, {"type": "tool-output-error", "toolCallId": "c", "errorText": "boom"}],
    "output-denied": [TIA, REQUEST, DENY, {"type": "tool-output-denied", "toolCallId": "c"}],
}

#: One chunk per tool event.
EVENTS: dict[str, dict[str, Any]] = {
    "tool-input-start": {"type": "tool-input-start", "toolCallId": "c", "toolName": "t"},
    "tool-input-delta": {"type": "tool-input-delta", "toolCallId": "c", "inputTextDelta": "{"},
    "tool-input-available": TIA,
    "tool-input-error": {
        "type": "tool-input-error",
        "toolCallId": "c",
        "toolName": "t",
        "input": {},
        "errorText": "bad",
    },
    "tool-approval-request": {**REQUEST, "approvalId": "a2"},
    "tool-approval-response": GRANT,
    "tool-output-available": {"type": "tool-output-available", "toolCallId": "c", "output": 2},
    "tool-output-error": {"type": "tool-output-error", "toolCallId": "c", "errorText": "x"},
    "tool-output-denied": {"type": "tool-output-denied", "toolCallId": "c"},
}


@pytest.mark.parametrize("event", EVENTS)
@pytest.mark.parametrize("state", ALL_STATES)
def test_every_transition(state: ToolPartState, event: str) -> None:
    builder = build(REACH[state])
    part = builder.tool_part("c")
    assert part is not None and part.state == state
    not_applied_before = builder.refused + builder.ignored
    builder.apply(EVENTS[event])
    expected = TOOL_TRANSITIONS[state].get(event)
    if (state, event) == ("output-available", "tool-output-available"):
        expected = None  # only a preliminary output may be replaced
    if event == "tool-input-delta" and state == "input-streaming":
        assert part.input == {} and part.raw_input == "{"  # repaired like the AI SDK
    assert part.state == (expected or state)
    assert builder.message.tool_parts == [part]  # never a second part for the call
    if expected is None:  # refused by the table, or ignored: no such approval / open input
        assert builder.refused + builder.ignored == not_applied_before + 1


@pytest.mark.parametrize("event", ["tool-input-start", "tool-input-available", "tool-input-error"])
def test_events_that_create_a_part(event: str) -> None:
    builder = build([EVENTS[event]])
    [part] = builder.message.tool_parts
    assert part.state == TOOL_TRANSITIONS[None][event]


@pytest.mark.parametrize(
    "event",
    [
        "tool-input-delta",
        "tool-approval-request",
        "tool-approval-response",
        "tool-output-available",
        "tool-output-error",
        "tool-output-denied",
    ],
)
def test_events_for_an_unknown_call_are_ignored(event: str) -> None:
    builder = build([EVENTS[event]])
    assert builder.message.parts == []
    assert builder.ignored + builder.refused == 1


def test_preliminary_output_is_replaced_by_the_final_one() -> None:
    builder = build(
        [
            TIA,
            {"type": "tool-output-available", "toolCallId": "c", "output": 1, "preliminary": True},
            {"type": "tool-output-available", "toolCallId": "c", "output": 2},
            {"type": "tool-output-available", "toolCallId": "c", "output": 3},
        ]
    )
    part = builder.tool_part("c")
    assert part is not None and part.output == 2 and part.preliminary is None
    assert builder.refused == 1


def test_chat_state_counts_what_it_did_not_apply() -> None:
    state = make_state()
    state.begin_request("r1", "hi")
    feed(state, "r1", [*REACH["output-available"], TIA, {"type": "bogus"}])
    assert (state.refused_transitions, state.ignored_chunks) == (1, 1)
    assert state.messages[-1].tool_parts[0].state == "output-available"


def test_late_input_does_not_undo_an_output() -> None:
    builder = build(REACH["output-available"] + [TIA, EVENTS["tool-input-start"]])
    part = builder.tool_part("c")
    assert part is not None and part.state == "output-available" and part.output == 1
    assert builder.refused == 2


# --------------------------------------------------------------------------
# Text, reasoning, other parts.


def test_text_streams_then_is_done() -> None:
    builder = MessageBuilder("m")
    assert builder.apply({"type": "text-start", "id": "t"})
    assert builder.apply({"type": "text-delta", "id": "t", "delta": "Hel"})
    assert builder.apply({"type": "text-delta", "id": "t", "delta": "lo"})
    [part] = builder.message.parts
    assert isinstance(part, TextPart) and part.state == "streaming" and part.text == "Hello"
    assert builder.apply({"type": "text-end", "id": "t"})
    assert read(part.state) == "done" and builder.message.text == "Hello"


def test_repeated_text_start_does_not_duplicate() -> None:
    builder = build(
        [
            {"type": "text-start", "id": "t"},
            {"type": "text-delta", "id": "t", "delta": "a"},
            {"type": "text-start", "id": "t"},
            {"type": "text-end", "id": "t"},
            {"type": "text-start", "id": "t"},
        ]
    )
    assert [p.type for p in builder.message.parts] == ["text"]
    assert builder.message.text == "a" and builder.ignored == 2


def test_a_text_id_may_return_in_a_new_step() -> None:
    builder = build(corpus("multi_step_reused_text_id"))
    texts = [p.text for p in builder.message.parts if isinstance(p, TextPart)]
    assert texts == ["Checking.", "Found three."]


@pytest.mark.parametrize(
    "chunk",
    [
        {"type": "text-delta", "id": "nope", "delta": "x"},
        {"type": "text-end", "id": "nope"},
        {"type": "reasoning-delta", "id": "nope", "delta": "x"},
        {"type": "reasoning-end", "id": "nope"},
        {"type": "reset-step"},
    ],
)
def test_chunks_without_their_part_are_ignored(chunk: dict[str, Any]) -> None:
    builder = build([chunk])
    assert builder.message.parts == [] and builder.ignored == 1


@pytest.mark.parametrize(
    "chunk",
    [
        None,
        "text-start",
        [],
        {},
        {"type": 3},
        {"type": "bogus"},
        {"type": "text-start"},
        {"type": "text-start", "id": 1},
        {"type": "text-delta", "id": "t", "delta": None},
        {"type": "start", "messageId": None},
        {"type": "tool-input-available", "toolCallId": "c", "toolName": "t"},
        {"type": "tool-output-available", "toolCallId": "c"},
        {"type": "tool-approval-response", "approvalId": "a", "approved": "yes"},
        {"type": "tool-input-start", "toolCallId": "c", "toolName": "t", "inputEncoding": "xml"},
        {"type": "finish", "finishReason": "because"},
        {"type": "data-x"},
        {"type": "message-metadata"},
        {"type": "error", "errorText": True},
    ],
)
def test_invalid_chunks_are_ignored(chunk: Any) -> None:
    assert chunk_type(chunk) is None
    builder = build([chunk])
    assert builder.message.parts == [] and builder.ignored == 1


def test_valid_chunk_types() -> None:
    assert chunk_type({"type": "tool-input-available", "toolCallId": "c", "toolName": "t",
                       "input": None}) == "tool-input-available"  # fmt: skip
    assert chunk_type({"type": "data-x", "data": None}) == "data-x"
    assert chunk_type({"type": "text-delta", "id": "t", "delta": "", "extra": 1}) == "text-delta"


def test_metadata_merges_deeply() -> None:
    builder = build(corpus("metadata_and_finish_reason"))
    assert builder.message.metadata == {
        "model": "m1",
        "usage": {"input": 5, "output": 2},
        "tags": ["b"],
        "done": True,
    }
    assert builder.finish_reason == "length"


def test_data_parts_update_by_id_and_skip_transient() -> None:
    builder = build(corpus("reasoning_sources_files_data"))
    data = {p.type: p for p in builder.message.parts if p.type.startswith("data-")}
    assert set(data) == {"data-weather", "data-note"}
    assert data["data-weather"].model_dump()["data"] == {"status": "done", "tempC": 20}
    assert data["data-note"].model_dump() == {"type": "data-note", "data": None}


def test_null_output_survives_the_wire() -> None:
    builder = build(corpus("tool_null_output"))
    wire = builder.message.to_wire()
    assert wire["parts"][1]["output"] is None and "errorText" not in wire["parts"][1]
    again = UIMessage.model_validate(wire)
    assert again.to_wire() == wire and again.tool_parts[0].output is None


def test_parts_parse_from_the_wire() -> None:
    wire = {
        "id": "m",
        "role": "assistant",
        "parts": [
            {
                "type": "dynamic-tool",
                "toolName": "x",
                "toolCallId": "c",
                "state": "input-available",
                "input": {},
            },
            {
                "type": "tool-y",
                "toolCallId": "d",
                "state": "output-denied",
                "input": 1,
                "approval": {"id": "a", "approved": False},
                "future": [1],
            },
            {"type": "custom", "kind": "p.t"},
            {"type": "steering-message", "id": "s", "parts": [{"type": "text", "text": "hi"}]},
            {"type": "something-new", "value": None},
        ],
    }
    message = UIMessage.model_validate(wire)
    assert message.to_wire() == wire
    dynamic, static = message.tool_parts
    assert (dynamic.name, dynamic.dynamic, static.name, static.dynamic) == ("x", True, "y", False)
    with pytest.raises(ValueError):
        ToolPart(type="dynamic-tool", tool_call_id="c", state="input-available")


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("", MISSING),
        ("{", {}),
        ('{"a": 1', {"a": 1}),
        ('{"a": "b', {"a": "b"}),
        ('{"a": [1, tr', {"a": [1, True]}),
        ('{"a": nu', {"a": None}),
        ("[1, 2.", [1, 2]),
        ('"ab\\u00', "ab"),
        ("NaN", MISSING),
    ],
)
def test_partial_json(text: str, value: Any) -> None:
    got = parse_partial_json(text)
    assert got is MISSING if value is MISSING else got == value


# --------------------------------------------------------------------------
# ChatState: the request lifecycle.


def make_state() -> ChatState:
    return ChatState(chat_id="chat-1", id_factory=counter())


def feed(state: ChatState, request_id: str, chunks: list[dict[str, Any]], start: int = 0) -> None:
    for sequence, chunk in enumerate(chunks, start):
        state.receive(chunk_frame(request_id, sequence, chunk))


def test_begin_request_returns_the_send_frame() -> None:
    state = make_state()
    frame = wire(state.begin_request("r1", "Hello?"))
    assert frame == {
        "type": "send",
        "requestId": "r1",
        "id": "chat-1",
        "trigger": "submit-message",
        "messages": [{"id": "id-1", "role": "user", "parts": [{"type": "text", "text": "Hello?"}]}],
        "headers": {},
        "body": {},
    }
    assert state.status == "submitted" and state.active and state.request_id == "r1"
    assert state.last_sequence is None
    with pytest.raises(LocalProtocolError):
        state.begin_request("r2", "again")


def test_second_request_carries_the_history() -> None:
    state = make_state()
    state.begin_request("r1", "one")
    feed(state, "r1", corpus("plain_text"))
    state.receive(from_server({"type": "end", "requestId": "r1"}))
    frame = wire(
        state.begin_request("r2", "two", body={"k": 1}, headers={"h": "v"}, metadata={"x": 1})
    )
    assert [m["role"] for m in frame["messages"]] == ["user", "assistant", "user"]
    assert frame["messages"][1]["parts"][1]["text"] == "Hello, world."
    assert (frame["body"], frame["headers"], frame["metadata"]) == ({"k": 1}, {"h": "v"}, {"x": 1})


def test_clear_starts_a_fresh_conversation() -> None:
    state = make_state()
    state.begin_request("r1", "one")
    with pytest.raises(LocalProtocolError):
        state.clear()  # not while a response is in flight
    feed(state, "r1", corpus("plain_text"))
    state.receive(from_server({"type": "end", "requestId": "r1"}))
    chat_id = state.chat_id
    state.clear()
    assert state.messages == [] and state.response_message is None
    frame = wire(state.begin_request("r2", "two"))
    assert [m["role"] for m in frame["messages"]] == ["user"] and frame["id"] == chat_id


def test_status_submitted_streaming_ready() -> None:
    state = make_state()
    state.begin_request("r1", "hi")
    assert not state.receive(from_server({"type": "start", "requestId": "r1"}))
    assert read(state.status) == "submitted"
    assert [m.role for m in state.messages] == ["user"]
    assert state.receive(chunk_frame("r1", 0, {"type": "start"}))  # status changed
    assert read(state.status) == "streaming"
    assert [m.role for m in state.messages] == ["user"]  # nothing to show yet
    feed(state, "r1", corpus("one_tool_call")[1:], start=1)
    assert read(state.status) == "streaming" and state.last_sequence == 10
    assert state.receive(from_server({"type": "end", "requestId": "r1"}))
    assert state.status == "ready" and not state.active and state.last_sequence is None
    assert [m.role for m in state.messages] == ["user", "assistant"]
    assert state.messages[-1] is state.response_message


@pytest.mark.parametrize(
    "name", ["one_tool_call", "parallel_tool_calls", "approval_granted", "tool_input_streaming"]
)
def test_status_stays_streaming_while_tools_run(name: str) -> None:
    state = make_state()
    state.begin_request("r1", "hi")
    for sequence, chunk in enumerate(corpus(name)):
        state.receive(chunk_frame("r1", sequence, chunk))
        assert state.status == "streaming", chunk
    state.receive(from_server({"type": "end", "requestId": "r1"}))
    assert state.status == "ready"


def test_frames_for_other_requests_are_ignored() -> None:
    state = make_state()
    state.begin_request("r1", "hi")
    for frame in [
        chunk_frame("other", 0, {"type": "text-start", "id": "t"}),
        from_server({"type": "end", "requestId": "other"}),
        from_server({"type": "error", "requestId": "other"}),
        from_server({"type": "no-active", "requestId": "other"}),
    ]:
        assert not state.receive(frame)
    assert state.status == "submitted" and state.ignored_frames == 4


@pytest.mark.parametrize(
    "frame",
    [
        {"type": "end"},
        {"type": 1, "requestId": "r1"},
        {"type": "surprise", "requestId": "r1"},
        {"type": "chunk", "requestId": "r1", "sequence": -1, "chunk": {"type": "start"}},
        {"type": "chunk", "requestId": "r1", "sequence": True, "chunk": {"type": "start"}},
        {"type": "chunk", "requestId": "r1", "sequence": "0", "chunk": {"type": "start"}},
        {"type": "error", "requestId": "r1", "errorText": 5},
        "not a frame",
        None,
    ],
)
def test_malformed_chat_frames_never_reach_the_chat(frame: object) -> None:
    """Session parses every frame with protocol.py; these stop there (C13)."""
    with pytest.raises(protocol.FrameError):
        protocol.parse_server_frame(json.dumps(frame))


def test_duplicate_and_out_of_order_chunks() -> None:
    chunks = corpus("text_many_deltas")
    state = make_state()
    state.begin_request("r1", "hi")
    order = [0, 1, 4, 3, 2, 2, 5, 0, 6, 6, 8, 7, 9, 10, 3]
    for sequence in order:
        state.receive(chunk_frame("r1", sequence, chunks[sequence]))
    assert state.last_sequence == 10
    state.receive(from_server({"type": "end", "requestId": "r1"}))
    assert state.messages[-1].to_wire() == build(chunks, "id-2").message.to_wire()


def test_buffer_is_bounded() -> None:
    state = ChatState(id_factory=counter(), max_buffered_chunks=2)
    state.begin_request("r1", "hi")
    for sequence in (5, 6, 7):
        state.receive(chunk_frame("r1", sequence, {"type": "start"}))
    assert state.ignored_frames == 1 and state.last_sequence is None


def test_end_with_a_gap_still_applies_what_came() -> None:
    state = make_state()
    state.begin_request("r1", "hi")
    state.receive(chunk_frame("r1", 0, {"type": "text-start", "id": "t"}))
    state.receive(chunk_frame("r1", 2, {"type": "text-delta", "id": "t", "delta": "late"}))
    assert state.messages[-1].text == ""
    state.receive(from_server({"type": "end", "requestId": "r1"}))
    assert state.messages[-1].text == "late" and state.status == "ready"


def test_resume_mid_stream_does_not_duplicate() -> None:
    chunks = corpus("one_tool_call")
    state = make_state()
    state.begin_request("r1", "hi")
    feed(state, "r1", chunks[:5])
    assert state.status == "streaming" and state.last_sequence == 4
    frame = wire(state.begin_resume("r2"))
    assert frame == {
        "type": "resume",
        "requestId": "r2",
        "id": "chat-1",
        "lastSequence": 4,
        "headers": {},
        "body": {},
    }
    assert state.status == "streaming"  # no flicker across the reconnect
    assert not state.receive(chunk_frame("r1", 5, chunks[5]))  # the old request is gone
    feed(state, "r2", chunks[2:], start=2)  # the server replays a little too much
    state.receive(from_server({"type": "end", "requestId": "r2"}))
    assert read(state.status) == "ready"
    assert [m.role for m in state.messages] == ["user", "assistant"]
    assert state.messages[-1].to_wire() == build(chunks).message.to_wire() | {"id": "msg-1"}
    assert state.ignored_chunks == 0 and state.refused_transitions == 0


def test_resume_with_explicit_sequence_and_full_replay() -> None:
    chunks = corpus("plain_text")
    state = make_state()
    state.begin_request("r1", "hi")
    feed(state, "r1", chunks[:3])
    assert state.begin_resume("r2").last_sequence == 2
    frame = wire(state.begin_resume("r3", last_sequence=0))  # ask for more than needed
    assert frame["lastSequence"] == 0
    feed(state, "r3", chunks)  # everything again, from 0
    state.receive(from_server({"type": "end", "requestId": "r3"}))
    assert state.messages[-1].text == "Hello, world."
    assert len(state.messages) == 2


def test_resume_without_a_response_rebuilds_in_place() -> None:
    chunks = corpus("plain_text")
    first = make_state()
    first.begin_request("r1", "hi")
    feed(first, "r1", chunks[:4])
    # A new page with the same history resumes whatever is streaming.
    state = ChatState(chat_id="chat-1", id_factory=counter("new"), messages=first.messages)
    frame = wire(state.begin_resume("r9"))
    assert "lastSequence" not in frame and state.status == "submitted"
    feed(state, "r9", chunks)
    state.receive(from_server({"type": "end", "requestId": "r9"}))
    assert [m.role for m in state.messages] == ["user", "assistant"]
    assert state.messages[-1].text == "Hello, world."


def test_no_active_answer_to_resume() -> None:
    state = make_state()
    state.begin_resume("r1")
    assert state.receive(from_server({"type": "no-active", "requestId": "r1"}))
    assert state.status == "ready" and not state.active and state.messages == []


def test_abort() -> None:
    state = make_state()
    assert state.abort() is None
    state.begin_request("r1", "hi")
    feed(state, "r1", corpus("abort_mid_text")[:4])
    abort = state.abort()
    assert abort is not None and wire(abort) == {"type": "abort", "requestId": "r1"}
    assert state.status == "ready" and not state.active
    assert not state.receive(chunk_frame("r1", 4, {"type": "abort"}))
    assert not state.receive(from_server({"type": "end", "requestId": "r1"}))
    assert state.messages[-1].text == "Once upon"
    state.begin_request("r2", "again")  # a new request is allowed at once


def test_error_frame() -> None:
    state = make_state()
    state.begin_request("r1", "hi")
    feed(state, "r1", corpus("plain_text")[:3])
    assert state.receive(
        from_server({"type": "error", "requestId": "r1", "errorText": "rate limited"})
    )
    assert (state.status, state.error, state.active) == ("error", "rate limited", False)
    state.begin_request("r2", "again")
    assert state.error is None and state.status == "submitted"
    state.receive(from_server({"type": "error", "requestId": "r2"}))
    assert state.error == "The chat server returned an error."


def test_error_chunk_keeps_streaming_until_end() -> None:
    state = make_state()
    state.begin_request("r1", "hi")
    chunks = corpus("error_chunk")
    feed(state, "r1", chunks)
    assert state.status == "streaming" and state.error == "model overloaded"
    state.receive(from_server({"type": "end", "requestId": "r1"}))
    assert read(state.status) == "error" and state.error == "model overloaded"


def test_fail_when_the_request_could_not_be_sent() -> None:
    state = make_state()
    assert not state.fail("x")
    state.begin_request("r1", "hi")
    assert state.fail("socket closed")
    assert (state.status, state.error, state.active) == ("error", "socket closed", False)


def test_respond_approval() -> None:
    chunks = corpus("approval_granted_no_echo")
    state = make_state()
    state.begin_request("r1", "hi")
    feed(state, "r1", chunks[:4])
    [pending] = state.pending_approvals
    assert pending.tool_call_id == "call-1" and pending.state == "approval-requested"
    with pytest.raises(LocalProtocolError):
        state.respond_approval("call-404", True)
    frame = wire(state.respond_approval("call-1", True, "looks fine"))
    assert frame == {
        "type": "cf_agent_tool_approval",
        "toolCallId": "call-1",
        "approved": True,
        "reason": "looks fine",
    }
    assert read(pending.state) == "approval-responded" and state.pending_approvals == []
    assert pending.approval is not None and pending.approval.approved is True
    with pytest.raises(LocalProtocolError):
        state.respond_approval("call-1", False)  # already answered
    feed(state, "r1", chunks[4:], start=4)
    state.receive(from_server({"type": "end", "requestId": "r1"}))
    part = state.messages[-1].tool_parts[0]
    assert part.state == "output-available" and part.approval is not None
    assert part.approval.model_dump() == {
        "id": "appr-1",
        "approved": True,
        "requestReason": "sends mail",
        "reason": "looks fine",
        "signature": "sig",
    }


def test_respond_approval_denied_without_reason() -> None:
    state = make_state()
    state.begin_request("r1", "hi")
    feed(state, "r1", corpus("approval_denied")[:4])
    assert wire(state.respond_approval("call-1", False)) == {
        "type": "cf_agent_tool_approval",
        "toolCallId": "call-1",
        "approved": False,
    }
    state.receive(chunk_frame("r1", 4, {"type": "tool-output-denied", "toolCallId": "call-1"}))
    assert state.messages[-1].tool_parts[0].state == "output-denied"


def test_respond_approval_in_an_earlier_message() -> None:
    state = make_state()
    state.begin_request("r1", "hi")
    feed(state, "r1", corpus("approval_denied")[:4])
    state.receive(
        from_server({"type": "end", "requestId": "r1"})
    )  # the response paused for approval
    state.respond_approval("call-1", True)
    assert state.messages[-1].tool_parts[0].state == "approval-responded"


def test_core_does_no_io() -> None:
    """The chat core, everything it imports included, lazy imports too: no asyncio, no js."""
    found = io_imports_reachable("clienttools.chat")
    assert {module: roots for module, roots in found.items() if roots} == {}
    core = {"clienttools.chat", "clienttools.message_builder", "clienttools.partial_json"}
    assert core | {"clienttools.uimessage", "clienttools.protocol"} <= set(found)


# --------------------------------------------------------------------------
# Hypothesis: no ordering or duplication moves anything backwards.

TOOL_CHUNKS = [
    {"type": "tool-input-start", "toolCallId": "c1", "toolName": "a"},
    {"type": "tool-input-delta", "toolCallId": "c1", "inputTextDelta": '{"k":'},
    {"type": "tool-input-delta", "toolCallId": "c1", "inputTextDelta": " 1}"},
    {"type": "tool-input-available", "toolCallId": "c1", "toolName": "a", "input": {"k": 1}},
    {"type": "tool-approval-request", "approvalId": "p1", "toolCallId": "c1"},
    {"type": "tool-approval-response", "approvalId": "p1", "approved": True},
    {"type": "tool-output-available", "toolCallId": "c1", "output": "ok", "preliminary": True},
    {"type": "tool-output-available", "toolCallId": "c1", "output": "done"},
    {"type": "tool-output-error", "toolCallId": "c1", "errorText": "e"},
    {"type": "tool-output-denied", "toolCallId": "c1"},
    {"type": "tool-input-available", "toolCallId": "c2", "toolName": "b", "input": {}},
    {"type": "tool-input-error", "toolCallId": "c3", "toolName": "c", "input": 1, "errorText": "x"},
    {"type": "tool-output-available", "toolCallId": "c2", "output": None},
    {"type": "text-start", "id": "t"},
    {"type": "text-delta", "id": "t", "delta": "x"},
    {"type": "text-end", "id": "t"},
    {"type": "start-step"},
]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(TOOL_CHUNKS), max_size=40))
def test_tool_states_never_move_backwards(chunks: list[dict[str, Any]]) -> None:
    builder = MessageBuilder("m")
    seen: dict[str, int] = {}
    for chunk in chunks:
        builder.apply(chunk)
        for part in builder.message.tool_parts:
            rank = TOOL_STATE_ORDER[part.state]
            assert rank >= seen.get(part.tool_call_id, 0)
            seen[part.tool_call_id] = rank
    ids = [p.tool_call_id for p in builder.message.tool_parts]
    assert len(ids) == len(set(ids))
    step_text_ids = sum(1 for p in builder.message.parts if p.type == "text")
    assert step_text_ids <= 1 + sum(1 for p in builder.message.parts if p.type == "step-start")
    UIMessage.model_validate(builder.message.to_wire())  # always a valid message


STREAM_NAMES = sorted(p.stem for p in CORPUS.glob("*.json"))


@st.composite
def deliveries(draw: st.DrawFn) -> tuple[str, list[int]]:
    """A corpus stream and an order of delivery: every index at least once."""
    name = draw(st.sampled_from(STREAM_NAMES))
    count = len(corpus(name))
    order = draw(st.permutations(range(count)))
    extra = draw(st.lists(st.integers(0, count - 1), max_size=count))
    positions = draw(st.lists(st.integers(0, count), min_size=len(extra), max_size=len(extra)))
    result = list(order)
    for value, at in zip(extra, positions, strict=True):
        result.insert(at, value)
    return name, result


@settings(max_examples=150, deadline=None)
@given(deliveries())
def test_any_delivery_order_builds_the_same_message(case: tuple[str, list[int]]) -> None:
    name, order = case
    chunks = corpus(name)
    state = ChatState(id_factory=lambda: "m")
    state.begin_request("r", "hi")
    for sequence in order:
        state.receive(chunk_frame("r", sequence, chunks[sequence]))
        # Chunks ahead of a gap wait; once one applies, the status stays put.
        assert state.status == ("streaming" if state.last_sequence is not None else "submitted")
    assert state.status == "streaming"
    state.receive(from_server({"type": "end", "requestId": "r"}))
    message = state.response_message
    assert message is not None
    assert message.to_wire() == build(chunks, "m").message.to_wire()


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(STREAM_NAMES), st.data())
def test_resume_replay_with_overlap_builds_the_same_message(name: str, data: st.DataObject) -> None:
    chunks = corpus(name)
    cut = data.draw(st.integers(0, len(chunks)), label="cut")
    replay_from = data.draw(st.integers(0, cut), label="replay_from")
    state = ChatState(id_factory=lambda: "m")
    state.begin_request("r1", "hi")
    feed(state, "r1", chunks[:cut])
    status_before = state.status
    frame = wire(state.begin_resume("r2"))
    assert frame.get("lastSequence") == (cut - 1 if cut else None)
    assert state.status == status_before  # a reconnect never flickers the status
    feed(state, "r2", chunks[replay_from:], start=replay_from)
    state.receive(from_server({"type": "end", "requestId": "r2"}))
    message = state.response_message
    assert message is not None
    assert message.to_wire() == build(chunks, "m").message.to_wire()
    assert sum(1 for m in state.messages if m.role == "assistant") == (1 if chunks else 0)


# --------------------------------------------------------------------------
# The asyncio facade, with a fake socket.


class FakeSocket:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.fail = False

    async def send(self, text: str) -> None:
        if self.fail:
            raise ConnectionError("socket closed")
        self.sent.append(json.loads(text))


@pytest.fixture
def socket() -> FakeSocket:
    return FakeSocket()


@pytest.fixture
def chat(socket: FakeSocket) -> Chat:
    return Chat(socket.send, chat_id="chat-1", id_factory=counter())


async def until_sent(socket: FakeSocket, count: int) -> dict[str, Any]:
    for _ in range(100):
        if len(socket.sent) >= count:
            return socket.sent[count - 1]
        await asyncio.sleep(0)
    raise AssertionError(f"only {len(socket.sent)} frames sent")


def play(chat: Chat, request_id: str, chunks: list[dict[str, Any]], start: int = 0) -> None:
    chat.feed(from_server({"type": "start", "requestId": request_id}))
    for sequence, chunk in enumerate(chunks, start):
        chat.feed(chunk_frame(request_id, sequence, chunk))


async def test_send_returns_the_finished_message(chat: Chat, socket: FakeSocket) -> None:
    statuses: list[str] = []
    chat.on_change(lambda c: statuses.append(c.status))
    task = asyncio.create_task(chat.send("Weather?"))
    frame = await until_sent(socket, 1)
    assert frame["type"] == "send" and frame["messages"][0]["parts"][0]["text"] == "Weather?"
    assert chat.status == "submitted"
    play(chat, frame["requestId"], corpus("one_tool_call"))
    assert not task.done()
    chat.feed(from_server({"type": "end", "requestId": frame["requestId"]}))
    message = await task
    assert message.text == "It is 18 °C and cloudy in Paris." and message.id == "msg-1"
    assert chat.messages[-1] is message and read(chat.status) == "ready"
    assert statuses[0] == "submitted" and statuses[-1] == "ready"
    assert set(statuses[1:-1]) == {"streaming"}  # no flicker while the tool ran


async def test_stream_yields_snapshots(chat: Chat, socket: FakeSocket) -> None:
    chunks = corpus("text_many_deltas")

    async def server() -> None:
        frame = await until_sent(socket, 1)
        play(chat, frame["requestId"], chunks)
        chat.feed(from_server({"type": "end", "requestId": frame["requestId"]}))

    task = asyncio.create_task(server())
    snapshots = [s async for s in chat.stream("go")]
    await task
    texts = [s.text for s in snapshots]
    assert texts[-1] == "The quick brown fox jumps."
    assert texts == sorted(texts, key=len)  # grows, never shrinks
    assert len({json.dumps(s.to_wire()) for s in snapshots}) == len(snapshots)  # every one new
    assert snapshots[-1] == chat.messages[-1] and snapshots[-1] is not chat.messages[-1]


async def test_stream_raises_on_error(chat: Chat, socket: FakeSocket) -> None:
    async def server() -> None:
        frame = await until_sent(socket, 1)
        play(chat, frame["requestId"], corpus("plain_text")[:4])
        chat.feed(
            from_server({"type": "error", "requestId": frame["requestId"], "errorText": "boom"})
        )

    task = asyncio.create_task(server())
    seen: list[UIMessage] = []
    with pytest.raises(ChatResponseError) as info:
        async for snapshot in chat.stream("go"):
            seen.append(snapshot)
    await task
    assert info.value.error_text == "boom" and seen
    assert info.value.message is not None and info.value.message.text == "Hello, world."


async def test_send_raises_on_error(chat: Chat, socket: FakeSocket) -> None:
    task = asyncio.create_task(chat.send("x"))
    frame = await until_sent(socket, 1)
    chat.feed(from_server({"type": "error", "requestId": frame["requestId"]}))
    with pytest.raises(ChatResponseError, match="returned an error"):
        await task
    assert chat.status == "error"


async def test_stop_sends_abort_and_send_returns_partial(chat: Chat, socket: FakeSocket) -> None:
    task = asyncio.create_task(chat.send("tell me a story"))
    frame = await until_sent(socket, 1)
    play(chat, frame["requestId"], corpus("abort_mid_text")[:5])
    await chat.stop()
    assert socket.sent[-1] == {"type": "abort", "requestId": frame["requestId"]}
    message = await task
    assert message.text == "Once upon a time" and chat.status == "ready"
    await chat.stop()  # nothing in flight: no frame
    assert len(socket.sent) == 2


async def test_respond_sends_the_approval(chat: Chat, socket: FakeSocket) -> None:
    task = asyncio.create_task(chat.send("delete it"))
    frame = await until_sent(socket, 1)
    chunks = corpus("approval_granted_no_echo")
    play(chat, frame["requestId"], chunks[:4])
    assert [p.tool_call_id for p in chat.pending_approvals] == ["call-1"]
    await chat.respond("call-1", True)
    assert socket.sent[-1] == {
        "type": "cf_agent_tool_approval",
        "toolCallId": "call-1",
        "approved": True,
    }
    assert chat.pending_approvals == []
    for sequence, chunk in enumerate(chunks[4:], 4):
        chat.feed(chunk_frame(frame["requestId"], sequence, chunk))
    chat.feed(from_server({"type": "end", "requestId": frame["requestId"]}))
    assert (await task).tool_parts[0].state == "output-available"


async def test_reconnect_resumes_without_flicker(chat: Chat, socket: FakeSocket) -> None:
    chunks = corpus("parallel_tool_calls")
    statuses: list[str] = []
    unsubscribe = chat.on_change(lambda c: statuses.append(c.status))
    task = asyncio.create_task(chat.send("both"))
    frame = await until_sent(socket, 1)
    play(chat, frame["requestId"], chunks[:4])
    chat.connection_lost()
    assert chat.status == "streaming"
    await chat.connection_restored()
    subscribe, resume = socket.sent[-2:]
    assert subscribe == {"type": "cf_agent_chat_subscribe", "id": "chat-1"}
    assert resume["type"] == "resume" and resume["lastSequence"] == 3
    assert resume["requestId"] != frame["requestId"]
    play(chat, resume["requestId"], chunks[1:], start=1)  # overlapping replay
    chat.feed(from_server({"type": "end", "requestId": resume["requestId"]}))
    message = await task
    assert len(message.tool_parts) == 2 and message.text == "Cold, and it is 14:05."
    assert "ready" not in statuses[:-1] and statuses[-1] == "ready"
    unsubscribe()
    unsubscribe()  # twice is harmless
    sent = len(socket.sent)
    await chat.connection_restored()  # nothing in flight: only the subscribe
    assert socket.sent[sent:] == [{"type": "cf_agent_chat_subscribe", "id": "chat-1"}]


async def test_send_failure_ends_in_error(chat: Chat, socket: FakeSocket) -> None:
    socket.fail = True
    with pytest.raises(ConnectionError):
        await chat.send("x")
    assert chat.status == "error" and chat.error is not None and "socket closed" in chat.error
    await chat.stop()  # the abort cannot be sent either, and that is fine


async def test_one_response_at_a_time(chat: Chat, socket: FakeSocket) -> None:
    task = asyncio.create_task(chat.send("first"))
    await until_sent(socket, 1)
    with pytest.raises(LocalProtocolError):
        await chat.send("second")
    await chat.stop()
    await task


async def test_clear_forgets_the_messages_and_tells_the_callbacks(
    chat: Chat, socket: FakeSocket
) -> None:
    task = asyncio.create_task(chat.send("first"))
    frame = await until_sent(socket, 1)
    with pytest.raises(LocalProtocolError):
        chat.clear()
    chat.feed(from_server({"type": "end", "requestId": frame["requestId"]}))
    await task
    seen: list[int] = []
    chat.on_change(lambda c: seen.append(len(c.messages)))
    chat.clear()
    assert chat.messages == [] and seen == [0]
    await asyncio.sleep(0)  # the clear goes out without being awaited
    assert socket.sent[-1] == {"type": "cf_agent_chat_clear", "id": "chat-1"}


async def test_a_clear_reaches_the_server_before_the_send_after_it() -> None:
    """`clear(); await send(...)`: the server sees them in that order (else it refuses
    the clear, the response having started)."""

    class SlowSocket(FakeSocket):
        async def send(self, text: str) -> None:
            await asyncio.sleep(0)  # a socket whose send yields, as a real one may
            await super().send(text)

    slow = SlowSocket()
    chat = Chat(slow.send, chat_id="chat-1", id_factory=counter())

    async def server() -> None:
        await until_sent(slow, 2)
        (request,) = [f for f in slow.sent if f["type"] == "send"]
        chat.feed(from_server({"type": "end", "requestId": request["requestId"]}))

    answered = asyncio.create_task(server())
    chat.clear()
    await chat.send("fresh start")  # in this task, as a page writes it (not wrapped in one)
    await answered
    assert [f["type"] for f in slow.sent] == ["cf_agent_chat_clear", "send"]
    chat.clear()
    chat.clear()
    await chat.stop()  # nothing in flight: no frame, and the clears are not held back
    await until_sent(slow, 4)
    assert [f["type"] for f in slow.sent[2:]] == ["cf_agent_chat_clear"] * 2


async def test_a_clear_that_cannot_be_sent_is_logged_and_the_send_still_tried(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sent: list[str] = []

    async def send(text: str) -> None:
        if json.loads(text)["type"] == "cf_agent_chat_clear":
            raise ConnectionError("socket closed")
        sent.append(json.loads(text)["type"])

    chat = Chat(send, chat_id="chat-1", id_factory=counter())
    chat.clear()
    with pytest.raises(TimeoutError):  # the send went out; no server answers it here
        await asyncio.wait_for(chat.send("x"), 0.05)
    assert sent == ["send"] and "could not send cf_agent_chat_clear" in caplog.text


async def test_a_failing_callback_does_not_break_the_chat(
    chat: Chat, socket: FakeSocket, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(_: Chat) -> None:
        raise RuntimeError("ui bug")

    chat.on_change(broken)
    task = asyncio.create_task(chat.send("x"))
    frame = await until_sent(socket, 1)
    play(chat, frame["requestId"], corpus("plain_text"))
    chat.feed(from_server({"type": "end", "requestId": frame["requestId"]}))
    assert (await task).text == "Hello, world."
    assert "on_change callback failed" in caplog.text


async def test_resume_after_a_reload_replays_the_whole_response(
    chat: Chat, socket: FakeSocket
) -> None:
    task = asyncio.create_task(chat.resume())
    frame = await until_sent(socket, 1)
    assert frame["type"] == "resume" and frame["id"] == "chat-1"
    assert "lastSequence" not in frame  # a fresh page asks for everything
    play(chat, frame["requestId"], corpus("one_tool_call"))
    chat.feed(from_server({"type": "end", "requestId": frame["requestId"]}))
    message = await task
    assert message is not None and message.text == "It is 18 °C and cloudy in Paris."
    assert read(chat.status) == "ready"


async def test_resume_with_nothing_streaming_returns_none(chat: Chat, socket: FakeSocket) -> None:
    task = asyncio.create_task(chat.resume())
    frame = await until_sent(socket, 1)
    chat.feed(from_server({"type": "no-active", "requestId": frame["requestId"]}))
    assert await task is None
    assert read(chat.status) == "ready"


async def test_resume_refuses_while_a_response_runs(chat: Chat, socket: FakeSocket) -> None:
    task = asyncio.create_task(chat.send("hi"))
    await until_sent(socket, 1)
    with pytest.raises(LocalProtocolError):
        await chat.resume()
    await chat.stop()
    await task
