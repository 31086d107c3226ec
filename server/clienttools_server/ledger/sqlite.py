"""The ledger in one SQLite file (or ``":memory:"``): the SQLite store and :class:`SqliteLedger`.

On a file the ledger is durable: each write is its own committed transaction
(``BEGIN IMMEDIATE``, so a read-then-write cannot interleave with another
process's write), or part of one ``batch()``; on ``":memory:"`` it is the
ledger of a server without ``--db``. One server process serves a file, so the
registrations (S2) live in that process's memory and the bus has nobody to
tell; everything else (the chat an execution answers, where an invoke went,
an approval's tool call id) is stored as on PostgreSQL, by the same rules
(``core.py``).

Synchronous under ``async``: sqlite3 answers from a local file in
microseconds, so every store method runs its SQL at once and its coroutine
never suspends. That is also what keeps a batch whole: nothing else runs
inside a block that awaits only ledger calls. Use it from one thread: the one
that opened it (the event loop's). Example::

    async with SqliteLedger("ledger.sqlite3") as ledger:
        run = await ledger.start_execution("chat-1", '{"messages":[]}', now=time.time())
        now = time.time()
        step = await ledger.record_step(run.id, 0, "tool", "get_location", "{}", "client", now)
        outcome = await ledger.resolve(run.id, step.seq, '{"lat":52.5,"lon":13.4}', now)
        stored = await ledger.get_step(run.id, 0)
        assert outcome.ok and stored.result() == {"lat": 52.5, "lon": 13.4}
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sqlite3
from collections.abc import AsyncIterator, Collection, Iterator, Sequence
from typing import Literal

from .core import LedgerCore
from .records import (
    DEFAULT_LEASE,
    FINISHED_STATUSES,
    ChatSummary,
    Execution,
    ExecutionStatus,
    LedgerClosed,
    Registration,
    Resolution,
    Step,
    StepState,
    StoredChat,
)
from .rules import Leases
from .schema import (
    EXECUTION_COLUMNS,
    SCHEMA_VERSION,
    STEP_COLUMNS,
    applied,
    fence,
    prune_session_tools,
    quiet_since,
    trim_session_tools,
    waiting_quiet_since,
    where,
)
from .schema import to_apply as migrations_to_apply
from .store import Batch

_FENCE = fence("sqlite")
_TRIM_SESSION_TOOLS = trim_session_tools("sqlite")
_PRUNE_SESSION_TOOLS = prune_session_tools("sqlite")
_INSERT_STEP = (
    f"INSERT INTO steps ({STEP_COLUMNS}) SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ? "
    f"WHERE {_FENCE} ON CONFLICT (execution_id, seq) DO NOTHING"
)
_QUIET = quiet_since("sqlite")
_IDLE = waiting_quiet_since("sqlite")
_SETTLE_SQL = {
    field: (
        f"UPDATE steps SET state = ?, {field}_json = ?, updated_at = ? "
        f"WHERE execution_id = ? AND seq = ? AND state = 'pending' AND {_FENCE} "
        f"RETURNING {STEP_COLUMNS}"
    )
    for field in ("result", "error")
}
_STEP_OF_RUN = ", ".join(f"s.{column.strip()}" for column in STEP_COLUMNS.split(","))


def _execution(row: Sequence[object]) -> Execution:
    return Execution(*row)  # type: ignore[arg-type]


def _step(row: Sequence[object]) -> Step:
    return Step(*row)  # type: ignore[arg-type]


def _marks(values: Collection[object]) -> str:
    return ", ".join("?" * len(values))


@dataclasses.dataclass(eq=False)
class _SqliteBatch(Batch):
    rolled_back: bool = False  # a call failed halfway and took the batch's writes back


class SqliteConnection:
    """The SQLite store's one connection: its pragmas, the migrations, transactions, batches."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._registrations: dict[str, Registration] = {}
        self._registration_order = 0
        # isolation_level=None: we open transactions ourselves (BEGIN IMMEDIATE).
        self._connection: sqlite3.Connection | None = sqlite3.connect(path, isolation_level=None)
        self._batch: _SqliteBatch | None = None
        try:
            db = self._connection
            db.execute("PRAGMA busy_timeout = 5000")
            db.execute("PRAGMA journal_mode = WAL")
            # In WAL mode NORMAL survives a killed process; only power loss may
            # drop the last commits, a trade we take for not syncing on every step.
            db.execute("PRAGMA synchronous = NORMAL")
            db.execute("PRAGMA foreign_keys = ON")
            self._migrate()
        except BaseException:
            self._close()  # a half-opened ledger must not leak its connection
            raise

    def _migrate(self) -> None:
        with self._write() as db:
            (version,) = db.execute("PRAGMA user_version").fetchone()
            if version == SCHEMA_VERSION:
                return
            for statement in migrations_to_apply("sqlite", applied(version, "sqlite")):
                db.execute(statement)
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    @property
    def _db(self) -> sqlite3.Connection:
        if self._connection is None:
            raise LedgerClosed("the ledger is closed")
        return self._connection

    def check_open(self) -> None:
        self._db  # noqa: B018 (raises once closed)

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        db = self._db
        batch = self._batch
        if batch is not None:
            if not db.in_transaction:
                db.execute("BEGIN IMMEDIATE")
            changes = db.total_changes
            try:
                yield db
            except BaseException:
                # Every call checks before it writes, so a call that raises has
                # usually written nothing. One that failed halfway (a database
                # error) takes the whole batch with it rather than leave half a call.
                if db.total_changes != changes and db.in_transaction:
                    db.execute("ROLLBACK")
                    batch.rolled_back = True
                raise
            return
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    @contextlib.asynccontextmanager
    async def write(self) -> AsyncIterator[sqlite3.Connection]:
        with self._write() as db:
            yield db

    def current_batch(self) -> Batch | None:
        # One connection: every call made while a batch is open is part of it.
        return self._batch

    @contextlib.asynccontextmanager
    async def open_batch(self) -> AsyncIterator[Batch]:
        db = self._db
        batch = self._batch = _SqliteBatch()
        try:
            yield batch
        finally:
            self._batch = None
            if db.in_transaction:
                try:
                    db.execute("COMMIT")
                except BaseException:
                    if db.in_transaction:
                        db.execute("ROLLBACK")
                    raise
            batch.committed = not batch.rolled_back

    async def close(self) -> None:
        self._close()

    def _close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None


