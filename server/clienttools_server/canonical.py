"""Canonical JSON: one text for one JSON value, so stored inputs and results compare as text.

The ledger stores every input, result and error in this form, and replay compares
what a step asks for with what was recorded as text; digests of model histories
hash it.

    >>> canonical_json({"b": 1, "a": [True, None, "é"]})
    '{"a":[true,null,"é"],"b":1}'
    >>> canonicalize('{ "b": 1, "a": 2 }')
    '{"a":2,"b":1}'
"""

from __future__ import annotations

import json


class Canonical(str):
    """Text that :func:`canonical_json` produced: stored as is, not parsed and encoded again."""

    __slots__ = ()


def canonical_json(value: object) -> str:
    """Serialize ``value`` so that equal JSON values give equal strings.

    Keys sorted, no whitespace, non-ASCII kept as is; NaN and infinities are
    refused because JSON has no spelling for them. ValueError for anything that
    is not a JSON value.
    """
    try:
        return Canonical(
            json.dumps(
                value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
            )
        )
    except (TypeError, RecursionError) as exc:
        # One exception type for "not a JSON value", whatever json tripped on.
        raise ValueError(f"not a JSON value: {exc}") from exc


def canonicalize(text: str) -> str:
    """Parse JSON text and return its canonical form; ValueError if it is not JSON."""
    if type(text) is Canonical:
        return text  # canonical_json made it: parsing and encoding again gives the same text
    try:
        value = json.loads(text)
    except RecursionError as exc:
        raise ValueError("JSON nested too deeply") from exc
    # json.loads accepts NaN and Infinity; canonical_json then refuses them.
    return canonical_json(value)
