"""The MicroPython flavour's input validator gives pydantic's errors for the same schema.

Each case is a pydantic model (what a Pyodide tool's signature becomes) and the
JSON Schema a MicroPython tool would declare for it; for inputs that JSON
carries without coercion, both must report the same `type`, `loc` and `msg`.
"""

from __future__ import annotations

import json
import typing
from typing import Annotated, Any, Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from clienttools import protocol, rules
from clienttools.input_schema import input_errors


class Everything(BaseModel):
    model_config = ConfigDict(extra="forbid")
    s: str
    i: int
    f: float
    b: bool
    items: list[int]
    mapping: dict[str, int]
    color: Literal["red", "green", "blue"]
    level: Annotated[int, Field(ge=1, le=5)]
    ratio: Annotated[float, Field(gt=0, lt=10)]
    code: Annotated[str, Field(min_length=2, max_length=3)]
    word: Annotated[str, Field(min_length=1)]
    few: Annotated[list[int], Field(min_length=1, max_length=2)]
    maybe: str | None = None


SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "s": {"type": "string"},
        "i": {"type": "integer"},
        "f": {"type": "number"},
        "b": {"type": "boolean"},
        "items": {"type": "array", "items": {"type": "integer"}},
        "mapping": {"type": "object", "additionalProperties": {"type": "integer"}},
        "color": {"enum": ["red", "green", "blue"], "type": "string"},
        "level": {"type": "integer", "minimum": 1, "maximum": 5},
        "ratio": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 10},
        "code": {"type": "string", "minLength": 2, "maxLength": 3},
        "word": {"type": "string", "minLength": 1},
        "few": {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 2},
        "maybe": {"anyOf": [{"type": "string"}, {"type": "null"}]},
    },
    "required": [
        "s", "i", "f", "b", "items", "mapping", "color", "level", "ratio", "code", "word", "few",
    ],
}  # fmt: skip

VALID: dict[str, Any] = {
    "s": "x",
    "i": 1,
    "f": 1.5,
    "b": True,
    "items": [1],
    "mapping": {"k": 1},
    "color": "red",
    "level": 3,
    "ratio": 2.5,
    "code": "ab",
    "word": "w",
    "few": [1],
}

CASES: list[dict[str, Any]] = [
    {},
    {"s": [], "i": {}, "f": [], "b": [], "items": "q", "mapping": [], "color": "pink"},
    {"i": 1.5, "level": 0, "ratio": 0, "code": "a", "word": "", "few": []},
    {"level": 9, "ratio": 10, "code": "abcd", "few": [1, 2, 3], "items": [1, []]},
    {"mapping": {"k": []}, "maybe": 3, "extra": 1, "more": None},
    {"color": 1, "s": None},
]


def _pydantic_errors(data: dict[str, Any]) -> list[tuple[str, list[Any], str]]:
    try:
        Everything.model_validate(data)
    except ValidationError as exc:
        errors = json.loads(exc.json(include_url=False))
        return [(e["type"], e["loc"], e["msg"]) for e in errors]
    return []


@pytest.mark.parametrize("changes", CASES)
def test_same_errors_as_pydantic(changes: dict[str, Any]) -> None:
    data = {**VALID, **changes} if changes else {}
    ours = [(e["type"], e["loc"], e["msg"]) for e in input_errors(SCHEMA, data)]
    assert ours == _pydantic_errors(data)
    assert ours  # every case is invalid


def test_valid_input_passes() -> None:
    assert input_errors(SCHEMA, VALID) == []
    assert input_errors(SCHEMA, {**VALID, "maybe": None, "i": 2.0}) == []


def test_errors_carry_input_and_ctx_and_missing_has_no_input() -> None:
    errors = input_errors(SCHEMA, {**VALID, "level": 7, "code": None})
    assert errors[0] == {
        "type": "less_than_equal",
        "loc": ["level"],
        "msg": "Input should be less than or equal to 5",
        "input": 7,
        "ctx": {"le": 5},
    }
    missing = input_errors(SCHEMA, {})[0]
    assert missing == {"type": "missing", "loc": ["s"], "msg": "Field required"}


def test_json_schema_is_strict_where_pydantic_is_lax() -> None:
    # Documented difference: nothing is coerced (pydantic's lax mode takes "3" and True).
    errors = input_errors(SCHEMA, {**VALID, "i": "3", "f": True})
    assert [(e["loc"], e["type"]) for e in errors] == [(["i"], "int_type"), (["f"], "float_type")]


def test_message_is_the_pyodide_flavours() -> None:
    errors = input_errors(SCHEMA, {})
    message = rules.invalid_input_message("everything", errors)
    assert message.startswith("invalid input for tool 'everything': s: Field required; ")
    assert message.endswith("and 7 more")


def test_protocol_literals_spell_the_shared_codes() -> None:
    assert typing.get_args(protocol.ErrorCode) == rules.ERROR_CODES
    assert typing.get_args(protocol.CancelReason) == rules.CANCEL_REASONS
    assert typing.get_args(protocol.AckOutcome) == rules.ACK_OUTCOMES
