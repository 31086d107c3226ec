"""Tools in a PyScript worker: where the page is, where the outbox waits, what the page sees.

A PyScript worker (`<script type="py" worker>` or `<script type="mpy" worker>`)
has a `WebSocket` of its own, so the client's socket opens there and a tool that
computes for seconds never blocks the page. It has no `sessionStorage`, `window`
or `document`: PyScript hands the worker the page's ones as synchronous proxies
(`pyscript.window`, `pyscript.document`), which need SharedArrayBuffer, that is,
a cross-origin isolated page (COOP `same-origin`, COEP `require-corp`; the
reference server sends both).

`ToolClient` of either flavour looks here by itself when it runs in a worker:
its outbox (C11) is then the page's `sessionStorage`, reached through the proxy.
That is the same per-tab, reload-proof store the main thread uses, and it is
synchronous, so a result is stored before it is sent with no change to the
client's send path (an awaited IndexedDB put, or a synchronous write to the
origin private file system, measured 3-5x slower per write: docs/client.md). Without
cross-origin isolation there is no page to reach: one console error says what is
missing, and the outbox stays in memory.

The page's main thread follows the client through PyScript's worker export:

    client = ToolClient(url)
    export = StatusExport(client)
    client_status, next_status = export.status, export.next_status
    __export__ = ["client_status", "next_status"]
    # main thread: tools = await pyscript.workers["tools"]
    #              status = await tools.next_status("connecting")

This module is plain Python that CPython, Pyodide and MicroPython all run (no
`typing`, `dataclasses` or `from __future__`), because both flavours import it.
"""

import asyncio

from clienttools.outbox import StorageOutbox  # defined with the writer; exported here too

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (MicroPython has none)
if TYPE_CHECKING:
    from typing import Any

__all__ = [
    "NOT_ISOLATED_MESSAGE",
    "MemoryStorage",
    "StatusExport",
    "StorageOutbox",
    "in_worker",
    "outbox_storage",
    "page_window",
]

#: The one console error of a worker on a page that is not cross-origin isolated.
NOT_ISOLATED_MESSAGE = (
    "clienttools: this page is not cross-origin isolated (crossOriginIsolated is false), so "
    "PyScript cannot give this worker the page's window and document. Serve the page with "
    "the headers Cross-Origin-Opener-Policy: same-origin and Cross-Origin-Embedder-Policy: "
    "require-corp, and its files with Cross-Origin-Resource-Policy (clienttools-server sends "
    "all three unless --no-cross-origin-isolation). Still working: the connection, tools "
    "that do not touch the page, and the status this worker exports. Not working: tools "
    "that use pyscript.window or pyscript.document, and keeping unacknowledged results "
    "across a reload (they wait in memory)."
)

_reported: "list[bool]" = []  # the error goes to the console once per worker, however many clients


def in_worker(js: "Any") -> bool:
    """True in a web worker: only a worker's global scope has `WorkerGlobalScope`."""
    return hasattr(js, "WorkerGlobalScope")


def page_window(js: "Any") -> "Any":
    """The page's `window` as PyScript proxies it into this worker; None where it cannot.

    None without PyScript, or on a page that is not cross-origin isolated (then
    PyScript's `window` is a stand-in that raises on every attribute, and the
    console gets `NOT_ISOLATED_MESSAGE`, once).
    """
    try:
        from pyscript import window
    except ImportError:
        return None
    if hasattr(window, "document"):
        return window
    if not _reported:
        _reported.append(True)
        js.console.error(NOT_ISOLATED_MESSAGE)
    return None


def outbox_storage(js: "Any") -> "Any":
    """Where a worker's client keeps its outbox: the page's sessionStorage, else memory."""
    window = page_window(js)
    if window is None:
        return MemoryStorage()
    return window.sessionStorage


class MemoryStorage:
    """`getItem`/`setItem` over a dict: the outbox of a worker that cannot reach the page."""

    def __init__(self) -> None:
        self._items: dict[str, str] = {}

    def getItem(self, key: str) -> "str | None":  # the Web Storage API's names
        return self._items.get(key)

    def setItem(self, key: str, value: str) -> None:
        self._items[key] = value


class StatusExport:
    """A client's status for the page's main thread, as functions a worker can `__export__`.

    `status()` answers at once; `await next_status(after)` answers once the status
    differs from `after` (at once if it already does), so the page follows every
    change with one pending call: a long poll over PyScript's worker export, which
    works with or without cross-origin isolation (the page calls into the worker).
    """

    def __init__(self, client: "Any") -> None:
        self._client = client
        self._changed = asyncio.Event()
        client.on_status(self._on_status)

    def _on_status(self, status: str) -> None:
        # A fresh event per change: every waiter of the old one wakes and looks again.
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def status(self) -> str:
        """idle, connecting, open, reconnecting or closed (ToolClient.status)."""
        return str(self._client.status)

    async def next_status(self, after: str) -> str:
        """The status, once it is not `after`."""
        while self._client.status == after:
            await self._changed.wait()
        return str(self._client.status)
