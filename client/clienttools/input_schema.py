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
    from collections.abc import Callable
    from typing import Any

    Error = dict[str, Any]
    Checker = Callable[[object, list[Any], list[Error]], None]

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


def is_number(value: object) -> bool:
    """A JSON number: an int or float, never a bool (an int on CPython, not on MicroPython)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _number(schema: "dict[str, Any]", keyword: str) -> "float | None":
    value = schema.get(keyword)
    return value if is_number(value) else None


def _has_type(value: object, name: str) -> bool:
    if name == "string":
        return isinstance(value, str)
    if name == "integer":
        if isinstance(value, float):
            return math.isfinite(value) and value == int(value)
        return is_number(value)
    if name == "number":
        return is_number(value)
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
    return compile_schema(schema)(value)


def compile_schema(schema: object) -> "Callable[[object], list[Error]]":
    """A checker for `schema`, built once: `check(value)` returns the errors (or [])."""
    checker = _compile(schema)

    def check(value: object) -> "list[Error]":
        errors: list[Error] = []
        checker(value, [], errors)
        return errors

    return check


def _nothing(value: object, loc: "list[Any]", errors: "list[Error]") -> None:
    pass


def _compile(schema: object) -> "Checker":
    """The checker of one (sub)schema: a chain of closures, so an invoke walks no keywords.

    `loc` is one list shared down the walk (append before descending, pop after);
    an error copies it.
    """
    if not isinstance(schema, dict):
        return _nothing  # `true`, or a schema this validator cannot read: no constraint
    steps: list[Checker] = []
    branches = schema.get("anyOf")
    if isinstance(branches, list):
        steps.append(_any_of(branches))
    if "const" in schema:
        steps.append(_one_of([schema["const"]]))
    elif isinstance(schema.get("enum"), list):
        steps.append(_one_of(schema["enum"]))
    kinds = schema.get("type")
    if kinds is not None:
        names = kinds if isinstance(kinds, list) else [kinds]
        steps.append(_type(names))
    rest = _by_kind(schema)
    if rest is not None:
        steps.append(rest)
    if not steps:
        return _nothing
    if len(steps) == 1:
        return steps[0]

    def check(value: object, loc: "list[Any]", errors: "list[Error]") -> None:
        before = len(errors)
        for step in steps:
            step(value, loc, errors)
            if len(errors) > before and step is not rest:
                return  # a wrong type or value: the keywords after it do not apply

    return check


def _any_of(branches: "list[Any]") -> "Checker":
    pairs = [(_compile(b), isinstance(b, dict) and b.get("type") == "null") for b in branches]

    def check(value: object, loc: "list[Any]", errors: "list[Error]") -> None:
        first: list[Error] | None = None
        for checker, null in pairs:
            found: list[Error] = []
            checker(value, loc, found)
            if not found:
                return
            if first is None and not null:
                first = found
        # Like pydantic for `T | None`: the errors of the first branch that is not null.
        errors.extend(first or [])

    return check


def _one_of(options: "list[Any]") -> "Checker":
    expected = _expected(options)
    msg = f"Input should be {expected}"

    def check(value: object, loc: "list[Any]", errors: "list[Error]") -> None:
        for option in options:
            if value == option and type(value) is type(option):
                return
        errors.append(_error("literal_error", loc, msg, value, {"expected": expected}))

    return check


def _is_integer(value: object) -> bool:
    if type(value) is int:  # exact: a bool is no integer here
        return True
    return _has_type(value, "integer")


#: One test per type name, chosen when the schema is compiled: an invoke then makes
#: one call per value, not a walk through every name `_has_type` knows.
_TYPE_TESTS: "dict[str, Callable[[object], bool]]" = {
    "string": lambda value: isinstance(value, str),
    "integer": _is_integer,
    "number": is_number,
    "boolean": lambda value: isinstance(value, bool),
    "array": lambda value: isinstance(value, list),
    "object": lambda value: isinstance(value, dict),
    "null": lambda value: value is None,
}


def _anything(value: object) -> bool:
    return True  # an unknown type name constrains nothing (as in `_has_type`)


def _type(names: "list[Any]") -> "Checker":
    first = names[0] if names else "null"
    kind, msg = _TYPE_ERRORS.get(first, ("type_error", f"Input should be {first}"))
    tests = [
        _TYPE_TESTS.get(name, _anything) if isinstance(name, str) else _anything for name in names
    ]

    def fail(value: object, loc: "list[Any]", errors: "list[Error]") -> None:
        if first == "integer" and isinstance(value, float):
            fraction = "Input should be a valid integer, got a number with a fractional part"
            errors.append(_error("int_from_float", loc, fraction, value))
        else:
            errors.append(_error(kind, loc, msg, value))

    if len(tests) == 1:  # the common schema: one type name, one test per value
        test = tests[0]

        def check_one(value: object, loc: "list[Any]", errors: "list[Error]") -> None:
            if not test(value):
                fail(value, loc, errors)

        return check_one

    def check(value: object, loc: "list[Any]", errors: "list[Error]") -> None:
        for test in tests:
            if test(value):
                return
        fail(value, loc, errors)

    return check


def _by_kind(schema: "dict[str, Any]") -> "Checker | None":
    """The keywords that depend on what the value is: lengths, bounds, items, properties."""
    text = _length(schema)
    number = _bounds(schema)
    array = _items(schema)
    mapping = _object(schema)
    if text is None and number is None and array is None and mapping is None:
        return None

    def check(value: object, loc: "list[Any]", errors: "list[Error]") -> None:
        if isinstance(value, str):
            if text is not None:
                text(value, loc, errors)
        elif isinstance(value, bool):
            pass
        elif isinstance(value, (int, float)):
            if number is not None:
                number(value, loc, errors)
        elif isinstance(value, list):
            if array is not None:
                array(value, loc, errors)
        elif isinstance(value, dict) and mapping is not None:
            mapping(value, loc, errors)

    return check


def _length(schema: "dict[str, Any]") -> "Checker | None":
    low, high = _number(schema, "minLength"), _number(schema, "maxLength")
    if low is None and high is None:
        return None

    def check(value: "Any", loc: "list[Any]", errors: "list[Error]") -> None:
        if low is not None and len(value) < low:
            msg = f"String should have at least {_plural(low, 'character')}"
            errors.append(_error("string_too_short", loc, msg, value, {"min_length": low}))
        if high is not None and len(value) > high:
            msg = f"String should have at most {_plural(high, 'character')}"
            errors.append(_error("string_too_long", loc, msg, value, {"max_length": high}))

    return check


_BOUNDS = (
    ("minimum", "greater_than_equal", "greater than or equal to", "ge"),
    ("exclusiveMinimum", "greater_than", "greater than", "gt"),
    ("maximum", "less_than_equal", "less than or equal to", "le"),
    ("exclusiveMaximum", "less_than", "less than", "lt"),
)


def _bounds(schema: "dict[str, Any]") -> "Checker | None":
    bounds = [
        (kind, f"Input should be {words} {schema[keyword]}", key, schema[keyword])
        for keyword, kind, words, key in _BOUNDS
        if _number(schema, keyword) is not None
    ]
    if not bounds:
        return None

    def check(value: "Any", loc: "list[Any]", errors: "list[Error]") -> None:
        for kind, msg, key, bound in bounds:
            if key == "ge":
                fails = value < bound
            elif key == "gt":
                fails = value <= bound
            elif key == "le":
                fails = value > bound
            else:
                fails = value >= bound
            if fails:
                errors.append(_error(kind, loc, msg, value, {key: bound}))

    return check


def _items(schema: "dict[str, Any]") -> "Checker | None":
    low, high = _number(schema, "minItems"), _number(schema, "maxItems")
    items = schema.get("items")
    each = _compile(items) if isinstance(items, dict) else None
    if low is None and high is None and each is None:
        return None

    def check(value: "Any", loc: "list[Any]", errors: "list[Error]") -> None:
        count = len(value)
        if low is not None and count < low:
            msg = f"List should have at least {_plural(low, 'item')} after validation, not {count}"
            ctx = {"field_type": "List", "min_length": low, "actual_length": count}
            errors.append(_error("too_short", loc, msg, value, ctx))
        if high is not None and count > high:
            msg = f"List should have at most {_plural(high, 'item')} after validation, not {count}"
            ctx = {"field_type": "List", "max_length": high, "actual_length": count}
            errors.append(_error("too_long", loc, msg, value, ctx))
        if each is not None:
            for index, item in enumerate(value):
                loc.append(index)
                each(item, loc, errors)
                loc.pop()

    return check


def _missing(loc: "list[Any]", name: str) -> "Error":
    return {"type": "missing", "loc": loc + [name], "msg": "Field required"}


def _object(schema: "dict[str, Any]") -> "Checker | None":
    properties = schema.get("properties")
    properties = properties if isinstance(properties, dict) else {}
    required = schema.get("required")
    required = required if isinstance(required, list) else []
    fields = [(name, _compile(sub), name in required) for name, sub in properties.items()]
    undeclared = [name for name in required if name not in properties]
    extra = schema.get("additionalProperties", True)
    extra_check = _compile(extra) if isinstance(extra, dict) else None
    forbid = extra is False
    if not fields and not undeclared and not forbid and extra_check is None:
        return None

    def check(value: "Any", loc: "list[Any]", errors: "list[Error]") -> None:
        for name, field, needed in fields:
            if name in value:
                loc.append(name)
                field(value[name], loc, errors)
                loc.pop()
            elif needed:
                errors.append(_missing(loc, name))
        for name in undeclared:
            if name not in value:
                errors.append(_missing(loc, name))
        if not forbid and extra_check is None:
            return
        for name in value:
            if name in properties:
                continue
            if forbid:
                msg = "Extra inputs are not permitted"
                errors.append(_error("extra_forbidden", loc + [name], msg, value[name]))
            elif extra_check is not None:
                loc.append(name)
                extra_check(value[name], loc, errors)
                loc.pop()

    return check
