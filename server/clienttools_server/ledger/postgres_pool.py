"""The PostgreSQL store's connections: the pool, transactions, batches, a database away.

Asynchronous: every call that reads or writes runs on psycopg's
:class:`~psycopg_pool.AsyncConnectionPool`, one pooled connection per call,
so a call waiting for the database holds up only the task that made it,
never the event loop. A batch belongs to the asyncio task that opened it (a
:class:`contextvars.ContextVar`, checked against the task): every call of
that task inside it runs on the batch's connection, in its one transaction,
while the calls of other tasks, made while the batch awaits, take
connections of their own and see none of its uncommitted writes.

How long a call waits, and how many run at once: a call waits at most
``timeout`` (DEFAULT_TIMEOUT, 5 s) for a connection. The wait does not block
the event loop, so it can ride out a database restart or a burst of calls
queued for the pool; it stays well under the lease (10 s), so a database
that is away or too slow fails the calls clearly (LedgerUnavailable: the
server answers 1013 and the peer retries) rather than leave them hanging
while runs' leases lapse. The pool's size (DEFAULT_MAX_SIZE, 8 connections)
bounds how many calls and batches of one process are at the database at
once. On a 2-core machine with a Unix socket, 100 tasks at once make 200
chats' ledger calls a second on 1 connection and ~240 on 2 to 16 (``python
-m bench.ledgers --pool-sizes``): the CPU is the limit, and more connections
only add PostgreSQL backends. In the server (``bench.ledgers``' 100 pages x
10 chats) 4 connections took 1.6 times the wall time per call of 8, and 16
did no better than 8. Eight also leaves room for round trips over a network,
during which a connection is held, and batches waiting on another process's
row lock; yet ten processes fit PostgreSQL's default 100 connections (8
pooled and 1 listening each). Past it calls queue, which is what makes a
slow database fail them within ``timeout`` instead of piling up at the
database. A connection idle inside a transaction for longer than the lease
is closed by the server (``idle_in_transaction_session_timeout``): a process
stopped in the middle of a batch (SIGSTOP) must not keep its runs' rows
locked, and so out of reach of the process taking them over, for longer than
its lease.

When the database goes away, a call fails clearly rather than waiting: it
raises :class:`~clienttools_server.ledger.LedgerUnavailable` once no
connection could be had within ``timeout`` seconds (or at once, when the
connection breaks under it), and the calls after it give up sooner
(AWAY_TIMEOUT) until one gets through. The pool reconnects by itself.

    connections = Connections(url, timeout=5.0, max_size=8, lease=10.0)
    await connections.open()
    rows = await connections.read("SELECT 1")
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import psycopg
import psycopg_pool

from .records import LedgerClosed, LedgerUnavailable
from .schema import SCHEMA_VERSION, applied, to_apply
from .store import Batch

# Seconds a call waits for a connection before it fails with LedgerUnavailable
# (the module docstring says why 5); once a call has failed, the next ones wait
# only AWAY_TIMEOUT, until one gets through: a database that is away must not
# hold every socket's frames for seconds each.
DEFAULT_TIMEOUT = 5.0
AWAY_TIMEOUT = 0.1
# Connections per process: how many calls and batches are at the database at once.
DEFAULT_MAX_SIZE = 8

# One key for the advisory lock that serializes migrations across processes.
_MIGRATION_LOCK = 0x636C_746C  # "cltl"

_IN_A_TRANSACTION = (psycopg.pq.TransactionStatus.INTRANS, psycopg.pq.TransactionStatus.INERROR)


class Transaction:
    """Statements on one connection in one transaction, begun lazily, in pipeline mode.

    The transaction's statements go through one psycopg pipeline, entered with
    ``BEGIN`` at its first statement: a statement whose outcome nothing waits
    for (:meth:`defer`) is sent at once and not waited for; one that is
    awaited waits for everything before it in one round trip (a pipeline
    Sync); ``COMMIT`` ends the pipeline. So BEGIN, the deferred statements and
    COMMIT cost no round trip of their own, and a transaction that wrote
    nothing sends nothing. An error in a deferred statement is raised at the
    next Sync, inside the same transaction, which then rolls back whole.

    The pipeline stays open until the transaction ends: leaving it makes
    psycopg send a Flush after the Sync, and PostgreSQL does not restart its
    ``idle_in_transaction_session_timeout`` for a Flush, so a process stopped
    inside a batch would keep its rows locked past its lease.
    """

    def __init__(self, connection: psycopg.AsyncConnection[Any]) -> None:
        self.connection = connection
        self._pipeline: psycopg.AsyncPipeline | None = None  # open: BEGIN was sent
        self._exit = contextlib.AsyncExitStack()

    @property
    def open(self) -> bool:
        """BEGIN was sent: the transaction is open on the server (or lost with it)."""
        return self._pipeline is not None

    async def _begun(self) -> psycopg.AsyncPipeline:
        if self._pipeline is None:
            self._pipeline = await self._exit.enter_async_context(self.connection.pipeline())
            await self.connection.execute("BEGIN")
        return self._pipeline

    async def defer(self, sql: str, params: Sequence[object] = ()) -> None:
        """Send a statement without waiting for it: its error comes at the next Sync."""
        await self._begun()
        await self.connection.execute(sql, params)

    async def _send(self, sql: str, params: Sequence[object]) -> psycopg.AsyncCursor[Any]:
        pipeline = await self._begun()
        cursor = await self.connection.execute(sql, params)
        await pipeline.sync()
        return cursor

    async def execute(self, sql: str, params: Sequence[object] = ()) -> int:
        """Run a statement; how many rows it changed."""
        cursor = await self._send(sql, params)
        return cursor.rowcount

    async def fetchone(self, sql: str, params: Sequence[object] = ()) -> tuple[Any, ...] | None:
        cursor = await self._send(sql, params)
        row: tuple[Any, ...] | None = await cursor.fetchone()
        return row

    async def fetchall(self, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        cursor = await self._send(sql, params)
        rows: list[tuple[Any, ...]] = await cursor.fetchall()
        return rows

    async def commit(self) -> bool:
        """COMMIT with what was deferred, in one round trip (nothing if nothing was written).

        False if the transaction had been lost: a statement in it was interrupted
        (its task cancelled), so the server rolled it back and COMMIT with it.
        """
        if self._pipeline is None:
            return True
        cursor = await self.connection.execute("COMMIT")
        await self._end_pipeline()  # its Sync, and COMMIT's outcome
        return cursor.statusmessage == "COMMIT"

    async def _end_pipeline(self) -> None:
        ending, self._exit, self._pipeline = self._exit, contextlib.AsyncExitStack(), None
        await ending.aclose()

    async def rollback(self) -> None:
        """Roll back what was sent (also after a COMMIT that failed), unless the
        connection is gone (then the server did)."""
        if self._pipeline is not None:
            with contextlib.suppress(psycopg.Error):
                await self._end_pipeline()  # what was in flight: its errors are the rollback's
        if self.connection.info.transaction_status in _IN_A_TRANSACTION:
            with contextlib.suppress(psycopg.OperationalError):
                await self.connection.execute("ROLLBACK")


@dataclasses.dataclass(eq=False)
class _Batch(Batch):
    """One task's open batch on one ledger."""

    owner: Connections | None = None
    task: asyncio.Task[Any] | None = None  # the task that opened it: the only one that uses it
    tx: Transaction | None = None  # its transaction, on a connection of its own
    rolled_back: bool = False  # a database error rolled back what it had written
    # It ended: a task spawned inside it (its context holds the batch) must not use it.
    closed: bool = False


