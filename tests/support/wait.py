"""Waiting on a condition instead of sleeping a fixed time.

await wait_until(lambda: server.hub.stats()["pending_calls"] == 1, 5, "the call to wait")
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


async def wait_until(predicate: Callable[[], bool], timeout: float = 20.0, what: str = "") -> None:
    """Poll `predicate` until it holds; TimeoutError naming `what` otherwise."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout:g} s in vain for {what or predicate}")
        await asyncio.sleep(0.01)
