"""Clocks a test controls, for a server built with ``clock=`` (see clienttools_server.clock).

clock = ManualClock()
async with running_server(config, clock=clock) as server:
    ...
    clock.advance(3600)          # an hour passes at once: due timers fire, in deadline order
    clock.next_deadline()        # when the earliest timer still waiting fires, or None

OffsetClock(path) is the wall clock plus the seconds written in ``path`` (re-read
on every reading); its timers keep real time. tests/support/clocked_server.py
runs the server process on one.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clienttools_server.clock import SYSTEM_CLOCK, Timer


@dataclass(order=True)
class ManualTimer:
    deadline: float
    order: int
    callback: Callable[..., object] = field(compare=False)
    args: tuple[Any, ...] = field(compare=False)
    cancelled: bool = field(default=False, compare=False)

    def cancel(self) -> None:
        self.cancelled = True


class ManualClock:
    """Time stands still until :meth:`advance` moves it."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self._now = start
        self._timers: list[ManualTimer] = []
        self._order = itertools.count()

    def now(self) -> float:
        return self._now

    def call_later(self, delay: float, callback: Callable[..., object], *args: Any) -> Timer:
        asyncio.get_running_loop()  # like loop.call_later: only inside the event loop
        timer = ManualTimer(self._now + max(delay, 0.0), next(self._order), callback, args)
        heapq.heappush(self._timers, timer)
        return timer

    def _live(self) -> list[ManualTimer]:
        self._timers = [t for t in self._timers if not t.cancelled]
        heapq.heapify(self._timers)
        return self._timers

    def deadlines(self) -> list[float]:
        """The deadlines of the timers still waiting, earliest first."""
        return sorted(t.deadline for t in self._live())

    def next_deadline(self) -> float | None:
        live = self._live()
        return live[0].deadline if live else None

    def advance(self, seconds: float) -> None:
        """Move time forward, firing every timer that falls due, each at its own deadline."""
        target = self._now + seconds
        while (live := self._live()) and live[0].deadline <= target:
            timer = heapq.heappop(self._timers)
            self._now = timer.deadline
            timer.cancelled = True
            timer.callback(*timer.args)
        self._now = target


class OffsetClock:
    """``time.time()`` plus the seconds in ``path`` (0 while it is missing or unreadable)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def now(self) -> float:
        try:
            offset = float(self.path.read_text() or 0)
        except (OSError, ValueError):
            offset = 0.0
        return time.time() + offset

    def call_later(self, delay: float, callback: Callable[..., object], *args: Any) -> Timer:
        return SYSTEM_CLOCK.call_later(delay, callback, *args)
