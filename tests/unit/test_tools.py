"""Tests of clienttools.tools: schemas, validation, calls, outputs, context, registry.

The JSON schemas generated for the sample tools in `SAMPLES` are compared with
the files in `tests/unit/snapshots/` (one `<tool name>.json` per sample: the
whole wire ToolSpec). After an intended change to schema generation, rewrite
them and review the diff:

    UPDATE_SNAPSHOTS=1 .venv/bin/pytest tests/unit/test_tools.py -q
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import enum
import functools
import inspect
import json
import math
import os
import re
import socket
import time
import types
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal, NotRequired, Optional

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field, JsonValue, ValidationError, field_validator
from typing_extensions import TypedDict  # pydantic needs this one on Python < 3.12

from clienttools import protocol
from clienttools.function_schema import parse_docstring
from clienttools.tools import (
    InvalidInput,
    InvalidOutput,
    Tool,
    ToolContext,
    ToolError,
    ToolRegistry,
    error_info,
)

SNAPSHOTS = Path(__file__).parent / "snapshots"
UPDATE_SNAPSHOTS = os.environ.get("UPDATE_SNAPSHOTS") == "1"


# --- sample types and tools (module level: their schemas are snapshotted) -----------


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


class Priority(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Point(BaseModel):
    """A point on the page, in CSS pixels."""

    x: float
    y: float = 0.0


class Shape(BaseModel):
    name: str
    points: list[Point]
    color: Color = Color.RED


@dataclasses.dataclass
class Size:
    width: int
    height: int = 1


class Filter(TypedDict):
    field: str
    value: str | int
    negate: NotRequired[bool]


def primitives(
    text: str, count: int, ratio: float, flag: bool, note: str | None = None, limit: int = 10
) -> str:
    """Exercise every JSON primitive.

    The second paragraph is not part of the description.

    Args:
        text: Some text.
        count: How many; described
            over two lines.
        ratio (float): A ratio, with the type in the docstring.
        flag: A switch.
        note: Optional note.

    Returns:
        Ignored by the schema.
    """
    return text


def nested_models(shape: Shape, origin: Point | None = None) -> Shape:
    """Take and return pydantic models (nested, so `$defs`)."""
    return shape


def dataclass_param(size: Size) -> Size:
    """Take and return a dataclass."""
    return size


def typed_dict_param(filters: list[Filter]) -> int:
    """Take a list of TypedDicts."""
    return len(filters)


def enums_and_literals(
    color: Color, priority: Priority = Priority.LOW, mode: Literal["fast", "exact"] = "fast"
) -> Color:
    """Take enums and a Literal."""
    return color


def annotated_fields(
    query: Annotated[str, Field(description="From Field, wins over the docstring", min_length=1)],
    page: Annotated[int, Field(ge=1, le=100)] = 1,
    tags: Annotated[list[str], Field(max_length=5)] | None = None,
) -> list[str]:
    """Constraints and descriptions from Annotated Field.

    Args:
        query: From the docstring, loses.
        page: From the docstring, used.
    """
    return []


async def with_context(ctx: ToolContext, steps: int = 3) -> int:
    """An async tool that takes a ToolContext (not in the schema)."""
    for step in range(1, steps + 1):
        await ctx.progress(step, steps)
    return steps


def no_parameters():  # type: ignore[no-untyped-def]
    """No parameters, no return annotation."""
    return None


def containers(
    ids: list[int],
    scores: dict[str, float],
    pair: tuple[int, str],
    unique: set[str],
    when: datetime.datetime,
    day: datetime.date,
    token: uuid.UUID,
) -> dict[str, list[int]]:
    """Containers and well-known string formats."""
    return {"ids": ids}


def awkward_names(json: int, schema: str = "", model_config: bool = False) -> None:
    """Parameter names that shadow BaseModel attributes still work."""


# One tool per docstring style, with the same parameters and the same words, so
# their snapshots differ only in the name.


def google_docstring(city: str, days: int = 3, units: Literal["C", "F"] = "C") -> str:
    """Forecast the weather for a city.

    The forecast comes from the page's own data.

    Args:
        city: The city to forecast, e.g.
            "Paris".
        days: How many days ahead.
        units (str): Celsius or Fahrenheit.

    Returns:
        A short forecast.
    """
    return city


def numpy_docstring(city: str, days: int = 3, units: Literal["C", "F"] = "C") -> str:
    """Forecast the weather for a city.

    The forecast comes from the page's own data.

    Parameters
    ----------
    city : str
        The city to forecast, e.g.
        "Paris".
    days : int, optional
        How many days ahead.
    units : {"C", "F"}
        Celsius or Fahrenheit.

    Returns
    -------
    str
        A short forecast.
    """
    return city


def sphinx_docstring(city: str, days: int = 3, units: Literal["C", "F"] = "C") -> str:
    """Forecast the weather for a city.

    The forecast comes from the page's own data.

    :param city: The city to forecast, e.g.
        "Paris".
    :param int days: How many days ahead.
    :param units: Celsius or Fahrenheit.
    :returns: A short forecast.
    """
    return city


SAMPLES: list[Callable[..., Any]] = [
    primitives,
    nested_models,
    dataclass_param,
    typed_dict_param,
    enums_and_literals,
    annotated_fields,
    with_context,
    no_parameters,
    containers,
    awkward_names,
    google_docstring,
    numpy_docstring,
    sphinx_docstring,
]


def make_tool(fn: Callable[..., Any], **options: Any) -> Tool:
    return ToolRegistry().add(fn, **options)


def spec_json(tool: Tool) -> dict[str, Any]:
    data: dict[str, Any] = tool.spec.model_dump(mode="json", by_alias=True, exclude_none=True)
    return data


def collect_progress() -> tuple[ToolContext, list[tuple[float, float | None, str | None]]]:
    reports: list[tuple[float, float | None, str | None]] = []
    ctx = ToolContext(
        request_id="r1",
        tool_call_id="c1",
        tool_name="t",
        attempt=2,
        report_progress=lambda p, t, m: reports.append((p, t, m)),
    )
    return ctx, reports


# --- schemas ------------------------------------------------------------------------


@pytest.mark.parametrize("fn", SAMPLES, ids=lambda fn: fn.__name__)
def test_schema_matches_snapshot(fn: Callable[..., Any]) -> None:
    actual = spec_json(make_tool(fn))
    path = SNAPSHOTS / f"{fn.__name__}.json"
    if UPDATE_SNAPSHOTS:
        SNAPSHOTS.mkdir(exist_ok=True)
        path.write_text(json.dumps(actual, indent=2, ensure_ascii=False) + "\n")
    assert path.exists(), f"no snapshot {path.name}; run with UPDATE_SNAPSHOTS=1"
    assert actual == json.loads(path.read_text())


def test_every_snapshot_has_a_sample() -> None:
    assert {p.stem for p in SNAPSHOTS.glob("*.json")} == {fn.__name__ for fn in SAMPLES}


@pytest.mark.parametrize("fn", SAMPLES, ids=lambda fn: fn.__name__)
def test_input_schema_shape(fn: Callable[..., Any]) -> None:
    schema = make_tool(fn).spec.input_schema
    assert schema["type"] == "object"
    assert schema["additionalProperties"] is False
    assert isinstance(schema["properties"], dict)
    assert isinstance(schema["required"], list)
    assert "title" not in schema
    json.dumps(schema, allow_nan=False)


def test_description_and_parameter_descriptions_from_docstring() -> None:
    tool = make_tool(primitives)
    assert tool.description == "Exercise every JSON primitive."
    props: Any = tool.spec.input_schema["properties"]
    assert props["text"]["description"] == "Some text."
    assert props["count"]["description"] == "How many; described over two lines."
    assert props["ratio"]["description"] == "A ratio, with the type in the docstring."
    assert "description" not in props["limit"]


def test_defaults_make_parameters_optional() -> None:
    schema = make_tool(primitives).spec.input_schema
    assert schema["required"] == ["text", "count", "ratio", "flag"]
    props: Any = schema["properties"]
    assert props["limit"]["default"] == 10
    assert props["note"]["default"] is None


def test_annotated_field_description_wins_over_docstring() -> None:
    props: Any = make_tool(annotated_fields).spec.input_schema["properties"]
    assert props["query"]["description"] == "From Field, wins over the docstring"
    assert props["query"]["minLength"] == 1
    assert props["page"]["description"] == "From the docstring, used."
    assert (props["page"]["minimum"], props["page"]["maximum"]) == (1, 100)


def test_field_as_default_value() -> None:
    def paged(
        page: int = Field(1, ge=1, description="From Field."),
        size: int = Field(default=20, le=50),
    ) -> int:
        """Pages.

        Args:
            page: Loses to the Field.
            size: Page size.
        """
        return page * size

    tool = make_tool(paged)
    assert tool.spec.input_schema["required"] == []
    assert tool.spec.input_schema["properties"] == {
        "page": {"default": 1, "description": "From Field.", "minimum": 1, "type": "integer"},
        "size": {"default": 20, "description": "Page size.", "maximum": 50, "type": "integer"},
    }
    assert tool.validate_input({}) == {"page": 1, "size": 20}
    with pytest.raises(InvalidInput, match="page: Input should be greater than or equal to 1"):
        tool.validate_input({"page": 0})


def test_nested_models_use_defs() -> None:
    schema = make_tool(nested_models).spec.input_schema
    defs: Any = schema["$defs"]
    assert set(defs) == {"Color", "Point", "Shape"}
    assert defs["Point"]["description"] == "A point on the page, in CSS pixels."


def test_output_schema_from_return_annotation() -> None:
    assert make_tool(primitives).spec.output_schema == {"type": "string"}
    nested = make_tool(nested_models).spec.output_schema
    assert nested is not None and nested["title"] == "Shape"
    assert set(nested["$defs"]) == {"Color", "Point"}  # type: ignore[arg-type]


def _returns_any(a: int) -> Any:
    return a


def _returns_object(a: int) -> object:
    return a


def _returns_none(a: int) -> None:
    return None


def _returns_optional(a: int) -> int | None:
    return None


@pytest.mark.parametrize("fn", [no_parameters, _returns_any, _returns_object, _returns_none])
def test_no_output_schema_when_unannotated_any_or_none(fn: Callable[..., Any]) -> None:
    assert make_tool(fn, name="t").spec.output_schema is None


def test_optional_return_keeps_its_schema() -> None:
    schema = make_tool(_returns_optional, name="t").spec.output_schema
    assert schema == {"anyOf": [{"type": "integer"}, {"type": "null"}]}


def test_spec_options() -> None:
    tool = make_tool(
        primitives, name="prim-2", description="Custom.", timeout=2.5, needs_approval=True
    )
    assert (tool.name, tool.description, tool.timeout, tool.needs_approval) == (
        "prim-2",
        "Custom.",
        2.5,
        True,
    )
    assert (tool.spec.name, tool.spec.description) == ("prim-2", "Custom.")
    assert (tool.spec.timeout_ms, tool.spec.needs_approval) == (2500, True)
    assert make_tool(primitives, timeout=0.0001).spec.timeout_ms == 1
    assert make_tool(primitives).spec.timeout_ms is None


@pytest.mark.parametrize("timeout", [0, -1.0, math.nan, math.inf])
def test_bad_timeout(timeout: float) -> None:
    with pytest.raises(ValueError, match="timeout must be a positive number"):
        make_tool(primitives, timeout=timeout)


def test_spec_frame_round_trips() -> None:
    registry = ToolRegistry()
    for fn in SAMPLES:
        registry.add(fn)
    frame = protocol.ClientToolsFrame(client_id="page", tools=registry.specs())
    again = protocol.parse_client_frame(protocol.dump_frame(frame))
    assert isinstance(again, protocol.ClientToolsFrame)
    assert again.tools == registry.specs()


def test_tools_frame_text_is_the_models_dump() -> None:
    registry = ToolRegistry()
    for fn in SAMPLES:
        registry.add(fn)
    registry.add(primitives, name="with-options", description="Ünïcode ✓", timeout=2.5)
    registry.add(primitives, name="approved", needs_approval=True, timeout=0.0001)
    for tool in registry:
        assert tool.wire_spec == spec_json(tool)
    expected = protocol.dump_frame(
        protocol.ClientToolsFrame(client_id="page-1", tools=registry.specs())
    )
    assert protocol.tools_frame_text("page-1", registry.wire_specs()) == expected


def test_tools_frame_text_refuses_what_the_model_refuses() -> None:
    specs = [make_tool(primitives).wire_spec]
    for client_id in ("", "x" * 257):
        with pytest.raises(ValidationError, match=r"client_id|clientId"):
            protocol.tools_frame_text(client_id, specs)
    assert json.loads(protocol.tools_frame_text("x" * 256, specs))["clientId"] == "x" * 256


@pytest.mark.parametrize("options", [{"description": 3}, {"needs_approval": 1}])
def test_a_spec_value_the_model_refuses_fails_at_registration(options: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        make_tool(primitives, **options)


def _signature_tool(params: list[tuple[str, Any, Any, str | None]], returns: Any) -> Any:
    """A function of keyword-only parameters (name, annotation, default, docstring entry)."""

    def fn(**kwargs: Any) -> Any:
        return 0

    fn.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=d) for n, _, d, _ in params]
    )
    fn.__annotations__ = {n: tp for n, tp, _, _ in params}
    if returns is not inspect.Parameter.empty:
        fn.__annotations__["return"] = returns
    described = [f"    {n}: {doc}" for n, _, _, doc in params if doc is not None]
    fn.__doc__ = "Summary.\n\nArgs:\n" + "\n".join(described) if described else "Summary."
    return fn


_EMPTY = inspect.Parameter.empty
_PLAIN_DEFAULTS = {int: 7, float: 2.5, bool: True, str: "x"}
_SIGNATURES = {
    "every plain kind": [
        (
            f"{tp.__name__}_{i}",
            tp,
            _PLAIN_DEFAULTS[tp] if i % 2 else _EMPTY,
            "Said." if i < 2 else None,
        )
        for tp in (int, float, bool, str)
        for i in range(4)
    ],
    "no parameters": [],
    "only defaults": [("a", int, 0, None), ("b", str, "", "Empty.")],
    "names pydantic models own": [("json", int, _EMPTY, None), ("schema", str, "s", None)],
    # Not plain: the model's schema is the schema, as before.
    "optional": [("a", int | None, None, None)],
    "list": [("a", list[int], _EMPTY, None)],
    "annotated": [("a", Annotated[int, Field(ge=0)], _EMPTY, None)],
    "field default": [("a", int, Field(3, ge=0), None)],
    "bool default for int": [("a", int, True, None)],
    "int default for float": [("a", float, 1, None)],
}


@pytest.mark.parametrize("returns", [_EMPTY, int, float, bool, str, None, list[int]], ids=repr)
@pytest.mark.parametrize("params", list(_SIGNATURES.values()), ids=list(_SIGNATURES))
def test_plain_signatures_have_the_schemas_pydantic_writes(
    params: list[tuple[str, Any, Any, str | None]], returns: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    fn = _signature_tool(params, returns)
    fast = make_tool(fn, name="t")
    arguments = {n: _PLAIN_DEFAULTS.get(tp, 1) for n, tp, d, _ in params if d is _EMPTY}
    fast_arguments = _validated(fast, arguments)
    # The same tool with pydantic making both schemas at registration.
    monkeypatch.setattr("clienttools.function_schema._plain_input_schema", lambda fields: None)
    monkeypatch.setattr("clienttools.function_schema._PLAIN_RETURNS", {})
    slow = make_tool(fn, name="t")
    assert fast.wire_spec == slow.wire_spec
    assert fast_arguments == _validated(slow, arguments)
    for value in (0, "3", 2.5, True, None, [1]):
        assert _dumped(fast, value) == _dumped(slow, value), value


def _validated(tool: Tool, arguments: dict[str, Any]) -> dict[str, Any] | str:
    try:
        return tool.validate_input(arguments)
    except InvalidInput as exc:
        return f"InvalidInput: {exc}"


def _dumped(tool: Tool, value: Any) -> str:
    try:
        return tool.dump_output_json(value)
    except InvalidOutput as exc:
        return f"InvalidOutput: {exc}"


def test_a_plain_signature_builds_its_model_on_the_first_invoke() -> None:
    tool = make_tool(_signature_tool([("a", int, _EMPTY, None)], int), name="t")
    assert tool._input_model is None
    with pytest.raises(InvalidInput, match="a"):
        tool.validate_input({"a": "not a number"})
    assert tool.input_model is tool._input_model is not None


def test_oversize_spec_is_refused() -> None:
    def huge(a: int) -> int:
        return a

    with pytest.raises(ValueError, match="over the 65536-byte limit"):
        make_tool(huge, description="x" * protocol.MAX_TOOL_SPEC_BYTES)


# --- docstrings ---------------------------------------------------------------------


def test_parse_docstring_variants() -> None:
    assert parse_docstring(None) == ("", {})
    assert parse_docstring("One line.") == ("One line.", {})
    assert parse_docstring("Wrapped\n    summary.\n\n    More.") == ("Wrapped summary.", {})
    assert parse_docstring("Args:\n    a: only args.") == ("", {"a": "only args."})
    assert parse_docstring("Args:\n        a: x\n            more\n    ") == ("", {"a": "x more"})
    assert parse_docstring("Sum.\n\nArgs:\n    a: x\nTrailing text.") == ("Sum.", {"a": "x"})
    doc = """Summary.

    Arguments:
        a (list[int]): first.
        *rest: splat.

            After a blank line.
        **opts: options.
    Returns:
        b: not an argument.
    """
    assert parse_docstring(doc) == (
        "Summary.",
        {"a": "first.", "rest": "splat. After a blank line.", "opts": "options."},
    )


def test_every_docstring_style_gives_the_same_schema() -> None:
    google, numpy, sphinx = (
        spec_json(make_tool(fn, name="forecast"))
        for fn in (google_docstring, numpy_docstring, sphinx_docstring)
    )
    assert google == numpy == sphinx
    assert google["description"] == "Forecast the weather for a city."
    props = google["inputSchema"]["properties"]
    assert props["city"]["description"] == 'The city to forecast, e.g. "Paris".'
    assert props["units"]["description"] == "Celsius or Fahrenheit."


def test_parse_docstring_of_each_style() -> None:
    expected = ("Sum.", {"a": "The first addend.", "b": "The second, over two lines."})
    google = """Sum.

    Args:
        a (int): The first addend.
        b: The second,
            over two lines.
    """
    numpy = """Sum.

    Parameters
    ----------
    a : int
        The first addend.
    b
        The second,
        over two lines.
    """
    sphinx = """Sum.

    :param int a: The first addend.
    :param b: The second,
        over two lines.
    :rtype: int
    """
    assert parse_docstring(google) == parse_docstring(numpy) == parse_docstring(sphinx) == expected


def test_docstring_without_readable_entries_keeps_its_summary() -> None:
    assert parse_docstring("Sum.\n\n    Args:\n    no entries") == ("Sum.", {})


def test_docstring_entries_for_missing_parameters_are_ignored() -> None:
    def f(a: int) -> int:
        """Doc.

        Args:
            a: exists.
            b: does not.
        """
        return a

    props: Any = make_tool(f).spec.input_schema["properties"]
    assert list(props) == ["a"]


def test_no_docstring_means_empty_description() -> None:
    def bare(a: int) -> int:
        return a

    assert make_tool(bare).description == ""


# --- decorator and registry ---------------------------------------------------------


def test_decorator_bare_returns_the_function_unchanged() -> None:
    registry = ToolRegistry()

    @registry.tool
    def double(a: int) -> int:
        """Double."""
        return 2 * a

    assert double(4) == 8
    tool = registry.get("double")
    assert tool is not None and tool.function is double


def test_decorator_with_arguments() -> None:
    registry = ToolRegistry()

    @registry.tool(name="times-three", description="Triple.", timeout=1, needs_approval=True)
    def triple(a: int) -> int:
        return 3 * a

    assert triple(2) == 6
    assert "triple" not in registry
    tool = registry.get("times-three")
    assert tool is not None
    assert (tool.description, tool.spec.timeout_ms, tool.needs_approval) == ("Triple.", 1000, True)


def test_registry_container_protocol() -> None:
    registry = ToolRegistry()
    first = registry.add(primitives)
    second = registry.add(nested_models)
    assert len(registry) == 2
    assert "primitives" in registry and "nope" not in registry
    assert list(registry) == [first, second]
    assert registry.specs() == [first.spec, second.spec]
    assert registry.get("nope") is None
    registry.remove("primitives")
    assert list(registry) == [second]
    with pytest.raises(KeyError, match="no tool named 'primitives'"):
        registry.remove("primitives")


def test_duplicate_name() -> None:
    registry = ToolRegistry()
    registry.add(primitives)
    with pytest.raises(ValueError, match="'primitives' is already registered; pass another name"):
        registry.add(primitives)
    registry.add(primitives, name="primitives_2")  # the same function under another name
    assert len(registry) == 2


@pytest.mark.parametrize("name", ["", "1abc", "a b", "x" * 65, "dot.ted", "ünï"])
def test_invalid_name(name: str) -> None:
    with pytest.raises(ValueError, match="is invalid: it must match"):
        make_tool(primitives, name=name)


def test_lambda_needs_a_name() -> None:
    with pytest.raises(ValueError, match=r"'<lambda>' is invalid.*pass a valid name"):
        make_tool(lambda: None)
    assert make_tool(lambda: None, name="noop").name == "noop"


def test_too_many_tools() -> None:
    registry = ToolRegistry()
    for i in range(protocol.MAX_TOOLS_PER_CONNECTION):
        registry.add(no_parameters, name=f"t{i}")
    with pytest.raises(ValueError, match="at most 128 tools"):
        registry.add(no_parameters, name="one_more")


def test_on_change_callbacks() -> None:
    registry = ToolRegistry()
    calls: list[str] = []
    unsubscribe = registry.on_change(lambda: calls.append(f"a{len(registry)}"))
    registry.on_change(lambda: calls.append(f"b{len(registry)}"))
    registry.add(primitives)
    assert calls == ["a1", "b1"]
    with pytest.raises(ValueError):
        registry.add(primitives)  # a failed add changes nothing and notifies no one
    registry.remove("primitives")
    assert calls == ["a1", "b1", "a0", "b0"]
    unsubscribe()
    unsubscribe()  # twice is harmless
    registry.add(primitives)
    assert calls[-1:] == ["b1"] and len(calls) == 5


def test_callback_may_unsubscribe_itself() -> None:
    registry = ToolRegistry()
    calls: list[int] = []

    def once() -> None:
        calls.append(1)
        unsubscribe()

    unsubscribe = registry.on_change(once)
    registry.on_change(lambda: calls.append(2))
    registry.add(primitives)
    registry.remove("primitives")
    assert calls == [1, 2, 2]


# --- unsupported functions ------------------------------------------------------------


class JsProxy:
    """Stands in for Pyodide's JsProxy: an arbitrary class pydantic cannot validate."""

    class constructor:  # mirrors the JS attribute
        name = "HTMLBodyElement"


