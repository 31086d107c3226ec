"""The value of a JSON prefix, repaired the way the ``ai`` package does it.

A port of the ``ai`` package's ``fixJson`` + ``parsePartialJson``, so a
streaming tool input shows the same partial value in Python as in the AI SDK
(``tests/unit/test_chat_differential.py`` checks every prefix of a corpus
against Node). We keep our own instead of a library because the libraries
disagree with ``fixJson`` on partial literals: ``pydantic_core.from_json(...,
allow_partial=True)`` drops a partial ``tr``, ``nu`` or ``2.`` that ``fixJson``
completes (``[1, tr`` gives ``[1]`` there, ``[1, true]`` in the AI SDK), and
``partial-json-parser`` disagrees with it on partial literals as well.

    >>> parse_partial_json('{"city": "Par')
    {'city': 'Par'}
    >>> parse_partial_json('[1, tr')
    [1, True]

The scanner is a stack of states; what each character does in each state is
the table ``_STEPS``, and how an open state is closed at the end is
``_CLOSERS``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Final

from pydantic import MISSING, JsonValue

from clienttools.protocol import load_json

__all__ = ["fix_json", "parse_partial_json"]

_LITERALS: Final = ("true", "false", "null")
_VALUE_OPENERS: Final[Mapping[str, str]] = {
    '"': "INSIDE_STRING",
    "{": "INSIDE_OBJECT_START",
    "[": "INSIDE_ARRAY_START",
}


#: The characters that end a number, and the containers in which each then acts:
#: fixJson lets "," act in an object or an array, "}" only in an object, "]" only in
#: an array.
_NUMBER_ENDS: Final[Mapping[str, frozenset[str]]] = {
    ",": frozenset({"INSIDE_OBJECT_AFTER_VALUE", "INSIDE_ARRAY_AFTER_VALUE"}),
    "}": frozenset({"INSIDE_OBJECT_AFTER_VALUE"}),
    "]": frozenset({"INSIDE_ARRAY_AFTER_VALUE"}),
}


class _Scan:
    """The scanner's state: the stack, and the end of the longest valid prefix."""

    __slots__ = ("last_valid", "literal_start", "stack", "text", "unicode_digits")

    def __init__(self, text: str) -> None:
        self.text = text
        self.stack = ["ROOT"]
        self.last_valid = -1
        self.literal_start = 0
        self.unicode_digits = 0

    def swap(self, state: str) -> None:
        self.stack[-1] = state

    def value_start(self, char: str, i: int, swap: str) -> None:
        if char not in _VALUE_OPENERS and char not in "ftn-0123456789":
            return
        if char != "-":
            self.last_valid = i
        self.swap(swap)
        if char in _VALUE_OPENERS:
            self.stack.append(_VALUE_OPENERS[char])
        elif char in "ftn":
            self.literal_start = i
            self.stack.append("INSIDE_LITERAL")
        else:
            self.stack.append("INSIDE_NUMBER")

    def after_object_value(self, char: str, i: int) -> None:
        if char == ",":
            self.swap("INSIDE_OBJECT_AFTER_COMMA")
        elif char == "}":
            self.last_valid = i
            self.stack.pop()

    def after_array_value(self, char: str, i: int) -> None:
        if char == ",":
            self.swap("INSIDE_ARRAY_AFTER_COMMA")
        elif char == "]":
            self.last_valid = i
            self.stack.pop()

    def after_value(self, char: str, i: int) -> None:
        """A number or literal ended at `char`: `char` then acts on the container."""
        if self.stack[-1] == "INSIDE_OBJECT_AFTER_VALUE":
            self.after_object_value(char, i)
        elif self.stack[-1] == "INSIDE_ARRAY_AFTER_VALUE":
            self.after_array_value(char, i)


def _root(s: _Scan, char: str, i: int) -> None:
    s.value_start(char, i, "FINISH")


def _object_start(s: _Scan, char: str, i: int) -> None:
    if char == '"':
        s.swap("INSIDE_OBJECT_KEY")
    elif char == "}":
        s.last_valid = i
        s.stack.pop()


def _object_after_comma(s: _Scan, char: str, i: int) -> None:
    if char == '"':
        s.swap("INSIDE_OBJECT_KEY")


def _object_key(s: _Scan, char: str, i: int) -> None:
    if char == '"':
        s.swap("INSIDE_OBJECT_AFTER_KEY")


def _object_after_key(s: _Scan, char: str, i: int) -> None:
    if char == ":":
        s.swap("INSIDE_OBJECT_BEFORE_VALUE")


def _object_before_value(s: _Scan, char: str, i: int) -> None:
    s.value_start(char, i, "INSIDE_OBJECT_AFTER_VALUE")


def _object_after_value(s: _Scan, char: str, i: int) -> None:
    s.after_object_value(char, i)


