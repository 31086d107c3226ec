"""What an I/O adapter provides: a socket, a way to open one, and storage for the outbox.

`ToolClient` drives any `Connector`: `native.NativeConnector` (CPython, on the
`websockets` library) and `browser.BrowserConnector` (Pyodide, on
`js.WebSocket`). Tests can plug in their own.

    class EchoSocket:                       # a Socket that answers itself
        async def send(self, text: str) -> None: ...
        async def receive(self) -> str | bytes | None: ...
        async def close(self, code: int = 1000, reason: str = "") -> None: ...

Errors (all `ConnectError`, each naming the URL, its token hidden, and the reason):

    ConnectError             connect() failed; .url, .reason
    +-- ConnectionFailed     the socket did not open: refused, unreachable, timed out, HTTP error
    +-- RegistrationTimeout  the socket opened, but no cf_agent_client_tools_ack came in time
    +-- ToolsRejected        the server refused some tools; .rejected holds (name, reason)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from clienttools.protocol import RejectedTool


def redact_token(url: str) -> str:
    """`url` with the value of its `token` query parameter hidden, for messages and logs."""
    if "?" not in url:
        # No query, no token. urllib.parse is imported only for a URL that has one: in
        # a page, importing it is a tenth of the SDK's start-up.
        return url
    from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    if not any(key == "token" for key, _ in query):
        return url
    hidden = urlencode([(key, "***" if key == "token" else value) for key, value in query])
    return urlunsplit(parts._replace(query=hidden))


class ConnectError(Exception):
    """The client could not connect to `url`; `reason` says why in plain words."""

    def __init__(self, url: str, reason: str) -> None:
        url = redact_token(url)
        super().__init__(f"cannot connect to {url}: {reason}")
        self.url = url
        self.reason = reason


class ConnectionFailed(ConnectError):
    """The WebSocket did not open: refused, unreachable within the timeout, or refused by HTTP."""


class RegistrationTimeout(ConnectError):
    """The WebSocket opened, but the server did not acknowledge the tools in time."""


class ToolsRejected(ConnectError):
    """The server acknowledged the tools frame but refused some tools."""

    def __init__(self, url: str, rejected: Sequence[RejectedTool]) -> None:
        reasons = "; ".join(f"{tool.name!r}: {tool.reason}" for tool in rejected)
        super().__init__(url, f"the server rejected tools: {reasons}")
        self.rejected = tuple(rejected)


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