def _star_args(*values: int) -> int:
    return 0


def _star_kwargs(**options: str) -> int:
    return 0


def _positional_only(a: int, /) -> int:
    return a


def _unannotated(a: int, b) -> int:  # type: ignore[no-untyped-def]
    return a


def _generator(a: int):  # type: ignore[no-untyped-def]
    yield a


async def _async_generator(a: int):  # type: ignore[no-untyped-def]
    yield a


def _unknown_param_type(node: JsProxy) -> None:
    pass


def _unknown_return_type(a: int) -> JsProxy:
    return JsProxy()


def _callable_param(callback: Callable[[int], int]) -> None:
    pass


def _two_contexts(a: ToolContext, b: ToolContext) -> None:
    pass


def _context_in_list(ctxs: list[ToolContext]) -> None:
    pass


def _unresolvable(a: NoSuchType) -> None:  # type: ignore[name-defined]  # noqa: F821
    pass


class _Class:
    def __init__(self, a: int) -> None:
        pass


@pytest.mark.parametrize(
    ("fn", "exc_type", "message"),
    [
        (_star_args, TypeError, r"\*values is not supported.*e\.g\. `values: list\[int\]`"),
        (_star_kwargs, TypeError, r"\*\*options is not supported.*`options: dict\[str, str\]`"),
        (_positional_only, TypeError, r"'a' is positional-only.*remove the `/`"),
        (_unannotated, TypeError, r"parameter 'b' has no type annotation; annotate it, e\.g\."),
        (_generator, TypeError, "generator functions are not supported; return a list"),
        (_async_generator, TypeError, "generator functions are not supported"),
        (_unknown_param_type, TypeError, r"parameter 'node' has type JsProxy.*use a JSON type"),
        (_unknown_return_type, TypeError, r"return type JsProxy is not supported.*remove"),
        (_callable_param, TypeError, r"parameter 'callback' has type .*Callable"),
        (_two_contexts, TypeError, "'a' and 'b' are both annotated ToolContext; keep one"),
        (_context_in_list, TypeError, "mixes ToolContext into.*annotate it `ctxs: ToolContext`"),
        (_unresolvable, TypeError, "name 'NoSuchType' is not defined; define the names"),
        (_Class, TypeError, r"must be a function \(def or async def\), got type"),
        (functools.partial(_positional_only, 1), TypeError, "wrap it in an annotated def"),
        (42, TypeError, "must be a function"),
    ],
    ids=lambda v: getattr(v, "__name__", None) if callable(v) else None,
)
def test_unsupported_functions(fn: Any, exc_type: type[Exception], message: str) -> None:
    registry = ToolRegistry()
    with pytest.raises(exc_type, match=message):
        registry.add(fn, name="t")
    assert len(registry) == 0


