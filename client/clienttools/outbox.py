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

    writer = OutboxWriter(session, MemoryOutboxStore())
    writer.restore()        # once, before the first connection
    ...
    writer.save_soon()      # after every input to the session, before sending
    writer.save()           # on close
"""

from __future__ import annotations

import asyncio
import logging

from clienttools.session import Session
from clienttools.transport import FlushesOnPageHide, OutboxStore

__all__ = ["OUTBOX_SAVE_DELAY", "OutboxWriter"]

logger = logging.getLogger("clienttools")

#: Seconds an outbox change may wait before it is written to the store.
OUTBOX_SAVE_DELAY = 0.02


class OutboxWriter:
    """Writes `session`'s outbox to `store`: new results at once, removals batched."""

    def __init__(self, session: Session, store: OutboxStore) -> None:
        self.session = session
        self.store = store
        self._restored = False
        self._saved_revision = session.outbox_revision
        self._saved_added = session.outbox_added
        self._saved_text: str | None = None
        self._timer: asyncio.TimerHandle | None = None

    def restore(self) -> None:
        """Load what the store kept into the session (once; later calls do nothing)."""
        if self._restored:
            return
        self._restored = True
        try:
            text = self.store.load()
        except Exception:
            logger.exception("loading the stored outbox failed")
            return
        if text:
            restored = self.session.restore_outbox(text)
            if restored:
                logger.info("restored %d unacknowledged results", restored)
        self._saved_revision = self.session.outbox_revision
        self._saved_added = self.session.outbox_added
        self._saved_text = text
        # Removals are batched; a store that can tell when the page goes away (the
        # browser's) gets a chance to write what is still waiting.
        if isinstance(self.store, FlushesOnPageHide):
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
            self._timer = asyncio.get_running_loop().call_later(OUTBOX_SAVE_DELAY, self._on_timer)

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
        except Exception:  # e.g. storage quota: results still go out while connected
            logger.exception("saving the outbox failed")

    def cancel(self) -> None:
        """Drop a batched write that has not happened yet."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
