"""The bus between server processes on one PostgreSQL ledger: LISTEN/NOTIFY.

A process tells another one (or all of them) that something changed in the
ledger with ``await PostgresLedger.notify``: a *kind* and a few ids. The rows
carry the data; a notification may carry a copy of what fits (the routing's
``invoke`` and ``settled``: ``cluster.routing.fits``), and goes by its ids when
it does not. A notification sent inside ``ledger.batch()`` is part of its
transaction: PostgreSQL delivers it only after the commit, so the receiver
always finds the rows it names.

:class:`Bus` is the receiving end: a connection of its own, outside the
ledger's pool (a listening connection waits in ``notifies()`` and cannot run
other statements), asynchronous, reconnecting with backoff when the database
goes away. Notifications sent while it was away are lost; so after every
reconnect it calls the ``on_reconnect`` handlers, which re-read what they
care about from the rows.

Each process listens on two channels of the ledger's schema (processes of
two schemas in one database never hear each other): its own
(``ledger.channel(ledger.owner)``) and the one for all
(``ledger.channel(None)``). A notification for all reaches every process,
its sender included; a handler that wants only the others' compares
``sender`` with ``ledger.owner``.

    async def on_settled(sender: str, args: tuple[str, ...]) -> None: ...

    bus = Bus(ledger)
    bus.on("settled", on_settled)             # awaited in the order notifications come
    bus.on_reconnect(resync)                  # an async function too
    await bus.start()                         # listening once it returns
    await ledger.notify(other_process, "settled", execution_id, "3")
    await bus.close()
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # imported when listening: a SQLite server needs no psycopg
    import psycopg

logger = logging.getLogger(__name__)

# Handlers are coroutines, awaited one after the other in the order the
# notifications came: each sees the rows as the one before it left them.
Handler = Callable[[str, tuple[str, ...]], Awaitable[None]]
ReconnectHandler = Callable[[], Awaitable[None]]

# Seconds between reconnect attempts: doubling from the first to the last.
FIRST_BACKOFF = 0.05
MAX_BACKOFF = 2.0
# How long start() waits for the first LISTEN before it returns anyway (the
# bus keeps trying in the background and resyncs once it is in).
START_TIMEOUT = 10.0


class Notifying(Protocol):
    """What the bus needs of the ledger: where to connect, which channels, who it is, and
    a way to drop the connections a restart of the database closed."""

    @property
    def owner(self) -> str: ...

    @property
    def conninfo(self) -> str: ...

    def channel(self, process_id: str | None) -> str: ...

    async def check_connections(self) -> None: ...


def encode(sender: str, kind: str, args: tuple[str, ...]) -> str:
    """A notification's payload: JSON ``[sender, kind, *args]`` (ids may hold any character)."""
    for value in (sender, kind, *args):
        if not isinstance(value, str):
            raise TypeError(f"notification fields are strings, not {type(value).__name__}")
    return json.dumps([sender, kind, *args], separators=(",", ":"))


def decode(payload: str) -> tuple[str, str, tuple[str, ...]] | None:
    """``(sender, kind, args)`` of a payload, None for one this code did not write."""
    try:
        fields = json.loads(payload)
    except ValueError:
        return None
    if (
        not isinstance(fields, list)
        or len(fields) < 2
        or not all(isinstance(f, str) for f in fields)
    ):
        return None
    return fields[0], fields[1], tuple(fields[2:])


def backoff() -> Iterator[float]:
    """Delays between reconnect attempts: 0.05 s doubling up to 2 s, then 2 s forever."""
    delay = FIRST_BACKOFF
    while True:
        yield delay
        delay = min(delay * 2, MAX_BACKOFF)


class Bus:
    """The notifications that reach this process, dispatched by kind on the event loop."""

    def __init__(self, ledger: Notifying) -> None:
        self._ledger = ledger
        self._handlers: dict[str, list[Handler]] = {}
        self._reconnect_handlers: list[ReconnectHandler] = []
        self._task: asyncio.Task[None] | None = None
        self._listening = asyncio.Event()
        self._connection: psycopg.AsyncConnection[object] | None = None
        self.connects = 0  # how many times LISTEN succeeded (tests and logs read it)

    def on(self, kind: str, handler: Handler) -> None:
        """Await ``handler(sender, args)`` for each notification of ``kind``, in order."""
        self._handlers.setdefault(kind, []).append(handler)

    def on_reconnect(self, handler: ReconnectHandler) -> None:
        """Await ``handler()`` after each reconnect: notifications may have been lost meanwhile."""
        self._reconnect_handlers.append(handler)

    @property
    def listening(self) -> bool:
        return self._listening.is_set()

    async def start(self) -> None:
        """Start listening; returns once LISTEN is in (or after START_TIMEOUT, still trying)."""
        if self._task is not None:
            raise RuntimeError("the bus is started already")
        self._task = asyncio.create_task(self._listen(), name="clienttools-bus")
        try:
            await asyncio.wait_for(self._listening.wait(), START_TIMEOUT)
        except TimeoutError:
            logger.warning("the bus is not listening yet; it keeps trying")

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _listen(self) -> None:
        import psycopg
        from psycopg import sql

        delays = backoff()
        while True:
            try:
                connection = await psycopg.AsyncConnection.connect(
                    self._ledger.conninfo, autocommit=True
                )
            except psycopg.OperationalError as exc:
                delay = next(delays)
                logger.debug("bus: cannot connect (%s); again in %g s", exc, delay)
                await asyncio.sleep(delay)
                continue
            try:
                async with connection:
                    self._connection = connection
                    for process_id in (self._ledger.owner, None):
                        channel = self._ledger.channel(process_id)
                        await connection.execute(
                            sql.SQL("LISTEN {}").format(sql.Identifier(channel))
                        )
                    delays = backoff()
                    self.connects += 1
                    self._listening.set()
                    if self.connects > 1:
                        logger.info("bus: listening again; resyncing from the ledger")
                        await self._reconnected()
                    async for notify in connection.notifies():
                        await self._dispatch(notify.payload)
            except psycopg.OperationalError as exc:
                logger.warning("bus: the connection to the ledger broke (%s); reconnecting", exc)
            finally:
                self._connection = None
                self._listening.clear()
            await asyncio.sleep(next(delays))

    async def _reconnected(self) -> None:
        # The bus was away, so the database may have been: the handlers read and
        # write through the ledger's pool, whose idle connections may be closed.
        try:
            await self._ledger.check_connections()
        except Exception:
            logger.exception("bus: the ledger's connections could not be checked")
        for handler in self._reconnect_handlers:
            try:
                await handler()
            except Exception:
                logger.exception("bus: a reconnect handler failed")

    async def _dispatch(self, payload: str) -> None:
        decoded = decode(payload)
        if decoded is None:
            logger.warning("bus: ignoring a notification this code did not write: %.200r", payload)
            return
        sender, kind, args = decoded
        for handler in self._handlers.get(kind, ()):
            try:
                await handler(sender, args)
            except Exception:
                logger.exception("bus: the handler of %r failed", kind)