def test_unannotated_message_example() -> None:
    def add(a: int, b) -> int:  # type: ignore[no-untyped-def]
        return a + int(b)

    with pytest.raises(TypeError) as info:
        make_tool(add)
    assert str(info.value) == (
        "tool 'add': parameter 'b' has no type annotation; annotate it, e.g. `b: int`"
    )


# --- annotations that name locals ---------------------------------------------------


def test_locally_defined_types_resolve() -> None:
    class LocalModel(BaseModel):
        n: int

    registry = ToolRegistry()

    @registry.tool
    def local(m: LocalModel) -> LocalModel:
        return m

    tool = registry.get("local")
    assert tool is not None
    kwargs = tool.validate_input({"m": {"n": "2"}})
    assert kwargs == {"m": LocalModel(n=2)}
    assert tool.dump_output(tool.call(kwargs, None)) == {"n": 2}


def test_locals_resolve_through_wrappers() -> None:
    # A client's own `tool` method between the decorator and the registry must
    # not change which namespace the annotations resolve in.
    class Wrapped(BaseModel):
        n: int

    registry = ToolRegistry()

    def client_tool(fn: Callable[..., Any]) -> Callable[..., Any]:
        return registry.tool(fn)

    @client_tool
    def wrapped(w: Wrapped) -> int:
        return w.n

    assert "wrapped" in registry


