"""`OutboxWriter`: keeps the session's unacknowledged results in an `OutboxStore`.

A new result is written before it is sent: `save_soon()` writes at once when the
session put a result in the outbox since the last write (`Session.outbox_added`),
and the client calls it before it sends. An ack only removes a result, and a
store that still holds an acknowledged result is harmless (a reload re-sends it;
the server answers `duplicate`, and a re-delivered invoke gets the stored result,
C7), so removals wait up to `OUTBOX_SAVE_DELAY` and are written together, or with
the next result. Closing the client, and in the browser hiding or leaving the
page, write at once too. A burst of invokes handled in one go (the browser
socket's batches) is one write, before the burst's results go out.

A `sessionStorage` write is the largest single cost of the browser's round
trip, so there is one per result, not one per change.

Both flavours use this writer (it runs on CPython, Pyodide and MicroPython 1.27,
in the subset of rules.py); each says how to arm its timer (`schedule`: by default
the running asyncio loop's `call_later`; mpy.py's is `setTimeout`).

    writer = OutboxWriter(session, MemoryOutboxStore())
    writer.restore()        # once, before the first connection
    ...
    writer.save_soon()      # after every input to the session, before sending
    writer.save()           # on close
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
    """Writes `session`'s outbox to `store`: new results at once, removals batched."""

    def __init__(
        self,
        session: "Session",
        store: "OutboxStore",
        schedule: "Callable[[float, Callable[[], None]], Any] | None" = None,
    ) -> None:
        """`schedule(delay, callback)` arms a timer and returns a handle with `cancel()`."""
        self.session = session
        self.store = store
        self._schedule = schedule or _call_later
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
        self._saved_text = text
        # Removals are batched; a store that can tell when the page goes away (the
        # browser's) gets a chance to write what is still waiting.
        if hasattr(self.store, "flush_on_page_hide"):  # transport.FlushesOnPageHide
            self.store.flush_on_page_hide(self.save)

    def save_soon(self) -> None:
        """Write a new result at once; leave a change that only removed results for the timer."""
        session = self.session
        if session.outbox_revision == self._saved_revision:
            return
        added = session.outbox_added - self._saved_added
        if added and session.outbox_size <= added:
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
