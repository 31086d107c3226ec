"""`OutboxWriter`: keeps the session's unacknowledged results in an `OutboxStore`.

Where the page's end writes the store (the main thread's `sessionStorage`: a
`pagehide` or a hidden page calls `save()`, see `page_hide_saves`), every change
waits up to `OUTBOX_SAVE_DELAY` and the changes are written together. A result
acknowledged within that time, which is nearly every result of a live
connection, is never written at all: a `sessionStorage` write was the largest
cost in the browser's round trip and, through the browser process, in its tail.
A reload or a navigation still finds every unacknowledged result in the store,
since `pagehide` comes first. Only a renderer crash within those 20 ms loses a
result; the server then delivers the call again and the tool runs again.

Where nothing tells the writer that the page ends (a PyScript worker, whose page
reloads without a word to it), a new result is written before it is sent:
`save_soon()` writes at once when the session put a result in the outbox since
the last write (`Session.outbox_added`), and the client calls it before it sends.
Removals still wait for the timer there: a store that still holds an acknowledged
result is harmless (a reload re-sends it; the server answers `duplicate`, and a
re-delivered invoke gets the stored result, C7). A burst of invokes handled in one
go (the browser socket's batches) is one write, before the burst's results go out.
Closing the client writes at once.

Both flavours use this writer (it runs on CPython, Pyodide and MicroPython 1.27,
in the subset of rules.py); each says how to arm its timer (`schedule`: by default
the running asyncio loop's `call_later`; mpy.py's is `setTimeout`).

    writer = OutboxWriter(session, MemoryOutboxStore())
    writer.restore()        # once, before the first connection
    ...
    writer.save_soon()      # after every input to the session, before sending
    writer.save()           # on close, and when the page is hidden or left
"""

from clienttools.portable import log, log_exception

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (MicroPython has none)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from clienttools.core import Session
    from clienttools.transport import OutboxStore

__all__ = ["OUTBOX_SAVE_DELAY", "OutboxWriter", "StorageOutbox"]

#: Seconds an outbox change may wait before it is written to the store.
OUTBOX_SAVE_DELAY = 0.02


class OutboxWriter:
    """Writes `session`'s outbox to `store`: batched, or new results at once (see above)."""

    def __init__(
        self,
        session: "Session",
        store: "OutboxStore",
        schedule: "Callable[[float, Callable[[], None]], Any] | None" = None,
        page_hide_saves: bool = False,
    ) -> None:
        """`schedule(delay, callback)` arms a timer and returns a handle with `cancel()`.

        `page_hide_saves`: the page's end calls `save()` (a store that can say so,
        the browser's, turns it on in `restore()`); new results are then batched too.
        """
        self.session = session
        self.store = store
        self._schedule = schedule or _call_later
        self.page_hide_saves = page_hide_saves
        self._restored = False
        self._saved_revision = session.outbox_revision
        self._saved_added = session.outbox_added
        self._saved_text: str | None = None
        self._timer: Any = None

    def restore(self) -> None:
        """Load what the store kept into the session (once; later calls do nothing)."""
        if self._restored:
            return
        self._restored = True
        try:
            text = self.store.load()
        except Exception as exc:
            log_exception(f"loading the stored outbox failed: {exc!r}")
            return
        if text:
            restored = self.session.restore_outbox(text)
            if restored:
                log("info", f"restored {restored} unacknowledged results")
        self._saved_revision = self.session.outbox_revision
        self._saved_added = self.session.outbox_added
        # An empty store says what an empty outbox's text says: nothing to write for it.
        self._saved_text = text or self.session.export_outbox()
        # Removals are batched; a store that can tell when the page goes away (the
        # browser's) gets a chance to write what is still waiting.
        if hasattr(self.store, "flush_on_page_hide"):  # transport.FlushesOnPageHide
            self.store.flush_on_page_hide(self.save)
            self.page_hide_saves = True

    def save_soon(self) -> None:
        """Leave the change for the timer; without `page_hide_saves`, write a new result now."""
        session = self.session
        if session.outbox_revision == self._saved_revision:
            return
        added = session.outbox_added - self._saved_added
        if added and not self.page_hide_saves and session.outbox_size <= added:
            self.save()  # the first results waiting (every one in the outbox is new)
        elif self._timer is None:
            # One timer for many acks: a write (and the next result's write) leaves it
            # armed, since arming one is a browser timer under Pyodide.
            self._timer = self._schedule(OUTBOX_SAVE_DELAY, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self.save()

    def save(self) -> None:
        """Write the outbox now if it changed since the last write."""
        session = self.session
        revision = session.outbox_revision
        if revision == self._saved_revision:
            return
        self._saved_revision = revision
        self._saved_added = session.outbox_added
        text = session.export_outbox()
        if text == self._saved_text:
            return  # e.g. a result and its ack between two writes: nothing to write
        self._saved_text = text
        try:
            self.store.save(text)
        except Exception as exc:  # e.g. storage quota: results still go out while connected
            log_exception(f"saving the outbox failed: {exc!r}")

    def cancel(self) -> None:
        """Drop a batched write that has not happened yet."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def _call_later(delay: float, callback: "Callable[[], None]") -> "Any":
    import asyncio

    return asyncio.get_running_loop().call_later(delay, callback)


class StorageOutbox:
    """An OutboxStore (transport.py) over anything with Web Storage's getItem/setItem.

    The key is the one the main-thread outbox uses, so moving a client from the
    page into a worker keeps what it had not yet had acknowledged.
    """

    def __init__(self, url: str, storage: "Any") -> None:
        self.key = "clienttools:outbox:" + url
        self.storage = storage
        self._set_item = storage.setItem  # looked up once: through the proxy, a lookup is a call

    def load(self) -> "str | None":
        value = self.storage.getItem(self.key)
        return value if isinstance(value, str) else None  # JS null, however it arrives

    def save(self, text: str) -> None:
        self._set_item(self.key, text)