def test_locals_of_a_finished_function_cannot_resolve() -> None:
    def factory() -> Callable[..., Any]:
        class Gone(BaseModel):
            n: int

        def late(g: Gone) -> int:
            return g.n

        return late

    with pytest.raises(TypeError, match=r"name 'Gone' is not defined.*before the tool"):
        make_tool(factory())


def test_bound_methods() -> None:
    class Counter:
        def __init__(self) -> None:
            self.total = 0

        def bump(self, by: int = 1) -> int:
            """Bump the counter."""
            self.total += by
            return self.total

    counter = Counter()
    tool = make_tool(counter.bump)
    assert tool.spec.input_schema["properties"] == {"by": {"default": 1, "type": "integer"}}
    assert tool.call(tool.validate_input({"by": 5}), None) == 5


def test_functools_wraps_decorated_functions() -> None:
    def logged(fn: Callable[..., int]) -> Callable[..., int]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> int:
            return fn(*args, **kwargs) + 1000

        return wrapper

    @logged
    def plus(a: int, b: int) -> int:
        """Plus."""
        return a + b

    tool = make_tool(plus)
    assert tool.spec.input_schema["required"] == ["a", "b"]
    assert tool.call(tool.validate_input({"a": 1, "b": 2}), None) == 1003


# --- context ------------------------------------------------------------------------


