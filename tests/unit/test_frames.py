"""Frame strategies: valid frames always parse; mutated ones parse or raise FrameError, no other."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError

from clienttools import frames
from clienttools.protocol import (
    CLIENT_FRAME_TYPES,
    SERVER_FRAME_TYPES,
    ClientFrame,
    FrameError,
    ServerFrame,
    describe_validation_error,
    dump_frame,
    parse_client_frame,
    parse_server_frame,
)
from tests.support.frames import (
    MUTATIONS,
    mutated_frames,
    valid_client_frames,
    valid_server_frames,
)

# Seeded (derandomize) and database-free: the same examples on every run and every machine.
FUZZ = settings(
    max_examples=300,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
PER_KIND = settings(FUZZ, max_examples=15)


@FUZZ
@given(valid_client_frames())
def test_valid_client_frames_parse_and_round_trip(wire: str) -> None:
    frame = parse_client_frame(wire)
    assert frame.type in CLIENT_FRAME_TYPES
    assert dump_frame(frame) == wire


@FUZZ
@given(valid_server_frames())
def test_valid_server_frames_parse_and_round_trip(wire: str) -> None:
    frame = parse_server_frame(wire)
    assert frame.type in SERVER_FRAME_TYPES
    assert dump_frame(frame) == wire


def parsed_or_refused(
    wire: str | bytes, parse: Callable[[str | bytes], Any], known_types: frozenset[str]
) -> Any:
    """Parse ``wire``; either way, check what a receiver relies on. The frame, or None."""
    raw = _json_or_none(wire)
    try:
        frame = parse(wire)
    except FrameError as exc:
        assert exc.message and str(exc) == exc.message
        if exc.request_id is not None:  # C13: the refusal can be answered, to that request
            assert isinstance(raw, dict) and exc.request_id == raw.get("requestId")
        if exc.frame_type is not None:
            assert isinstance(raw, dict) and exc.frame_type == raw.get("type")
        return None
    # Only a JSON object of a known type is a frame; it can be sent on as it was parsed.
    assert isinstance(raw, dict) and raw["type"] in known_types and frame.type == raw["type"]
    assert parse(dump_frame(frame)) == frame
    if "request_id" in type(frame).model_fields:
        assert frame.request_id == raw.get("requestId")
    return frame


@FUZZ
@given(mutated_frames(valid_client_frames()))
def test_mutated_client_frames_parse_or_raise_frame_error(wire: str | bytes) -> None:
    parsed_or_refused(wire, parse_client_frame, CLIENT_FRAME_TYPES)


@FUZZ
@given(mutated_frames(valid_server_frames()))
def test_mutated_server_frames_parse_or_raise_frame_error(wire: str | bytes) -> None:
    parsed_or_refused(wire, parse_server_frame, SERVER_FRAME_TYPES)


def _json_or_none(wire: str | bytes) -> object:
    if isinstance(wire, bytes):
        return None
    try:
        return json.loads(wire)
    except (ValueError, RecursionError):
        return None


def _depth(text: str) -> int:
    depth = best = 0
    for ch in text:
        if ch in "[{":
            depth += 1
            best = max(best, depth)
        elif ch in "]}":
            depth -= 1
    return best


# What each kind must really produce, so a strategy bug cannot silently test nothing.
SHAPE = {
    "binary": lambda w: isinstance(w, bytes),
    "non_object": lambda w: isinstance(w, str) and not isinstance(json.loads(w), dict),
    "deep_nesting": lambda w: isinstance(w, str) and _depth(w) >= 2,
    "huge_string": lambda w: isinstance(w, str) and len(w) >= 17_000,
    "invalid_json": lambda w: isinstance(w, str),
    "unicode": lambda w: isinstance(w, str),
    "wrong_type": lambda w: isinstance(_json_or_none(w), dict),
    "missing_field": lambda w: isinstance(_json_or_none(w), dict),
    "extra_field": lambda w: isinstance(_json_or_none(w), dict),
    "unknown_type": lambda w: isinstance(_json_or_none(w), dict),
}


@pytest.mark.parametrize("kind", MUTATIONS)
@PER_KIND
@given(data=st.data())
def test_each_mutation_kind(kind: str, data: st.DataObject) -> None:
    wire = data.draw(mutated_frames(valid_server_frames(), kinds=[kind]))
    assert SHAPE[kind](wire)
    parsed_or_refused(wire, parse_server_frame, SERVER_FRAME_TYPES)


@PER_KIND
@given(mutated_frames(valid_client_frames(), kinds=["missing_field", "wrong_type"]))
def test_structural_mutations_parse_only_what_still_fits(wire: str | bytes) -> None:
    # Not every such mutation is refused (a missing optional field is fine); which ones
    # must be is the deterministic test below. What is accepted is still a frame.
    parsed_or_refused(wire, parse_client_frame, CLIENT_FRAME_TYPES)


@PER_KIND
@given(mutated_frames(valid_client_frames(), kinds=["unknown_type"]))
def test_an_unknown_type_is_always_refused(wire: str | bytes) -> None:
    raw = json.loads(wire)
    with pytest.raises(FrameError, match="unknown frame type") as refused:
        parse_client_frame(wire)
    assert refused.value.frame_type == raw["type"]


# The smallest valid frame of each client type: its required fields, and a result's
# output (a result carries exactly one of output or error; any JSON value is an output).
MINIMAL_CLIENT_FRAMES: dict[str, dict[str, object]] = {
    "cf_agent_client_tools": {"clientId": "page", "tools": []},
    "cf_agent_client_tool_result": {"requestId": "r1", "output": None},
    "cf_agent_client_tool_progress": {"requestId": "r1", "progress": 0.5},
    "cf_agent_tool_approval": {"toolCallId": "c1", "approved": True},
    "cf_agent_pong": {"t": 1.0},
    "send": {"requestId": "r1", "id": "chat", "messages": []},
    "resume": {"requestId": "r1", "id": "chat"},
    "abort": {"requestId": "r1"},
    "cf_agent_chat_subscribe": {"id": "chat"},
    "cf_agent_chat_clear": {"id": "chat"},
}
# A value of another JSON kind than the field's: strict models take none of them.
OTHER_KIND = {str: 7, float: "1.5", bool: "true", list: {}, dict: []}


def _required_aliases(frame_type: str) -> set[str]:
    [model] = [
        m for m in vars(frames).values()
        if isinstance(m, type) and issubclass(m, frames.WireModel) and m is not frames.WireModel
        and "type" in m.model_fields and m.model_fields["type"].default == frame_type
    ]  # fmt: skip
    return {f.alias or n for n, f in model.model_fields.items() if f.is_required()}


@pytest.mark.parametrize("frame_type", sorted(CLIENT_FRAME_TYPES))
def test_a_required_field_missing_or_of_another_kind_is_refused(frame_type: str) -> None:
    base = MINIMAL_CLIENT_FRAMES[frame_type]
    assert set(base) - {"output"} == _required_aliases(frame_type)
    parse_client_frame(json.dumps({"type": frame_type, **base}))
    for field, value in base.items():
        without = {"type": frame_type, **{k: v for k, v in base.items() if k != field}}
        with pytest.raises(FrameError, match=field):
            parse_client_frame(json.dumps(without))
        if value is None:
            continue  # any JSON value is an output
        wrong = {"type": frame_type, **base, field: OTHER_KIND[type(value)]}
        with pytest.raises(FrameError, match=field):
            parse_client_frame(json.dumps(wrong))


def test_mutated_frames_accepts_a_fixed_base_and_rejects_unknown_kinds() -> None:
    with pytest.raises(ValueError):
        mutated_frames('{"type":"cf_agent_ping","t":1}', kinds=["nope"])
    assert set(SHAPE) == set(MUTATIONS)


# Each frame is validated by the model its `type` names, not by the side's discriminated
# union (so the first frame makes one model's validator, not the side's all): the same
# frames, the same errors, word for word, as the union gives.
_UNIONS = {
    parse_client_frame: TypeAdapter(ClientFrame),
    parse_server_frame: TypeAdapter(ServerFrame),
}


def _check_as_the_union(parse: Callable[[str | bytes], object], wire: str | bytes) -> None:
    try:
        frame = parse(wire)
    except FrameError as exc:
        if not exc.message.startswith("invalid "):
            return  # refused before validation (not JSON, unknown type, ...): no model ran
        raw = json.loads(wire)
        with pytest.raises(ValidationError) as union_error:
            _UNIONS[parse].validate_python(raw, by_alias=True)
        expected = describe_validation_error(union_error.value, skip=1)
        assert exc.message == f"invalid {raw['type']!r} frame: {expected}"
    else:
        assert frame == _UNIONS[parse].validate_python(json.loads(wire), by_alias=True)


@FUZZ
@given(st.one_of(valid_client_frames(), mutated_frames(valid_client_frames())))
def test_client_frames_validate_as_their_union_does(wire: str | bytes) -> None:
    _check_as_the_union(parse_client_frame, wire)


@FUZZ
@given(st.one_of(valid_server_frames(), mutated_frames(valid_server_frames())))
def test_server_frames_validate_as_their_union_does(wire: str | bytes) -> None:
    _check_as_the_union(parse_server_frame, wire)
