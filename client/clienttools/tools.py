"""Tools from plain functions: schema, input validation, output serialization.

A `ToolRegistry` turns annotated functions into `Tool`s. Everything a tool needs
at call time (the input model, the output adapter, the JSON schemas, the wire
`ToolSpec`) is built once, at registration, so an invoke costs one pydantic
validation, the call and one serialization.

    >>> registry = ToolRegistry()
    >>> @registry.tool
    ... def add(a: int, b: int = 1) -> int:
    ...     '''Add two integers.
    ...
    ...     Args:
    ...         a: The first addend.
    ...         b: The second addend.
    ...     '''
    ...     return a + b
    >>> tool = registry.get("add")
    >>> tool.spec.description, tool.spec.input_schema["required"]
    ('Add two integers.', ['a'])
    >>> kwargs = tool.validate_input({"a": 2})
    >>> tool.dump_output(tool.call(kwargs, context=None))  # no ToolContext parameter
    3

How a function becomes a tool:

- Name: `name=` or the function's `__name__`; it must match the protocol's
  `TOOL_NAME_PATTERN`. Description: `description=` or the first paragraph of the
  docstring.
- Every parameter needs a type annotation pydantic can validate (primitives,
  lists, dicts, pydantic models, dataclasses, TypedDicts, enums, Literals, ...).
  A parameter with a default is optional (not in `required`). Its description is
  `Annotated[T, Field(description=...)]` if given, else its entry in the
  docstring's parameter section: Google (`Args:`), NumPy (`Parameters`) or
  Sphinx (`:param name:`), read by `docstring_parser`.
- `function_schema(fn, name)` does this reading, once, at registration (like
  pydantic-ai's `_function_schema.py`); `Tool` adds the name, limits and spec.
- A parameter annotated `ToolContext` (or `ToolContext | None`, so the function
  stays callable without one) receives the call's context and is left out of
  the schema. It is always given a context, never None.
- `*args`, `**kwargs`, positional-only parameters, missing annotations,
  generator functions and unknown types are refused when the tool is
  registered (`TypeError`, with a message that says how to fix the function).
- The return annotation becomes `outputSchema`: none when the function has no
  return annotation or returns `Any`/`object`/`None`. The returned value is
  validated against the annotation, when there is one, and dumped to JSON-ready
  Python data.

Running tools: `Tool.call` calls the function inline and returns its result,
or, for an `async def` tool, the coroutine for the caller to run. Pyodide's
main thread has no thread pool, so a sync tool blocks the page's event loop
until it returns and cannot be cancelled or timed out while it runs; only async
tools can be cancelled (asyncio cancellation at their next `await`). Long work
belongs in an `async def` that awaits now and then, e.g. `ctx.progress(...)`.

Annotations are resolved with `typing.get_type_hints`, so
`from __future__ import annotations` works. For a function defined inside
another function, names local to the enclosing function are found while that
function is still running (the usual case: the decorator runs there); a name
defined only after the tool is registered cannot be resolved.
"""

from __future__ import annotations

import functools
import inspect
import json
import math
import re
import sys
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Final, TypeVar, Union, overload

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    PydanticUserError,
    ValidationError,
    create_model,
)
from pydantic.fields import FieldInfo
from pydantic.json_schema import GenerateJsonSchema
from pydantic_core import PydanticSerializationError

from clienttools import protocol
from clienttools.context import InvalidInput, InvalidOutput, ToolContext, ToolError
from clienttools.observers import Observers
from clienttools.rules import drop_missing_inputs, invalid_input_message

if TYPE_CHECKING:
    # Imported where an adapter is made: pydantic imports this module on first use, and a
    # page whose tools have plain signatures needs none before the first invoke.
    from pydantic import TypeAdapter

__all__ = [
    "InvalidInput",
    "InvalidOutput",
    "Tool",
    "ToolContext",
    "ToolError",
    "ToolRegistry",
    "error_info",
]

F = TypeVar("F", bound=Callable[..., Any])

_NAME_RE: Final = re.compile(protocol.TOOL_NAME_PATTERN)


# --- errors -------------------------------------------------------------------------


class _Unserializable(Exception):
    """Raised by the serializer fallback so the error can name the offending type."""

    def __init__(self, value: object) -> None:
        self.type_name = type(value).__name__
        # Pyodide wraps JS values in JsProxy subclasses; the JS constructor's name
        # ("HTMLBodyElement") tells the developer far more than the proxy class.
        self.is_js = any(cls.__name__ == "JsProxy" for cls in type(value).__mro__)
        self.js_constructor: str | None = None
        if self.is_js:
            try:
                self.js_constructor = str(value.constructor.name)  # type: ignore[attr-defined]
            except Exception:
                self.js_constructor = None
        super().__init__(self.describe())

    def describe(self) -> str:
        if not self.is_js:
            return f"an object of type {self.type_name!r}"
        of = f" of a JavaScript {self.js_constructor}" if self.js_constructor else ""
        return f"a JsProxy{of} (type {self.type_name!r})"