def _ctx_optional(a: int, ctx: ToolContext | None = None) -> str:
    return "none" if ctx is None else ctx.request_id


def _ctx_old_optional(ctx: Optional[ToolContext], a: int) -> str:  # noqa: UP045 (the spelling is the test)
    return "none" if ctx is None else ctx.tool_name


def _ctx_annotated(ctx: Annotated[ToolContext, "meta"], a: int) -> int:
    return ctx.attempt


@pytest.mark.parametrize(
    ("fn", "expected"),
    [(_ctx_optional, "r1"), (_ctx_old_optional, "t"), (_ctx_annotated, 2)],
)
def test_context_injected_and_left_out_of_schema(fn: Callable[..., Any], expected: Any) -> None:
    tool = make_tool(fn, name="t")
    assert tool.context_parameter == "ctx"
    schema = tool.spec.input_schema
    assert schema["properties"] == {"a": {"type": "integer"}}
    assert schema["required"] == ["a"]
    kwargs = tool.validate_input({"a": 1})
    assert kwargs == {"a": 1}
    ctx, _ = collect_progress()
    assert tool.call(kwargs, ctx) == expected


def test_context_is_not_an_input() -> None:
    tool = make_tool(_ctx_optional, name="t")
    with pytest.raises(InvalidInput, match="ctx: Extra inputs are not permitted"):
        tool.validate_input({"a": 1, "ctx": {}})


