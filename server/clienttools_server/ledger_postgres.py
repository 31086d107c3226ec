"""The ledger (rule S8) in PostgreSQL, shared by every server process that points at it.

:class:`PostgresLedger` behaves as :class:`~clienttools_server.ledger.SqliteLedger`
does, method by method: each logical step is one committed transaction (or a
part of one :meth:`~PostgresLedger.batch`), stale, duplicate and oversize
settlements are :class:`~clienttools_server.ledger.Outcome` values, and the
same inputs raise the same exceptions. The contract tests run against both.

Why synchronous: the whole server calls the :class:`~clienttools_server.ledger.Ledger`
protocol synchronously from its event loop, with ``batch()`` relied on to hold
no ``await`` (frames queued inside leave after the commit). So this store
takes its connections from psycopg's *sync* :class:`~psycopg_pool.ConnectionPool`,
one per call (the same one for every call inside a batch). A call blocks the
event loop for one round trip to the database: on a Unix socket or a LAN that
is a fraction of a millisecond (bench/README.md has the figure). The next
step is an async interface (``AsyncConnectionPool``) once the callers await
the ledger; the routing between processes (LISTEN/NOTIFY) will want a
connection of its own outside the pool, since a listening connection cannot
run other statements.

When the database goes away, a call fails clearly rather than waiting: it
raises :class:`~clienttools_server.ledger.LedgerUnavailable` once no
connection could be had within ``timeout`` seconds (or at once, when the
connection breaks under it), and the calls after it give up sooner until one
gets through. The pool reconnects by itself; calls after the database is
back work again. (The server closes a socket whose frame met it with 1013,
so the peer sends it again after reconnecting: docs/scaling.md.)

The schema is created, or migrated, when the ledger opens, under an advisory
lock so that processes starting together do not race; its version is the row
of ``ledger_schema``. Text values the ledger does not parse (session, name,
request id, error) may hold characters PostgreSQL's ``text`` cannot (NUL);
they are stored escaped and read back as given.

Example::

    ledger = PostgresLedger("postgresql:///clienttools?host=/run/postgresql")
    run = ledger.start_execution("chat-1", '{"messages":[]}', now=time.time())
    ledger.record_step(run.id, 0, "tool", "get_location", "{}", "client", now=time.time())
    assert ledger.resolve(run.id, 0, '{"lat":52.5}', now=time.time()).ok
    ledger.close()
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import threading
import uuid
from collections.abc import Collection, Iterator, Sequence
from types import TracebackType
from typing import Any, Literal

import psycopg
import psycopg_pool

from .cluster import encode
from .ledger import (
    DEFAULT_LEASE,
    FINISHED_STATUSES,
    ChatBusy,
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
    UnknownExecution,
    UnknownStep,
    _canonicalize,
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

SCHEMA_VERSION = 5

# Seconds a call waits for a connection before it fails with LedgerUnavailable.
# The wait blocks the caller's event loop (the interface is synchronous), so it is
# short; once a call has failed, the next ones wait only AWAY_TIMEOUT, until one
# gets through: a database that is away must not stall every socket for seconds.
DEFAULT_TIMEOUT = 2.0
AWAY_TIMEOUT = 0.1

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

    def __init__(self, connection: psycopg.Connection[Any]) -> None:
        self.connection = connection

    def execute(self, sql: str, params: Sequence[object] = ()) -> psycopg.Cursor[Any]:
        return self.connection.execute(sql, params)


@dataclasses.dataclass
class _Batch:
    connection: psycopg.Connection[Any]
    depth: int = 0
    open: bool = False  # a transaction is open on the connection


class PostgresLedger:
    """The ledger in one PostgreSQL database (or the first schema of its ``search_path``).

    ``conninfo`` is a libpq URL or key=value string. Safe to share between
    threads: a batch belongs to the thread that opened it.
    """

    def __init__(
        self,
        conninfo: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        max_size: int = 4,
        lease: float = DEFAULT_LEASE,
    ) -> None:
        self._leases = Leases(lease)
        self._conninfo = conninfo
        self._namespace = ""  # set once connected: the channels' prefix for this schema
        self._timeout = timeout
        self._away = False  # the last call found the database unreachable
        self._local = threading.local()
        self._closed = False
        self._pool: psycopg_pool.ConnectionPool[psycopg.Connection[Any]] = (
            psycopg_pool.ConnectionPool(
                conninfo,
                min_size=1,
                max_size=max_size,
                timeout=timeout,
                # autocommit: we open transactions ourselves, as SqliteLedger does, so
                # a batch can keep going after a call that refused before writing.
                kwargs={"autocommit": True, "connect_timeout": max(1, round(timeout))},
                check=_alive,
                # Give up reconnecting in the background soon: then each call that
                # finds no connection starts a fresh attempt, so the ledger is back
                # within seconds of the database, not after a backoff grown long.
                reconnect_timeout=timeout,
                open=False,
                name="clienttools-ledger",
            )
        )
        try:
            self._pool.open(wait=True, timeout=timeout)
            self._migrate()
            [(database, schema)] = self._read("SELECT current_database(), current_schema()")
            self._namespace = _namespace(str(database), str(schema))
        except psycopg_pool.PoolTimeout as exc:
            self._pool.close()
            raise LedgerUnavailable(
                f"the PostgreSQL ledger could not connect within {timeout:g} s: {exc}"
            ) from exc
        except BaseException:
            self._pool.close()  # a half-opened ledger must not leak its connections
            raise

    def _migrate(self) -> None:
        with self._write() as tx:
            tx.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
            tx.execute("CREATE TABLE IF NOT EXISTS ledger_schema (version INTEGER NOT NULL)")
            row = tx.execute("SELECT version FROM ledger_schema").fetchone()
            version = 0 if row is None else int(row[0])
            if version > SCHEMA_VERSION:
                raise RuntimeError(
                    f"ledger schema version {version} is not supported "
                    f"(this code knows version {SCHEMA_VERSION})"
                )
            for statements in MIGRATIONS[version:]:
                for statement in statements:
                    tx.execute(statement)
            if row is None:
                tx.execute("INSERT INTO ledger_schema (version) VALUES (%s)", (SCHEMA_VERSION,))
            elif version != SCHEMA_VERSION:
                tx.execute("UPDATE ledger_schema SET version = %s", (SCHEMA_VERSION,))

    # connections and transactions

    def _check_open(self) -> None:
        if self._closed:
            raise LedgerClosed("the ledger is closed")

    @property
    def _batch(self) -> _Batch | None:
        batch: _Batch | None = getattr(self._local, "batch", None)
        return batch

    @contextlib.contextmanager
    def _connection(self) -> Iterator[psycopg.Connection[Any]]:
        """The batch's connection, or one from the pool for this call."""
        self._check_open()
        batch = self._batch
        if batch is not None:
            with self._unavailable_as_error():
                yield batch.connection
            return
        with self._unavailable_as_error(), self._pooled() as connection:
            yield connection

    def _pooled(self) -> contextlib.AbstractContextManager[psycopg.Connection[Any]]:
        return self._pool.connection(timeout=AWAY_TIMEOUT if self._away else self._timeout)

    @contextlib.contextmanager
    def _unavailable_as_error(self) -> Iterator[None]:
        waited = AWAY_TIMEOUT if self._away else self._timeout
        try:
            yield
        except psycopg_pool.PoolTimeout as exc:
            self._away = True
            raise LedgerUnavailable(
                f"the PostgreSQL ledger is unreachable: no connection within {waited:g} s"
            ) from exc
        except psycopg.OperationalError as exc:
            self._away = True
            raise LedgerUnavailable(f"the PostgreSQL ledger is unreachable: {exc}") from exc
        except BaseException:
            self._away = False  # an answer came back, so the database is there
            raise
        self._away = False

    def _read(self, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        with self._connection() as connection:
            return connection.execute(sql, params).fetchall()

    @contextlib.contextmanager
    def _write(self) -> Iterator[_Transaction]:
        """One atomic write: its own committed transaction, or a part of the batch's."""
        batch = self._batch
        if batch is None:
            with self._connection() as connection:
                connection.execute("BEGIN")
                tx = _Transaction(connection)
                try:
                    yield tx
                except BaseException:
                    _rollback(connection, "ROLLBACK")
                    raise
                connection.execute("COMMIT")
            return
        with self._connection() as connection:
            if not batch.open:
                connection.execute("BEGIN")
                batch.open = True
            tx = _Transaction(connection)
            try:
                yield tx
            except psycopg.Error:
                # A database error aborts a PostgreSQL transaction: the whole batch
                # goes, rather than half a call. (Refusals are checked before any
                # statement, so they never come here and leave the batch alone.)
                _rollback(connection, "ROLLBACK")
                batch.open = False
                raise

    def _write_one(self, sql: str, params: Sequence[object]) -> list[tuple[Any, ...]]:
        """One statement that is a whole write by itself: atomic with no BEGIN and COMMIT."""
        if self._batch is not None:
            with self._write() as tx:
                return tx.execute(sql, params).fetchall()
        with self._connection() as connection:
            return connection.execute(sql, params).fetchall()

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Commit every write made inside the block in one transaction, when the block ends.

        As :meth:`SqliteLedger.batch <clienttools_server.ledger.SqliteLedger.batch>`:
        a call that refuses (a divergence, an unknown execution, a value that
        cannot be stored) leaves the calls before it to be committed; a
        database error rolls the whole batch back, since it aborts the
        transaction. Keep it synchronous (no ``await``). Nestable.
        """
        self._check_open()
        batch = self._batch
        if batch is not None:
            batch.depth += 1
            try:
                yield
            finally:
                batch.depth -= 1
            return
        with self._unavailable_as_error(), self._pooled() as connection:
            batch = _Batch(connection, depth=1)
            self._local.batch = batch
            try:
                yield
            finally:
                self._local.batch = None
                if batch.open:
                    try:
                        with self._unavailable_as_error():
                            connection.execute("COMMIT")
                    except BaseException:
                        _rollback(connection, "ROLLBACK")
                        raise

    def __enter__(self) -> PostgresLedger:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._pool.close()

    # the bus (clienttools_server.cluster)

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

    def notify(self, process_id: str | None, kind: str, *args: str) -> None:
        """Tell one process (None: every process, this one included) that rows changed.

        Ids only (the rows carry the data). Inside :meth:`batch` it is part of
        the transaction: delivered after the commit, or never if it rolls back.
        """
        payload = encode(self.owner, kind, args)
        self._write_one("SELECT pg_notify(%s, %s)", (self.channel(process_id), payload))

    # processes and registrations (S2 across processes)

    def keep_alive(self, now: float) -> frozenset[str]:
        # One statement: this process's row renewed, the registrations (and rows) of
        # processes dead for long deleted, and who is alive now. Not at once: a
        # process that was only stalled (SIGSTOP, a long pause) and comes back
        # finds its registrations there again, counted once its row is renewed.
        seconds = self._leases.seconds * FORGET_DEAD_AFTER_LEASES
        rows = self._write_one(
            "WITH me AS (INSERT INTO processes (id, alive_until) VALUES (%s, %s) "
            "ON CONFLICT (id) DO UPDATE SET alive_until = EXCLUDED.alive_until), "
            "dead AS (DELETE FROM processes WHERE alive_until < %s AND id <> %s RETURNING id), "
            "unregistered AS (DELETE FROM registrations WHERE process_id IN "
            "(SELECT id FROM dead)) "
            "SELECT id FROM processes WHERE alive_until >= %s AND id <> %s",
            (self.owner, now + self._leases.seconds, now - seconds, self.owner, now, self.owner),
        )
        return frozenset({self.owner, *(str(row[0]) for row in rows)})

    def register(
        self, connection_id: str, session: str, client_id: str | None, tools_json: str
    ) -> int:
        # Another connection of the same page (session, clientId) is one it left.
        [(order,)] = self._write_one(
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

    def unregister(self, connection_id: str) -> None:
        self._write_one(
            "DELETE FROM registrations WHERE connection_id = %s RETURNING 1", (connection_id,)
        )

    def registrations(self, session: str, now: float) -> list[Registration]:
        rows = self._read(
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

    def delivered_to(self, connection_ids: Collection[str]) -> list[tuple[str, str, str | None]]:
        if not connection_ids:
            return []
        rows = self._read(
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

    def mark_approval(self, execution_id: str, seq: int, tool_call_id: str) -> None:
        self._write_one(
            "UPDATE steps SET tool_call_id = %s WHERE execution_id = %s AND seq = %s "
            "AND resolution = 'approval' RETURNING 1",
            (_escape(tool_call_id), _escape(execution_id), seq),
        )

    def approval_step(self, session: str, tool_call_id: str) -> tuple[Step, str | None] | None:
        columns = ", ".join(f"s.{column.strip()}" for column in _STEP_READ.split(","))
        rows = self._read(
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

    def registered(self, connection_id: str, now: float) -> bool:
        rows = self._read(
            f"SELECT 1 FROM registrations AS r WHERE r.connection_id = %s AND {_LIVE_PROCESS}",
            (connection_id, self.owner, now),
        )
        return bool(rows)

    # for the shared chunk log (shared_stream.py), whose statements are its own

    def statement(self, sql: str, params: Sequence[object]) -> list[tuple[Any, ...]]:
        """Run one statement that is a whole read or write by itself; its rows."""
        return self._write_one(sql, params)

    def held(self, execution_id: str) -> int | None:
        """The generation this process holds for the execution (None: not its own);
        :class:`~clienttools_server.ledger.LeaseLost` if it lost it."""
        return self._held(execution_id)

    def lease_lost(self, execution_id: str, held: int) -> None:
        """Raise LeaseLost if a fenced write that changed nothing was refused by the fence."""
        self._check_lease(execution_id, held)

    # leases

    def _held(self, execution_id: str) -> int | None:
        """The generation held for the execution (None: not ours); LeaseLost if lost."""
        return self._leases.generation(execution_id)

    def _check_lease(self, execution_id: str, held: int | None) -> None:
        """After a fenced write changed nothing: raise LeaseLost if the fence is why."""
        if held is None:
            return
        rows = self._read(
            "SELECT generation FROM executions WHERE id = %s", (_escape(execution_id),)
        )
        if rows and int(rows[0][0]) != held:
            raise self._leases.lose(execution_id, int(rows[0][0]))

    def take_over(self, now: float) -> list[Execution]:
        leases = self._leases
        # SKIP LOCKED: a run another process is taking over (or writing) right now
        # is not lapsed for us; the next round sees how it ended.
        rows = self._write_one(
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

    def renew(self, now: float) -> list[str]:
        leases = self._leases
        if not leases.held:
            return []
        held = list(leases.held.items())
        rows = self._write_one(
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

    def start_execution(
        self, session: str, request_json: str, now: float, chat_id: str | None = None
    ) -> Execution:
        _canonicalize(request_json)  # refuse what could not be re-run later
        leases = self._leases
        execution = Execution(
            uuid.uuid4().hex, session, "running", request_json, None, now, now,
            leases.owner, 1, now + leases.seconds,
        )  # fmt: skip
        # The unique index on the unfinished executions of a chat decides, in the
        # same statement: of two processes starting one chat at once, one gets it.
        rows = self._write_one(
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

    def get_execution(self, execution_id: str) -> Execution | None:
        rows = self._read(
            f"SELECT {_EXECUTION_COLUMNS} FROM executions WHERE id = %s", (_escape(execution_id),)
        )
        return _execution_from_row(rows[0]) if rows else None

    def executions(
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
        rows = self._read(
            f"SELECT {_EXECUTION_COLUMNS} FROM executions {clause} ORDER BY created_at, id",
            params,
        )
        return [_execution_from_row(row) for row in rows]

    def set_status(
        self, execution_id: str, status: ExecutionStatus, now: float, error: str | None = None
    ) -> None:
        held = self._held(execution_id)
        with self._write() as tx:
            execution = self._execution_in(tx, execution_id, lock=True)
            if held is not None and execution.generation != held:
                raise self._leases.lose(execution_id, execution.generation)
            _check_transition(execution, status)
            if execution.finished:
                return  # same finished status again: nothing changes
            tx.execute(
                "UPDATE executions SET status = %s, error = %s, updated_at = %s WHERE id = %s",
                (status, _maybe_escape(error), now, execution_id),
            )
            if status in FINISHED_STATUSES:
                self._settle_pending(tx, execution_id, status, now, ttl=None)

    def _execution_in(
        self, tx: _Transaction, execution_id: str, *, lock: bool = False
    ) -> Execution:
        # FOR UPDATE: another process's status change waits for ours, as
        # SQLite's BEGIN IMMEDIATE makes it.
        row = tx.execute(
            f"SELECT {_EXECUTION_COLUMNS} FROM executions WHERE id = %s"
            + (" FOR UPDATE" if lock else ""),
            (_escape(execution_id),),
        ).fetchone()
        if row is None:
            raise UnknownExecution(f"no execution {execution_id}")
        return _execution_from_row(row)

    def _settle_pending(
        self,
        tx: _Transaction,
        execution_id: str,
        status: ExecutionStatus,
        now: float,
        ttl: float | None,
    ) -> None:
        state, error_json = _closing_error(status, ttl)
        tx.execute(
            "UPDATE steps SET state = %s, error_json = %s, updated_at = %s "
            "WHERE execution_id = %s AND state = 'pending'",
            (state, error_json, now, execution_id),
        )

    def expire_paused(self, ttl: float, now: float) -> list[str]:
        cutoff = now - ttl
        with self._write() as tx:
            # SKIP LOCKED: a run another process is changing right now is not idle.
            rows = tx.execute(
                "SELECT id FROM executions AS e WHERE updated_at < %s AND ("
                " status = 'paused' OR (status = 'running' AND EXISTS ("
                "  SELECT 1 FROM steps WHERE execution_id = e.id AND state = 'pending')))"
                " ORDER BY created_at, id FOR UPDATE SKIP LOCKED",
                (cutoff,),
            ).fetchall()
            expired = [str(row[0]) for row in rows]
            for execution_id in expired:
                tx.execute(
                    "UPDATE executions SET status = 'expired', error = %s, updated_at = %s "
                    "WHERE id = %s",
                    (f"expired after {ttl:g} s without progress", now, execution_id),
                )
                self._settle_pending(tx, execution_id, "expired", now, ttl)
        return expired

    def prune_finished(self, retention: float, now: float) -> int:
        if retention < 0:
            raise ValueError(f"retention must not be negative, not {retention}")
        with self._write() as tx:
            # The steps go with their execution (ON DELETE CASCADE).
            deleted = tx.execute(
                "DELETE FROM executions WHERE status = ANY(%s) AND updated_at < %s",
                (sorted(FINISHED_STATUSES), now - retention),
            ).rowcount
        return int(deleted)

    # steps

    def record_step(
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
        [(inserted,)] = self._write_one(
            _RECORD_STEP,
            (
                execution_id, seq, kind, _escape(name), canonical_input, resolution, state,
                stored_result, None, _maybe_escape(request_id), 0, now, now, None,
                execution_id, held, now, execution_id,
            ),
        )  # fmt: skip
        if inserted:
            return step
        self._check_lease(execution_id, held)
        # Recorded before (a replay), or no such execution: only now worth a read.
        existing = self.get_step(execution_id, seq)
        if existing is None:
            raise UnknownExecution(f"no execution {execution_id}")
        check_replay(existing, kind, name, canonical_input)
        return existing

    def _step_in(
        self, connection: psycopg.Connection[Any], execution_id: str, seq: int
    ) -> Step | None:
        row = connection.execute(
            f"SELECT {_STEP_READ} FROM steps WHERE execution_id = %s AND seq = %s",
            (_escape(execution_id), seq),
        ).fetchone()
        return None if row is None else _step_from_row(row)

    def record_spec(self, execution_id: str, seq: int, spec_json: str) -> Step | None:
        """Record the tool spec of a step once (the first stays); the step, None if missing."""
        canonical = _canonicalize(spec_json)
        held = self._held(execution_id)
        # The step as it stands after the update: the updated row, or else the one
        # that already had a spec (the statement's snapshot predates its update).
        rows = self._write_one(
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
            self._check_lease(execution_id, held)
        return _step_from_row(rows[0]) if rows else None

    def get_step(self, execution_id: str, seq: int) -> Step | None:
        with self._connection() as connection:
            return self._step_in(connection, execution_id, seq)

    def step_by_request_id(self, request_id: str) -> Step | None:
        rows = self._read(
            f"SELECT {_STEP_READ} FROM steps WHERE request_id = %s ORDER BY created_at LIMIT 1",
            (_escape(request_id),),
        )
        return _step_from_row(rows[0]) if rows else None

    def steps(self, execution_id: str) -> list[Step]:
        rows = self._read(
            f"SELECT {_STEP_READ} FROM steps WHERE execution_id = %s ORDER BY seq",
            (_escape(execution_id),),
        )
        return [_step_from_row(row) for row in rows]

    def pending_steps(
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
        rows = self._read(
            f"SELECT {columns} FROM steps AS s JOIN executions AS e ON e.id = s.execution_id "
            f"WHERE {' AND '.join(where)} ORDER BY s.created_at, s.execution_id, s.seq",
            params,
        )
        return [_step_from_row(row) for row in rows]

    def resolve(self, execution_id: str, seq: int, result_json: str, now: float) -> Outcome:
        return self._settle(execution_id, seq, "result", result_json, now)

    def reject(self, execution_id: str, seq: int, error_json: str, now: float) -> Outcome:
        return self._settle(execution_id, seq, "error", error_json, now)

    def _settle(
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
            rows = self._write_one(
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
        self._check_lease(execution_id, held)
        step = self.get_step(execution_id, seq)
        refusal = _refusal(step, execution_id, seq)
        if refusal is not None:
            return refusal
        assert isinstance(prepared, Outcome)
        return dataclasses.replace(prepared, step=step)

    def add_attempt(
        self,
        execution_id: str,
        seq: int,
        now: float,
        *,
        target_connection: str | None = None,
        target_client_id: str | None = None,
    ) -> int:
        held = self._held(execution_id)
        rows = self._write_one(
            "UPDATE steps SET attempts = attempts + 1, updated_at = %s, "
            "target_connection = %s, target_client_id = %s "
            f"WHERE execution_id = %s AND seq = %s AND {_FENCE} RETURNING attempts",
            (
                now, target_connection, _maybe_escape(target_client_id), _escape(execution_id),
                seq, _escape(execution_id), held,
            ),
        )  # fmt: skip
        if not rows:
            self._check_lease(execution_id, held)
            raise UnknownStep(f"no step {seq} in execution {execution_id}")
        return int(rows[0][0])


def _namespace(database: str, schema: str) -> str:
    """A short tag of the ledger's database and schema: channel names stay within 63 bytes."""
    return hashlib.sha256(f"{database}\x00{schema}".encode()).hexdigest()[:12]


def _by_age(execution: Execution) -> tuple[float, str]:
    return execution.created_at, execution.id


def _alive(connection: psycopg.Connection[Any]) -> None:
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


def _rollback(connection: psycopg.Connection[Any], statement: str) -> None:
    """Roll back, unless the connection is gone (then the server rolled back already)."""
    with contextlib.suppress(psycopg.OperationalError):
        connection.execute(statement)