class _SqliteSessions(SqliteConnection):
    """The SQLite dialect of the processes, registrations, session owners, their tools and
    chats."""

    # processes and registrations: one process, so they live in its memory

    async def keep_alive(
        self, owner: str, now: float, until: float, forget_before: float
    ) -> frozenset[str]:
        return frozenset({owner})

    async def register(
        self, owner: str, connection_id: str, session: str, client_id: str | None, tools: str
    ) -> int:
        self._registration_order += 1
        for other in [
            r.connection_id
            for r in self._registrations.values()
            if client_id is not None and (r.session, r.client_id) == (session, client_id)
        ]:
            del self._registrations[other]
        self._registrations[connection_id] = Registration(
            connection_id, session, owner, self._registration_order, client_id, tools
        )
        return self._registration_order

    async def unregister(self, connection_id: str) -> None:
        self._registrations.pop(connection_id, None)

    async def registrations(self, owner: str, session: str, now: float) -> list[Registration]:
        return sorted(
            (r for r in self._registrations.values() if r.session == session),
            key=lambda r: r.order,
        )

    async def registered(self, owner: str, connection_id: str, now: float) -> bool:
        return connection_id in self._registrations

    async def notify(
        self, owner: str, process_id: str | None, kind: str, args: Sequence[str]
    ) -> None:
        # One process, nobody to tell: callers take the local path for this one.
        if process_id is not None and process_id != owner:
            raise RuntimeError(
                f"a SQLite ledger has one process; it cannot notify process {process_id}"
            )

    # who owns each session (O1)

    async def claim_session(self, session: str, principal: str, now: float) -> str:
        with self._write() as db:
            db.execute(
                "INSERT INTO session_owners (session, principal, created_at) VALUES (?, ?, ?) "
                "ON CONFLICT (session) DO NOTHING",
                (session, principal, now),
            )
            (owner,) = db.execute(
                "SELECT principal FROM session_owners WHERE session = ?", (session,)
            ).fetchone()
        return str(owner)

    async def session_owner(self, session: str) -> str | None:
        row = self._db.execute(
            "SELECT principal FROM session_owners WHERE session = ?", (session,)
        ).fetchone()
        return None if row is None else str(row[0])

    async def sessions_owned_by(self, principal: str) -> list[str]:
        rows = self._db.execute(
            "SELECT session FROM session_owners WHERE principal = ? ORDER BY session",
            (principal,),
        ).fetchall()
        return [str(session) for (session,) in rows]

    # the tools each session's pages registered (S2)

    async def remember_tools(
        self, session: str, specs: Sequence[tuple[str, str]], now: float, keep: int
    ) -> None:
        with self._write() as db:
            db.executemany(
                "INSERT INTO session_tools (session, name, spec_json, updated_at) "
                "VALUES (?, ?, ?, ?) ON CONFLICT (session, name) DO UPDATE SET "
                "spec_json = excluded.spec_json, updated_at = excluded.updated_at",
                [(session, name, spec, now) for name, spec in specs],
            )
            db.execute(_TRIM_SESSION_TOOLS, (session, session, keep))

    async def remembered_tools(self, session: str) -> list[tuple[str, str]]:
        rows = self._db.execute(
            "SELECT name, spec_json FROM session_tools WHERE session = ? ORDER BY updated_at, name",
            (session,),
        ).fetchall()
        return [(str(name), str(spec)) for name, spec in rows]

    async def prune_session_tools(self, cutoff: float) -> int:
        with self._write() as db:
            return int(db.execute(_PRUNE_SESSION_TOOLS, (cutoff,)).rowcount)

    # the conversations (H1-H5)

    async def get_chat(self, chat_id: str) -> StoredChat | None:
        db = self._db
        row = db.execute(
            "SELECT session, version, updated_at, streaming FROM chats WHERE id = ?", (chat_id,)
        ).fetchone()
        if row is None:
            return None
        messages = db.execute(
            "SELECT message_json FROM chat_messages WHERE chat_id = ? ORDER BY position",
            (chat_id,),
        ).fetchall()
        return StoredChat(chat_id, row[0], row[1], row[2], tuple(m[0] for m in messages), row[3])

    # One process: its subscribers are its own, so nothing is recorded (or told).

    async def subscribe_chat(self, owner: str, chat_id: str) -> StoredChat | None:
        return await self.get_chat(chat_id)

    async def unsubscribe_chat(self, owner: str, chat_id: str) -> None:
        return None

    async def locked_chat(
        self, tx: sqlite3.Connection, chat_id: str, session: str, now: float, new: bool
    ) -> tuple[str, int, int]:
        # A new chat is made at version 0: the write lock is ours, no one races.
        make = (
            "INSERT INTO chats (id, session, version, message_count, streaming, updated_at) "
            "VALUES (?, ?, 0, 0, NULL, ?) ON CONFLICT (id) DO NOTHING"
        )
        if new and tx.execute(make, (chat_id, session, now)).rowcount == 1:
            return session, 0, 0
        row = tx.execute(
            "SELECT session, version, message_count FROM chats WHERE id = ?", (chat_id,)
        ).fetchone()
        if row is None:
            tx.execute(make, (chat_id, session, now))
            return session, 0, 0
        return str(row[0]), int(row[1]), int(row[2])

    async def store_chat(
        self, owner: str, tx: sqlite3.Connection, chat_id: str, keep: int,
        messages: Sequence[str], version: int, streaming: str | None, now: float, count: int,
    ) -> None:  # fmt: skip
        # The chat's messages are at positions 0 to count - 1: the new ones are written over
        # those at their positions, and only what is left past the new end is deleted.
        end = keep + len(messages)
        if count > end:
            tx.execute(
                "DELETE FROM chat_messages WHERE chat_id = ? AND position >= ?", (chat_id, end)
            )
        if messages:
            tx.executemany(
                "INSERT INTO chat_messages (chat_id, position, message_json) VALUES (?, ?, ?) "
                "ON CONFLICT (chat_id, position) "
                "DO UPDATE SET message_json = excluded.message_json",
                [(chat_id, keep + i, text) for i, text in enumerate(messages)],
            )
        tx.execute(
            "UPDATE chats SET version = ?, message_count = ?, streaming = ?, updated_at = ? "
            "WHERE id = ?",
            (version, end, streaming, now, chat_id),
        )

    async def delete_chat(self, owner: str, chat_id: str) -> bool:
        with self._write() as db:
            return bool(db.execute("DELETE FROM chats WHERE id = ?", (chat_id,)).rowcount)

    async def chats(
        self, session: str | None, limit: int, before: tuple[float, str] | None,
        sessions: Collection[str] | None,
    ) -> list[ChatSummary]:  # fmt: skip
        clause, params = where(
            None if session is None else ("session = ?", [session]),
            None if sessions is None else (f"session IN ({_marks(sessions)})", list(sessions)),
            None
            if before is None
            else ("(updated_at < ? OR (updated_at = ? AND id < ?))", [before[0], *before]),
        )
        rows = self._db.execute(
            "SELECT id, session, message_count, version, updated_at FROM chats "
            f"{clause} ORDER BY updated_at DESC, id DESC LIMIT ?",
            (*params, limit),
        ).fetchall()
        return [ChatSummary(*row) for row in rows]

    async def prune_chats(self, cutoff: float) -> int:
        with self._write() as db:
            # A response that can no longer finish (its run ended without a last
            # save, or expired) does not keep its chat alive.
            return int(
                db.execute(
                    "DELETE FROM chats WHERE updated_at < ? AND (streaming IS NULL OR NOT EXISTS ("
                    " SELECT 1 FROM executions WHERE id = streaming "
                    " AND status IN ('running', 'paused')))",
                    (cutoff,),
                ).rowcount
            )


