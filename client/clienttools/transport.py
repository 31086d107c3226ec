"""What an I/O adapter provides: a socket, a way to open one, and storage for the outbox.

`ToolClient` drives any `Connector`: `native.NativeConnector` (CPython, on the
`websockets` library) and `browser.BrowserConnector` (Pyodide, on
`js.WebSocket`). Tests can plug in their own.

    class EchoSocket:                       # a Socket that answers itself
        async def send(self, text: str) -> None: ...
        async def receive(self) -> str | bytes | None: ...
        async def close(self, code: int = 1000, reason: str = "") -> None: ...

The errors of connect() (`ConnectError` and its kinds) are defined in errors.py, which
the MicroPython flavour shares, and are importable from here as well.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from clienttools.errors import (
    ConnectError,
    ConnectionFailed,
    RegistrationTimeout,
    ToolsRejected,
    redact_token,
)

__all__ = [
    "ConnectError",
    "ConnectionFailed",
    "Connector",
    "FlushesOnPageHide",
    "MemoryOutboxStore",
    "OutboxStore",
    "PushesFrames",
    "RegistrationTimeout",
    "ReportsClose",
    "SendsAtOnce",
    "Socket",
    "ToolsRejected",
    "redact_token",
]


class Socket(Protocol):
    """One open WebSocket, text frames only.

    A socket may offer more: `ReportsClose` (why the server closed it),
    `SendsAtOnce` and `PushesFrames` (the browser's). The client asks with
    `isinstance`, once per socket.
    """

    async def send(self, text: str) -> None:
        """Send one text frame. May raise once the socket is closed."""
        ...

    async def receive(self) -> str | bytes | None:
        """The next frame (bytes for a binary frame); None once the socket is closed."""
        ...

    async def close(self, code: int = 1000, reason: str = "") -> None:
        """Close the socket; returns when closed. Never raises for an already-closed socket."""
        ...


@runtime_checkable
class ReportsClose(Protocol):
    """A socket that tells the close code and reason the server sent (both adapters do)."""

    @property
    def close_code(self) -> int | None: ...

    @property
    def close_reason(self) -> str: ...


@runtime_checkable
class SendsAtOnce(Protocol):
    """A socket whose send only queues (a browser WebSocket), so it can send without awaiting."""

    def send_nowait(self, text: str) -> None:
        """Send one text frame now; raise once the socket is closed."""
        ...


@runtime_checkable
class PushesFrames(Protocol):
    """A socket that can hand frames to a receiver from its own message event.

    After `deliver_to(receiver)`, every frame goes to `receiver(frame, more)`
    (which must not raise) and `receive()` only returns the close (None). `more`
    is True when the socket hands over the next frame right after this one (a
    batch): the receiver may hold its output until the batch's last frame.
    """

    def deliver_to(self, receiver: Callable[[str | bytes, bool], None]) -> None: ...


class Connector(Protocol):
    """Opens sockets."""

    async def open(self, url: str, timeout: float) -> Socket:
        """Open a WebSocket to `url` within `timeout` seconds; raise ConnectionFailed otherwise."""
        ...


class OutboxStore(Protocol):
    """Where unacknowledged results wait across a page reload (Session.export_outbox text)."""

    def load(self) -> str | None:
        """The last saved text, or None."""
        ...

    def save(self, text: str) -> None:
        """Replace the saved text."""
        ...


@runtime_checkable
class FlushesOnPageHide(Protocol):
    """An outbox store that can tell when the page goes away (the browser's)."""

    def flush_on_page_hide(self, flush: Callable[[], None]) -> None:
        """Call `flush` when the page is hidden or left, so a batched save is not lost."""
        ...


class MemoryOutboxStore:
    """An OutboxStore in memory: survives reconnects of one client, not a restart."""

    def __init__(self, text: str | None = None) -> None:
        self.text = text

    def load(self) -> str | None:
        return self.text

    def save(self, text: str) -> None:
        self.text = text
