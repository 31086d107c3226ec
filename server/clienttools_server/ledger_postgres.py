"""The ledger (rule S8) in PostgreSQL, shared by every server process that points at it.

:class:`PostgresLedger` behaves as :class:`~clienttools_server.ledger.SqliteLedger`
does, method by method: each logical step is one committed transaction (or a
part of one :meth:`~PostgresLedger.batch`), stale, duplicate and oversize
settlements are :class:`~clienttools_server.ledger.Outcome` values, and the
same inputs raise the same exceptions. The contract tests run against both.

Asynchronous: every call that reads or writes is a coroutine on psycopg's
:class:`~psycopg_pool.AsyncConnectionPool`, one pooled connection per call,
so a call waiting for the database holds up only the task that made it,
never the event loop. A :meth:`~PostgresLedger.batch` belongs to the asyncio
task that opened it (a :class:`contextvars.ContextVar`, checked against the
task): every call of that task inside it runs on the batch's connection, in
its one transaction, while the calls of other tasks, made while the batch
awaits, take connections of their own and see none of its uncommitted writes.
What announces a batch's writes to a peer goes through
:meth:`~PostgresLedger.after_commit`, so it leaves once they are durable.
The routing between processes (LISTEN/NOTIFY, ``cluster.py``) listens on a
connection of its own outside the pool, since a listening connection cannot
run other statements; :meth:`~PostgresLedger.notify` goes through the pool.

How long a call waits, and how many run at once: a call waits at most
``timeout`` (DEFAULT_TIMEOUT, 5 s) for a connection. The wait no longer
blocks the event loop, so it can be longer than the 2 s of a synchronous
store and ride out a database restart or a burst of calls queued for the
pool; it stays well under the lease (10 s), so a database that is away or
too slow fails the calls clearly (LedgerUnavailable: the server answers 1013
and the peer retries) rather than leave them hanging while runs' leases
lapse. The pool's size (DEFAULT_MAX_SIZE, 8 connections) bounds how many
calls and batches of one process are at the database at once: calls of many
tasks now overlap, where the synchronous store had one in flight at a time.
On this 2-core machine with a Unix socket, 100 tasks at once make 200 chats'
ledger calls a second on 1 connection and ~240 on 2 to 16 (``python -m
bench.ledgers --pool-sizes``): the CPU, ~3 ms a chat here and ~2 in
PostgreSQL, is the limit, and more connections only add PostgreSQL backends.
In the server (``bench.ledgers``' 100 pages x 10 chats, 3 runs) 4
connections took 1.6 times the wall time per call of 8, and 16 did no better
than 8: the server's calls do queue for 8 (nearly every one waits for a
connection) but gain nothing from more on 2 cores. Eight also leaves room
for what these loads do not have: round trips over a network, during which a
connection is held, and batches waiting on another process's row lock, which
would otherwise hold up this process's other tasks; yet ten processes fit
PostgreSQL's default 100 connections (8 pooled and 1 listening each). Past
it calls queue, which is what makes a slow database fail them within
``timeout`` instead of piling up at the database. A connection idle inside a
transaction for longer than the lease is closed by the server
(``idle_in_transaction_session_timeout``): a process stopped in the middle
of a batch (SIGSTOP) must not keep its runs' rows locked, and so out of
reach of the process taking them over, for longer than its lease.

When the database goes away, a call fails clearly rather than waiting: it
raises :class:`~clienttools_server.ledger.LedgerUnavailable` once no
connection could be had within ``timeout`` seconds (or at once, when the
connection breaks under it), and the calls after it give up sooner
(AWAY_TIMEOUT) until one gets through. The pool reconnects by itself; calls
after the database is back work again. (The server closes a socket whose
frame met it with 1013, so the peer sends it again after reconnecting:
docs/scaling.md.)

The schema is created, or migrated, when the ledger opens, under an advisory
lock so that processes starting together do not race; its version is the row
of ``ledger_schema``. Text values the ledger does not parse (session, name,
request id, error) may hold characters PostgreSQL's ``text`` cannot (NUL);
they are stored escaped and read back as given.

Example::

    url = "postgresql:///clienttools?host=/run/postgresql"
    async with await PostgresLedger.connect(url) as ledger:
        run = await ledger.start_execution("chat-1", '{"messages":[]}', now=time.time())
        async with ledger.batch():
            await ledger.record_step(run.id, 0, "tool", "get_location", "{}", "client", time.time())
            ledger.after_commit(lambda: print("recorded"))  # once the batch has committed
        assert (await ledger.resolve(run.id, 0, '{"lat":52.5}', now=time.time())).ok
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import hashlib
import uuid
from collections.abc import AsyncIterator, Callable, Collection, Iterator, Sequence
from types import TracebackType
from typing import Any, Literal

import psycopg
import psycopg_pool

from .canonical import canonicalize
from .cluster.bus import encode
from .ledger import (
    DEFAULT_LEASE,
    FINISHED_STATUSES,
    ChatBusy,
    ChatOfOtherSession,
    ChatSummary,
    Execution,
    ExecutionStatus,
    Leases,
    LedgerClosed,
    LedgerUnavailable,
    Outcome,
    Registration,
    Resolution,
    Step,
    StepKind,
    StoredChat,
    UnknownExecution,
    UnknownStep,
    _check_statuses,
    _check_transition,
    _closing_error,
    _prepare_error,
    _prepare_input,
    _prepare_recorded_result,
    _prepare_result,
    _refusal,
    check_replay,
)

SCHEMA_VERSION = 7

# Seconds a call waits for a connection before it fails with LedgerUnavailable
# (the module docstring says why 5); once a call has failed, the next ones wait
# only AWAY_TIMEOUT, until one gets through: a database that is away must not
# hold every socket's frames for seconds each.
DEFAULT_TIMEOUT = 5.0
AWAY_TIMEOUT = 0.1
# Connections per process: how many calls and batches are at the database at once.
DEFAULT_MAX_SIZE = 8

# A process dead for this many leases is forgotten, with its registrations.
FORGET_DEAD_AFTER_LEASES = 10

# One key for the advisory lock that serializes migrations across processes.
_MIGRATION_LOCK = 0x636C_746C  # "cltl"

# MIGRATIONS[n] takes the schema from version n to n + 1. Ids and sessions sort
# by byte (COLLATE "C"), as SQLite does, whatever the database's locale.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        """
        CREATE TABLE executions (
            id           TEXT COLLATE "C" PRIMARY KEY,
            session      TEXT COLLATE "C" NOT NULL,
            status       TEXT NOT NULL
                         CHECK (status IN ('running', 'paused', 'completed', 'error', 'expired')),
            request_json TEXT NOT NULL,
            error        TEXT,
            created_at   DOUBLE PRECISION NOT NULL,
            updated_at   DOUBLE PRECISION NOT NULL
        )
        """,
        "CREATE INDEX executions_by_status ON executions (status, updated_at)",
        "CREATE INDEX executions_by_session ON executions (session, status)",
        """
        CREATE TABLE steps (
            execution_id TEXT COLLATE "C" NOT NULL
                         REFERENCES executions (id) ON DELETE CASCADE,
            seq          BIGINT NOT NULL CHECK (seq >= 0),
            kind         TEXT NOT NULL CHECK (kind IN ('model', 'tool')),
            name         TEXT NOT NULL,
            input_json   TEXT NOT NULL,
            resolution   TEXT NOT NULL CHECK (resolution IN ('client', 'approval', 'server')),
            state        TEXT NOT NULL
                         CHECK (state IN ('pending', 'applied', 'error', 'expired')),
            result_json  TEXT,
            error_json   TEXT,
            request_id   TEXT,
            attempts     INTEGER NOT NULL DEFAULT 0,
            created_at   DOUBLE PRECISION NOT NULL,
            updated_at   DOUBLE PRECISION NOT NULL,
            PRIMARY KEY (execution_id, seq)
        )
        """,
        # Only pending steps are ever searched by state, and they are few.
        "CREATE INDEX steps_pending ON steps (resolution, execution_id) WHERE state = 'pending'",
        "CREATE INDEX steps_by_request_id ON steps (request_id) WHERE request_id IS NOT NULL",
    ),
    # 2: the tool spec a client call was made with, for the outputSchema after a restart.
    ("ALTER TABLE steps ADD COLUMN spec_json TEXT",),
    # 3: run ownership: the lease's owner, its generation (fencing), until when it holds.
    (
        'ALTER TABLE executions ADD COLUMN owner TEXT COLLATE "C"',
        "ALTER TABLE executions ADD COLUMN generation BIGINT NOT NULL DEFAULT 0",
        "ALTER TABLE executions ADD COLUMN lease_until DOUBLE PRECISION",
    ),
    # 4: routing between processes: who is alive, which connection registered which
    # tools where (S2 across processes), where each call's last invoke went (S5).
    (
        """
        CREATE TABLE processes (
            id          TEXT COLLATE "C" PRIMARY KEY,
            alive_until DOUBLE PRECISION NOT NULL
        )
        """,
        "CREATE SEQUENCE registration_order",
        """
        CREATE TABLE registrations (
            connection_id TEXT COLLATE "C" PRIMARY KEY,
            session       TEXT COLLATE "C" NOT NULL,
            process_id    TEXT COLLATE "C" NOT NULL,
            registration  BIGINT NOT NULL DEFAULT nextval('registration_order'),
            client_id     TEXT COLLATE "C",
            tools_json    TEXT NOT NULL
        )
        """,
        "CREATE INDEX registrations_by_session ON registrations (session, registration)",
        "CREATE INDEX registrations_by_process ON registrations (process_id)",
        'ALTER TABLE steps ADD COLUMN target_connection TEXT COLLATE "C"',
        'ALTER TABLE steps ADD COLUMN target_client_id TEXT COLLATE "C"',
        # An approval's tool call id: a chat on any process answers it by that id.
        'ALTER TABLE steps ADD COLUMN tool_call_id TEXT COLLATE "C"',
    ),
    # 5: a chat's response across processes (shared_stream.py): the chat an execution
    # answers, at most one unfinished execution per chat, and the chunks streamed so far.
    (
        'ALTER TABLE executions ADD COLUMN chat_id TEXT COLLATE "C"',
        "CREATE UNIQUE INDEX executions_streaming ON executions (session, chat_id) "
        "WHERE status IN ('running', 'paused')",
        "CREATE INDEX executions_by_chat ON executions (session, chat_id, created_at)",
        """
        CREATE TABLE chunks (
            execution_id TEXT COLLATE "C" NOT NULL
                         REFERENCES executions (id) ON DELETE CASCADE,
            seq          BIGINT NOT NULL CHECK (seq >= 0),
            chunk_json   TEXT,
            PRIMARY KEY (execution_id, seq)
        )
        """,
    ),
    # 6: who owns each session (O1). The sessions already in the ledger were used by the
    # one principal there was, the holders of the shared token: they keep them.
    (
        """
        CREATE TABLE session_owners (
            session    TEXT COLLATE "C" PRIMARY KEY,
            principal  TEXT COLLATE "C" NOT NULL,
            created_at DOUBLE PRECISION NOT NULL
        )
        """,
        "CREATE INDEX session_owners_by_principal ON session_owners (principal, session)",
        "INSERT INTO session_owners (session, principal, created_at) "
        "SELECT session, 'shared', MIN(created_at) FROM executions GROUP BY session",
    ),
    # 7: the conversations stored on the server (H1): one row per chat, one per message.
    (
        """
        CREATE TABLE chats (
            id            TEXT COLLATE "C" PRIMARY KEY,
            session       TEXT COLLATE "C" NOT NULL,
            version       BIGINT NOT NULL,
            message_count INTEGER NOT NULL,
            streaming     TEXT COLLATE "C",
            updated_at    DOUBLE PRECISION NOT NULL
        )
        """,
        "CREATE INDEX chats_by_age ON chats (updated_at, id)",
        "CREATE INDEX chats_by_session ON chats (session, updated_at, id)",
        """
        CREATE TABLE chat_messages (
            chat_id      TEXT COLLATE "C" NOT NULL REFERENCES chats (id) ON DELETE CASCADE,
            position     INTEGER NOT NULL CHECK (position >= 0),
            message_json TEXT NOT NULL,
            PRIMARY KEY (chat_id, position)
        )
        """,
    ),
)
assert len(MIGRATIONS) == SCHEMA_VERSION

_EXECUTION_COLUMNS = (
    "id, session, status, request_json, error, created_at, updated_at, "
    "owner, generation, lease_until"
)
# The fence every write for an execution carries: it applies only while the
# execution is at the generation this instance holds (NULL: not one of ours, no
# fence). The row lock: a take-over waits for this write, or this write waits for
# the take-over and then sees the new generation. NO KEY UPDATE, the lock the
# execution's own UPDATE takes anyway: two writers for one execution queue up on
# it instead of both sharing it and then deadlocking on the upgrade.
_FENCE = (
    "EXISTS (SELECT 1 FROM executions WHERE id = %s "
    "AND generation = COALESCE(%s::bigint, generation) FOR NO KEY UPDATE)"
)
_STEP_COLUMNS = (
    "execution_id, seq, kind, name, input_json, resolution, state, result_json, "
    "error_json, request_id, attempts, created_at, updated_at, spec_json"
)
# What a step is read back with: its columns and where its last invoke went.
_STEP_READ = _STEP_COLUMNS + ", target_connection, target_client_id"
# A process counts as alive while its row's alive_until has not passed; its own
# registrations always count for itself.
_LIVE_PROCESS = (
    "(r.process_id = %s OR EXISTS (SELECT 1 FROM processes AS p "
    "WHERE p.id = r.process_id AND p.alive_until >= %s))"
)
# Each write below is one statement, so one round trip and atomic by itself: the
# step and the execution's updated_at (a step recorded or settled is progress, so
# the run is not idle and not expirable yet) change together or not at all.
# An unknown execution inserts nothing, rather than raising a foreign-key error
# that would abort a batch's transaction.
_RECORD_STEP = (
    f"WITH inserted AS (INSERT INTO steps ({_STEP_COLUMNS}) "
    "SELECT %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s "
    f"WHERE {_FENCE} "
    "ON CONFLICT (execution_id, seq) DO NOTHING RETURNING execution_id), "
    "touched AS (UPDATE executions SET updated_at = %s "
    "WHERE id = %s AND EXISTS (SELECT 1 FROM inserted)) "
    "SELECT count(*) FROM inserted"
)
_SETTLE_SQL = {
    field: (
        f"WITH settled AS (UPDATE steps SET state = %s, {field}_json = %s, updated_at = %s "
        f"WHERE execution_id = %s AND seq = %s AND state = 'pending' AND {_FENCE} "
        f"RETURNING {_STEP_READ}), "
        "touched AS (UPDATE executions SET updated_at = %s "
        "WHERE id IN (SELECT execution_id FROM settled)) "
        "SELECT * FROM settled"
    )
    for field in ("result", "error")
}


def _escape(text: str) -> str:
    """``text`` as PostgreSQL can store it: NUL (and so the escape character) escaped."""
    if "\\" not in text and "\x00" not in text:
        return text
    return text.replace("\\", "\\\\").replace("\x00", "\\0")


def _unescape(text: str) -> str:
    if "\\" not in text:
        return text
    out: list[str] = []
    chars = iter(text)
    for char in chars:
        if char == "\\":
            escaped = next(chars, "")
            out.append("\x00" if escaped == "0" else escaped)
        else:
            out.append(char)
    return "".join(out)


def _maybe_escape(text: str | None) -> str | None:
    return None if text is None else _escape(text)


def _maybe_unescape(text: object) -> str | None:
    return None if text is None else _unescape(str(text))


def _execution_from_row(row: Sequence[Any]) -> Execution:
    (id_, session, status, request_json, error, created_at, updated_at, owner, generation,
     lease_until) = row  # fmt: skip
    return Execution(
        id_, _unescape(session), status, request_json, _maybe_unescape(error), created_at,
        updated_at, owner, int(generation), lease_until,
    )  # fmt: skip


def _step_from_row(row: Sequence[Any]) -> Step:
    (execution_id, seq, kind, name, input_json, resolution, state, result_json, error_json,
     request_id, attempts, created_at, updated_at, spec_json, target_connection,
     target_client_id) = row  # fmt: skip
    return Step(
        execution_id, seq, kind, _unescape(name), input_json, resolution, state, result_json,
        error_json, _maybe_unescape(request_id), attempts, created_at, updated_at, spec_json,
        target_connection, _maybe_unescape(target_client_id),
    )  # fmt: skip


class _Transaction:
    """Statements on one connection inside an open transaction."""

    def __init__(self, connection: psycopg.AsyncConnection[Any]) -> None:
        self.connection = connection

    async def execute(self, sql: str, params: Sequence[object] = ()) -> int:
        """Run a statement; how many rows it changed."""
        cursor = await self.connection.execute(sql, params)
        return cursor.rowcount

    async def fetchone(self, sql: str, params: Sequence[object] = ()) -> tuple[Any, ...] | None:
        cursor = await self.connection.execute(sql, params)
        row: tuple[Any, ...] | None = await cursor.fetchone()
        return row

    async def fetchall(self, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        cursor = await self.connection.execute(sql, params)
        rows: list[tuple[Any, ...]] = await cursor.fetchall()
        return rows


@dataclasses.dataclass(eq=False)
class _Batch:
    """One task's open batch on one ledger."""

    ledger: PostgresLedger
    task: asyncio.Task[Any] | None  # the task that opened it: the only one that uses it
    connection: psycopg.AsyncConnection[Any]
    open: bool = False  # a transaction is open on the connection
    rolled_back: bool = False  # a database error rolled back what it had written
    # It ended: a task spawned inside it (its context holds the batch) must not use it.
    closed: bool = False
    actions: list[Callable[[], None]] = dataclasses.field(default_factory=list)


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