def test_context_properties_are_read_only() -> None:
    ctx, _ = collect_progress()
    assert (ctx.request_id, ctx.tool_call_id, ctx.tool_name, ctx.attempt) == ("r1", "c1", "t", 2)
    assert ctx.last_progress is None
    with pytest.raises(AttributeError):
        ctx.request_id = "other"  # type: ignore[misc]
    assert "request_id='r1'" in repr(ctx)


async def test_progress_reports_and_must_increase() -> None:
    ctx, reports = collect_progress()
    await ctx.progress(1)
    await ctx.progress(2.5, 10, "halfway")
    assert reports == [(1, None, None), (2.5, 10, "halfway")]
    assert ctx.last_progress == 2.5
    with pytest.raises(ValueError, match=r"strictly greater than the last reported value.*C10"):
        await ctx.progress(2.5)
    with pytest.raises(ValueError, match=r"got 1 after 2\.5"):
        await ctx.progress(1)
    with pytest.raises(ValueError, match="finite"):
        await ctx.progress(math.nan)
    with pytest.raises(ValueError, match="finite"):
        await ctx.progress(3, math.inf)
    assert len(reports) == 2  # refused reports are not sent
    await ctx.progress(3)
    assert reports[-1] == (3, None, None)


async def test_progress_yields_to_the_event_loop() -> None:
    ctx, _ = collect_progress()
    ran: list[bool] = []

    async def other() -> None:
        ran.append(True)

    task = asyncio.get_running_loop().create_task(other())
    await ctx.progress(1)
    assert ran == [True]  # the other task got its turn inside progress()
    await task


async def test_async_tool_with_progress() -> None:
    tool = make_tool(with_context)
    assert tool.is_async
    ctx, reports = collect_progress()
    coro = tool.call(tool.validate_input({"steps": 2}), ctx)
    assert asyncio.iscoroutine(coro)
    assert tool.dump_output(await coro) == 2
    assert reports == [(1, 2, None), (2, 2, None)]


def test_sync_tool_runs_inline() -> None:
    tool = make_tool(primitives)
    assert not tool.is_async
    kwargs = tool.validate_input({"text": "t", "count": 1, "ratio": 1, "flag": True})
    assert tool.call(kwargs, None) == "t"


def test_async_bound_method_is_async() -> None:
    class Box:
        async def fetch(self) -> int:
            return 1

    assert make_tool(Box().fetch).is_async


# --- input validation ---------------------------------------------------------------


def test_validate_applies_defaults_and_builds_models() -> None:
    tool = make_tool(nested_models)
    kwargs = tool.validate_input({"shape": {"name": "tri", "points": [{"x": 1}, {"x": 2, "y": 3}]}})
    assert kwargs == {
        "shape": Shape(name="tri", points=[Point(x=1), Point(x=2, y=3)]),
        "origin": None,
    }
    assert isinstance(kwargs["shape"].points[0], Point)


def test_validation_is_lax_like_json() -> None:
    tool = make_tool(containers)
    kwargs = tool.validate_input(
        {
            "ids": ["1", 2],
            "scores": {"a": 1},
            "pair": [1, "x"],
            "unique": ["a", "a"],
            "when": "2024-05-01T12:00:00Z",
            "day": "2024-05-01",
            "token": "12345678-1234-5678-1234-567812345678",
        }
    )
    assert kwargs["ids"] == [1, 2]
    assert kwargs["pair"] == (1, "x")
    assert kwargs["unique"] == {"a"}
    assert kwargs["when"] == datetime.datetime(2024, 5, 1, 12, tzinfo=datetime.UTC)
    assert kwargs["day"] == datetime.date(2024, 5, 1)
    assert isinstance(kwargs["token"], uuid.UUID)
    enums = make_tool(enums_and_literals).validate_input({"color": "green", "priority": 2})
    assert enums == {"color": Color.GREEN, "priority": Priority.HIGH, "mode": "fast"}
    size = make_tool(dataclass_param).validate_input({"size": {"width": 3}})
    assert size == {"size": Size(3, 1)}


def test_awkward_parameter_names_validate() -> None:
    tool = make_tool(awkward_names)
    assert tool.validate_input({"json": 1, "model_config": True}) == {
        "json": 1,
        "schema": "",
        "model_config": True,
    }


def test_mapping_input() -> None:
    tool = make_tool(dataclass_param)
    assert tool.validate_input(types.MappingProxyType({"size": {"width": 1}})) == {"size": Size(1)}


def _errors(tool: Tool, data: Any) -> InvalidInput:
    with pytest.raises(InvalidInput) as info:
        tool.validate_input(data)
    exc = info.value
    json.dumps(exc.errors, allow_nan=False)  # JSON-safe, as the wire needs
    assert all("url" not in err for err in exc.errors)
    assert str(exc).startswith(f"invalid input for tool {tool.name!r}: ")
    return exc


def test_missing_field() -> None:
    exc = _errors(make_tool(primitives), {"text": "t", "count": 1, "ratio": 1.0})
    assert exc.errors == [{"type": "missing", "loc": ["flag"], "msg": "Field required"}]
    assert str(exc) == "invalid input for tool 'primitives': flag: Field required"