class SqliteStore(_SqliteSessions):
    """The SQLite dialect of every ledger operation, on the connection of its base class."""

    # leases

    async def generation(self, execution_id: str) -> int | None:
        row = self._db.execute(
            "SELECT generation FROM executions WHERE id = ?", (execution_id,)
        ).fetchone()
        return None if row is None else int(row[0])

    async def take_over(self, owner: str, until: float, now: float) -> list[Execution]:
        # One server process per file: a run another instance held was a dead
        # predecessor's, so it is taken whether or not its lease lapsed.
        with self._write() as db:
            rows = db.execute(
                "UPDATE executions SET owner = ?, generation = generation + 1, lease_until = ? "
                "WHERE status IN ('running', 'paused') "
                "AND (owner IS NOT ? OR lease_until IS NULL OR lease_until < ?) "
                f"RETURNING {EXECUTION_COLUMNS}",
                (owner, until, owner, now),
            ).fetchall()
        return [_execution(row) for row in rows]

    async def renew(self, held: Sequence[tuple[str, int]], until: float) -> set[str]:
        with self._write() as db:
            return {
                execution_id
                for execution_id, generation in held
                if db.execute(
                    "UPDATE executions SET lease_until = ? WHERE id = ? AND generation = ?",
                    (until, execution_id, generation),
                ).rowcount
            }

    # executions

    async def insert_execution(self, execution: Execution, chat_id: str | None) -> bool:
        e = execution
        values = (
            e.id, e.session, e.status, e.request_json, e.error, e.created_at, e.updated_at,
            e.owner, e.generation, e.lease_until, chat_id,
        )  # fmt: skip
        with self._write() as db:
            inserted = db.execute(
                f"INSERT INTO executions ({EXECUTION_COLUMNS}, chat_id) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (session, chat_id) WHERE status IN ('running', 'paused') DO NOTHING",
                values,
            ).rowcount
        return bool(inserted)

    async def get_execution(self, execution_id: str) -> Execution | None:
        row = self._db.execute(
            f"SELECT {EXECUTION_COLUMNS} FROM executions WHERE id = ?", (execution_id,)
        ).fetchone()
        return None if row is None else _execution(row)

    async def executions(
        self, statuses: Collection[ExecutionStatus] | None, session: str | None
    ) -> list[Execution]:
        clause, params = where(
            None if statuses is None else (f"status IN ({_marks(statuses)})", list(statuses)),
            None if session is None else ("session = ?", [session]),
        )
        rows = self._db.execute(
            f"SELECT {EXECUTION_COLUMNS} FROM executions {clause} ORDER BY created_at, id",
            params,
        ).fetchall()
        return [_execution(row) for row in rows]

    async def locked_execution(self, tx: sqlite3.Connection, execution_id: str) -> Execution | None:
        # BEGIN IMMEDIATE holds the write lock already.
        row = tx.execute(
            f"SELECT {EXECUTION_COLUMNS} FROM executions WHERE id = ?", (execution_id,)
        ).fetchone()
        return None if row is None else _execution(row)

    async def set_status(
        self, tx: sqlite3.Connection, execution_id: str, status: ExecutionStatus,
        error: str | None, now: float, held: int | None, froms: Sequence[ExecutionStatus],
        settle: tuple[StepState, str] | None,
    ) -> bool:  # fmt: skip
        changed = tx.execute(
            "UPDATE executions SET status = ?, error = ?, updated_at = ? WHERE id = ? "
            f"AND generation = COALESCE(?, generation) AND status IN ({_marks(froms)})",
            (status, error, now, execution_id, held, *froms),
        ).rowcount
        if changed and settle is not None:
            tx.execute(
                "UPDATE steps SET state = ?, error_json = ?, updated_at = ? "
                "WHERE execution_id = ? AND state = 'pending'",
                (*settle, now, execution_id),
            )
        return changed == 1

    async def idle_executions(self, tx: sqlite3.Connection, cutoff: float) -> list[str]:
        rows = tx.execute(
            f"SELECT id FROM executions AS e WHERE {_IDLE} ORDER BY created_at, id",
            (cutoff,) * 4,
        ).fetchall()
        return [str(row[0]) for row in rows]

    async def prune_finished(self, cutoff: float) -> int:
        finished = ", ".join(f"'{status}'" for status in sorted(FINISHED_STATUSES))
        with self._write() as db:
            # The steps go with their execution (ON DELETE CASCADE).
            return int(
                db.execute(
                    f"DELETE FROM executions AS e WHERE status IN ({finished}) "
                    f"AND created_at < ? AND {_QUIET}",
                    (cutoff,) * 4,
                ).rowcount
            )

    # steps

    async def insert_step(self, step: Step, held: int | None) -> bool:
        s = step  # its fields, in STEP_COLUMNS' order (astuple would deep-copy them, slowly)
        values = (
            s.execution_id, s.seq, s.kind, s.name, s.input_json, s.resolution, s.state,
            s.result_json, s.error_json, s.request_id, s.attempts, s.created_at, s.updated_at,
            s.spec_json, s.target_connection, s.target_client_id, s.execution_id, held,
        )  # fmt: skip
        with self._write() as db:
            inserted = db.execute(_INSERT_STEP, values).rowcount
        return bool(inserted)

    async def get_step(self, execution_id: str, seq: int) -> Step | None:
        row = self._db.execute(
            f"SELECT {STEP_COLUMNS} FROM steps WHERE execution_id = ? AND seq = ?",
            (execution_id, seq),
        ).fetchone()
        return None if row is None else _step(row)

    async def step_by_request_id(self, request_id: str) -> Step | None:
        row = self._db.execute(
            f"SELECT {STEP_COLUMNS} FROM steps WHERE request_id = ? ORDER BY created_at LIMIT 1",
            (request_id,),
        ).fetchone()
        return None if row is None else _step(row)

    async def steps(self, execution_id: str) -> list[Step]:
        rows = self._db.execute(
            f"SELECT {STEP_COLUMNS} FROM steps WHERE execution_id = ? ORDER BY seq", (execution_id,)
        ).fetchall()
        return [_step(row) for row in rows]

    async def pending_steps(self, session: str | None, resolution: Resolution | None) -> list[Step]:
        clause, params = where(
            ("s.state = 'pending' AND e.status IN ('running', 'paused')", []),
            None if session is None else ("e.session = ?", [session]),
            None if resolution is None else ("s.resolution = ?", [resolution]),
        )
        rows = self._db.execute(
            f"SELECT {_STEP_OF_RUN} FROM steps AS s JOIN executions AS e ON e.id = s.execution_id "
            f"{clause} ORDER BY s.created_at, s.execution_id, s.seq",
            params,
        ).fetchall()
        return [_step(row) for row in rows]

    async def settle(
        self, execution_id: str, seq: int, field: Literal["result", "error"], state: StepState,
        value_json: str, now: float, held: int | None,
    ) -> Step | None:  # fmt: skip
        with self._write() as db:
            rows = db.execute(
                _SETTLE_SQL[field], (state, value_json, now, execution_id, seq, execution_id, held)
            ).fetchall()
        return _step(rows[0]) if rows else None

    async def add_attempt(
        self, execution_id: str, seq: int, now: float, target: tuple[str | None, str | None],
        held: int | None,
    ) -> int | None:  # fmt: skip
        with self._write() as db:
            row = db.execute(
                "UPDATE steps SET attempts = attempts + 1, "
                "updated_at = CASE WHEN state = 'pending' THEN ? ELSE updated_at END, "
                "target_connection = ?, target_client_id = ? "
                f"WHERE execution_id = ? AND seq = ? AND {_FENCE} RETURNING attempts",
                (now, *target, execution_id, seq, execution_id, held),
            ).fetchone()
        return None if row is None else int(row[0])

    async def record_spec(
        self, execution_id: str, seq: int, spec_json: str, held: int | None
    ) -> Step | None:
        with self._write() as db:
            db.execute(
                "UPDATE steps SET spec_json = ? "
                f"WHERE execution_id = ? AND seq = ? AND spec_json IS NULL AND {_FENCE}",
                (spec_json, execution_id, seq, execution_id, held),
            )
        return await self.get_step(execution_id, seq)

    async def mark_approval(self, execution_id: str, seq: int, tool_call_id: str) -> None:
        with self._write() as db:
            db.execute(
                "UPDATE steps SET tool_call_id = ? WHERE execution_id = ? AND seq = ? "
                "AND resolution = 'approval'",
                (tool_call_id, execution_id, seq),
            )

    async def approval_step(
        self, session: str, tool_call_id: str
    ) -> tuple[Step, str | None] | None:
        row = self._db.execute(
            f"SELECT {_STEP_OF_RUN}, e.owner FROM steps AS s "
            "JOIN executions AS e ON e.id = s.execution_id "
            "WHERE s.state = 'pending' AND s.resolution = 'approval' AND s.tool_call_id = ? "
            "AND e.session = ? AND e.status IN ('running', 'paused') LIMIT 1",
            (tool_call_id, session),
        ).fetchone()
        if row is None:
            return None
        *step, owner = row
        return _step(step), None if owner is None else str(owner)

    async def delivered_to(
        self, connection_ids: Collection[str]
    ) -> list[tuple[str, str, str | None]]:
        rows = self._db.execute(
            "SELECT s.request_id, s.target_connection, e.owner FROM steps AS s "
            "JOIN executions AS e ON e.id = s.execution_id "
            "WHERE s.state = 'pending' AND s.resolution = 'client' "
            f"AND s.target_connection IN ({_marks(connection_ids)}) "
            "AND e.status IN ('running', 'paused')",
            list(connection_ids),
        ).fetchall()
        return [
            (str(r), str(c), None if o is None else str(o)) for r, c, o in rows if r is not None
        ]


class SqliteLedger(LedgerCore[sqlite3.Connection]):
    """The ledger in one SQLite file (or ``":memory:"``): the rules over the SQLite store.

    Every write commits before returning (inside :meth:`batch`: when the batch
    ends), so a process killed right after a call loses nothing that call
    acknowledged.
    """

    def __init__(self, path: str | os.PathLike[str], *, lease: float = DEFAULT_LEASE) -> None:
        leases = Leases(lease)  # checked before the file is opened
        super().__init__(SqliteStore(path), leases)
