"""The Pyodide adapter: `js.WebSocket` behind the transport interface; a sessionStorage outbox.

`ToolClient` picks this adapter by itself when it runs in Pyodide, so a page
rarely touches it directly:

    from clienttools.browser import BrowserConnector, SessionStorageOutbox
    client = ToolClient(url, connector=BrowserConnector(), outbox_store=SessionStorageOutbox(url))

Every JS callback is a `create_proxy` that this module keeps and destroys when
its socket closes (or fails to open), so reconnecting forever leaks nothing.
`BrowserConnector.proxies_created` and `.proxies_destroyed` count them; a
browser test checks that they match after many reconnects. Importing this module
sends the SDK's log records to the browser console (see `ConsoleLogHandler`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import js
from pyodide.ffi import create_proxy, jsnull

from clienttools.transport import ConnectionFailed

_OPEN = 1


class BrowserSocket:
    """One open `js.WebSocket`. Frames arrive on a queue; `None` marks the close."""

    def __init__(self, ws: Any, connector: BrowserConnector) -> None:
        self._ws = ws
        self._connector = connector
        self._incoming: asyncio.Queue[str | bytes | None] = asyncio.Queue()
        self._proxies: list[Any] = []
        self.close_code: int | None = None
        self.close_reason = ""
        ws.binaryType = "arraybuffer"
        ws.onmessage = self._proxy(self._on_message)
        ws.onclose = self._proxy(self._on_close)
        ws.onerror = self._proxy(lambda event: None)  # a close event always follows

    def _proxy(self, fn: Callable[[Any], None]) -> Any:
        proxy = create_proxy(fn)
        self._proxies.append(proxy)
        self._connector.proxies_created += 1
        return proxy

    def _on_message(self, event: Any) -> None:
        data = event.data
        if isinstance(data, str):
            self._incoming.put_nowait(data)
        else:  # an ArrayBuffer: binary frames are a protocol error the session reports
            self._incoming.put_nowait(bytes(data.to_py()))

    def _on_close(self, event: Any) -> None:
        self.close_code = int(event.code)
        self.close_reason = str(event.reason)
        self._incoming.put_nowait(None)
        # Destroying a proxy while JS is still inside it is not allowed: do it next turn.
        asyncio.get_running_loop().call_soon(self._release)

    def _release(self) -> None:
        if not self._proxies:
            return
        self._ws.onmessage = None
        self._ws.onclose = None
        self._ws.onerror = None
        self._ws.onopen = None
        self._connector.release(self._proxies)
        self._proxies = []

    def send_nowait(self, text: str) -> None:
        """Send at once: a browser WebSocket only queues, so this never blocks."""
        if self._ws.readyState != _OPEN:
            raise ConnectionError("the WebSocket is not open")
        self._ws.send(text)

    async def send(self, text: str) -> None:
        self.send_nowait(text)

    async def receive(self) -> str | bytes | None:
        return await self._incoming.get()

    async def close(self, code: int = 1000, reason: str = "") -> None:
        if self._proxies:
            self._ws.close(code, reason)
            self._incoming.put_nowait(None)
            self._release()


class BrowserConnector:
    """Opens `js.WebSocket`s; counts the JS proxies it makes and destroys."""

    def __init__(self) -> None:
        self.proxies_created = 0
        self.proxies_destroyed = 0

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

        ws.onopen = socket._proxy(on_open)
        closed_early = asyncio.ensure_future(socket._incoming.get())
        waiters: list[asyncio.Future[Any]] = [opened, closed_early]
        try:
            await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            if opened.done():
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
        value = js.sessionStorage.getItem(self.key)
        return None if value is None or value is jsnull else str(value)

    def save(self, text: str) -> None:
        js.sessionStorage.setItem(self.key, text)


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


log_to_console()