def _string(s: _Scan, char: str, i: int) -> None:
    if char == '"':
        s.stack.pop()
        s.last_valid = i
    elif char == "\\":
        s.stack.append("INSIDE_STRING_ESCAPE")
    else:
        s.last_valid = i


def _array_start(s: _Scan, char: str, i: int) -> None:
    if char == "]":
        s.last_valid = i
        s.stack.pop()
    else:
        s.value_start(char, i, "INSIDE_ARRAY_AFTER_VALUE")


def _array_after_value(s: _Scan, char: str, i: int) -> None:
    if char == ",":
        s.swap("INSIDE_ARRAY_AFTER_COMMA")
    elif char == "]":
        s.last_valid = i
        s.stack.pop()
    else:
        s.last_valid = i


def _array_after_comma(s: _Scan, char: str, i: int) -> None:
    s.value_start(char, i, "INSIDE_ARRAY_AFTER_VALUE")


def _string_escape(s: _Scan, char: str, i: int) -> None:
    s.stack.pop()
    if char == "u":
        s.unicode_digits = 0
        s.stack.append("INSIDE_STRING_UNICODE_ESCAPE")
    else:
        s.last_valid = i


def _string_unicode_escape(s: _Scan, char: str, i: int) -> None:
    if char in "0123456789abcdefABCDEF":
        s.unicode_digits += 1
        if s.unicode_digits == 4:
            s.stack.pop()
            s.last_valid = i


def _number(s: _Scan, char: str, i: int) -> None:
    if char in "0123456789":
        s.last_valid = i
    elif char in "eE-.":
        pass
    elif char in _NUMBER_ENDS:
        s.stack.pop()
        if s.stack[-1] in _NUMBER_ENDS[char]:
            s.after_value(char, i)
    else:
        s.stack.pop()


def _literal(s: _Scan, char: str, i: int) -> None:
    partial = s.text[s.literal_start : i + 1]
    if any(word.startswith(partial) for word in _LITERALS):
        s.last_valid = i
        return
    s.stack.pop()
    s.after_value(char, i)


def _finish(s: _Scan, char: str, i: int) -> None:
    pass  # a complete top-level value: whatever follows is cut off


#: What one character does in each state (``fixJson``'s switch, as data).
_STEPS: Final[Mapping[str, Callable[[_Scan, str, int], None]]] = {
    "ROOT": _root,
    "FINISH": _finish,
    "INSIDE_OBJECT_START": _object_start,
    "INSIDE_OBJECT_AFTER_COMMA": _object_after_comma,
    "INSIDE_OBJECT_KEY": _object_key,
    "INSIDE_OBJECT_AFTER_KEY": _object_after_key,
    "INSIDE_OBJECT_BEFORE_VALUE": _object_before_value,
    "INSIDE_OBJECT_AFTER_VALUE": _object_after_value,
    "INSIDE_STRING": _string,
    "INSIDE_STRING_ESCAPE": _string_escape,
    "INSIDE_STRING_UNICODE_ESCAPE": _string_unicode_escape,
    "INSIDE_ARRAY_START": _array_start,
    "INSIDE_ARRAY_AFTER_VALUE": _array_after_value,
    "INSIDE_ARRAY_AFTER_COMMA": _array_after_comma,
    "INSIDE_NUMBER": _number,
    "INSIDE_LITERAL": _literal,
}

#: What closes each state still open at the end; a literal is completed instead.
_CLOSERS: Final[Mapping[str, str]] = {
    "INSIDE_STRING": '"',
    "INSIDE_OBJECT_START": "}",
    "INSIDE_OBJECT_AFTER_COMMA": "}",
    "INSIDE_OBJECT_KEY": "}",
    "INSIDE_OBJECT_AFTER_KEY": "}",
    "INSIDE_OBJECT_BEFORE_VALUE": "}",
    "INSIDE_OBJECT_AFTER_VALUE": "}",
    "INSIDE_ARRAY_START": "]",
    "INSIDE_ARRAY_AFTER_VALUE": "]",
    "INSIDE_ARRAY_AFTER_COMMA": "]",
}


def fix_json(text: str) -> str:
    """`text` cut to its longest valid prefix and closed, like the ``ai`` package's ``fixJson``."""
    scan = _Scan(text)
    for i, char in enumerate(text):
        _STEPS[scan.stack[-1]](scan, char, i)
    result = text[: scan.last_valid + 1]
    for state in reversed(scan.stack):
        if state == "INSIDE_LITERAL":
            partial = text[scan.literal_start :]
            word = next((w for w in _LITERALS if w.startswith(partial)), None)
            if word is not None:
                result += word[len(partial) :]
        else:
            result += _CLOSERS.get(state, "")
    return result


def parse_partial_json(text: str) -> JsonValue | MISSING:
    """The value of a JSON prefix, repaired like the AI SDK does; ``MISSING`` if none."""
    for candidate in (text, None):
        try:
            return load_json(fix_json(text) if candidate is None else candidate)
        except ValueError:
            continue
    return MISSING
