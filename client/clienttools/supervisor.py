"""What both `ToolClient`s do alike around the core: the status table, connect, reconnect.

The two adapters (client.py on CPython's asyncio, which Pyodide runs too, and
mpy.py on MicroPython's asyncio and `js`) differ in how they open a socket and
wait on it; what they decide is here, once: how the status moves
(`CLIENT_TRANSITIONS`), when `connect()` may start, what the server's answer to
the tools frame means (`registration_error`) and the reconnect loop of C11
(`supervise`). Runs on CPython, Pyodide and MicroPython 1.27 (the subset of rules.py).

    >>> next_status("idle", ClientEvent.CONNECT)
    'connecting'
    >>> next_status("closed", ClientEvent.LOST)
    Traceback (most recent call last):
    ...
    clienttools.rules.LocalProtocolError: a client that is closed cannot be lost

`supervise(client)` drives a client that has `_connection`, `_closing`, `reconnect`,
`_step(event)`, `async _open(first)`, `async _connection_over(connection)` (wait for
its end, then let it go) and `async _close_after_loss()`.
"""

import asyncio

from clienttools.errors import ConnectError, ConnectionFailed, ToolsRejected, redact_token
from clienttools.events import ToolsAcknowledged
from clienttools.portable import log, log_exception
from clienttools.rules import LocalProtocolError, backoff

try:
    from enum import Enum
except ImportError:  # MicroPython: no enum, so the members below stay plain strings
    Enum = object  # type: ignore[assignment,misc]

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (MicroPython has none)
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any

__all__ = [
    "CLIENT_TRANSITIONS",
    "ClientEvent",
    "ClientStatus",
    "check_connect",
    "check_options",
    "next_status",
    "registration_error",
    "supervise",
    "warn_rejected",
]


class ClientEvent(Enum):
    CONNECT = "connect"  # connect() was called
    OPENED = "opened"  # a socket opened and the server acknowledged the tools
    LOST = "lost"  # the open connection ended unexpectedly; reconnecting
    CLOSED = "closed"  # closed for good: close(), a failed connect(), or reconnect off


#: The client status as a table: `CLIENT_TRANSITIONS[status][event]` is the next
#: status; a missing entry raises `LocalProtocolError`. Closing is always possible
#: (and closing twice harmless); nothing but connect() leaves "closed".
CLIENT_TRANSITIONS: "dict[str, dict[ClientEvent, str]]" = {
    "idle": {ClientEvent.CONNECT: "connecting", ClientEvent.CLOSED: "closed"},
    "connecting": {ClientEvent.OPENED: "open", ClientEvent.CLOSED: "closed"},
    "open": {ClientEvent.LOST: "reconnecting", ClientEvent.CLOSED: "closed"},
    "reconnecting": {ClientEvent.OPENED: "open", ClientEvent.CLOSED: "closed"},
    "closed": {ClientEvent.CONNECT: "connecting", ClientEvent.CLOSED: "closed"},
}


def next_status(status: str, event: "ClientEvent") -> str:
    """The status `event` leads to from `status`; LocalProtocolError if the table has none."""
    following = CLIENT_TRANSITIONS[status].get(event)
    if following is None:
        raise LocalProtocolError(
            f"a client that is {status} cannot be {getattr(event, 'value', event)}"
        )
    return following


