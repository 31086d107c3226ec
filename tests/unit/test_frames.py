"""Frame strategies: valid frames always parse; mutated ones parse or raise FrameError, no other."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError

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


@FUZZ
@given(mutated_frames(valid_client_frames()))
def test_mutated_client_frames_parse_or_raise_frame_error(wire: str | bytes) -> None:
    assert isinstance(wire, str | bytes)
    with contextlib.suppress(FrameError):
        parse_client_frame(wire)


@FUZZ
@given(mutated_frames(valid_server_frames()))
def test_mutated_server_frames_parse_or_raise_frame_error(wire: str | bytes) -> None:
    assert isinstance(wire, str | bytes)
    with contextlib.suppress(FrameError):
        parse_server_frame(wire)


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
    with contextlib.suppress(FrameError):
        parse_server_frame(wire)


@PER_KIND
@given(mutated_frames(valid_client_frames(), kinds=["missing_field", "wrong_type", "unknown_type"]))
def test_structural_mutations_are_mostly_refused(wire: str | bytes) -> None:
    # Not every mutation must fail (a missing optional field is fine), but the type
    # field is the most likely target, so these never crash and usually refuse.
    try:
        parse_client_frame(wire)
    except FrameError as exc:
        assert exc.message


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