def _is_js_null(value: object) -> bool:
    # Pyodide gives JS `null` as `pyodide.ffi.jsnull` (type JsNull), not None; a tool
    # that returns `localStorage.getItem(...)` for a missing key means JSON null.
    return type(value).__name__ == "JsNull"


def _refuse_unknown(value: Any) -> Any:
    # Pydantic calls this only for types it cannot serialize by itself (JS proxies,
    # DOM nodes, sockets, ...); its own message does not say what to do instead.
    if _is_js_null(value):
        return None
    raise _Unserializable(value)


def error_info(exc: BaseException) -> protocol.ToolErrorInfo:
    """The wire error for an exception raised by validating, running or dumping a tool.

    `ToolError` keeps its message and data; `InvalidInput` sends its errors as
    `data`; any other exception becomes `tool_error` with `data.exception` naming
    its type (C6).
    """
    if isinstance(exc, ToolError):
        return protocol.ToolErrorInfo(code="tool_error", message=exc.message, data=exc.data)
    if isinstance(exc, InvalidInput):
        errors: list[JsonValue] = list(exc.errors)
        return protocol.ToolErrorInfo(code="invalid_input", message=exc.message, data=errors)
    if isinstance(exc, InvalidOutput):
        return protocol.ToolErrorInfo(code="invalid_output", message=exc.message)
    name = type(exc).__name__
    return protocol.ToolErrorInfo(
        code="tool_error", message=str(exc) or name, data={"exception": name}
    )


# --- schema generation ---------------------------------------------------------------


class _ToolJsonSchema(GenerateJsonSchema):
    """Pydantic's JSON schema without per-field titles.

    A title like "User Id" next to the property `user_id` only costs the model
    tokens; model and enum titles (in `$defs`) stay, they name the types.
    """

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False


def _unwrap_annotated(tp: Any) -> tuple[Any, tuple[Any, ...]]:
    if typing.get_origin(tp) is Annotated:
        args = typing.get_args(tp)
        return args[0], tuple(args[1:])
    return tp, ()


def _is_context_annotation(tp: Any) -> bool:
    """`ToolContext`, `ToolContext | None` or `Optional[ToolContext]`, maybe `Annotated`."""
    tp, _ = _unwrap_annotated(tp)
    if tp is ToolContext:
        return True
    if typing.get_origin(tp) in (Union, types.UnionType):
        rest = [a for a in typing.get_args(tp) if a is not type(None)]
        return len(rest) == 1 and _unwrap_annotated(rest[0])[0] is ToolContext
    return False


def _mentions_context(tp: Any) -> bool:
    if tp is ToolContext:
        return True
    return any(_mentions_context(arg) for arg in typing.get_args(tp))


_SECTION_TITLE_RE: Final = re.compile(r"^[A-Z][A-Za-z ]*:\s*$")


def _join_lines(text: str) -> str:
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """The first paragraph and the parameter descriptions of a docstring, of any common style.

    Google (`Args:`), NumPy (`Parameters` underlined) and Sphinx/reST
    (`:param name:`) docstrings are read by `docstring_parser`. Lines of a
    paragraph or of one parameter's description are joined with spaces; a
    docstring that no style can read still gives its first paragraph.

        >>> parse_docstring('''Add.
        ...
        ...     Args:
        ...         a (int): The first
        ...             addend.
        ...     ''')
        ('Add.', {'a': 'The first addend.'})
        >>> parse_docstring('''Add.
        ...
        ...     :param a: The first addend.
        ...     ''')
        ('Add.', {'a': 'The first addend.'})
    """
    if not doc:
        return "", {}
    lines = inspect.cleandoc(doc).splitlines()
    if len(lines) == 1 and not _SECTION_TITLE_RE.match(lines[0]):
        return lines[0].strip(), {}  # the usual one-line docstring: no parser needed
    # Imported on first use: a page whose tools have one-line docstrings never pays for it.
    import docstring_parser

    opens_with_section = bool(_SECTION_TITLE_RE.match(lines[0]))
    if opens_with_section:
        # "Args:" on the docstring's first line: cleandoc took its entries'
        # indentation, and the parsers read a first line as the summary. Give
        # them a placeholder summary and the entries indented under the title.
        if not any(_SECTION_TITLE_RE.match(line) for line in lines[1:]):
            lines = [lines[0], *(f"    {line}" for line in lines[1:])]
        lines = ["-", "", *lines]
    text = "\n".join(lines)
    try:
        parsed = docstring_parser.parse(text)
    except docstring_parser.ParseError:
        return ("" if opens_with_section else _join_lines(text.split("\n\n", 1)[0])), {}
    params: dict[str, str] = {}
    for param in parsed.params:
        name = param.arg_name.lstrip("*")  # `*args:` and `**options:` entries
        if param.description is not None and name.isidentifier():
            params.setdefault(name, _join_lines(param.description))
    summary = "" if opens_with_section else parsed.short_description or ""
    if summary and parsed.long_description and not parsed.blank_after_short_description:
        summary += "\n" + parsed.long_description.split("\n\n", 1)[0]  # a wrapped first line
    return _join_lines(summary), params


