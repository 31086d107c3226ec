"""The bus between processes (clienttools_server.cluster.bus) on a real PostgreSQL.

Two ledgers on one schema stand for two server processes; each has its own Bus.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import psycopg
import pytest

from clienttools_server.cluster.bus import Bus, decode, encode
from clienttools_server.ledger import SqliteLedger
from clienttools_server.ledger.postgres import PostgresLedger
from tests.support.postgres import PostgresServer

T0 = 1_000.0


class Heard:
    """What one bus received, by kind, and a way to wait for it."""

    def __init__(self, bus: Bus, *kinds: str) -> None:
        self.got: list[tuple[str, str, tuple[str, ...]]] = []
        self.reconnects = 0
        self._changed = asyncio.Event()
        for kind in kinds:
            bus.on(kind, self._handler(kind))
        bus.on_reconnect(self._reconnected)

    def _handler(self, kind: str) -> Callable[[str, tuple[str, ...]], Awaitable[None]]:
        async def handle(sender: str, args: tuple[str, ...]) -> None:
            self.got.append((kind, sender, args))
            self._changed.set()

        return handle

    async def _reconnected(self) -> None:
        self.reconnects += 1
        self._changed.set()

    async def until(self, condition: Callable[[], bool], timeout: float = 10.0) -> None:
        async with asyncio.timeout(timeout):
            while not condition():
                self._changed.clear()
                # Woken by what this bus hears; the bus's own state is polled.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), 0.05)


async def restart(postgres: PostgresServer, heard: Heard, *buses: Bus) -> None:
    """Stop PostgreSQL until every bus has noticed, then start it again."""
    postgres.stop()
    try:
        await heard.until(lambda: not any(bus.listening for bus in buses))
    finally:
        postgres.start_again()


@contextlib.asynccontextmanager
async def processes(url: str, count: int) -> AsyncIterator[list[tuple[PostgresLedger, Bus]]]:
    """``count`` ledgers on one schema, each with its bus (not started)."""
    async with contextlib.AsyncExitStack() as stack:
        found = []
        for _ in range(count):
            ledger = await stack.enter_async_context(await PostgresLedger.connect(url))
            bus = Bus(ledger)
            stack.push_async_callback(bus.close)
            found.append((ledger, bus))
        yield found


@contextlib.asynccontextmanager
async def two_processes(url: str) -> AsyncIterator[tuple[PostgresLedger, Bus, PostgresLedger, Bus]]:
    async with processes(url, 2) as [(a, bus_a), (b, bus_b)]:
        yield a, bus_a, b, bus_b


async def test_a_notification_reaches_its_target_only_and_a_broadcast_all(
    postgres: PostgresServer,
) -> None:
    async with two_processes(postgres.fresh_url()) as (a, bus_a, b, bus_b):
        heard_a, heard_b = Heard(bus_a, "ping", "all"), Heard(bus_b, "ping", "all")
        await bus_a.start()
        await bus_b.start()
        await a.notify(b.owner, "ping", "x 1", '\u00e9"')
        await a.notify(None, "all", "y")
        await heard_b.until(lambda: len(heard_b.got) == 2)
        await heard_a.until(lambda: len(heard_a.got) == 1)
        assert heard_b.got == [("ping", a.owner, ("x 1", '\u00e9"')), ("all", a.owner, ("y",))]
        # The sender hears its own broadcast, never the other's direct one.
        assert heard_a.got == [("all", a.owner, ("y",))]


async def test_processes_of_another_schema_hear_nothing(postgres: PostgresServer) -> None:
    async with (
        two_processes(postgres.fresh_url()) as (a, bus_a, _b, _bus_b),
        await PostgresLedger.connect(postgres.fresh_url()) as elsewhere,
    ):
        bus = Bus(elsewhere)
        heard = Heard(bus, "all")
        heard_a = Heard(bus_a, "all")
        try:
            await bus.start()
            await bus_a.start()
            await elsewhere.notify(None, "all", "other schema")
            await a.notify(None, "all", "this schema")
            await heard_a.until(lambda: bool(heard_a.got))
            await heard.until(lambda: bool(heard.got))
            assert [args for _, _, args in heard_a.got] == [("this schema",)]
            assert [args for _, _, args in heard.got] == [("other schema",)]
        finally:
            await bus.close()


async def test_a_notification_in_a_batch_comes_after_its_rows(postgres: PostgresServer) -> None:
    async with two_processes(postgres.fresh_url()) as (a, _bus_a, b, bus_b):
        heard = Heard(bus_b, "barrier")
        seen: list[object] = []

        async def read_the_step(sender: str, args: tuple[str, ...]) -> None:
            heard.got.append(("recorded", sender, args))  # as it arrives, before the read
            step = await b.get_step(args[0], int(args[1]))
            seen.append(None if step is None else step.state)

        bus_b.on("recorded", read_the_step)
        await bus_b.start()
        execution = await a.start_execution("chat-1", "{}", T0)
        async with a.batch():
            await a.record_step(execution.id, 0, "tool", "t", "{}", "client", T0, "req-1")
            await a.notify(b.owner, "recorded", execution.id, "0")
            # Not before the commit: a notification sent after it from outside the batch
            # arrives first (PostgreSQL delivers notifications in commit order).
            await b.notify(b.owner, "barrier")
            await heard.until(lambda: bool(heard.got))
            assert [kind for kind, _, _ in heard.got] == ["barrier"]
        await heard.until(lambda: bool(seen))
        assert [kind for kind, _, _ in heard.got] == ["barrier", "recorded"]
        assert seen == ["pending"]


async def test_a_rolled_back_batch_notifies_nobody(postgres: PostgresServer) -> None:
    async with two_processes(postgres.fresh_url()) as (a, _bus_a, b, bus_b):
        heard = Heard(bus_b, "lost", "after")
        await bus_b.start()
        with pytest.raises(psycopg.errors.DivisionByZero):
            async with a.batch():
                await a.notify(b.owner, "lost")
                await a.statement("SELECT 1/0", ())  # a database error rolls the batch back
        await a.notify(b.owner, "after")
        await heard.until(lambda: bool(heard.got))
        assert [kind for kind, _, _ in heard.got] == ["after"]


async def test_the_bus_reconnects_after_a_restart_of_postgresql(postgres: PostgresServer) -> None:
    async with two_processes(postgres.fresh_url()) as (a, _bus_a, b, bus_b):
        heard = Heard(bus_b, "ping")
        await bus_b.start()
        await a.notify(b.owner, "ping", "before")
        await heard.until(lambda: len(heard.got) == 1)
        await restart(postgres, heard, bus_b)
        await heard.until(lambda: heard.reconnects == 1, timeout=20)
        assert bus_b.listening and bus_b.connects == 2
        for _ in range(50):  # the pool reconnects by itself, within about 2 s
            try:
                await a.notify(b.owner, "ping", "after")
                break
            except Exception:
                await asyncio.sleep(0.1)
        await heard.until(lambda: len(heard.got) == 2)
        assert [args for _, _, args in heard.got] == [("before",), ("after",)]


async def test_after_a_restart_the_resync_finds_the_ledger_usable(
    postgres: PostgresServer,
) -> None:
    async with two_processes(postgres.fresh_url()) as (_a, _bus_a, b, bus_b):
        for _ in range(3):  # connections in b's pool, idle through the restart
            await b.statement("SELECT 1", ())
        outcomes: list[object] = []

        async def resync() -> None:  # what a reconnect handler does: read the rows
            try:
                outcomes.append(await b.statement("SELECT 1", ()))
            except Exception as exc:
                outcomes.append(exc)

        bus_b.on_reconnect(resync)
        heard = Heard(bus_b)
        await bus_b.start()
        await restart(postgres, heard, bus_b)
        await heard.until(lambda: heard.reconnects == 1, timeout=20)
        # The bus replaced the connections the restart closed before the handlers ran.
        assert outcomes == [[(1,)]]


def test_payloads_carry_any_id_and_refuse_what_is_not_ours() -> None:
    assert decode(encode("p", "k", ("a b", "\\", "\u2603"))) == ("p", "k", ("a b", "\\", "\u2603"))
    assert decode("not json") is None
    assert decode('["only-one"]') is None
    assert decode('{"a": 1}') is None
    assert decode('["p", "k", 3]') is None
    with pytest.raises(TypeError):
        encode("p", "k", (3,))  # type: ignore[arg-type]


async def test_sqlite_has_one_process_and_refuses_to_notify_another() -> None:
    async with SqliteLedger(":memory:") as ledger:
        await ledger.notify(None, "anything")
        await ledger.notify(ledger.owner, "anything")
        with pytest.raises(RuntimeError, match="one process"):
            await ledger.notify("another-process", "anything")
