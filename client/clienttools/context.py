"""What a running tool sees and raises, in both flavours: ToolContext, ToolError, InvalidInput.

Pure Python that runs on CPython, Pyodide and MicroPython 1.27 (no pydantic,
`typing` or `from __future__`; see rules.py), so the Pyodide client (tools.py
re-exports both) and the MicroPython client (mpy.py) hand tools the same objects.

    async def count_up(steps, ctx):
        for step in range(1, steps + 1):
            await ctx.progress(step, total=steps)   # C10: strictly increasing
        if steps > 10:
            raise ToolError("too many steps", data={"max": 10})
"""

import asyncio
import math

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (MicroPython has none)
if TYPE_CHECKING:
    from collections.abc import Callable

    from pydantic import JsonValue


def json_problem(value: object, depth: int = 0) -> "str | None":
    """Why `value` is not plain JSON data (None, bool, int, finite float, str, list, dict), or None.

    The same answer on every interpreter: MicroPython's `json.dumps` writes NaN as
    `nan` and has no `allow_nan`, so this walks the value instead.

        >>> json_problem({"a": [1, 2.5, None]}) is None
        True
        >>> json_problem({"a": float("nan")})
        'NaN or Infinity at a'
    """
    if value is None or isinstance(value, (bool, str, int)):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else "NaN or Infinity"
    if depth > 100:
        return "nested too deeply"
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            problem = json_problem(item, depth + 1)
            if problem is not None:
                return _at(problem, index)
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"a key of type {type(key).__name__!r}"
            problem = json_problem(item, depth + 1)
            if problem is not None:
                return _at(problem, key)
        return None
    return f"an object of type {type(value).__name__!r}"


def _at(problem: str, where: object) -> str:
    if " at " in problem:
        head, _, tail = problem.partition(" at ")
        return f"{head} at {where}.{tail}"
    return f"{problem} at {where}"


class ToolError(Exception):
    """Raise from a tool to send the model a readable error (code `tool_error`).

    `data` travels to the model as the error's `data`; it must be JSON (checked
    here, so a mistake shows up where it is made, not when the result is sent).

        >>> ToolError("no such city", data={"city": "Atlantis"}).data
        {'city': 'Atlantis'}
    """

    def __init__(self, message: str, data: "JsonValue" = None) -> None:
        problem = json_problem(data)
        if problem is not None:
            raise TypeError(f"ToolError data must be JSON-serializable: {problem}")
        super().__init__(message)
        self.message = message
        self.data = data


class InvalidInput(Exception):
    """The input failed the tool's schema (code `invalid_input`); the tool did not run.

    `errors` are pydantic's errors (or input_schema.py's, in pydantic's words) without
    documentation URLs, JSON-safe, with `loc` naming parameters as the tool knows them.
    """

    def __init__(self, message: str, errors: "list[dict[str, JsonValue]]") -> None:
        super().__init__(message)
        self.message = message
        self.errors = errors


class InvalidOutput(Exception):
    """The return value could not be serialized or failed the tool's output schema.

    Code `invalid_output`; `str()` names the offending type or the schema failure.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ToolContext:
    """Given to a tool that asks for it (a `ToolContext` parameter; `context=True` on MicroPython).

    `progress()` reports progress to the server (C10: strictly increasing per call).
    """

    __slots__ = (
        "_attempt",
        "_last_progress",
        "_report_progress",
        "_request_id",
        "_tool_call_id",
        "_tool_name",
    )

    def __init__(
        self,
        *,
        request_id: str,
        tool_call_id: str,
        tool_name: str,
        attempt: int,
        report_progress: "Callable[[float, float | None, str | None], None]",
    ) -> None:
        self._request_id = request_id
        self._tool_call_id = tool_call_id
        self._tool_name = tool_name
        self._attempt = attempt
        self._report_progress = report_progress
        self._last_progress: float | None = None

    @property
    def request_id(self) -> str:
        return self._request_id

    @property
    def tool_call_id(self) -> str:
        return self._tool_call_id

    @property
    def tool_name(self) -> str:
        return self._tool_name

    @property
    def attempt(self) -> int:
        """1 on the first delivery of this call, +1 on each re-delivery after a reconnect."""
        return self._attempt

    @property
    def last_progress(self) -> "float | None":
        """The last progress value reported, None before the first report."""
        return self._last_progress

    async def progress(
        self, progress: float, total: "float | None" = None, message: "str | None" = None
    ) -> None:
        """Report progress, then yield to the event loop once so the frame can go out.

        Raises ValueError if `progress` is not strictly greater than the last
        value reported for this call (protocol rule C10), or is not finite.
        """
        if not math.isfinite(progress):
            raise ValueError(f"progress must be a finite number, got {progress!r}")
        if total is not None and not math.isfinite(total):
            raise ValueError(f"total must be a finite number or None, got {total!r}")
        last = self._last_progress
        if last is not None and progress <= last:
            raise ValueError(
                f"progress must be strictly greater than the last reported value "
                f"(protocol rule C10): got {progress!r} after {last!r}"
            )
        self._last_progress = progress
        self._report_progress(progress, total, message)
        await asyncio.sleep(0)

    def __repr__(self) -> str:
        return (
            f"ToolContext(tool_name={self._tool_name!r}, request_id={self._request_id!r}, "
            f"attempt={self._attempt})"
        )
