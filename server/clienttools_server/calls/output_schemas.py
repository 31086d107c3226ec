"""Tool ``outputSchema`` checks (S5), by the ``jsonschema`` package, Draft 2020-12.

Draft 2020-12 is what pydantic emits: ``$defs``/``$ref``, ``prefixItems``,
``const`` (where ``true`` is not ``1``), ``pattern`` and the rest are checked
as the specification says. Each distinct schema is compiled once (a
registration is refused when its schema is not itself a valid schema) and the
compiled validators are kept in a bounded cache shared by every path that
applies a result: a live result, a result re-delivered after a restart (its
schema comes from the ledger) and a resolve from outside.

    >>> schemas = OutputSchemas()
    >>> schemas.problem({"type": "integer"}) is None
    True
    >>> schemas.errors({"type": "object", "required": ["x"]}, {"y": 1})
    ["$: 'x' is a required property"]
    >>> schemas.problem({"type": 3})
    '3 is not valid under any of the given schemas (at $.type)'
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from jsonschema.protocols import Validator
from pydantic import JsonValue

from ..canonical import canonical_json

# How many violations one message names; how many compiled schemas one server keeps.
MAX_ERRORS = 5
MAX_COMPILED = 4_096


def _where(path: Iterable[object]) -> str:
    """A JSONPath-like location (``$.a[0].b``) of a deque of keys and indexes."""
    text = "$"
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else f".{part}"
    return text


class OutputSchemas:
    """Compiled Draft 2020-12 validators, one per distinct schema, least recently used first out."""

    def __init__(self, limit: int = MAX_COMPILED) -> None:
        self.limit = limit
        self._compiled: OrderedDict[str, Validator] = OrderedDict()

    def problem(self, schema: Mapping[str, JsonValue]) -> str | None:
        """Why ``schema`` is not a valid Draft 2020-12 schema, or None (it is then compiled)."""
        try:
            self.validator(schema)
        except SchemaError as exc:
            return f"{exc.message} (at {_where(exc.path)})"
        return None

    def validator(self, schema: Mapping[str, JsonValue]) -> Validator:
        """The compiled validator of ``schema``; SchemaError when it is not a valid schema."""
        key = canonical_json(schema)
        found = self._compiled.get(key)
        if found is not None:
            self._compiled.move_to_end(key)
            return found
        Draft202012Validator.check_schema(schema)
        compiled: Validator = Draft202012Validator(schema)
        self._compiled[key] = compiled
        while len(self._compiled) > self.limit:
            self._compiled.popitem(last=False)
        return compiled

    def errors(self, schema: Mapping[str, JsonValue], value: JsonValue) -> list[str]:
        """Where and how ``value`` breaks ``schema`` (jsonschema's messages); empty if it fits.

        A schema that is not valid is one error too: a result cannot be checked
        against it, so it is not applied.
        """
        try:
            validator = self.validator(schema)
        except SchemaError as exc:
            return [f"the outputSchema is not a valid schema: {exc.message}"]
        try:
            found = sorted(
                validator.iter_errors(value),
                key=lambda e: ([str(part) for part in e.path], e.message),
            )
        except Exception as exc:  # a $ref to nothing, say: jsonschema finds it only now
            return [f"the outputSchema cannot be applied: {exc}"]
        return [f"{_where(error.path)}: {error.message}" for error in found[:MAX_ERRORS]]
