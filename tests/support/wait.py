"""Waiting on a condition instead of sleeping a fixed time.

await wait_until(lambda: server.hub.stats()["pending_calls"] == 1, 5, "the call to wait")

The predicate may be a coroutine function too (one that reads the ledger):

async def finished() -> bool:
    return (await ledger.get_execution(run_id)).status == "completed"

await wait_until(finished, 5, "the run to finish")

From a thread that may block (a test's blocking socket), wait_until_blocking does the same.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable


async def wait_until(
    predicate: Callable[[], bool | Awaitable[bool]], timeout: float = 20.0, what: str = ""
) -> None:
    """Poll `predicate` (awaiting it if it returns an awaitable) until it holds.

    TimeoutError naming `what` otherwise.
    """
    deadline = time.monotonic() + timeout
    while not await _holds(predicate):
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout:g} s in vain for {what or predicate}")
        await asyncio.sleep(0.01)


async def _holds(predicate: Callable[[], bool | Awaitable[bool]]) -> bool:
    value = predicate()
    if inspect.isawaitable(value):
        return bool(await value)
    return bool(value)


def wait_until_blocking(
    predicate: Callable[[], bool], timeout: float = 20.0, what: str = ""
) -> None:
    """:func:`wait_until` for a thread that may block: polls with time.sleep."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout:g} s in vain for {what or predicate}")
        time.sleep(0.01)