class PostgresLedger:
    """The ledger in one PostgreSQL database (or the first schema of its ``search_path``).

    ``conninfo`` is a libpq URL or key=value string. Opened with
    ``await PostgresLedger.connect(conninfo)``; closed with ``await ledger.close()``
    or by ``async with``. One instance serves every task of an event loop: a
    batch belongs to the task that opened it.
    """

    def __init__(
        self,
        conninfo: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        max_size: int = DEFAULT_MAX_SIZE,
        lease: float = DEFAULT_LEASE,
    ) -> None:
        """A ledger not open yet (no I/O here): :meth:`connect` makes and opens one."""
        self._leases = Leases(lease)
        self._conninfo = conninfo
        self._namespace = ""  # set once connected: the channels' prefix for this schema
        self._timeout = timeout
        self._away = False  # the last call found the database unreachable
        self._closed = True  # until connect() has opened it
        self._idle_in_transaction = f"{max(1, round(lease * 1000))}ms"
        self._pool: psycopg_pool.AsyncConnectionPool[psycopg.AsyncConnection[Any]] = (
            psycopg_pool.AsyncConnectionPool(
                conninfo,
                min_size=1,
                max_size=max_size,
                timeout=timeout,
                # autocommit: we open transactions ourselves, as SqliteLedger does, so
                # a batch can keep going after a call that refused before writing.
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

    @classmethod
    async def connect(
        cls,
        conninfo: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        max_size: int = DEFAULT_MAX_SIZE,
        lease: float = DEFAULT_LEASE,
    ) -> PostgresLedger:
        """Open a ledger: connect (else LedgerUnavailable after ``timeout``), migrate its schema."""
        ledger = cls(conninfo, timeout=timeout, max_size=max_size, lease=lease)
        await ledger._open()
        return ledger

    async def _open(self) -> None:
        try:
            await self._pool.open(wait=True, timeout=self._timeout)
            self._closed = False
            await self._migrate()
            [(database, schema)] = await self._read("SELECT current_database(), current_schema()")
            self._namespace = _namespace(str(database), str(schema))
        except psycopg_pool.PoolTimeout as exc:
            await self._close()
            raise LedgerUnavailable(
                f"the PostgreSQL ledger could not connect within {self._timeout:g} s: {exc}"
            ) from exc
        except BaseException:
            await self._close()  # a half-opened ledger must not leak its connections
            raise

    async def _configure(self, connection: psycopg.AsyncConnection[Any]) -> None:
        # A process stopped inside a batch must not hold its runs' rows locked,
        # out of reach of the process taking them over, past its lease.
        await connection.execute(
            "SELECT set_config('idle_in_transaction_session_timeout', %s, false)",
            (self._idle_in_transaction,),
        )

    async def _migrate(self) -> None:
        async with self._write() as tx:
            await tx.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
            await tx.execute("CREATE TABLE IF NOT EXISTS ledger_schema (version INTEGER NOT NULL)")
            row = await tx.fetchone("SELECT version FROM ledger_schema")
            version = 0 if row is None else int(row[0])
            if version > SCHEMA_VERSION:
                raise RuntimeError(
                    f"ledger schema version {version} is not supported "
                    f"(this code knows version {SCHEMA_VERSION})"
                )
            for statements in MIGRATIONS[version:]:
                for statement in statements:
                    await tx.execute(statement)
            if row is None:
                await tx.execute(
                    "INSERT INTO ledger_schema (version) VALUES (%s)", (SCHEMA_VERSION,)
                )
            elif version != SCHEMA_VERSION:
                await tx.execute("UPDATE ledger_schema SET version = %s", (SCHEMA_VERSION,))

    # connections and transactions

    def _check_open(self) -> None:
        if self._closed:
            raise LedgerClosed("the ledger is closed (or was never opened: connect() opens it)")

    @property
    def _batch(self) -> _Batch | None:
        """This ledger's batch that the current task opened and that is still open."""
        batches = _BATCHES.get()
        if not batches:
            return None
        task = _current_task()
        for batch in reversed(batches):
            if batch.ledger is self and batch.task is task and not batch.closed:
                return batch
        return None

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """The batch's connection, or one from the pool for this call."""
        self._check_open()
        batch = self._batch
        if batch is None:
            with self._unavailable_as_error():
                async with self._pooled() as connection:
                    yield connection
            return
        with self._unavailable_as_error():
            try:
                yield batch.connection
            except psycopg.Error:
                # A database error aborts a PostgreSQL transaction: the whole batch
                # goes, rather than half a call. (Refusals are checked before any
                # statement, so they never come here and leave the batch alone.)
                if batch.open:
                    await _rollback(batch.connection)
                    batch.open = False
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

    async def _read(self, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        async with self._connection() as connection:
            cursor = await connection.execute(sql, params)
            rows: list[tuple[Any, ...]] = await cursor.fetchall()
            return rows

    @contextlib.asynccontextmanager
    async def _write(self) -> AsyncIterator[_Transaction]:
        """One atomic write: its own committed transaction, or a part of the batch's."""
        batch = self._batch
        async with self._connection() as connection:
            if batch is not None:
                if not batch.open:
                    await connection.execute("BEGIN")
                    batch.open = True
                yield _Transaction(connection)
                return
            await connection.execute("BEGIN")
            try:
                yield _Transaction(connection)
            except BaseException:
                await _rollback(connection)
                raise
            await connection.execute("COMMIT")

    async def _write_one(self, sql: str, params: Sequence[object]) -> list[tuple[Any, ...]]:
        """One statement that is a whole write by itself: atomic with no BEGIN and COMMIT."""
        if self._batch is not None:
            async with self._write() as tx:
                return await tx.fetchall(sql, params)
        return await self._read(sql, params)

    @contextlib.asynccontextmanager
    async def batch(self) -> AsyncIterator[None]:
        """Commit every write made inside the block in one transaction, when the block ends.

        As :meth:`SqliteLedger.batch <clienttools_server.ledger.SqliteLedger.batch>`:
        a call that refuses (a divergence, an unknown execution, a value that
        cannot be stored) leaves the calls before it to be committed; a
        database error rolls the whole batch back, since it aborts the
        transaction. The batch is the current task's: its calls inside the
        block run on the batch's connection, other tasks' calls while it
        awaits do not. What announces its writes goes through
        :meth:`after_commit`. Nestable.
        """
        self._check_open()
        if self._batch is not None:
            yield  # nested: the outermost batch commits
            return
        with self._unavailable_as_error():
            async with self._pooled() as connection:
                batch = _Batch(self, _current_task(), connection)
                token = _BATCHES.set((*_BATCHES.get(), batch))
                try:
                    yield
                except BaseException:
                    await self._end(batch, token, raising=True)
                    raise
                await self._end(batch, token, raising=False)

    async def _end(
        self, batch: _Batch, token: contextvars.Token[tuple[_Batch, ...]], *, raising: bool
    ) -> None:
        """Commit the batch's transaction, then run what waited for the commit."""
        batch.closed = True
        _BATCHES.reset(token)
        connection = batch.connection
        if batch.open:
            batch.open = False
            if connection.info.transaction_status != psycopg.pq.TransactionStatus.INTRANS:
                # A statement was interrupted (its task cancelled) and aborted the
                # transaction, or the connection is gone: COMMIT would only roll back.
                await _rollback(connection)
                if not raising:
                    raise LedgerUnavailable("the batch's transaction was lost: nothing committed")
                return
            try:
                with self._unavailable_as_error():
                    await connection.execute("COMMIT")
            except BaseException:
                await _rollback(connection)
                raise
        if batch.rolled_back:
            return  # what the actions would announce is gone
        for action in batch.actions:
            action()

    def after_commit(self, action: Callable[[], None]) -> None:
        """Run ``action`` once the writes so far are committed: now, or when the batch ends.

        Inside this task's batch it waits for the outermost batch's commit and
        runs in the order registered (also when the block raised: what was
        written before is committed); it is dropped if a database error rolled
        the batch back or its commit failed.
        """
        batch = self._batch
        if batch is None:
            action()
        else:
            batch.actions.append(action)

    async def __aenter__(self) -> PostgresLedger:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        if not self._closed:
            await self._close()

    async def _close(self) -> None:
        self._closed = True
        await self._pool.close()

    # the bus (clienttools_server.cluster.bus)

    @property
    def owner(self) -> str:
        """This instance's process id: the owner it writes into the runs it holds."""
        return self._leases.owner

    @property
    def conninfo(self) -> str:
        return self._conninfo

    def channel(self, process_id: str | None) -> str:
        """The LISTEN channel of one process (None: of every process) in this schema."""
        return f"ct_{self._namespace}_{'all' if process_id is None else process_id}"

    async def notify(self, process_id: str | None, kind: str, *args: str) -> None:
        """Tell one process (None: every process, this one included) that rows changed.

        Ids only (the rows carry the data). Inside :meth:`batch` it is part of
        the transaction: delivered after the commit, or never if it rolls back.
        """
        payload = encode(self.owner, kind, args)
        await self._write_one("SELECT pg_notify(%s, %s)", (self.channel(process_id), payload))

    # processes and registrations (S2 across processes)

    async def keep_alive(self, now: float) -> frozenset[str]:
        # One statement: this process's row renewed, the registrations (and rows) of
        # processes dead for long deleted, and who is alive now. Not at once: a
        # process that was only stalled (SIGSTOP, a long pause) and comes back
        # finds its registrations there again, counted once its row is renewed.
        seconds = self._leases.seconds * FORGET_DEAD_AFTER_LEASES
        rows = await self._write_one(
            "WITH me AS (INSERT INTO processes (id, alive_until) VALUES (%s, %s) "
            "ON CONFLICT (id) DO UPDATE SET alive_until = EXCLUDED.alive_until), "
            "dead AS (DELETE FROM processes WHERE alive_until < %s AND id <> %s RETURNING id), "
            "unregistered AS (DELETE FROM registrations WHERE process_id IN "
            "(SELECT id FROM dead)) "
            "SELECT id FROM processes WHERE alive_until >= %s AND id <> %s",
            (self.owner, now + self._leases.seconds, now - seconds, self.owner, now, self.owner),
        )
        return frozenset({self.owner, *(str(row[0]) for row in rows)})

    async def register(
        self, connection_id: str, session: str, client_id: str | None, tools_json: str
    ) -> int:
        # Another connection of the same page (session, clientId) is one it left.
        [(order,)] = await self._write_one(
            "WITH moved AS (DELETE FROM registrations WHERE session = %s AND client_id = %s "
            "AND connection_id <> %s) "
            "INSERT INTO registrations (connection_id, session, process_id, client_id, tools_json) "
            "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (connection_id) DO UPDATE SET "
            "client_id = EXCLUDED.client_id, tools_json = EXCLUDED.tools_json, "
            "registration = EXCLUDED.registration RETURNING registration",
            (
                _escape(session), _maybe_escape(client_id), connection_id, connection_id,
                _escape(session), self.owner, _maybe_escape(client_id), tools_json,
            ),
        )  # fmt: skip
        return int(order)

    async def unregister(self, connection_id: str) -> None:
        await self._write_one(
            "DELETE FROM registrations WHERE connection_id = %s RETURNING 1", (connection_id,)
        )

    async def registrations(self, session: str, now: float) -> list[Registration]:
        rows = await self._read(
            "SELECT r.connection_id, r.session, r.process_id, r.registration, r.client_id, "
            f"r.tools_json FROM registrations AS r WHERE r.session = %s AND {_LIVE_PROCESS} "
            "ORDER BY r.registration",
            (_escape(session), self.owner, now),
        )
        return [
            Registration(
                str(connection_id),
                _unescape(str(name)),
                str(process_id),
                int(order),
                _maybe_unescape(client_id),
                str(tools_json),
            )
            for connection_id, name, process_id, order, client_id, tools_json in rows
        ]

    async def delivered_to(
        self, connection_ids: Collection[str]
    ) -> list[tuple[str, str, str | None]]:
        if not connection_ids:
            return []
        rows = await self._read(
            "SELECT s.request_id, s.target_connection, e.owner FROM steps AS s "
            "JOIN executions AS e ON e.id = s.execution_id "
            "WHERE s.state = 'pending' AND s.resolution = 'client' "
            "AND s.target_connection = ANY(%s) AND e.status IN ('running', 'paused')",
            (list(connection_ids),),
        )
        return [
            (_unescape(str(request_id)), str(connection), None if owner is None else str(owner))
            for request_id, connection, owner in rows
            if request_id is not None
        ]

    async def mark_approval(self, execution_id: str, seq: int, tool_call_id: str) -> None:
        await self._write_one(
            "UPDATE steps SET tool_call_id = %s WHERE execution_id = %s AND seq = %s "
            "AND resolution = 'approval' RETURNING 1",
            (_escape(tool_call_id), _escape(execution_id), seq),
        )

    async def approval_step(
        self, session: str, tool_call_id: str
    ) -> tuple[Step, str | None] | None:
        columns = ", ".join(f"s.{column.strip()}" for column in _STEP_READ.split(","))
        rows = await self._read(
            f"SELECT {columns}, e.owner FROM steps AS s "
            "JOIN executions AS e ON e.id = s.execution_id "
            "WHERE s.state = 'pending' AND s.resolution = 'approval' AND s.tool_call_id = %s "
            "AND e.session = %s AND e.status IN ('running', 'paused') LIMIT 1",
            (_escape(tool_call_id), _escape(session)),
        )
        if not rows:
            return None
        *step, owner = rows[0]
        return _step_from_row(step), None if owner is None else str(owner)

    async def registered(self, connection_id: str, now: float) -> bool:
        rows = await self._read(
            f"SELECT 1 FROM registrations AS r WHERE r.connection_id = %s AND {_LIVE_PROCESS}",
            (connection_id, self.owner, now),
        )
        return bool(rows)

    # for the shared chunk log (shared_stream.py), whose statements are its own

    async def statement(self, sql: str, params: Sequence[object]) -> list[tuple[Any, ...]]:
        """Run one statement that is a whole read or write by itself; its rows."""
        return await self._write_one(sql, params)

    def held(self, execution_id: str) -> int | None:
        """The generation this process holds for the execution (None: not its own);
        :class:`~clienttools_server.ledger.LeaseLost` if it lost it."""
        return self._held(execution_id)

    async def lease_lost(self, execution_id: str, held: int) -> None:
        """Raise LeaseLost if a fenced write that changed nothing was refused by the fence."""
        await self._check_lease(execution_id, held)

    # leases

    def _held(self, execution_id: str) -> int | None:
        """The generation held for the execution (None: not ours); LeaseLost if lost."""
        return self._leases.generation(execution_id)

    async def _check_lease(self, execution_id: str, held: int | None) -> None:
        """After a fenced write changed nothing: raise LeaseLost if the fence is why."""
        if held is None:
            return
        rows = await self._read(
            "SELECT generation FROM executions WHERE id = %s", (_escape(execution_id),)
        )
        if rows and int(rows[0][0]) != held:
            raise self._leases.lose(execution_id, int(rows[0][0]))

    async def take_over(self, now: float) -> list[Execution]:
        leases = self._leases
        # SKIP LOCKED: a run another process is taking over (or writing) right now
        # is not lapsed for us; the next round sees how it ended.
        rows = await self._write_one(
            "UPDATE executions SET owner = %s, generation = generation + 1, lease_until = %s "
            "WHERE id IN (SELECT id FROM executions WHERE status IN ('running', 'paused') "
            "AND (lease_until IS NULL OR lease_until < %s) FOR UPDATE SKIP LOCKED) "
            f"RETURNING {_EXECUTION_COLUMNS}",
            (leases.owner, now + leases.seconds, now),
        )
        taken = sorted((_execution_from_row(row) for row in rows), key=_by_age)
        for execution in taken:
            leases.hold(execution.id, execution.generation)
        return taken

    async def renew(self, now: float) -> list[str]:
        leases = self._leases
        if not leases.held:
            return []
        held = list(leases.held.items())
        rows = await self._write_one(
            "UPDATE executions AS e SET lease_until = %s "
            "FROM unnest(%s::text[], %s::bigint[]) AS h (id, generation) "
            "WHERE e.id = h.id AND e.generation = h.generation RETURNING e.id",
            (now + leases.seconds, [_escape(i) for i, _ in held], [g for _, g in held]),
        )
        renewed = {_unescape(str(row[0])) for row in rows}
        lost = [execution_id for execution_id, _ in held if execution_id not in renewed]
        for execution_id in lost:
            leases.lose(execution_id, None)
        return lost

    def release(self, execution_id: str) -> None:
        self._leases.release(execution_id)

    # executions

    async def start_execution(
        self, session: str, request_json: str, now: float, chat_id: str | None = None
    ) -> Execution:
        canonicalize(request_json)  # refuse what could not be re-run later
        leases = self._leases
        execution = Execution(
            uuid.uuid4().hex, session, "running", request_json, None, now, now,
            leases.owner, 1, now + leases.seconds,
        )  # fmt: skip
        # The unique index on the unfinished executions of a chat decides, in the
        # same statement: of two processes starting one chat at once, one gets it.
        rows = await self._write_one(
            f"INSERT INTO executions ({_EXECUTION_COLUMNS}, chat_id) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) "
            "ON CONFLICT (session, chat_id) WHERE status IN ('running', 'paused') DO NOTHING "
            "RETURNING id",
            (
                execution.id, _escape(session), "running", request_json, None, now, now,
                leases.owner, 1, now + leases.seconds, _maybe_escape(chat_id),
            ),
        )  # fmt: skip
        if not rows:
            raise ChatBusy(f"chat {chat_id!r} of session {session!r} has a response streaming")
        leases.hold(execution.id, 1)
        return execution

    async def get_execution(self, execution_id: str) -> Execution | None:
        rows = await self._read(
            f"SELECT {_EXECUTION_COLUMNS} FROM executions WHERE id = %s", (_escape(execution_id),)
        )
        return _execution_from_row(rows[0]) if rows else None

    async def executions(
        self,
        statuses: Collection[ExecutionStatus] | None = None,
        session: str | None = None,
    ) -> list[Execution]:
        _check_statuses(statuses)
        self._check_open()
        where: list[str] = []
        params: list[object] = []
        if statuses is not None:
            if not statuses:
                return []
            where.append("status = ANY(%s)")
            params.append(list(statuses))
        if session is not None:
            where.append("session = %s")
            params.append(_escape(session))
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        rows = await self._read(
            f"SELECT {_EXECUTION_COLUMNS} FROM executions {clause} ORDER BY created_at, id",
            params,
        )
        return [_execution_from_row(row) for row in rows]

    async def set_status(
        self, execution_id: str, status: ExecutionStatus, now: float, error: str | None = None
    ) -> None:
        held = self._held(execution_id)
        async with self._write() as tx:
            execution = await self._execution_in(tx, execution_id, lock=True)
            if held is not None and execution.generation != held:
                raise self._leases.lose(execution_id, execution.generation)
            _check_transition(execution, status)
            if execution.finished:
                return  # same finished status again: nothing changes
            await tx.execute(
                "UPDATE executions SET status = %s, error = %s, updated_at = %s WHERE id = %s",
                (status, _maybe_escape(error), now, execution_id),
            )
            if status in FINISHED_STATUSES:
                await self._settle_pending(tx, execution_id, status, now, ttl=None)

    async def _execution_in(
        self, tx: _Transaction, execution_id: str, *, lock: bool = False
    ) -> Execution:
        # FOR UPDATE: another process's status change waits for ours, as
        # SQLite's BEGIN IMMEDIATE makes it.
        row = await tx.fetchone(
            f"SELECT {_EXECUTION_COLUMNS} FROM executions WHERE id = %s"
            + (" FOR UPDATE" if lock else ""),
            (_escape(execution_id),),
        )
        if row is None:
            raise UnknownExecution(f"no execution {execution_id}")
        return _execution_from_row(row)

    async def _settle_pending(
        self,
        tx: _Transaction,
        execution_id: str,
        status: ExecutionStatus,
        now: float,
        ttl: float | None,
    ) -> None:
        state, error_json = _closing_error(status, ttl)
        await tx.execute(
            "UPDATE steps SET state = %s, error_json = %s, updated_at = %s "
            "WHERE execution_id = %s AND state = 'pending'",
            (state, error_json, now, execution_id),
        )

    async def expire_paused(self, ttl: float, now: float) -> list[str]:
        cutoff = now - ttl
        async with self._write() as tx:
            # SKIP LOCKED: a run another process is changing right now is not idle.
            rows = await tx.fetchall(
                "SELECT id FROM executions AS e WHERE updated_at < %s AND ("
                " status = 'paused' OR (status = 'running' AND EXISTS ("
                "  SELECT 1 FROM steps WHERE execution_id = e.id AND state = 'pending')))"
                " ORDER BY created_at, id FOR UPDATE SKIP LOCKED",
                (cutoff,),
            )
            expired = [str(row[0]) for row in rows]
            for execution_id in expired:
                await tx.execute(
                    "UPDATE executions SET status = 'expired', error = %s, updated_at = %s "
                    "WHERE id = %s",
                    (f"expired after {ttl:g} s without progress", now, execution_id),
                )
                await self._settle_pending(tx, execution_id, "expired", now, ttl)
        return expired

    async def prune_finished(self, retention: float, now: float) -> int:
        if retention < 0:
            raise ValueError(f"retention must not be negative, not {retention}")
        async with self._write() as tx:
            # The steps go with their execution (ON DELETE CASCADE).
            deleted = await tx.execute(
                "DELETE FROM executions WHERE status = ANY(%s) AND updated_at < %s",
                (sorted(FINISHED_STATUSES), now - retention),
            )
        return deleted

    # steps

    async def record_step(
        self,
        execution_id: str,
        seq: int,
        kind: StepKind,
        name: str,
        input_json: str,
        resolution: Resolution,
        now: float,
        request_id: str | None = None,
        result_json: str | None = None,
    ) -> Step:
        if seq < 0:
            raise ValueError(f"seq must be >= 0, not {seq}")
        canonical_input = _prepare_input(name, input_json)
        state, stored_result = _prepare_recorded_result(result_json)
        held = self._held(execution_id)
        step = Step(
            execution_id, seq, kind, name, canonical_input, resolution, state,
            stored_result, None, request_id, 0, now, now, None,
        )  # fmt: skip
        [(inserted,)] = await self._write_one(
            _RECORD_STEP,
            (
                execution_id, seq, kind, _escape(name), canonical_input, resolution, state,
                stored_result, None, _maybe_escape(request_id), 0, now, now, None,
                execution_id, held, now, execution_id,
            ),
        )  # fmt: skip
        if inserted:
            return step
        await self._check_lease(execution_id, held)
        # Recorded before (a replay), or no such execution: only now worth a read.
        existing = await self.get_step(execution_id, seq)
        if existing is None:
            raise UnknownExecution(f"no execution {execution_id}")
        check_replay(existing, kind, name, canonical_input)
        return existing

    # who owns each session (O1)

    async def claim_session(self, session: str, principal: str, now: float) -> str:
        async with self._write() as tx:
            await tx.execute(
                "INSERT INTO session_owners (session, principal, created_at) "
                "VALUES (%s, %s, %s) ON CONFLICT (session) DO NOTHING",
                (_escape(session), _escape(principal), now),
            )
            # A statement of its own: in READ COMMITTED it sees the row of a claim
            # that won the race and committed while the insert above waited for it.
            row = await tx.fetchone(
                "SELECT principal FROM session_owners WHERE session = %s", (_escape(session),)
            )
        assert row is not None
        return _unescape(str(row[0]))

    async def session_owner(self, session: str) -> str | None:
        rows = await self._read(
            "SELECT principal FROM session_owners WHERE session = %s", (_escape(session),)
        )
        return _unescape(str(rows[0][0])) if rows else None

    async def sessions_owned_by(self, principal: str) -> list[str]:
        rows = await self._read(
            "SELECT session FROM session_owners WHERE principal = %s ORDER BY session",
            (_escape(principal),),
        )
        return [_unescape(str(session)) for (session,) in rows]

    async def record_spec(self, execution_id: str, seq: int, spec_json: str) -> Step | None:
        """Record the tool spec of a step once (the first stays); the step, None if missing."""
        canonical = canonicalize(spec_json)
        held = self._held(execution_id)
        # The step as it stands after the update: the updated row, or else the one
        # that already had a spec (the statement's snapshot predates its update).
        rows = await self._write_one(
            f"WITH updated AS (UPDATE steps SET spec_json = %s "
            f"WHERE execution_id = %s AND seq = %s AND spec_json IS NULL AND {_FENCE} "
            f"RETURNING {_STEP_READ}) "
            "SELECT * FROM updated UNION ALL "
            f"SELECT {_STEP_READ} FROM steps WHERE execution_id = %s AND seq = %s "
            "AND NOT EXISTS (SELECT 1 FROM updated)",
            (
                canonical, _escape(execution_id), seq, _escape(execution_id), held,
                _escape(execution_id), seq,
            ),
        )  # fmt: skip
        if not rows or rows[0][13] is None or rows[0][13] != canonical:
            # Nothing updated: a spec recorded before (fine), or the fence refused it.
            await self._check_lease(execution_id, held)
        return _step_from_row(rows[0]) if rows else None

    async def get_step(self, execution_id: str, seq: int) -> Step | None:
        rows = await self._read(
            f"SELECT {_STEP_READ} FROM steps WHERE execution_id = %s AND seq = %s",
            (_escape(execution_id), seq),
        )
        return _step_from_row(rows[0]) if rows else None

    async def step_by_request_id(self, request_id: str) -> Step | None:
        rows = await self._read(
            f"SELECT {_STEP_READ} FROM steps WHERE request_id = %s ORDER BY created_at LIMIT 1",
            (_escape(request_id),),
        )
        return _step_from_row(rows[0]) if rows else None

    async def steps(self, execution_id: str) -> list[Step]:
        rows = await self._read(
            f"SELECT {_STEP_READ} FROM steps WHERE execution_id = %s ORDER BY seq",
            (_escape(execution_id),),
        )
        return [_step_from_row(row) for row in rows]

    async def pending_steps(
        self, session: str | None = None, resolution: Resolution | None = None
    ) -> list[Step]:
        columns = ", ".join(f"s.{column.strip()}" for column in _STEP_READ.split(","))
        where = ["s.state = 'pending'", "e.status IN ('running', 'paused')"]
        params: list[object] = []
        if session is not None:
            where.append("e.session = %s")
            params.append(_escape(session))
        if resolution is not None:
            where.append("s.resolution = %s")
            params.append(resolution)
        rows = await self._read(
            f"SELECT {columns} FROM steps AS s JOIN executions AS e ON e.id = s.execution_id "
            f"WHERE {' AND '.join(where)} ORDER BY s.created_at, s.execution_id, s.seq",
            params,
        )
        return [_step_from_row(row) for row in rows]

    async def resolve(self, execution_id: str, seq: int, result_json: str, now: float) -> Outcome:
        return await self._settle(execution_id, seq, "result", result_json, now)

    async def reject(self, execution_id: str, seq: int, error_json: str, now: float) -> Outcome:
        return await self._settle(execution_id, seq, "error", error_json, now)

    async def _settle(
        self,
        execution_id: str,
        seq: int,
        field: Literal["result", "error"],
        value_json: str,
        now: float,
    ) -> Outcome:
        prepared = _prepare_result(value_json) if field == "result" else _prepare_error(value_json)
        held = self._held(execution_id)
        if not isinstance(prepared, Outcome):
            state = "applied" if field == "result" else "error"
            # The UPDATE's "AND state = 'pending'" is the one check that counts:
            # of two processes settling the same step, exactly one gets the row.
            rows = await self._write_one(
                _SETTLE_SQL[field],
                (state, prepared, now, _escape(execution_id), seq, _escape(execution_id), held,
                 now),
            )  # fmt: skip
            if rows:
                settled = _step_from_row(rows[0])
                return Outcome(
                    True, "applied", f"step {seq} of execution {execution_id} settled", settled
                )
        # Missing, already settled, fenced, or a value that cannot be stored: nothing was written.
        await self._check_lease(execution_id, held)
        step = await self.get_step(execution_id, seq)
        refusal = _refusal(step, execution_id, seq)
        if refusal is not None:
            return refusal
        assert isinstance(prepared, Outcome)
        return dataclasses.replace(prepared, step=step)

    async def add_attempt(
        self,
        execution_id: str,
        seq: int,
        now: float,
        *,
        target_connection: str | None = None,
        target_client_id: str | None = None,
    ) -> int:
        held = self._held(execution_id)
        rows = await self._write_one(
            "UPDATE steps SET attempts = attempts + 1, updated_at = %s, "
            "target_connection = %s, target_client_id = %s "
            f"WHERE execution_id = %s AND seq = %s AND {_FENCE} RETURNING attempts",
            (
                now, target_connection, _maybe_escape(target_client_id), _escape(execution_id),
                seq, _escape(execution_id), held,
            ),
        )  # fmt: skip
        if not rows:
            await self._check_lease(execution_id, held)
            raise UnknownStep(f"no step {seq} in execution {execution_id}")
        return int(rows[0][0])

    # the conversations (H1-H5)

    async def get_chat(self, chat_id: str) -> StoredChat | None:
        key = _escape(chat_id)
        rows = await self._read(
            "SELECT session, version, updated_at, streaming, "
            "(SELECT array_agg(message_json ORDER BY position) FROM chat_messages "
            " WHERE chat_id = chats.id) FROM chats WHERE id = %s",
            (key,),
        )
        if not rows:
            return None
        session, version, updated_at, streaming, messages = rows[0]
        return StoredChat(
            chat_id, _unescape(session), int(version), updated_at, tuple(messages or ()),
            streaming,
        )  # fmt: skip

    async def save_chat(
        self,
        chat_id: str,
        session: str,
        keep: int,
        messages: Sequence[str],
        now: float,
        *,
        streaming: str | None,
    ) -> int:
        if keep < 0:
            raise ValueError(f"keep must not be negative, not {keep}")
        key, owner = _escape(chat_id), _escape(session)
        async with self._write() as tx:
            # The row lock: two saves of one chat (two processes) queue up on it.
            await tx.execute(
                "INSERT INTO chats (id, session, version, message_count, streaming, updated_at) "
                "VALUES (%s, %s, 0, 0, NULL, %s) ON CONFLICT (id) DO NOTHING",
                (key, owner, now),
            )
            row = await tx.fetchone(
                "SELECT session, version, message_count FROM chats WHERE id = %s FOR UPDATE",
                (key,),
            )
            assert row is not None
            if row[0] != owner:
                raise ChatOfOtherSession(f"chat {chat_id!r} belongs to another session")
            version, keep = int(row[1]) + 1, min(keep, int(row[2]))
            await tx.execute(
                "DELETE FROM chat_messages WHERE chat_id = %s AND position >= %s", (key, keep)
            )
            if messages:
                await tx.execute(
                    "INSERT INTO chat_messages (chat_id, position, message_json) "
                    "SELECT %s, %s + ord - 1, m "
                    "FROM unnest(%s::text[]) WITH ORDINALITY AS t(m, ord)",
                    (key, keep, list(messages)),  # JSON text: never a raw NUL
                )
            await tx.execute(
                "UPDATE chats SET version = %s, message_count = %s, streaming = %s, "
                "updated_at = %s WHERE id = %s",
                (version, keep + len(messages), streaming, now, key),
            )
        return version

    async def delete_chat(self, chat_id: str) -> bool:
        rows = await self._write_one(
            "DELETE FROM chats WHERE id = %s RETURNING id", (_escape(chat_id),)
        )
        return bool(rows)

    async def chats(
        self,
        session: str | None,
        limit: int,
        before: tuple[float, str] | None = None,
        *,
        sessions: Collection[str] | None = None,
    ) -> list[ChatSummary]:
        self._check_open()
        where: list[str] = []
        params: list[object] = []
        if session is not None:
            where.append("session = %s")
            params.append(_escape(session))
        if sessions is not None:
            where.append("session = ANY(%s)")
            params.append([_escape(s) for s in sessions])
        if before is not None:
            where.append("(updated_at, id) < (%s, %s)")
            params.extend((before[0], _escape(before[1])))
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        rows = await self._read(
            "SELECT id, session, message_count, version, updated_at FROM chats "
            f"{clause} ORDER BY updated_at DESC, id DESC LIMIT %s",
            (*params, limit),
        )
        return [
            ChatSummary(_unescape(r[0]), _unescape(r[1]), int(r[2]), int(r[3]), r[4]) for r in rows
        ]

    async def prune_chats(self, retention: float, now: float) -> int:
        if retention < 0:
            raise ValueError(f"retention must not be negative, not {retention}")
        rows = await self._write_one(
            "DELETE FROM chats WHERE updated_at < %s AND (streaming IS NULL OR NOT EXISTS ("
            " SELECT 1 FROM executions WHERE id = streaming "
            " AND status IN ('running', 'paused'))) RETURNING id",
            (now - retention,),
        )
        return len(rows)


def _namespace(database: str, schema: str) -> str:
    """A short tag of the ledger's database and schema: channel names stay within 63 bytes."""
    return hashlib.sha256(f"{database}\x00{schema}".encode()).hexdigest()[:12]


def _by_age(execution: Execution) -> tuple[float, str]:
    return execution.created_at, execution.id


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


async def _rollback(connection: psycopg.AsyncConnection[Any]) -> None:
    """Roll back, unless the connection is gone (then the server rolled back already)."""
    with contextlib.suppress(psycopg.OperationalError):
        await connection.execute("ROLLBACK")
