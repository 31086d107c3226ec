"""From a function to a tool's schema: `function_schema(fn, name)` -> `FunctionSchema`.

What `ToolRegistry` (tools.py) reads once, when a function is registered, like
pydantic-ai's `_function_schema.py`: the signature, the type hints and the
docstring become the input model and `inputSchema`, the return annotation the
output adapter and `outputSchema`. tools.py adds the name, the limits and the wire
spec, and runs the tool.

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

Annotations are resolved with `typing.get_type_hints`, so
`from __future__ import annotations` works. For a function defined inside
another function, names local to the enclosing function are found while that
function is still running (the usual case: the decorator runs there); a name
defined only after the tool is registered cannot be resolved.
"""

from __future__ import annotations

import functools
import inspect
import math
import re
import sys
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Final, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    PydanticUserError,
    create_model,
)
from pydantic.fields import FieldInfo
from pydantic.json_schema import GenerateJsonSchema

from clienttools.context import ToolContext

if TYPE_CHECKING:
    # Imported where an adapter is made: pydantic imports this module on first use, and a
    # page whose tools have plain signatures needs none before the first invoke.
    from pydantic import TypeAdapter

__all__ = ["FunctionSchema", "function_schema", "parse_docstring"]


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
