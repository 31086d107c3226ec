"""Change callbacks: subscribe, get an unsubscribe function, and a callback that raises is logged.

One mechanism for every "tell me when it changes" of the SDK: the registry's
`on_change`, the client's `on_status` and the chat's `on_change`.

    >>> seen = []
    >>> observers: Observers[[int]] = Observers("example")
    >>> unsubscribe = observers.subscribe(seen.append)
    >>> observers.notify(1)
    >>> unsubscribe()
    >>> unsubscribe()  # twice is harmless
    >>> observers.notify(2)
    >>> seen
    [1]

Callbacks run in subscription order; one may unsubscribe itself (or another)
while it runs. A callback that raises is logged (`logging.exception`) and the
rest still run: an app's callback must never break the connection, the chat or
the registry that notifies it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Generic, ParamSpec

__all__ = ["Observers"]

logger = logging.getLogger("clienttools")

P = ParamSpec("P")


class Observers(Generic[P]):
    """The callbacks subscribed to one kind of change; `what` names it in the log."""

    __slots__ = ("_callbacks", "what")

    def __init__(self, what: str) -> None:
        self.what = what
        self._callbacks: list[Callable[P, object]] = []

    def subscribe(self, callback: Callable[P, object]) -> Callable[[], None]:
        """Call `callback` on every change; returns the function that unsubscribes it."""
        self._callbacks.append(callback)

        def unsubscribe() -> None:
            if callback in self._callbacks:
                self._callbacks.remove(callback)

        return unsubscribe

    def notify(self, *args: P.args, **kwargs: P.kwargs) -> None:
        for callback in tuple(self._callbacks):  # a callback may unsubscribe itself
            try:
                callback(*args, **kwargs)
            except Exception:
                logger.exception("%s callback failed", self.what)

    def __len__(self) -> int:
        return len(self._callbacks)
