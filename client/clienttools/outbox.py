"""`OutboxWriter`: keeps the session's unacknowledged results in an `OutboxStore`, batched.

Writing the whole outbox on every change was over half of an invoke's time in
the browser, and quadratic while results wait for acks (bench/README.md). So
the outbox turning empty or non-empty is written at once (a small write), and
changes to a non-empty outbox wait up to `OUTBOX_SAVE_DELAY` to be written
together. Closing the client, and in the browser hiding or leaving the page,
write at once too.

    writer = OutboxWriter(session, MemoryOutboxStore())
    writer.restore()        # once, before the first connection
    ...
    writer.save_soon()      # after every input to the session
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
    """Writes `session`'s outbox to `store` when it changed: at once, or batched."""

    def __init__(self, session: Session, store: OutboxStore) -> None:
        self.session = session
        self.store = store
        self._restored = False
        self._saved_revision = session.outbox_revision
        self._saved_text: str | None = None
        self._saved_empty = True
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
        self._saved_text = text
        self._saved_empty = self.session.outbox_size == 0
        # Saves are batched; a store that can tell when the page goes away (the
        # browser's) gets a chance to write what is still waiting.
        if isinstance(self.store, FlushesOnPageHide):
            self.store.flush_on_page_hide(self.save)

    def save_soon(self) -> None:
        """Write a change: at once if the outbox turned empty or non-empty, else batched."""
        if self.session.outbox_revision == self._saved_revision:
            return
        if (self.session.outbox_size == 0) != self._saved_empty:
            self.save()  # the first result waiting, or the last one acked
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(OUTBOX_SAVE_DELAY, self.save)

    def save(self) -> None:
        """Write the outbox now if it changed since the last write."""
        self.cancel()
        revision = self.session.outbox_revision
        if revision == self._saved_revision:
            return
        self._saved_revision = revision
        text = self.session.export_outbox()
        self._saved_empty = self.session.outbox_size == 0
        if text == self._saved_text:
            return  # e.g. a result and its ack within one delay: nothing to write
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
