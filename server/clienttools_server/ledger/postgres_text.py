"""Text as PostgreSQL's ``text`` can hold it: NUL, and so the escape character, escaped.

The ledger's values it does not parse (a session, a name, a request id, an error)
may hold any character; these store them escaped and read them back as given.

    >>> unescape(escape("a\\x00b\\\\c")) == "a\\x00b\\\\c"
    True
"""

from __future__ import annotations


def escape(text: str) -> str:
    """``text`` as PostgreSQL can store it: NUL (and so the escape character) escaped."""
    if "\\" not in text and "\x00" not in text:
        return text
    return text.replace("\\", "\\\\").replace("\x00", "\\0")


def unescape(text: str) -> str:
    if "\\" not in text:
        return text
    out: list[str] = []
    chars = iter(text)
    for char in chars:
        if char == "\\":
            escaped = next(chars, "")
            out.append("\x00" if escaped == "0" else escaped)
        else:
            out.append(char)
    return "".join(out)


def maybe_escape(text: str | None) -> str | None:
    return None if text is None else escape(text)


def maybe_unescape(text: object) -> str | None:
    return None if text is None else unescape(str(text))