def _defining_namespace(fn: Callable[..., Any]) -> dict[str, Any] | None:
    """Locals of the running frame whose code defines `fn`, if it is on the stack.

    With `from __future__ import annotations`, a function defined inside another
    function has string annotations that may name the enclosing function's
    locals, which `get_type_hints` cannot see. The enclosing frame is the one
    whose code object holds `fn`'s code among its constants; matching on that,
    rather than on a fixed stack depth, works however many wrappers (client,
    registry) sit between the user's decorator and this function.
    """
    code = getattr(inspect.unwrap(fn), "__code__", None)
    if code is None:
        return None
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None:
        if code in frame.f_code.co_consts:
            return dict(frame.f_locals)
        frame = frame.f_back
    return None


def _type_hints(fn: Callable[..., Any], tool_name: str) -> dict[str, Any]:
    try:
        return typing.get_type_hints(fn, include_extras=True)
    except NameError:
        pass  # maybe a local of the enclosing function: look for its frame below
    except Exception as exc:
        raise TypeError(f"tool {tool_name!r}: cannot resolve its type annotations: {exc}") from exc
    localns = _defining_namespace(fn)
    try:
        return typing.get_type_hints(fn, localns=localns, include_extras=True)
    except Exception as exc:
        raise TypeError(
            f"tool {tool_name!r}: cannot resolve its type annotations: {exc}; define the "
            f"names it uses at module level, or before the tool is registered"
        ) from exc


def _type_repr(tp: Any) -> str:
    if isinstance(tp, type):
        return tp.__qualname__
    return repr(tp).replace("typing.", "")


def _check_json_schema_able(tool_name: str, what: str, tp: Any) -> None:
    """Raise a TypeError naming `what` if pydantic can build no validator or schema for `tp`."""
    from pydantic import TypeAdapter

    try:
        TypeAdapter(tp).json_schema(schema_generator=_ToolJsonSchema)
    except PydanticUserError as exc:
        raise TypeError(
            f"tool {tool_name!r}: {what} has type {_type_repr(tp)}, which pydantic cannot "
            f"turn into a JSON schema: {_pydantic_reason(exc)}"
        ) from exc


def _pydantic_reason(exc: PydanticUserError) -> str:
    """Pydantic's first line, plus what to do when the type is simply unknown to it."""
    reason = str(exc).splitlines()[0]
    if exc.code in ("schema-for-unknown-type", "invalid-for-json-schema"):
        reason += (
            "; use a JSON type (str, int, float, bool, None, list, dict) or a pydantic "
            "model, dataclass, TypedDict, Enum or Literal built from them"
        )
    return reason


def _finish_input_schema(schema: dict[str, Any]) -> dict[str, JsonValue]:
    """Fixed key order and an always-present `required`, whatever pydantic leaves out."""
    schema.pop("title", None)  # the name of our synthetic model, meaningless to the model
    out: dict[str, JsonValue] = {
        "type": "object",
        "properties": schema.pop("properties", {}),
        "required": schema.pop("required", []),
        "additionalProperties": False,
    }
    schema.pop("type", None)
    schema.pop("additionalProperties", None)
    out.update(schema)  # `$defs` and anything a future pydantic adds
    return out


# The output path for functions without a (useful) return annotation. With
# pydantic's default `ser_json_inf_nan='null'`, inferred floats NaN/Infinity turn
# silently into null; 'constants' keeps them as floats so the JSON check in
# `Tool.dump_output` can refuse them.
_NAN_KEEPING: Final = ConfigDict(ser_json_inf_nan="constants")
_NAN_KEEPING_DEFERRED: Final = ConfigDict(ser_json_inf_nan="constants", defer_build=True)
_UNVALIDATED_RETURNS: Final = (Any, object)
_EMPTY: Final = inspect.Parameter.empty
# Return values whose JSON is their own `json.dumps`, with no pydantic validation or
# serialization to go through: a value of exactly the annotated type, or of any of
# these types where the output is not validated. Validating and
# dumping them through pydantic gives the same value (a test holds them equal) at a
# third of an invoke's protocol work in a page.
_PLAIN_TYPES: Final[frozenset[type]] = frozenset({int, float, bool, str, type(None)})
_NO_PLAIN_OUTPUTS: Final[frozenset[type]] = frozenset()


def _plain_outputs(return_type: Any, validated: bool) -> frozenset[type]:
    if not validated:
        return _PLAIN_TYPES
    if return_type is None:
        return_type = type(None)
    return frozenset({return_type}) if return_type in _PLAIN_TYPES else _NO_PLAIN_OUTPUTS


