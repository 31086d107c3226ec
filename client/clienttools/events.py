"""What the protocol core (core.py) asks its adapter to do, or tells it: plain classes.

Runs on CPython, Pyodide and MicroPython 1.27 (no dataclasses there): each event
is equal to another of its class with the same fields, and shows them.

    >>> CancelTool("r1", "timeout") == CancelTool("r1", "timeout")
    True
    >>> CancelTool("r1", "timeout")
    CancelTool(request_id='r1', reason='timeout')
"""

from clienttools.context import ToolContext

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (MicroPython has none)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

__all__ = [
    "CancelTool",
    "ChatFrameReceived",
    "Rejection",
    "ReplaceConnection",
    "RunTool",
    "ToolsAcknowledged",
]


class _Event:
    """Equal when of one class with equal fields; shown with its fields."""

    __slots__: "tuple[str, ...]" = ()
    _fields: "tuple[str, ...]" = ()  # in the constructor's order, for repr

    def _values(self) -> "tuple[Any, ...]":
        return tuple(getattr(self, name) for name in self._fields)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other._values() == self._values()

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._fields)
        return f"{type(self).__name__}({fields})"


class RunTool(_Event):
    """Run `tool` with validated `arguments`; then report tool_returned/raised/cancelled.

    `tool.call(arguments, context)` returns the value of a sync tool, or a
    coroutine for an async one, which the adapter runs as a cancellable task.
    """

    __slots__ = _fields = ("request_id", "tool_call_id", "attempt", "tool", "arguments")

    def __init__(
        self,
        request_id: str,
        tool_call_id: str,
        attempt: int,
        tool: "Any",
        arguments: "dict[str, Any]",
    ) -> None:
        self.request_id = request_id
        self.tool_call_id = tool_call_id
        self.attempt = attempt
        self.tool = tool
        self.arguments = arguments

    def context(
        self, report_progress: "Callable[[float, float | None, str | None], None] | None"
    ) -> ToolContext:
        """The ToolContext for this run; `report_progress` should call `Session.report_progress`."""
        return ToolContext(
            request_id=self.request_id,
            tool_call_id=self.tool_call_id,
            tool_name=self.tool.name,
            attempt=self.attempt,
            report_progress=report_progress or _ignore_progress,
        )


def _ignore_progress(progress: float, total: "float | None", message: "str | None") -> None:
    pass


class CancelTool(_Event):
    """Cancel the run of `request_id` (the tool sees CancelledError), then report tool_cancelled.

    `reason` is a protocol CancelReason, or "shutdown" when the app closed the client.
    """

    __slots__ = _fields = ("request_id", "reason")

    def __init__(self, request_id: str, reason: str) -> None:
        self.request_id = request_id
        self.reason = reason


class Rejection(_Event):
    """One tool the server refused, and why (in a tools ack)."""

    __slots__ = _fields = ("name", "reason")

    def __init__(self, name: str, reason: str) -> None:
        self.name = name
        self.reason = reason


class ToolsAcknowledged(_Event):
    """The server answered the tools frame (C1)."""

    __slots__ = _fields = ("accepted", "rejected")

    def __init__(self, accepted: "tuple[str, ...]", rejected: "tuple[Rejection, ...]") -> None:
        self.accepted = accepted
        self.rejected = rejected


class ChatFrameReceived(_Event):
    """A chat frame (start, chunk, end, error, no-active, the stored messages).

    `frame` is what `Session.chat_frame` made of it: the Pyodide flavour's model.
    """

    __slots__ = _fields = ("frame",)

    def __init__(self, frame: "Any") -> None:
        self.frame = frame


class ReplaceConnection(_Event):
    """C12: nothing arrived for too long. Drop the socket and reconnect (C11)."""

    __slots__ = _fields = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason
