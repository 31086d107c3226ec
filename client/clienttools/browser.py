"""The Pyodide adapter: `js.WebSocket` behind the transport interface; a sessionStorage outbox.

`ToolClient` picks this adapter by itself when it runs in Pyodide, so a page
rarely touches it directly:

    from clienttools.browser import BrowserConnector, SessionStorageOutbox
    client = ToolClient(url, connector=BrowserConnector(), outbox_store=SessionStorageOutbox(url))

Every JS callback is a `create_proxy` that this module keeps and destroys when
its socket closes (or fails to open), so reconnecting forever leaks nothing.
`BrowserConnector.proxies_created` and `.proxies_destroyed` count them; a
browser test checks that they match after many reconnects. Importing this module
changes nothing; `log_to_console()` sends the SDK's log records to the browser
console (see `ConsoleLogHandler`), and `ToolClient` calls it when it picks these
adapters.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import js
from pyodide.ffi import create_proxy, jsnull

from clienttools.jspump import DIRECT_FRAMES, PUMP_SOURCE, TURN_AFTER
from clienttools.transport import ConnectionFailed

_OPEN = 1


# The socket's handlers in JavaScript (jspump.py): each frame reaches Python as the
# string itself, and the burst bookkeeping stays in JavaScript, so a burst reaches
# Python as one array. The Python handlers below are the same logic, for a page whose
# Content-Security-Policy forbids making functions.
_pump_factory: Any = None


def _js_pump() -> Any:
    """The JS handler factory, or None where the page forbids making functions.

    A Content-Security-Policy without 'unsafe-eval' (Pyodide needs only
    'wasm-unsafe-eval') refuses `Function`; the socket then runs the same
    handlers in Python.
    """
    global _pump_factory
    if _pump_factory is None:
        try:
            _pump_factory = js.Function.new(PUMP_SOURCE)()
        except Exception:
            _pump_factory = False
    return _pump_factory or None


def _frame_data(data: Any) -> str | bytes:
    """A frame as the session takes it: text stays text, an ArrayBuffer becomes bytes."""
    if isinstance(data, str):
        return data
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    return bytes(data.to_py())  # an ArrayBuffer: a protocol error the session reports


class BrowserSocket:
    """One open `js.WebSocket`. Frames arrive on a queue, or at a receiver; `None` marks the close.

    With a receiver (`deliver_to`), a frame that arrives while the page is idle is
    handed over inside its `onmessage` event: no event-loop turn between the
    socket and the session, which under Pyodide is a round through the browser's
    task queue. A burst is batched instead: after `DIRECT_FRAMES` frames without
    the page getting a free turn, frames wait in a backlog that one task drains
    (a `MessageChannel` message, which also marks the free turn). Handling a
    burst frame by frame from `onmessage` halves pipelined throughput: a batch
    runs the same code back to back, warm.

    The handlers are JavaScript (jspump.py) where the page allows making a
    function, else the same logic in Python (`_on_message`, `_on_turn`).
    """

    def __init__(self, ws: Any, connector: BrowserConnector) -> None:
        self._ws = ws
        self._connector = connector
        self._incoming: asyncio.Queue[str | bytes | None] = asyncio.Queue()
        self._proxies: list[Any] = []
        self._receiver: Callable[[str | bytes, bool], None] | None = None
        self._ws_send: Any = ws.send  # looked up once: a JS attribute read costs a proxy call
        self._open = True  # False once closed, by us or the peer: no readyState read per send
        self.close_code: int | None = None
        self.close_reason = ""
        ws.binaryType = "arraybuffer"
        # The Python handlers' state (when JavaScript cannot have it).
        self._backlog: list[str | bytes] = []
        self._direct = 0  # frames handed over directly since the page last had a free turn
        self._turn_posted = False
        self._channel: Any = None
        self._post_message: Any = None  # the channel's port2.postMessage, looked up once
        pump = _js_pump()
        connector.js_handlers = pump is not None
        if pump is not None:
            self._js_release: Any = pump(
                ws,
                self._proxy(self._on_frame),
                self._proxy(self._on_batch),
                self._proxy(self._on_close),
                DIRECT_FRAMES,
                TURN_AFTER,
            )
        else:
            self._js_release = None
            ws.onmessage = self._proxy(self._on_message)
            ws.onclose = self._proxy(self._on_close_event)
            ws.onerror = self._proxy(lambda event: None)  # a close event always follows

    def _proxy(self, fn: Callable[..., None]) -> Any:
        proxy = create_proxy(fn)
        self._proxies.append(proxy)
        self._connector.proxies_created += 1
        return proxy

    # --- frames from the JavaScript handlers -------------------------------------------

    def _on_frame(self, data: Any) -> None:
        """One frame, handed over inside its message event."""
        receiver = self._receiver
        if receiver is None:
            self._incoming.put_nowait(_frame_data(data))
        else:
            receiver(data if isinstance(data, str) else _frame_data(data), False)

    def _on_batch(self, frames: Any) -> None:
        """The frames of a burst, in order, as one JS array."""
        self._deliver([_frame_data(data) for data in frames.to_py()])

    # --- the same, in Python -----------------------------------------------------------

    def _on_message(self, event: Any) -> None:
        data = _frame_data(event.data)
        if self._receiver is None:
            self._incoming.put_nowait(data)
        elif self._backlog or self._direct >= DIRECT_FRAMES:
            self._backlog.append(data)
            self._post_turn()
        else:
            self._direct += 1
            if self._direct >= TURN_AFTER:
                self._post_turn()
            self._receiver(data, False)

    def _post_turn(self) -> None:
        if not self._turn_posted:
            self._turn_posted = True
            self._post_message(None)

    def _on_turn(self, event: Any) -> None:
        """The page had a free turn: hand over the backlog; direct delivery may resume."""
        self._turn_posted = False
        self._direct = 0
        self._drain()

    def _drain(self) -> None:
        while self._backlog and self._receiver is not None:
            frames, self._backlog = self._backlog, []
            self._deliver(frames)

    def _on_close_event(self, event: Any) -> None:
        self._drain()  # every frame before the close
        self._on_close(event.code, event.reason)

    # --- both ---------------------------------------------------------------------------

    def _deliver(self, frames: list[str | bytes]) -> None:
        receiver = self._receiver
        if receiver is None:
            for data in frames:
                self._incoming.put_nowait(data)
            return
        last = len(frames) - 1
        for i, data in enumerate(frames):
            if self._receiver is None:
                return  # released meanwhile
            self._receiver(data, i < last)

    def deliver_to(self, receiver: Callable[[str | bytes, bool], None]) -> None:
        """From now on hand every frame to `receiver(frame, more)` (which must not raise).

        `more` is True for every frame of a batch but the last. Frames already queued
        go to it at once; `receive()` then only returns the close (None). Called from a
        running event loop.
        """
        if self._js_release is None:  # the Python handlers: their free-turn channel
            self._channel = js.MessageChannel.new()
            self._channel.port1.onmessage = self._proxy(self._on_turn)
            self._post_message = self._channel.port2.postMessage
        self._receiver = receiver
        queued = []
        while not self._incoming.empty():
            queued.append(self._incoming.get_nowait())
        frames = [data for data in queued if data is not None]
        for i, data in enumerate(frames):
            receiver(data, i + 1 < len(frames))
        if len(frames) < len(queued):
            self._incoming.put_nowait(None)

    def _on_close(self, code: Any, reason: Any) -> None:
        """The close event, after every frame that came before it."""
        self._open = False
        self.close_code = int(code)
        self.close_reason = str(reason)
        self._incoming.put_nowait(None)
        # Destroying a proxy while JS is still inside it is not allowed: do it next turn.
        asyncio.get_running_loop().call_soon(self._release)

    def _release(self) -> None:
        if not self._proxies:
            return
        if self._js_release is not None:
            self._js_release()
            self._js_release = None
        else:
            self._ws.onmessage = None
            self._ws.onclose = None
            self._ws.onerror = None
        self._ws.onopen = None
        self._open = False
        self._receiver = None
        self._backlog = []
        if self._channel is not None:
            self._channel.port1.onmessage = None
            self._channel.port1.close()
            self._channel = None
            self._post_message = None
        self._connector.release(self._proxies)
        self._proxies = []

    def send_nowait(self, text: str) -> None:
        """Send at once: a browser WebSocket only queues, so this never blocks.

        Raises once the socket closed. While it is closing (the peer's close frame
        came, the close event not yet) the browser drops what is sent; a result
        lost so waits in the outbox and is sent again after the reconnect (C11).
        """
        if not self._open:
            raise ConnectionError("the WebSocket is not open")
        self._ws_send(text)

    async def send(self, text: str) -> None:
        self.send_nowait(text)

    async def receive(self) -> str | bytes | None:
        return await self._incoming.get()

    async def close(self, code: int = 1000, reason: str = "") -> None:
        self._open = False
        if self._proxies:
            self._ws.close(code, reason)
            self._incoming.put_nowait(None)
            self._release()


class BrowserConnector:
    """Opens `js.WebSocket`s; counts the JS proxies it makes and destroys."""

    def __init__(self) -> None:
        self.proxies_created = 0
        self.proxies_destroyed = 0
        #: Whether the sockets' handlers are JavaScript (None before the first socket).
        self.js_handlers: bool | None = None

    def release(self, proxies: list[Any]) -> None:
        for proxy in proxies:
            proxy.destroy()
            self.proxies_destroyed += 1

    async def open(self, url: str, timeout: float) -> BrowserSocket:
        ws = js.WebSocket.new(url)
        socket = BrowserSocket(ws, self)
        opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def on_open(event: Any) -> None:
            if not opened.done():
                opened.set_result(None)

        on_open_proxy = socket._proxy(on_open)
        ws.onopen = on_open_proxy
        closed_early = asyncio.ensure_future(socket._incoming.get())
        waiters: list[asyncio.Future[Any]] = [opened, closed_early]
        try:
            await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            if opened.done():
                # Not needed any more (and out of JS by now): one proxy fewer per live socket.
                ws.onopen = None
                socket._proxies.remove(on_open_proxy)
                self.release([on_open_proxy])
                return socket
            if not closed_early.done():
                raise ConnectionFailed(url, f"no answer within {timeout:g} s")
            code = socket.close_code
            detail = f" (close code {code})" if code not in (None, 1006) else ""
            raise ConnectionFailed(url, f"the server refused or is unreachable{detail}")
        except BaseException:
            if ws.readyState <= _OPEN:
                ws.close()
            socket._release()
            raise
        finally:
            closed_early.cancel()


class SessionStorageOutbox:
    """Keeps the unacknowledged results of one URL in `sessionStorage`, so a reload resends them."""

    def __init__(self, url: str) -> None:
        self.key = f"clienttools:outbox:{url}"
        self._page_hide_proxy: Any = None
        self._storage: Any = js.sessionStorage  # one proxy, not a lookup per write
        self._set_item: Any = self._storage.setItem

    def flush_on_page_hide(self, flush: Callable[[], None]) -> None:
        """Call `flush` when the page is hidden or left, so a batched save is not lost.

        `pagehide` covers reloads and navigation; `visibilitychange` to hidden covers
        a tab that a mobile browser may discard without unloading it. The proxy lives
        as long as the page.
        """
        if self._page_hide_proxy is not None:
            return

        def on_event(event: Any) -> None:
            if event.type == "pagehide" or str(js.document.visibilityState) == "hidden":
                flush()

        self._page_hide_proxy = create_proxy(on_event)
        js.window.addEventListener("pagehide", self._page_hide_proxy)
        js.document.addEventListener("visibilitychange", self._page_hide_proxy)

    def load(self) -> str | None:
        value = self._storage.getItem(self.key)
        return None if value is None or value is jsnull else str(value)

    def save(self, text: str) -> None:
        self._set_item(self.key, text)


class ConsoleLogHandler(logging.Handler):
    """Sends the SDK's log records to the browser console.

    Without a handler, Python's last-resort handler writes warnings to stderr,
    which PyScript shows as a red error banner in the page: an ignored bad frame
    is worth a console line, not an error on the user's screen.
    """

    def emit(self, record: logging.LogRecord) -> None:
        text = f"{record.name}: {self.format(record)}"
        if record.levelno >= logging.ERROR:
            js.console.error(text)
        elif record.levelno >= logging.WARNING:
            js.console.warn(text)
        else:
            js.console.info(text)


def log_to_console() -> None:
    """Route the `clienttools` logger to the console (once); records still propagate."""
    logger = logging.getLogger("clienttools")
    if not any(isinstance(h, ConsoleLogHandler) for h in logger.handlers):
        logger.addHandler(ConsoleLogHandler())