def test_wrong_type() -> None:
    exc = _errors(make_tool(primitives), {"text": 1, "count": "x", "ratio": 1.0, "flag": True})
    assert [(e["loc"], e["type"], e["input"]) for e in exc.errors] == [
        (["text"], "string_type", 1),
        (["count"], "int_parsing", "x"),
    ]


def test_extra_field() -> None:
    exc = _errors(make_tool(dataclass_param), {"size": {"width": 1}, "colour": "red"})
    assert exc.errors == [
        {
            "type": "extra_forbidden",
            "loc": ["colour"],
            "msg": "Extra inputs are not permitted",
            "input": "red",
        }
    ]


def test_nested_error_locations() -> None:
    exc = _errors(make_tool(nested_models), {"shape": {"name": "s", "points": [{"x": "?"}]}})
    assert exc.errors[0]["loc"] == ["shape", "points", 0, "x"]
    assert "shape.points.0.x: Input should be a valid number" in str(exc)


def test_not_an_object() -> None:
    exc = _errors(make_tool(primitives), ["not", "a", "dict"])
    assert exc.errors[0]["type"] == "model_type"


def test_validator_exceptions_become_json_safe() -> None:
    class Even(BaseModel):
        n: int

        @field_validator("n")
        @classmethod
        def _even(cls, n: int) -> int:
            if n % 2:
                raise ValueError("must be even")
            return n

    def takes_even(e: Even) -> int:
        return e.n

    exc = _errors(make_tool(takes_even), {"e": {"n": 3}})
    assert exc.errors[0]["ctx"] == {"error": "must be even"}
    assert exc.errors[0]["msg"] == "Value error, must be even"


def test_non_finite_input_in_errors_stays_json() -> None:
    exc = _errors(make_tool(primitives), {"text": math.inf, "count": math.nan})
    assert [e["input"] for e in exc.errors[:2]] == ["Infinity", "NaN"]


def test_long_error_lists_are_summarized() -> None:
    def many(a: int, b: int, c: int, d: int, e: int, f: int, g: int) -> None:
        pass

    exc = _errors(make_tool(many), {})
    assert len(exc.errors) == 7
    assert str(exc).endswith("and 2 more")


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=10,
)
_FUZZED = [make_tool(fn) for fn in SAMPLES]


@given(
    tool_index=st.integers(0, len(_FUZZED) - 1),
    data=st.dictionaries(
        st.sampled_from(["text", "count", "shape", "size", "filters", "color", "ids", "x"]),
        JSON,
    ),
)
# The draws are small; on a loaded machine (the suite's other process, a benchmark)
# generating them can still take seconds, which says nothing about the tool.
@settings(suppress_health_check=[HealthCheck.too_slow])
def test_any_json_input_validates_or_raises_invalid_input(
    tool_index: int, data: dict[str, Any]
) -> None:
    tool = _FUZZED[tool_index]
    try:
        tool.validate_input(data)
    except InvalidInput as exc:
        json.dumps(exc.errors, allow_nan=False)
        assert str(exc)


@given(a=st.integers(), b=st.integers())
def test_add_round_trip(a: int, b: int) -> None:
    def add(a: int, b: int) -> int:
        return a + b

    tool = make_tool(add)
    assert tool.dump_output(tool.call(tool.validate_input({"a": a, "b": b}), None)) == a + b


# --- outputs ------------------------------------------------------------------------


def _unannotated_tool() -> Tool:
    def anything(value: Any):  # type: ignore[no-untyped-def]
        return value

    return make_tool(anything)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        (True, True),
        (3, 3),
        (2.5, 2.5),
        ("text", "text"),
        ([1, "a", None], [1, "a", None]),
        ({"k": [1, {"n": None}]}, {"k": [1, {"n": None}]}),
        ((1, 2), [1, 2]),
        ({"only"}, ["only"]),
        (Point(x=1), {"x": 1.0, "y": 0.0}),
        (Size(2), {"width": 2, "height": 1}),
        (Color.GREEN, "green"),
        (datetime.date(2024, 5, 1), "2024-05-01"),
        ({"nested": [Point(x=2)]}, {"nested": [{"x": 2.0, "y": 0.0}]}),
        (uuid.UUID(int=1), "00000000-0000-0000-0000-000000000001"),
        (b"bytes", "bytes"),
    ],
    ids=repr,
)
def test_supported_outputs_unannotated(value: Any, expected: JsonValue) -> None:
    out = _unannotated_tool().dump_output(value)
    assert out == expected
    json.dumps(out, allow_nan=False)


def test_annotated_outputs_validate_and_serialize() -> None:
    assert make_tool(nested_models).dump_output(Shape(name="s", points=[])) == {
        "name": "s",
        "points": [],
        "color": "red",
    }
    assert make_tool(dataclass_param).dump_output(Size(1, 2)) == {"width": 1, "height": 2}
    assert make_tool(enums_and_literals).dump_output(Color.RED) == "red"
    assert make_tool(enums_and_literals).dump_output("green") == "green"  # lax, like input
    assert make_tool(containers).dump_output({"a": (1, 2)}) == {"a": [1, 2]}
    assert make_tool(_returns_none, name="t").dump_output(None) is None


def _pydantic_dump(tool: Tool, value: Any) -> str | type[InvalidOutput]:
    """What `dump_output_json` gives through pydantic alone (no plain-value shortcut)."""
    adapter = tool.output_adapter
    try:
        if tool._validate_output:
            value = adapter.validate_python(value)
        out = adapter.dump_python(value, mode="json", warnings="error")
        return protocol.dump_json(out)
    except (ValidationError, ValueError):  # pydantic's own errors are ValueErrors too
        return InvalidOutput


def _tool_returning(annotation: Any) -> Tool:
    def returns(a: int):  # type: ignore[no-untyped-def]
        return a

    if annotation is not inspect.Parameter.empty:
        returns.__annotations__["return"] = annotation
    return make_tool(returns)


