"""Check a tool's input against its JSON Schema, with pydantic's error types and messages.

The MicroPython flavour has no pydantic, so its tools declare their input as a
JSON Schema dict and this small validator checks each invoke's input before the
tool runs (C2). It covers what tool inputs use: `type` (one or a list),
`properties`, `required`, `additionalProperties` (false or a schema), `items`,
`enum`, `const`, `anyOf`, `minimum`/`maximum`, `exclusiveMinimum`/`exclusiveMaximum`,
`minLength`/`maxLength` and `minItems`/`maxItems`; other keywords are ignored, as
JSON Schema ignores unknown ones. Errors have the shape, `type` and `msg` that
the Pyodide flavour's pydantic gives for the same schema, so the model reads the
same `invalid_input` either way (tests/unit/test_input_schema.py compares them).
Unlike pydantic's lax mode nothing is coerced: "3" is not an integer here.

Pure Python that runs on CPython and MicroPython 1.27 (see rules.py).

    >>> schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    >>> input_errors(schema, {"a": "one"})
    [{'type': 'int_type', 'loc': ['a'], 'msg': 'Input should be a valid integer', 'input': 'one'}]
    >>> input_errors(schema, {"a": 1})
    []
"""

import math

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (MicroPython has none)
if TYPE_CHECKING:
    from typing import Any

    Error = dict[str, Any]

# JSON Schema type -> (pydantic error type, message)
_TYPE_ERRORS = {
    "string": ("string_type", "Input should be a valid string"),
    "integer": ("int_type", "Input should be a valid integer"),
    "number": ("float_type", "Input should be a valid number"),
    "boolean": ("bool_type", "Input should be a valid boolean"),
    "array": ("list_type", "Input should be a valid list"),
    "object": ("dict_type", "Input should be a valid dictionary"),
    "null": ("none_required", "Input should be None"),
}


def _is_number(value: object) -> bool:
    # bool is an int on CPython (not on MicroPython); JSON Schema keeps them apart.
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _number(schema: "dict[str, Any]", keyword: str) -> "float | None":
    value = schema.get(keyword)
    return value if _is_number(value) else None


def _has_type(value: object, name: str) -> bool:
    if name == "string":
        return isinstance(value, str)
    if name == "integer":
        if isinstance(value, float):
            return math.isfinite(value) and value == int(value)
        return _is_number(value)
    if name == "number":
        return _is_number(value)
    if name == "boolean":
        return isinstance(value, bool)
    if name == "array":
        return isinstance(value, list)
    if name == "object":
        return isinstance(value, dict)
    if name == "null":
        return value is None
    return True  # an unknown type name constrains nothing


def _error(kind: str, loc: "list[Any]", msg: str, value: object, ctx: "Any" = None) -> "Error":
    error: Error = {"type": kind, "loc": list(loc), "msg": msg, "input": value}
    if ctx is not None:
        error["ctx"] = ctx
    return error


def _expected(options: "list[Any]") -> str:
    # pydantic's literal_error wording: 'a', 'b' or 'c'
    texts = [repr(option) for option in options]
    if len(texts) == 1:
        return texts[0]
    return ", ".join(texts[:-1]) + " or " + texts[-1]