def _output_adapter(
    tool_name: str, tp: Any
) -> tuple[TypeAdapter[Any], dict[str, JsonValue] | None]:
    """The validating adapter for a return annotation, and its JSON schema (None for None)."""
    from pydantic import TypeAdapter

    try:
        try:
            adapter: TypeAdapter[Any] = TypeAdapter(tp, config=_NAN_KEEPING)
        except PydanticUserError as exc:
            if exc.code != "type-adapter-config-unused":
                raise
            # Models, dataclasses and TypedDicts carry their own config.
            adapter = TypeAdapter(tp)
        if tp is type(None):
            return adapter, None  # "returns nothing" is no structure worth a schema
        schema = adapter.json_schema(mode="serialization", schema_generator=_ToolJsonSchema)
    except PydanticUserError as exc:
        raise TypeError(
            f"tool {tool_name!r}: return type {_type_repr(tp)} is not supported: "
            f"{_pydantic_reason(exc)}; or remove the return annotation"
        ) from exc
    return adapter, schema


# --- from a function to its schema ----------------------------------------------------


@dataclass(frozen=True)
class FunctionSchema:
    """What a function's signature, annotations and docstring say about it as a tool.

    Built by `function_schema`; `Tool` adds the name, the limits and the wire spec.
    """

    #: The docstring's first paragraph ("" without a docstring).
    description: str
    #: The generated input model: fields p0, p1, ... aliased by parameter name; None
    #: while not built yet (a signature of plain parameters, see `_plain_input_schema`).
    input_model: type[BaseModel] | None
    #: Builds the input model (the one above, or the first time it is needed).
    make_input_model: Callable[[], type[BaseModel]]
    #: `inputSchema`: an object with `properties`, `required` and no other properties.
    input_schema: dict[str, JsonValue]
    #: (internal field name, parameter name) per schema parameter, in signature order.
    fields: tuple[tuple[str, str], ...]
    #: The parameter that receives the ToolContext, if any.
    context_parameter: str | None
    #: Validates (when `validate_output`) and dumps the return value; None while not
    #: made yet (no return annotation, or a plain one: see `_PLAIN_RETURNS`).
    output_adapter: TypeAdapter[Any] | None
    #: Makes the output adapter (the one above, or the first time it is needed).
    make_output_adapter: Callable[[], TypeAdapter[Any]]
    output_schema: dict[str, JsonValue] | None
    validate_output: bool
    #: Types of return value that are dumped with `json.dumps` alone (see `_PLAIN_TYPES`).
    plain_outputs: frozenset[type]
    is_async: bool


def function_schema(fn: Callable[..., Any], tool_name: str) -> FunctionSchema:
    """Read `fn`'s signature, type hints and docstring into a `FunctionSchema`.

    Raises TypeError, naming the tool and the fix, for a parameter that cannot
    be part of a schema (`*args`, `**kwargs`, positional-only, unannotated, a
    type pydantic cannot describe) or an unsupported return type.
    """
    doc_summary, doc_params = parse_docstring(inspect.getdoc(fn))
    hints = _type_hints(fn, tool_name)
    context_param: str | None = None
    fields: dict[str, Any] = {}
    field_names: list[tuple[str, str]] = []
    for param in inspect.signature(fn).parameters.values():
        annotation = _parameter_annotation(tool_name, param, hints)
        if _is_context_annotation(annotation):
            if context_param is not None:
                raise TypeError(
                    f"tool {tool_name!r}: parameters {context_param!r} and {param.name!r} are "
                    f"both annotated ToolContext; keep one"
                )
            context_param = param.name
            continue
        # Internal field names p0, p1... with the parameter name as alias: any
        # parameter name works, even one that shadows a BaseModel attribute
        # (`json`, `copy`, `schema`) or starts with `_` (a private attribute).
        internal = f"p{len(field_names)}"
        field_names.append((internal, param.name))
        fields[internal] = _parameter_field(param, annotation, doc_params.get(param.name))

    def make_input_model() -> type[BaseModel]:
        return _input_model(fn, tool_name, fields, field_names)[0]

    input_model: type[BaseModel] | None = None
    input_schema = _plain_input_schema(fields)
    if input_schema is None:
        input_model, input_schema = _input_model(fn, tool_name, fields, field_names)
    return_type = hints.get("return", _EMPTY)
    output_adapter: TypeAdapter[Any] | None = None
    if return_type is _EMPTY or return_type in _UNVALIDATED_RETURNS:
        make_output_adapter, output_schema, validate_output = _any_output, None, False
    elif isinstance(return_type, type) and return_type in _PLAIN_RETURNS:
        # Known schemas (a test compares them with pydantic's); the adapter is made on
        # first use, for a value that is not already of the type (plain_outputs).
        make_output_adapter = functools.partial(_deferred_adapter, return_type)
        output_schema, validate_output = _PLAIN_RETURNS[return_type], True
    else:
        output_adapter, output_schema = _output_adapter(tool_name, return_type)
        make_output_adapter = functools.partial(_made, output_adapter)
        validate_output = True
    return FunctionSchema(
        description=doc_summary,
        input_model=input_model,
        make_input_model=make_input_model,
        input_schema=_finish_input_schema(input_schema),
        fields=tuple(field_names),
        context_parameter=context_param,
        output_adapter=output_adapter,
        make_output_adapter=make_output_adapter,
        output_schema=output_schema,
        validate_output=validate_output,
        plain_outputs=_plain_outputs(return_type, validate_output),
        is_async=inspect.iscoroutinefunction(fn),
    )


