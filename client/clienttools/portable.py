"""The few things that differ between CPython (and Pyodide) and MicroPython 1.27.

Logging (`logging` there, the page's console here, through `log_to`), the one JSON
codec of the client's frames (`dumps`, `loads`: compact, no NaN) and the UTF-8 size
of a text. The protocol core and what sits around it import these, so neither has
a branch on the interpreter of its own. Imports no `js`, `asyncio` or pydantic.

    >>> dumps({"a": [1, None], "é": True})
    '{"a":[1,null],"é":true}'
    >>> utf8_size("é")
    2
"""

import json
import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (MicroPython has none)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

__all__ = ["dumps", "loads", "log", "log_exception", "log_to", "utf8_encodable", "utf8_size"]

if sys.implementation.name == "micropython":
    # No logging module worth the name (a stub without handlers): mpy.py sends these
    # lines to the page's console with `log_to`, since this module imports no `js`.
    _sink: "list[Callable[[str, str], None]]" = []

    def log(level: str, message: str) -> None:
        """Log `message` at "debug", "info", "warn" or "error" (dropped until `log_to`)."""
        if _sink:
            _sink[0](level, message)

    def log_to(sink: "Callable[[str, str], None]") -> None:
        """Send every line `log` gets to `sink(level, message)` from now on."""
        _sink[:] = [sink]

    def log_exception(message: str) -> None:
        """Log `message` as an error, in an `except` block (no traceback on MicroPython)."""
        log("error", message)

    def dumps(value: object) -> str:
        """`value` as compact JSON text (MicroPython writes no NaN here: callers check first)."""
        return json.dumps(value, separators=(",", ":"))

    def loads(text: str) -> "Any":
        return json.loads(text)

    def utf8_encodable(value: object) -> bool:
        return True  # a MicroPython str is UTF-8: no lone surrogates

else:
    import logging

    _logger = logging.getLogger("clienttools")
    _LEVELS = {"debug": 10, "info": 20, "warn": 30, "error": 40}

    def log(level: str, message: str) -> None:
        """Log `message` at "debug", "info", "warn" or "error" on the `clienttools` logger."""
        _logger.log(_LEVELS[level], "%s", message)

    def log_exception(message: str) -> None:
        """Log `message` as an error with the traceback, in an `except` block."""
        _logger.exception("%s", message)

    def log_to(sink: "Callable[[str, str], None]") -> None:
        """CPython and Pyodide log through `logging`: its handlers decide where lines go."""
        raise RuntimeError("log_to is for MicroPython; configure the 'clienttools' logger")

    def _refuse_constant(name: str) -> object:
        # Python's json accepts NaN and Infinity; JSON does not, and neither can we send them.
        raise ValueError(f"{name} is not a JSON value")

    # One decoder and one encoder for every frame: `json.loads`/`json.dumps` with options
    # build a new one per call, a tenth of an invoke's time.
    # (Bound methods, not functions that call them: these run for every frame.)
    loads = json.JSONDecoder(parse_constant=_refuse_constant).decode  # type: ignore[assignment]
    dumps = json.JSONEncoder(  # type: ignore[assignment]
        separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode

    def utf8_encodable(value: object) -> bool:
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            return False
        return True


if hasattr(str, "isascii"):

    def utf8_size(text: str) -> int:
        """Bytes of `text` as UTF-8 (an ASCII text is its length: no encoding needed)."""
        return len(text) if text.isascii() else len(text.encode("utf-8"))

else:  # MicroPython

    def utf8_size(text: str) -> int:
        """Bytes of `text` as UTF-8."""
        return len(text.encode("utf-8"))