# Made once, before any example runs: registering is slow next to a dump.
_RETURNING = {
    annotation: _tool_returning(annotation)
    for annotation in (inspect.Parameter.empty, Any, object, int, float, bool, str, None)
}


_PLAIN_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(),
)


@given(value=_PLAIN_VALUES)
@example(value="lone \ud800 surrogate")
@example(value=math.nan)
@pytest.mark.parametrize("annotation", list(_RETURNING), ids=repr)
def test_plain_outputs_dump_as_pydantic_dumps_them(annotation: Any, value: Any) -> None:
    tool = _RETURNING[annotation]
    expected = _pydantic_dump(tool, value)
    if expected is InvalidOutput:
        with pytest.raises(InvalidOutput):
            tool.dump_output_json(value)
    else:
        assert tool.dump_output_json(value) == expected


class _Slotted:
    __slots__ = ()


def _counting() -> Any:
    return (i for i in range(3))


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (object(), "returned an object of type 'object', which cannot be serialized to JSON"),
        ([1, _Slotted()], "an object of type '_Slotted'"),
        (JsProxy(), r"a JsProxy of a JavaScript HTMLBodyElement .*\.to_py\(\)"),
        ({"node": JsProxy()}, "a JsProxy of a JavaScript HTMLBodyElement"),
        (_counting(), "returned a generator object, which is not JSON; return the data itself"),
        (iter([1, 2]), "returned a list_iterator object"),
        (map(str, [1]), "returned a map object"),
        (math.nan, "returned NaN or Infinity, which JSON cannot represent"),
        ([1.0, math.inf], "returned NaN or Infinity"),
        ({"deep": {"x": -math.inf}}, "returned NaN or Infinity"),
        (Point(x=math.nan), "returned NaN or Infinity"),
        (b"\xff", "cannot be serialized to JSON"),
        (types.SimpleNamespace(a=1), "an object of type 'SimpleNamespace'"),
        (range(3), "an object of type 'range'"),
    ],
    # The same ids in every process (pytest-xdist): no object addresses in them.
    ids=lambda value: re.sub(r" at 0x[0-9a-f]+", "", repr(value)),
)
def test_invalid_outputs(value: Any, message: str) -> None:
    with pytest.raises(InvalidOutput, match=message):
        _unannotated_tool().dump_output(value)


def test_socket_output() -> None:
    with socket.socket() as sock, pytest.raises(InvalidOutput, match="of type 'socket'"):
        _unannotated_tool().dump_output(sock)


def test_circular_output() -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(InvalidOutput, match="cannot be serialized to JSON"):
        _unannotated_tool().dump_output(loop)


def test_coroutine_from_a_sync_tool_is_closed() -> None:
    async def forgot_to_await() -> int:
        return 1

    coro = forgot_to_await()
    with pytest.raises(InvalidOutput, match="returned a coroutine object"):
        _unannotated_tool().dump_output(coro)
    # Closed, so no "coroutine was never awaited" warning when it is collected.
    assert inspect.getcoroutinestate(coro) == "CORO_CLOSED"


class _OtherShape(BaseModel):
    name: str


@pytest.mark.parametrize(
    ("fn", "value", "message"),
    [
        (nested_models, _OtherShape(name="x"), r"does not match its return annotation: "),
        (nested_models, {"name": "s"}, r"points: Field required"),
        (typed_dict_param, "many", r"Input should be a valid integer"),
        (_returns_none, 1, r"Input should be None"),
        (containers, {"a": ["x"]}, r"a\.0: Input should be a valid integer"),
        (primitives, math.nan, r"Input should be a valid string"),
    ],
    ids=lambda v: getattr(v, "__name__", None),
)
def test_output_failing_the_return_annotation(
    fn: Callable[..., Any], value: Any, message: str
) -> None:
    with pytest.raises(InvalidOutput, match=message):
        make_tool(fn, name="t").dump_output(value)


def test_annotated_float_nan() -> None:
    def ratio() -> float:
        return math.nan

    with pytest.raises(InvalidOutput, match="NaN or Infinity"):
        make_tool(ratio).dump_output(math.inf)


# --- errors -------------------------------------------------------------------------


def test_tool_error() -> None:
    err = ToolError("not found", data={"id": 3, "tried": ["a", "b"]})
    assert (err.message, err.data, str(err)) == (
        "not found",
        {"id": 3, "tried": ["a", "b"]},
        "not found",
    )
    assert ToolError("plain").data is None
    with pytest.raises(TypeError, match="ToolError data must be JSON-serializable"):
        ToolError("bad", data={"x": object()})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="ToolError data must be JSON-serializable"):
        ToolError("nan", data=math.nan)


def test_error_info() -> None:
    assert error_info(ToolError("no", data={"k": 1})) == protocol.ToolErrorInfo(
        code="tool_error", message="no", data={"k": 1}
    )
    info = error_info(ValueError("boom"))
    assert (info.code, info.message, info.data) == (
        "tool_error",
        "boom",
        {"exception": "ValueError"},
    )
    assert error_info(KeyError()).message == "KeyError"
    invalid = _errors(make_tool(primitives), {})
    info = error_info(invalid)
    assert (info.code, info.data) == ("invalid_input", invalid.errors)
    info = error_info(InvalidOutput("bad output"))
    assert (info.code, info.message) == ("invalid_output", "bad output")


# --- cost ---------------------------------------------------------------------------


def test_invoke_is_cheap() -> None:
    # The benchmark wants 2,000 invokes a second from the whole client; the tools'
    # share (validate, call, dump) must be a small fraction of that budget.
    tool = make_tool(nested_models)
    data = {"shape": {"name": "s", "points": [{"x": 1, "y": 2}] * 5}}
    start = time.perf_counter()
    for _ in range(2000):
        tool.dump_output(tool.call(tool.validate_input(data), None))
    assert time.perf_counter() - start < 1.0