_ANY_OUTPUT: list[TypeAdapter[Any]] = []


def _any_output() -> TypeAdapter[Any]:
    """The one output adapter of the tools without a (useful) return annotation."""
    if not _ANY_OUTPUT:
        _ANY_OUTPUT.append(_deferred_adapter(Any))
    return _ANY_OUTPUT[0]


def _deferred_adapter(tp: Any) -> TypeAdapter[Any]:
    from pydantic import TypeAdapter

    adapter: TypeAdapter[Any] = TypeAdapter(tp, config=_NAN_KEEPING_DEFERRED)
    return adapter


def _made(adapter: TypeAdapter[Any]) -> TypeAdapter[Any]:
    return adapter


def _parameter_annotation(
    tool_name: str, param: inspect.Parameter, hints: Mapping[str, Any]
) -> Any:
    """The parameter's type hint; TypeError for a parameter a tool cannot have."""
    pname = param.name
    if param.kind is inspect.Parameter.VAR_POSITIONAL:
        raise TypeError(
            f"tool {tool_name!r}: *{pname} is not supported, tools take named "
            f"parameters only; use a list parameter instead, e.g. `{pname}: list[int]`"
        )
    if param.kind is inspect.Parameter.VAR_KEYWORD:
        raise TypeError(
            f"tool {tool_name!r}: **{pname} is not supported, the schema needs every "
            f"parameter by name; declare the parameters, or take one dict, "
            f"e.g. `{pname}: dict[str, str]`"
        )
    if param.kind is inspect.Parameter.POSITIONAL_ONLY:
        raise TypeError(
            f"tool {tool_name!r}: parameter {pname!r} is positional-only, but tools "
            f"are called with keyword arguments; remove the `/` from the signature"
        )
    if pname not in hints:
        raise TypeError(
            f"tool {tool_name!r}: parameter {pname!r} has no type annotation; "
            f"annotate it, e.g. `{pname}: int`"
        )
    annotation = hints[pname]
    if not _is_context_annotation(annotation) and _mentions_context(annotation):
        raise TypeError(
            f"tool {tool_name!r}: parameter {pname!r} mixes ToolContext into "
            f"{_type_repr(annotation)}; annotate it `{pname}: ToolContext`"
        )
    return annotation


def _parameter_field(
    param: inspect.Parameter, annotation: Any, doc_description: str | None
) -> tuple[Any, FieldInfo]:
    """The `create_model` field of one parameter: its type, alias, default and description."""
    default = param.default
    if isinstance(default, FieldInfo):
        # `a: int = Field(3, ge=0)`, the validate_call style: same as Annotated.
        annotation = Annotated[annotation, default]
        default = _EMPTY
    _, metadata = _unwrap_annotated(annotation)
    has_description = any(isinstance(m, FieldInfo) and m.description is not None for m in metadata)
    # `Field(...)` given to create_model overrides the Annotated one, so set
    # only what the Annotated Field cannot already say.
    field_kwargs: dict[str, Any] = {"alias": param.name}
    if not has_description and doc_description is not None:
        field_kwargs["description"] = doc_description
    if default is not _EMPTY:
        field_kwargs["default"] = default
    return annotation, Field(**field_kwargs)


#: JSON schema types of the plain parameter and return types, as pydantic writes them.
_PLAIN_SCHEMA_TYPES: Final[dict[type, str]] = {
    int: "integer",
    float: "number",
    bool: "boolean",
    str: "string",
}


#: The output schemas of plain return annotations (None: "returns nothing").
_PLAIN_RETURNS: Final[dict[type, dict[str, JsonValue] | None]] = {
    **{tp: {"type": kind} for tp, kind in _PLAIN_SCHEMA_TYPES.items()},
    type(None): None,
}


def _plain_input_schema(fields: dict[str, Any]) -> dict[str, Any] | None:
    """The input schema pydantic would write, for parameters of plain types only; else None.

    Plain: annotated exactly `int`, `float`, `bool` or `str` (no `Annotated`, no
    `Field`), with no default or a default of that very type (a finite float). For
    such a signature, pydantic's schema is this one (a test compares them over many
    signatures), and building the input model and its schema was most of a tool's
    registration: the model is then built when the first invoke needs it.
    """
    properties: dict[str, Any] = {}
    required: list[str] = []
    for annotation, info in fields.values():
        kind = _PLAIN_SCHEMA_TYPES.get(annotation) if isinstance(annotation, type) else None
        if kind is None or info.alias is None:
            return None
        prop: dict[str, Any] = {}
        if not info.is_required():
            default = info.default
            if type(default) is not annotation or (
                annotation is float and not math.isfinite(default)
            ):
                return None
            prop["default"] = default
        else:
            required.append(info.alias)
        if info.description is not None:
            prop["description"] = info.description
        prop["type"] = kind
        properties[info.alias] = prop
    schema: dict[str, Any] = {"properties": properties}
    if required:
        schema["required"] = required
    return schema