class ClientStatus:
    """The status half of both ToolClients: where the client is, and who wants to know.

    A subclass sets `url` and, in connect(), `_closed_event` (an asyncio.Event);
    `_step(event)` moves the status by `CLIENT_TRANSITIONS`.
    """

    url = ""
    _status = "idle"
    _closed_event: "asyncio.Event | None" = None

    def __init__(self) -> None:
        self._status_callbacks: list[Callable[[Any], object]] = []

    @property
    def status(self) -> str:
        """idle -> connecting -> open (-> reconnecting -> open ...) -> closed."""
        return self._status

    @property
    def connected(self) -> bool:
        """True while a connection is open and its tools were acknowledged."""
        return self._status == "open"

    def on_status(self, callback: "Callable[[Any], object]") -> "Callable[[], None]":
        """Call `callback(status)` on every status change; returns an unsubscribe function.

        A callback that raises is logged; the connection and the other callbacks go on.
        """
        self._status_callbacks.append(callback)

        def unsubscribe() -> None:
            if callback in self._status_callbacks:
                self._status_callbacks.remove(callback)

        return unsubscribe

    async def wait_closed(self) -> None:
        """Wait until the client is closed (by close(), or after a close with reconnect off)."""
        if self._status in ("idle", "closed") or self._closed_event is None:
            return
        await self._closed_event.wait()

    async def _connect_first(self) -> None:
        """What connect() does in both flavours once it is set up: the first attempt.

        A first attempt that fails closes the client again (and raises); it is not
        retried. Needs `async _open(first)` and `async _stop()` of the subclass.
        """
        self._step(ClientEvent.CONNECT)
        try:
            await self._open(first=True)  # type: ignore[attr-defined]
        except BaseException:
            await self._stop()  # type: ignore[attr-defined]
            raise

    def _step(self, event: "ClientEvent") -> None:
        """Move the status by `CLIENT_TRANSITIONS`; tell the callbacks when it changed."""
        status = next_status(self._status, event)
        if status == self._status:
            return
        self._status = status
        log("info", f"{redact_token(self.url)}: {status}")
        if status == "closed" and self._closed_event is not None:
            self._closed_event.set()
        for callback in list(self._status_callbacks):  # a callback may unsubscribe itself
            try:
                callback(status)
            except Exception as exc:
                log_exception(f"status callback failed: {exc!r}")


def check_options(url: "str | None", connect_timeout: float, webmcp: bool) -> str:
    """The client's url ("" for a client of document.modelContext only), if its options hold."""
    if connect_timeout <= 0:
        raise ValueError("connect_timeout must be positive")
    if url is None and not webmcp:
        raise ValueError("a ToolClient needs the server's url (or webmcp=True, and no server)")
    return url or ""


def check_connect(status: str, url: str) -> None:
    """connect() may start: not already connecting or open, and there is a server to go to."""
    if status in ("connecting", "open", "reconnecting"):
        raise RuntimeError(f"ToolClient.connect() called while {status}")
    if not url:
        raise RuntimeError("this ToolClient has no url: it serves document.modelContext only")


def warn_rejected(rejected: "Sequence[Any]") -> None:
    for tool in rejected:
        log("warn", f"server rejected tool {tool.name!r}: {tool.reason}")


def registration_error(
    url: str, outcome: "ToolsAcknowledged | str", first: bool
) -> "ConnectError | None":
    """What the end of registration means: None when the tools are in, else the error to raise.

    `outcome` is the tools ack, or why the connection ended before one came. Tools
    the server refuses fail the first connect (the app must hear of it); on a
    reconnect they are logged, and the rest of the tools serve on.
    """
    if not isinstance(outcome, ToolsAcknowledged):
        return ConnectionFailed(url, str(outcome))
    if outcome.rejected:
        if first:
            return ToolsRejected(url, outcome.rejected)
        warn_rejected(outcome.rejected)
    return None


async def supervise(client: "Any") -> None:
    """C11: watch the open connection; after an unexpected end, reconnect with backoff."""
    while True:
        connection = client._connection
        if connection is None:
            return
        await client._connection_over(connection)
        if client._closing:
            return
        if not client.reconnect:
            log("warn", "connection lost; reconnect is off, so the client closes")
            await client._close_after_loss()
            return
        client._step(ClientEvent.LOST)
        for delay in backoff():
            await asyncio.sleep(delay)
            if client._closing:  # closed while it waited: no connection to make any more
                return
            try:
                await client._open(first=False)
                break
            except ConnectError as exc:
                log("info", f"reconnect failed: {exc}")
