"""The server's one clock: the time and the timers, injected wherever either is needed.

Everything in the server that reads the time (ledger writes, TTL and retention,
the server_time tool, pings, flood windows) or waits for it (tool timeouts, the
expiry loop, pings, the idle timeout of a connection) goes through a
:class:`Clock`, so a test can run the server on a clock of its own (a manual
one that jumps an hour, or the wall clock plus an offset).

    clock = SystemClock()
    clock.now()                                     # seconds since the epoch
    timer = clock.call_later(5.0, print, "later")   # a Timer
    timer.cancel()
    await sleep(clock, 1.0)                         # asyncio.sleep on this clock
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Callable
from typing import Any, Protocol


class Timer(Protocol):
    """A callback scheduled by :meth:`Clock.call_later`; cancelling twice is harmless."""

    def cancel(self) -> None: ...


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the epoch, as ``time.time()``."""
        ...

    def call_later(self, delay: float, callback: Callable[..., object], *args: Any) -> Timer:
        """Run ``callback(*args)`` ``delay`` seconds from now, in the running event loop."""
        ...


class SystemClock:
    """The wall clock and the running event loop's timers."""

    def now(self) -> float:
        return time.time()

    def call_later(self, delay: float, callback: Callable[..., object], *args: Any) -> Timer:
        # In a context of its own, not the caller's: a cancelled timer stays in the
        # loop's queue until its time (a tool timeout's: minutes away), and would
        # keep the caller's context alive that long (a run's toolsets, its journal).
        loop = asyncio.get_running_loop()
        return loop.call_later(delay, callback, *args, context=contextvars.Context())


SYSTEM_CLOCK = SystemClock()


async def sleep(clock: Clock, delay: float) -> None:
    """Wait ``delay`` seconds of ``clock``."""
    woken = asyncio.get_running_loop().create_future()
    timer = clock.call_later(delay, _wake, woken)
    try:
        await woken
    finally:
        timer.cancel()


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