def _input_model(
    fn: Callable[..., Any],
    tool_name: str,
    fields: dict[str, Any],
    field_names: list[tuple[str, str]],
) -> tuple[type[BaseModel], dict[str, Any]]:
    try:
        input_model: type[BaseModel] = create_model(
            f"{tool_name}_input",
            __config__=ConfigDict(extra="forbid"),
            __module__=getattr(fn, "__module__", None) or __name__,
            **fields,
        )
        schema = input_model.model_json_schema(by_alias=True, schema_generator=_ToolJsonSchema)
    except PydanticUserError as exc:
        # Find the culprit only now: checking each parameter up front would
        # build every schema twice.
        for internal, pname in field_names:
            _check_json_schema_able(tool_name, f"parameter {pname!r}", fields[internal][0])
        raise TypeError(f"tool {tool_name!r}: cannot build its input schema: {exc}") from exc
    return input_model, schema


# --- tools --------------------------------------------------------------------------


class Tool:
    """One function as a tool: its `spec` for the wire, and validate / call / dump.

    Build tools with `ToolRegistry.add` or the `ToolRegistry.tool` decorator;
    constructing a `Tool` directly does the same checks without registering it.
    """

    __slots__ = (
        "_context_param",
        "_fields",
        "_input_model",
        "_make_input_model",
        "_make_output",
        "_output",
        "_plain_outputs",
        "_spec",
        "_validate_output",
        "description",
        "function",
        "is_async",
        "name",
        "needs_approval",
        "read_only",
        "timeout",
        "wire_spec",
    )

    name: str
    description: str
    function: Callable[..., Any]
    is_async: bool
    timeout: float | None
    needs_approval: bool
    #: Reads and changes nothing: `readOnlyHint` on document.modelContext (webmcp.py).
    read_only: bool
    #: The spec as the tools frame carries it (camelCase keys, absent fields left out).
    wire_spec: dict[str, Any]

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        timeout: float | None = None,
        needs_approval: bool = False,
        read_only: bool = False,
    ) -> None:
        if isinstance(fn, type) or not callable(fn):
            raise TypeError(
                f"a tool must be a function (def or async def), got {type(fn).__name__} {fn!r}"
            )
        if not (inspect.isfunction(fn) or inspect.ismethod(fn)):
            raise TypeError(
                f"a tool must be a function (def or async def), got {type(fn).__name__}; "
                f"wrap it in an annotated def"
            )
        tool_name = fn.__name__ if name is None else name
        if not _NAME_RE.match(tool_name):
            raise ValueError(
                f"tool name {tool_name!r} is invalid: it must match {protocol.TOOL_NAME_PATTERN} "
                f"(a letter or '_', then up to 63 letters, digits, '_' or '-'); "
                f"pass a valid name, e.g. name='my_tool'"
            )
        if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
            raise TypeError(
                f"tool {tool_name!r}: generator functions are not supported; "
                f"return a list instead of yielding items"
            )
        if timeout is not None and not (math.isfinite(timeout) and timeout > 0):
            raise ValueError(
                f"tool {tool_name!r}: timeout must be a positive number of seconds, got {timeout!r}"
            )

        schema = function_schema(fn, tool_name)
        self.name = tool_name
        self.description = schema.description if description is None else description
        self.function = fn
        self.is_async = schema.is_async
        self.timeout = timeout
        self.needs_approval = needs_approval
        self.read_only = read_only
        self._context_param = schema.context_parameter
        self._input_model = schema.input_model
        self._make_input_model = schema.make_input_model
        self._fields = schema.fields
        self._output = schema.output_adapter
        self._make_output = schema.make_output_adapter
        self._validate_output = schema.validate_output
        self._plain_outputs = schema.plain_outputs
        timeout_ms = None if timeout is None else max(1, round(timeout * 1000))
        self._spec: protocol.ToolSpec | None = None
        if isinstance(self.description, str) and type(needs_approval) is bool:
            # What ToolSpec would dump, written directly: building the ToolSpec model
            # (its validator and serializer) was a tenth of a page's start-up, and the
            # tools frame needs only this (`spec` builds the model on first use).
            wire: dict[str, Any] = {
                "name": tool_name,
                "description": self.description,
                "inputSchema": schema.input_schema,
            }
            if schema.output_schema is not None:
                wire["outputSchema"] = schema.output_schema
            wire["needsApproval"] = needs_approval
            if timeout_ms is not None:
                wire["timeoutMs"] = timeout_ms
            self.wire_spec = wire
        else:  # a value ToolSpec refuses: let it say so, as it always did
            self._spec = protocol.ToolSpec(
                name=tool_name,
                description=self.description,
                input_schema=schema.input_schema,
                output_schema=schema.output_schema,
                needs_approval=needs_approval,
                timeout_ms=timeout_ms,
            )
            self.wire_spec = self._spec.model_dump(mode="json", by_alias=True, exclude_none=True)
        size = protocol.json_size(self.wire_spec)
        if size > protocol.MAX_TOOL_SPEC_BYTES:
            raise ValueError(
                f"tool {tool_name!r}: its spec is {size} bytes, over the "
                f"{protocol.MAX_TOOL_SPEC_BYTES}-byte limit servers accept; shorten the "
                f"docstring or simplify the parameter types"
            )

    @property
    def spec(self) -> protocol.ToolSpec:
        """The tool's `ToolSpec` (the wire model of `wire_spec`), built on first use."""
        if self._spec is None:
            self._spec = protocol.ToolSpec.model_validate(self.wire_spec, by_alias=True)
        return self._spec

    @property
    def input_model(self) -> type[BaseModel]:
        """The generated pydantic model of the input (fields aliased by parameter name).

        For a signature of plain parameters it is built on first use (the first
        invoke), not at registration: see `_plain_input_schema`.
        """
        if self._input_model is None:
            self._input_model = self._make_input_model()
        return self._input_model

    @property
    def output_adapter(self) -> TypeAdapter[Any]:
        """The adapter that validates (when the return is annotated) and dumps the output.

        Made on first use for a return that is unannotated or of a plain type: a value
        of exactly that type never needs it (`_PLAIN_TYPES`).
        """
        if self._output is None:
            self._output = self._make_output()
        return self._output

    @property
    def context_parameter(self) -> str | None:
        """The name of the parameter that receives the ToolContext, if any."""
        return self._context_param

    def validate_input(self, input: Mapping[str, Any]) -> dict[str, Any]:
        """Validate the model's JSON input; return keyword arguments (without the context).

        Raises InvalidInput with pydantic's errors: missing, wrong-typed or unknown
        arguments.
        """
        # Lax python-mode validation of the already-parsed JSON. For values that
        # came out of `json.loads` (str, int, float, bool, None, list, dict) lax
        # python mode accepts and coerces exactly what lax JSON mode would
        # ("3" -> 3, "2024-01-01" -> date, list -> tuple, "red" -> Color.RED), and
        # it skips re-dumping the input to text per call. Strict python mode is not
        # an option: it refuses a str for a date or a dict for a dataclass.
        input_model = self._input_model or self.input_model
        try:
            model = input_model.model_validate(input)
        except ValidationError as exc:
            raise self._invalid_input(exc) from None
        values = model.__dict__
        return {pname: values[internal] for internal, pname in self._fields}

    def _invalid_input(self, exc: ValidationError) -> InvalidInput:
        # Through JSON text: `ctx` may hold exception objects, `input` any python
        # value, even NaN/Infinity (python's json.loads accepts them in frames);
        # those come back as the strings "NaN"/"Infinity" so the errors stay JSON.
        errors: list[dict[str, JsonValue]] = json.loads(
            exc.json(include_url=False), parse_constant=str
        )
        drop_missing_inputs(errors)
        return InvalidInput(invalid_input_message(self.name, errors), errors)

    def call(self, arguments: dict[str, Any], context: ToolContext | None) -> Any:
        """Call the function with validated `arguments`, injecting `context` where declared.

        Returns the value, or for an async tool the coroutine (not yet started).
        Exceptions raised by a sync tool propagate.
        """
        if self._context_param is None:
            return self.function(**arguments)
        return self.function(**arguments, **{self._context_param: context})

    def dump_output(self, value: Any) -> JsonValue:
        """The return value as JSON-ready python data; raises InvalidOutput.

        Validates against the return annotation when there is one. The result is
        guaranteed to pass `json.dumps(..., allow_nan=False)`.
        """
        return self._dump_output(value)[0]

    def dump_output_json(self, value: Any) -> str:
        """The return value as the compact JSON text a result frame carries; raises InvalidOutput.

        The same checks as `dump_output`, and the text comes from the check itself, so
        a result is encoded once.
        """
        return self._dump_output(value)[1]

    def _dump_output(self, value: Any) -> tuple[JsonValue, str]:
        if type(value) in self._plain_outputs:
            return value, self._dump_json(value, protocol.plain_json)
        if _is_js_null(value):
            value = None
        if isinstance(value, (Iterator, types.CoroutineType, types.AsyncGeneratorType)):
            if isinstance(value, types.CoroutineType):
                value.close()  # never awaited; closing avoids a RuntimeWarning at GC
            raise InvalidOutput(
                f"tool {self.name!r} returned a {type(value).__name__} object, which is "
                f"not JSON; return the data itself (e.g. a list, not an iterator)"
            )
        output = self._output
        if output is None:
            output = self.output_adapter
        if self._validate_output:
            try:
                value = output.validate_python(value)
            except ValidationError as exc:
                where = protocol.describe_validation_error(exc)
                raise InvalidOutput(
                    f"tool {self.name!r} returned a value that does not match its return "
                    f"annotation: {where}"
                ) from None
        try:
            out: JsonValue = output.dump_python(
                value, mode="json", fallback=_refuse_unknown, warnings="error"
            )
        except _Unserializable as exc:
            fix = (
                "convert it with .to_py() or copy out the fields you need"
                if exc.is_js
                else "return plain data (str, int, float, bool, None, list, dict) or a "
                "pydantic model or dataclass of them"
            )
            raise InvalidOutput(
                f"tool {self.name!r} returned {exc.describe()}, which cannot be serialized "
                f"to JSON; {fix}"
            ) from None
        except (PydanticSerializationError, ValueError, RecursionError) as exc:
            raise InvalidOutput(
                f"tool {self.name!r} returned a value that cannot be serialized to JSON: {exc}"
            ) from None
        return out, self._dump_json(out)

    def _dump_json(self, out: JsonValue, dump: Callable[[Any], str] = protocol.dump_json) -> str:
        try:
            return dump(out)
        except ValueError:
            raise InvalidOutput(
                f"tool {self.name!r} returned NaN or Infinity, which JSON cannot represent; "
                f"return None or a string instead"
            ) from None

    def __repr__(self) -> str:
        kind = "async " if self.is_async else ""
        return f"<Tool {self.name!r}: {kind}{getattr(self.function, '__qualname__', '?')}>"


