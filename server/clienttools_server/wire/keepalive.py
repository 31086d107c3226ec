"""The app's pings to every page of one process, from one timer (C12).

A page treats its connection as dead when nothing arrives for 2.5 ping
intervals, so the server pings each page that registered tools once per
interval; the page's pong (or any frame) shows the server it is alive.

A process may hold ten thousand idle pages, and then the pings are nearly all
it does. One sleeping task per page costs a timer, a future, a task switch and
a serialized frame per ping. Here the pages are spread over :data:`SLOTS` slots
by when they joined, one timer ticks every ``interval / SLOTS`` seconds, and
each tick pings one slot with one frame text for all of its pages: what is left
per page is the send itself.

    pinger = Pinger(clock, interval=15.0)
    pinger.add(page)          # page.on_ping(now, text) once per interval from now on
    pinger.discard(page)      # when its socket closes
"""

from __future__ import annotations

from typing import Protocol

from clienttools.protocol import PingFrame, dump_frame

from ..clock import Clock, Timer

#: The slots the pages are spread over: a page's first ping comes between
#: ``interval * (1 - 1/SLOTS)`` and ``interval`` after it joined.
SLOTS = 16


class Pinged(Protocol):
    def on_ping(self, now: float, text: str) -> None:
        """Time for a ping: ``text`` is the ``cf_agent_ping`` frame, stamped ``now``."""


class Pinger:
    """Every added page's ``on_ping`` once per ``interval`` seconds of ``clock``."""

    def __init__(self, clock: Clock, interval: float) -> None:
        self._clock = clock
        self._tick_s = interval / SLOTS
        self._slots: list[dict[Pinged, None]] = [{} for _ in range(SLOTS)]
        self._slot_of: dict[Pinged, int] = {}
        self._next = 0  # the slot the next tick pings
        self._timer: Timer | None = None

    def __len__(self) -> int:
        return len(self._slot_of)

    def add(self, page: Pinged) -> None:
        # The slot just pinged: its next turn is a whole interval away.
        slot = (self._next - 1) % SLOTS
        self._slots[slot][page] = None
        self._slot_of[page] = slot
        if self._timer is None:
            self._timer = self._clock.call_later(self._tick_s, self._tick)

    def discard(self, page: Pinged) -> None:
        slot = self._slot_of.pop(page, None)
        if slot is not None:
            del self._slots[slot][page]
        if not self._slot_of and self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _tick(self) -> None:
        pages = self._slots[self._next]
        self._next = (self._next + 1) % SLOTS
        self._timer = self._clock.call_later(self._tick_s, self._tick)
        if pages:
            now = self._clock.now()
            text = dump_frame(PingFrame(t=now * 1000))
            for page in list(pages):  # on_ping may end the page, and discard it
                page.on_ping(now, text)
