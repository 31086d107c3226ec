"""Coroutines started from synchronous code (a timer firing, a frame queued after a commit).

A timer's callback cannot await the ledger, so it starts the coroutine here.
:class:`Background` keeps a reference to each task until it ends (the event
loop keeps only weak ones), logs what one raised (nothing awaits it to see),
and cancels those still running when the server stops.

    background = Background("proxy")
    clock.call_later(5.0, background.call, time_out, entry)   # time_out(entry) as a task then
    await background.close()
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

logger = logging.getLogger(__name__)


class Background:
    """The tasks one part of the server started and nobody awaits."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._tasks: set[asyncio.Task[None]] = set()

    def call(self, function: Callable[..., Coroutine[Any, Any, None]], *args: Any) -> None:
        """Start ``function(*args)`` as a task."""
        task = asyncio.get_running_loop().create_task(function(*args))
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            logger.error("%s: a background task failed", self.name, exc_info=exc)

    async def close(self) -> None:
        """Cancel what still runs and wait for it to stop."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