# --- registry -----------------------------------------------------------------------


class ToolRegistry:
    """The tools of one client, by name, in registration order.

    >>> registry = ToolRegistry()
    >>> unsubscribe = registry.on_change(lambda: print("changed:", len(registry)))
    >>> registry.add(lambda: None, name="noop")
    changed: 1
    <Tool 'noop': <lambda>>
    >>> registry.remove("noop")
    changed: 0
    """

    def __init__(self) -> None:
        self._tools: dict[str, Tool] = {}
        self._observers: Observers[[]] = Observers("registry on_change")

    @overload
    def tool(self, fn: F, /) -> F: ...

    @overload
    def tool(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        description: str | None = None,
        timeout: float | None = None,
        needs_approval: bool = False,
        read_only: bool = False,
    ) -> Callable[[F], F]: ...

    def tool(
        self,
        fn: F | None = None,
        /,
        *,
        name: str | None = None,
        description: str | None = None,
        timeout: float | None = None,
        needs_approval: bool = False,
        read_only: bool = False,
    ) -> F | Callable[[F], F]:
        """Register a function as a tool: `@registry.tool` or `@registry.tool(name=...)`.

        Returns the function unchanged, so it stays callable and testable as is.
        """

        def register(f: F) -> F:
            self.add(
                f,
                name=name,
                description=description,
                timeout=timeout,
                needs_approval=needs_approval,
                read_only=read_only,
            )
            return f

        return register if fn is None else register(fn)

    def add(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        timeout: float | None = None,
        needs_approval: bool = False,
        read_only: bool = False,
    ) -> Tool:
        """Register `fn` and return its Tool.

        `read_only=True` says the tool changes nothing; it is the `readOnlyHint` a
        browser's agent sees on `document.modelContext` (not part of the wire spec).

        Raises ValueError for a bad or duplicate name (or a full registry) and
        TypeError for a signature that cannot be a tool.
        """
        tool_name = getattr(fn, "__name__", "") if name is None else name
        if tool_name in self._tools:
            raise ValueError(
                f"a tool named {tool_name!r} is already registered; pass another name, "
                f"e.g. name='{tool_name}_2', or remove the old one first"
            )
        if len(self._tools) >= protocol.MAX_TOOLS_PER_CONNECTION:
            raise ValueError(
                f"cannot register {tool_name!r}: servers accept at most "
                f"{protocol.MAX_TOOLS_PER_CONNECTION} tools per connection"
            )
        tool = Tool(
            fn,
            name=name,
            description=description,
            timeout=timeout,
            needs_approval=needs_approval,
            read_only=read_only,
        )
        self._tools[tool.name] = tool
        self._changed()
        return tool

    def remove(self, name: str) -> None:
        """Unregister a tool. Raises KeyError if there is none of that name."""
        if name not in self._tools:
            raise KeyError(f"no tool named {name!r}")
        del self._tools[name]
        self._changed()

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool]:
        return iter(list(self._tools.values()))

    def __len__(self) -> int:
        return len(self._tools)

    def specs(self) -> list[protocol.ToolSpec]:
        """The specs of every tool, in registration order (the `tools` of the frame)."""
        return [tool.spec for tool in self._tools.values()]

    def wire_specs(self) -> list[dict[str, Any]]:
        """`specs()` as the tools frame carries them, without building the models."""
        return [tool.wire_spec for tool in self._tools.values()]

    def on_change(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call `callback()` after every add and remove; returns an unsubscribe function.

        Callbacks run in subscription order; one that raises is logged and the
        rest still run (the change itself has happened).
        """
        return self._observers.subscribe(callback)

    def _changed(self) -> None:
        self._observers.notify()