# The batches open in this context, innermost last (one per ledger at most). A
# task spawned inside a batch copies the context, so each batch also names the
# task it belongs to.
_BATCHES: contextvars.ContextVar[tuple[_Batch, ...]] = contextvars.ContextVar(
    "clienttools_ledger_batches", default=()
)


def _current_task() -> asyncio.Task[Any] | None:
    try:
        return asyncio.current_task()
    except RuntimeError:  # no event loop running: no task, so no batch
        return None


async def _alive(connection: psycopg.AsyncConnection[Any]) -> None:
    """Raise if the server closed this connection (a restart), without a round trip.

    Reads what the server sent while the connection sat in the pool: a server
    that shut down sent its goodbye and closed the socket, and libpq notices
    that here. (An empty query would notice more, a network gone silent, but
    costs a round trip on every call.)
    """
    pgconn = connection.pgconn
    pgconn.consume_input()  # OperationalError once the socket is closed
    if pgconn.status != psycopg.pq.ConnStatus.OK:
        raise psycopg.OperationalError("the connection is broken")


class Connections:
    """The pool of one PostgreSQL ledger, and the transactions and batches on it."""

    def __init__(self, conninfo: str, *, timeout: float, max_size: int, lease: float) -> None:
        """Not open yet (no I/O here): :meth:`open` connects and migrates."""
        self.conninfo = conninfo
        self._timeout = timeout
        self._away = False  # the last call found the database unreachable
        self._closed = True  # until open() has opened it
        self._idle_in_transaction = f"{max(1, round(lease * 1000))}ms"
        self._pool: psycopg_pool.AsyncConnectionPool[psycopg.AsyncConnection[Any]] = (
            psycopg_pool.AsyncConnectionPool(
                conninfo,
                min_size=1,
                max_size=max_size,
                timeout=timeout,
                # autocommit: we open transactions ourselves, as the SQLite store
                # does, so a batch can keep going after a call that refused before
                # writing.
                kwargs={"autocommit": True, "connect_timeout": max(1, round(timeout))},
                configure=self._configure,
                check=_alive,
                # Give up reconnecting in the background soon: then each call that
                # finds no connection starts a fresh attempt, so the ledger is back
                # within seconds of the database, not after a backoff grown long.
                reconnect_timeout=timeout,
                open=False,
                name="clienttools-ledger",
            )
        )

    async def open(self) -> None:
        """Connect (else LedgerUnavailable after ``timeout``) and migrate the schema."""
        try:
            await self._pool.open(wait=True, timeout=self._timeout)
            self._closed = False
            await self._migrate()
        except psycopg_pool.PoolTimeout as exc:
            await self.close()
            raise LedgerUnavailable(
                f"the PostgreSQL ledger could not connect within {self._timeout:g} s: {exc}"
            ) from exc
        except BaseException:
            await self.close()  # a half-opened ledger must not leak its connections
            raise

    async def _configure(self, connection: psycopg.AsyncConnection[Any]) -> None:
        # A process stopped inside a batch must not hold its runs' rows locked,
        # out of reach of the process taking them over, past its lease.
        await connection.execute(
            "SELECT set_config('idle_in_transaction_session_timeout', %s, false)",
            (self._idle_in_transaction,),
        )

    async def _migrate(self) -> None:
        # Under an advisory lock, so that processes starting together do not race;
        # the version is the one row of ledger_schema.
        async with self.write() as tx:
            await tx.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
            await tx.execute("CREATE TABLE IF NOT EXISTS ledger_schema (version INTEGER NOT NULL)")
            row = await tx.fetchone("SELECT version FROM ledger_schema")
            version = 0 if row is None else int(row[0])
            for statement in to_apply("postgres", applied(version, "postgres")):
                await tx.execute(statement)
            if row is None:
                await tx.execute(
                    "INSERT INTO ledger_schema (version) VALUES (%s)", (SCHEMA_VERSION,)
                )
            elif version != SCHEMA_VERSION:
                await tx.execute("UPDATE ledger_schema SET version = %s", (SCHEMA_VERSION,))

    def check_open(self) -> None:
        if self._closed:
            raise LedgerClosed("the ledger is closed (or was never opened: connect() opens it)")

    async def close(self) -> None:
        self._closed = True
        await self._pool.close()

    async def check_connections(self) -> None:
        """Try every idle connection with a round trip; replace those that fail.

        For after the database was away: a connection the restart closed can still
        pass the pool's check (:func:`_alive`) until its first statement fails.
        """
        self.check_open()
        await self._pool.check()

    def current_batch(self) -> _Batch | None:
        """This ledger's batch that the current task opened and that is still open."""
        batches = _BATCHES.get()
        if not batches:
            return None
        task = _current_task()
        for batch in reversed(batches):
            if batch.owner is self and batch.task is task and not batch.closed:
                return batch
        return None

    @contextlib.asynccontextmanager
    async def _batch_tx(self, batch: _Batch) -> AsyncIterator[Transaction]:
        """The batch's transaction; a database error in it rolls the whole batch back."""
        assert batch.tx is not None
        with self._unavailable_as_error():
            try:
                yield batch.tx
            except psycopg.Error:
                # A database error aborts a PostgreSQL transaction: the whole batch
                # goes, rather than half a call. (Refusals are checked before any
                # statement, so they never come here and leave the batch alone.)
                if batch.tx.open:
                    await batch.tx.rollback()
                    batch.rolled_back = True
                raise

    def _pooled(self) -> contextlib.AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]:
        return self._pool.connection(timeout=AWAY_TIMEOUT if self._away else self._timeout)

    @contextlib.contextmanager
    def _unavailable_as_error(self) -> Iterator[None]:
        waited = AWAY_TIMEOUT if self._away else self._timeout
        try:
            yield
        except LedgerUnavailable:
            raise  # said so already, by a call inside this one (a batch's)
        except psycopg_pool.PoolTimeout as exc:
            self._away = True
            raise LedgerUnavailable(
                f"the PostgreSQL ledger is unreachable: no connection within {waited:g} s"
            ) from exc
        except psycopg_pool.PoolClosed as exc:
            raise LedgerClosed("the ledger is closed") from exc
        except psycopg.errors.IdleInTransactionSessionTimeout as exc:
            # The database is there; it ended a batch left idle past the lease.
            raise LedgerUnavailable(
                f"the PostgreSQL ledger ended a transaction idle past the lease: {exc}"
            ) from exc
        except psycopg.OperationalError as exc:
            self._away = True
            raise LedgerUnavailable(f"the PostgreSQL ledger is unreachable: {exc}") from exc
        except Exception:
            self._away = False  # an answer came back, so the database is there
            raise
        self._away = False

    async def read(self, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        """One statement's rows: in the batch's transaction, or on a pooled connection."""
        self.check_open()
        batch = self.current_batch()
        if batch is not None:
            async with self._batch_tx(batch) as tx:
                return await tx.fetchall(sql, params)
        with self._unavailable_as_error():
            async with self._pooled() as connection:
                cursor = await connection.execute(sql, params)
                rows: list[tuple[Any, ...]] = await cursor.fetchall()
                return rows

    @contextlib.asynccontextmanager
    async def write(self) -> AsyncIterator[Transaction]:
        """One atomic write: its own committed transaction, or a part of the batch's."""
        self.check_open()
        batch = self.current_batch()
        if batch is not None:
            async with self._batch_tx(batch) as tx:
                yield tx
            return
        with self._unavailable_as_error():
            async with self._pooled() as connection:
                tx = Transaction(connection)
                try:
                    yield tx
                    if not await tx.commit():
                        raise LedgerUnavailable("the transaction was lost: nothing committed")
                except BaseException:
                    await tx.rollback()
                    raise

    async def write_one(self, sql: str, params: Sequence[object]) -> list[tuple[Any, ...]]:
        """One statement that is a whole write by itself: atomic with no BEGIN and COMMIT."""
        if self.current_batch() is not None:
            async with self.write() as tx:
                return await tx.fetchall(sql, params)
        return await self.read(sql, params)

    async def write_later(self, sql: str, params: Sequence[object]) -> None:
        """A whole write whose outcome nothing waits for: in a batch, sent without waiting
        (an error in it comes with the batch's next statement or its commit); else now,
        on its own."""
        self.check_open()
        batch = self.current_batch()
        if batch is None:
            with self._unavailable_as_error():
                async with self._pooled() as connection:
                    await connection.execute(sql, params)
            return
        async with self._batch_tx(batch) as tx:
            await tx.defer(sql, params)

    @contextlib.asynccontextmanager
    async def open_batch(self) -> AsyncIterator[Batch]:
        """Open this task's batch on a connection of its own; commit it when the block ends."""
        with self._unavailable_as_error():
            async with self._pooled() as connection:
                batch = _Batch(owner=self, task=_current_task(), tx=Transaction(connection))
                token = _BATCHES.set((*_BATCHES.get(), batch))
                try:
                    yield batch
                except BaseException:
                    await self._end(batch, token, raising=True)
                    raise
                await self._end(batch, token, raising=False)

    async def _end(
        self, batch: _Batch, token: contextvars.Token[tuple[_Batch, ...]], *, raising: bool
    ) -> None:
        """Commit the batch's transaction; mark it committed unless it was rolled back."""
        batch.closed = True
        _BATCHES.reset(token)
        tx = batch.tx
        assert tx is not None
        if tx.open:
            try:
                with self._unavailable_as_error():
                    committed = await tx.commit()
            except BaseException:
                await tx.rollback()
                raise
            if not committed:
                if not raising:
                    raise LedgerUnavailable("the batch's transaction was lost: nothing committed")
                return
        batch.committed = not batch.rolled_back