def _plural(count: object, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def input_errors(schema: "dict[str, Any]", value: object) -> "list[Error]":
    """Every way `value` fails `schema`, in pydantic's error format; empty when it passes."""
    errors: list[Error] = []
    _check(schema, value, [], errors)
    return errors


def _check(schema: object, value: object, loc: "list[Any]", errors: "list[Error]") -> None:
    if not isinstance(schema, dict):
        return  # `true`, or a schema this validator cannot read: no constraint
    if "anyOf" in schema and isinstance(schema["anyOf"], list):
        _check_any_of(schema["anyOf"], value, loc, errors)
    if "const" in schema and value != schema["const"]:
        expected = _expected([schema["const"]])
        msg = f"Input should be {expected}"
        errors.append(_error("literal_error", loc, msg, value, {"expected": expected}))
        return
    if "enum" in schema and isinstance(schema["enum"], list):
        options = schema["enum"]
        if not any(value == option and type(value) is type(option) for option in options):
            expected = _expected(options)
            msg = f"Input should be {expected}"
            errors.append(_error("literal_error", loc, msg, value, {"expected": expected}))
            return
    kinds = schema.get("type")
    if kinds is not None:
        names = kinds if isinstance(kinds, list) else [kinds]
        if not any(_has_type(value, name) for name in names):
            first = names[0] if names else "null"
            if first == "integer" and isinstance(value, float):
                msg = "Input should be a valid integer, got a number with a fractional part"
                errors.append(_error("int_from_float", loc, msg, value))
            else:
                kind, msg = _TYPE_ERRORS.get(first, ("type_error", f"Input should be {first}"))
                errors.append(_error(kind, loc, msg, value))
            return
    if isinstance(value, str):
        _check_length(schema, value, loc, errors)
    elif _is_number(value):
        _check_bounds(schema, value, loc, errors)
    elif isinstance(value, list):
        _check_items(schema, value, loc, errors)
    elif isinstance(value, dict):
        _check_object(schema, value, loc, errors)


def _check_any_of(
    branches: "list[Any]", value: object, loc: "list[Any]", errors: "list[Error]"
) -> None:
    first: list[Error] | None = None
    for branch in branches:
        found: list[Error] = []
        _check(branch, value, loc, found)
        if not found:
            return
        if first is None and not (isinstance(branch, dict) and branch.get("type") == "null"):
            first = found
    # Like pydantic for `T | None`: the errors of the first branch that is not null.
    errors.extend(first or [])


def _check_length(
    schema: "dict[str, Any]", value: str, loc: "list[Any]", errors: "list[Error]"
) -> None:
    low, high = _number(schema, "minLength"), _number(schema, "maxLength")
    if low is not None and len(value) < low:
        msg = f"String should have at least {_plural(low, 'character')}"
        errors.append(_error("string_too_short", loc, msg, value, {"min_length": low}))
    if high is not None and len(value) > high:
        msg = f"String should have at most {_plural(high, 'character')}"
        errors.append(_error("string_too_long", loc, msg, value, {"max_length": high}))


_BOUNDS = (
    ("minimum", "greater_than_equal", "greater than or equal to", "ge"),
    ("exclusiveMinimum", "greater_than", "greater than", "gt"),
    ("maximum", "less_than_equal", "less than or equal to", "le"),
    ("exclusiveMaximum", "less_than", "less than", "lt"),
)


def _check_bounds(
    schema: "dict[str, Any]", value: "Any", loc: "list[Any]", errors: "list[Error]"
) -> None:
    for keyword, kind, words, key in _BOUNDS:
        bound = schema.get(keyword)
        if not _is_number(bound):
            continue
        if key == "ge":
            fails = value < bound
        elif key == "gt":
            fails = value <= bound
        elif key == "le":
            fails = value > bound
        else:
            fails = value >= bound
        if fails:
            msg = f"Input should be {words} {bound}"
            errors.append(_error(kind, loc, msg, value, {key: bound}))


def _check_items(
    schema: "dict[str, Any]", value: "list[Any]", loc: "list[Any]", errors: "list[Error]"
) -> None:
    low, high = _number(schema, "minItems"), _number(schema, "maxItems")
    count = len(value)
    if low is not None and count < low:
        msg = f"List should have at least {_plural(low, 'item')} after validation, not {count}"
        ctx = {"field_type": "List", "min_length": low, "actual_length": count}
        errors.append(_error("too_short", loc, msg, value, ctx))
    if high is not None and count > high:
        msg = f"List should have at most {_plural(high, 'item')} after validation, not {count}"
        ctx = {"field_type": "List", "max_length": high, "actual_length": count}
        errors.append(_error("too_long", loc, msg, value, ctx))
    items = schema.get("items")
    if isinstance(items, dict):
        for index, item in enumerate(value):
            _check(items, item, loc + [index], errors)


def _check_object(
    schema: "dict[str, Any]", value: "dict[str, Any]", loc: "list[Any]", errors: "list[Error]"
) -> None:
    properties = schema.get("properties")
    properties = properties if isinstance(properties, dict) else {}
    required = schema.get("required")
    required = required if isinstance(required, list) else []
    for name, subschema in properties.items():
        if name in value:
            _check(subschema, value[name], loc + [name], errors)
        elif name in required:
            errors.append({"type": "missing", "loc": loc + [name], "msg": "Field required"})
    for name in required:
        if name not in properties and name not in value:
            errors.append({"type": "missing", "loc": loc + [name], "msg": "Field required"})
    extra = schema.get("additionalProperties", True)
    for name in value:
        if name in properties:
            continue
        if extra is False:
            msg = "Extra inputs are not permitted"
            errors.append(_error("extra_forbidden", loc + [name], msg, value[name]))
        elif isinstance(extra, dict):
            _check(extra, value[name], loc + [name], errors)
