"""The ledger (rule S8) in PostgreSQL, shared by every server process that points at it.

:class:`PostgresLedger` is the ledger's rules (``core.py``, the same class as
SQLite's) over the PostgreSQL store here: each logical step is one committed
transaction (or a part of one :meth:`~PostgresLedger.batch`), and most are
one statement, so one round trip: the fence and the write together. The
connections, batches and what happens while the database is away are
``postgres_pool.py``'s. The routing between processes
(LISTEN/NOTIFY, ``cluster.py``) listens on a connection of its own outside
the pool; :meth:`~PostgresLedger.notify` goes through the pool. The shared
chunk log of a chat's response (``shared_stream.py``) has its statements here
too (:meth:`~PostgresLedger.append_chunks`, ...).

The schema is created, or migrated, when the ledger opens (``schema.py``).
What is shared about sessions (processes, registrations, owners, their tools,
chats) is ``postgres_sessions.py``'s. Text values the ledger does not parse
(session, name, request id, error) may hold characters PostgreSQL's ``text``
cannot (NUL); they are stored escaped and read back as given (``postgres_text.py``).

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

from collections.abc import Collection, Sequence
from typing import Any, Literal

from ..cluster.bus import encode
from .core import FORGET_DEAD_AFTER_LEASES, LedgerCore
from .postgres_pool import AWAY_TIMEOUT, DEFAULT_MAX_SIZE, DEFAULT_TIMEOUT, Transaction
from .postgres_sessions import PostgresSessions
from .postgres_text import escape, maybe_escape, maybe_unescape, unescape
from .records import (
    DEFAULT_LEASE,
    FINISHED_STATUSES,
    Execution,
    ExecutionStatus,
    Resolution,
    Step,
    StepState,
)
from .rules import Leases
from .schema import (
    EXECUTION_COLUMNS,
    SCHEMA_VERSION,
    STEP_COLUMNS,
    fence,
    quiet_since,
    waiting_quiet_since,
    where,
)

__all__ = [
    "AWAY_TIMEOUT",
    "DEFAULT_MAX_SIZE",
    "DEFAULT_TIMEOUT",
    "FORGET_DEAD_AFTER_LEASES",
    "SCHEMA_VERSION",
    "PostgresLedger",
    "PostgresStore",
    "escape",
]

_FENCE = fence("postgres")
_STEP_OF_RUN = ", ".join(f"s.{column.strip()}" for column in STEP_COLUMNS.split(","))
_QUIET = quiet_since("postgres")
_IDLE = waiting_quiet_since("postgres")
# Each write below is one statement, so one round trip and atomic by itself. A step
# recorded or settled is its run's progress by its own timestamps (quiet_since): the
# run's row is not written. An unknown execution inserts nothing, rather than raising
# an error that would abort a batch's transaction.
_RECORD_STEP = (
    f"INSERT INTO steps ({STEP_COLUMNS}) "
    "SELECT %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s "
    f"WHERE {_FENCE} "
    "ON CONFLICT (execution_id, seq) DO NOTHING RETURNING 1"
)
_SETTLE_SQL = {
    field: (
        f"UPDATE steps SET state = %s, {field}_json = %s, updated_at = %s "
        f"WHERE execution_id = %s AND seq = %s AND state = 'pending' AND {_FENCE} "
        f"RETURNING {STEP_COLUMNS}"
    )
    for field in ("result", "error")
}
# The shared chunk log of a chat's response (shared_stream.py).
_APPEND_CHUNKS = (
    "WITH ins AS (INSERT INTO chunks (execution_id, seq, chunk_json) "
    "SELECT %s, r.seq, r.chunk FROM unnest(%s::bigint[], %s::text[]) AS r (seq, chunk) "
    f"WHERE {_FENCE} ON CONFLICT (execution_id, seq) DO NOTHING RETURNING 1), "
    "told AS (SELECT pg_notify(c, %s) FROM unnest(%s::text[]) AS c "
    "WHERE EXISTS (SELECT 1 FROM ins)) "
    "SELECT (SELECT count(*) FROM ins), (SELECT count(*) FROM told)"
)
_READ_CHUNKS = (
    "SELECT e.status, e.owner, e.updated_at, c.seq, c.chunk_json FROM executions AS e "
    "LEFT JOIN chunks AS c ON c.execution_id = e.id AND c.seq > %s "
    "WHERE e.id = %s ORDER BY c.seq"
)
_LATEST_OF_CHAT = (
    "SELECT id, status, owner, updated_at FROM executions "
    "WHERE session = %s AND chat_id = %s ORDER BY created_at DESC, id DESC LIMIT 1"
)
_PRUNE_CHUNKS = (
    "WITH gone AS (DELETE FROM chunks AS c USING executions AS e WHERE c.execution_id = e.id "
    "AND e.status = ANY(%s) AND e.created_at < %s AND e.updated_at < %s RETURNING 1) "
    "SELECT count(*) FROM gone"
)

# Where an execution stands, for the chunk log: (status, owner, updated_at).
ChunkHead = tuple[str, str | None, float]
# One row of the chunk log: (seq, a batch of chunks as JSON, or None for the end;
# cluster/shared_streams.py packs and unpacks them).
ChunkRow = tuple[int, str | None]


async def _still(
    tx: Transaction, condition: str, rows: list[tuple[Any, ...]], params: Sequence[object]
) -> list[tuple[Any, ...]]:
    """The runs of ``rows`` (locked) that still meet ``condition``, read again.

    A ``SELECT ... FOR UPDATE`` judges a row by its statement's snapshot and checks
    it again only if the row itself changed; a step's write does not change its
    run's row (quiet_since), it only locks it. So a step that committed between the
    snapshot and the lock is seen only by a statement of its own, which this is:
    every write for these runs either committed before it or waits for our lock.
    """
    return await tx.fetchall(
        f"SELECT id FROM executions AS e WHERE id = ANY(%s) AND {condition} "
        "ORDER BY created_at, id",
        ([row[0] for row in rows], *params),
    )


def _execution(row: Sequence[Any]) -> Execution:
    (id_, session, status, request_json, error, created_at, updated_at, owner, generation,
     lease_until) = row  # fmt: skip
    return Execution(
        id_, unescape(session), status, request_json, maybe_unescape(error), created_at,
        updated_at, owner, int(generation), lease_until,
    )  # fmt: skip


def _step(row: Sequence[Any]) -> Step:
    (execution_id, seq, kind, name, input_json, resolution, state, result_json, error_json,
     request_id, attempts, created_at, updated_at, spec_json, target_connection,
     target_client_id) = row  # fmt: skip
    return Step(
        execution_id, seq, kind, unescape(name), input_json, resolution, state, result_json,
        error_json, maybe_unescape(request_id), attempts, created_at, updated_at, spec_json,
        target_connection, maybe_unescape(target_client_id),
    )  # fmt: skip


class PostgresStore(PostgresSessions):
    """The PostgreSQL dialect of every ledger operation, on the pool of :class:`Connections`."""

    # leases

    async def generation(self, execution_id: str) -> int | None:
        rows = await self.read(
            "SELECT generation FROM executions WHERE id = %s", (escape(execution_id),)
        )
        return int(rows[0][0]) if rows else None

    async def take_over(self, owner: str, until: float, now: float) -> list[Execution]:
        # SKIP LOCKED: a run another process is taking over (or writing) right now
        # is not lapsed for us; the next round sees how it ended.
        rows = await self.write_one(
            "UPDATE executions SET owner = %s, generation = generation + 1, lease_until = %s "
            "WHERE id IN (SELECT id FROM executions WHERE status IN ('running', 'paused') "
            "AND (lease_until IS NULL OR lease_until < %s) FOR UPDATE SKIP LOCKED) "
            f"RETURNING {EXECUTION_COLUMNS}",
            (owner, until, now),
        )
        return [_execution(row) for row in rows]

    async def renew(self, held: Sequence[tuple[str, int]], until: float) -> set[str]:
        rows = await self.write_one(
            "UPDATE executions AS e SET lease_until = %s "
            "FROM unnest(%s::text[], %s::bigint[]) AS h (id, generation) "
            "WHERE e.id = h.id AND e.generation = h.generation RETURNING e.id",
            (until, [escape(i) for i, _ in held], [g for _, g in held]),
        )
        return {unescape(str(row[0])) for row in rows}

    # executions

    async def insert_execution(self, execution: Execution, chat_id: str | None) -> bool:
        e = execution
        rows = await self.write_one(
            f"INSERT INTO executions ({EXECUTION_COLUMNS}, chat_id) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) "
            "ON CONFLICT (session, chat_id) WHERE status IN ('running', 'paused') DO NOTHING "
            "RETURNING id",
            (
                e.id, escape(e.session), e.status, e.request_json, maybe_escape(e.error),
                e.created_at, e.updated_at, e.owner, e.generation, e.lease_until,
                maybe_escape(chat_id),
            ),
        )  # fmt: skip
        return bool(rows)

    async def get_execution(self, execution_id: str) -> Execution | None:
        rows = await self.read(
            f"SELECT {EXECUTION_COLUMNS} FROM executions WHERE id = %s", (escape(execution_id),)
        )
        return _execution(rows[0]) if rows else None

    async def executions(
        self, statuses: Collection[ExecutionStatus] | None, session: str | None
    ) -> list[Execution]:
        clause, params = where(
            None if statuses is None else ("status = ANY(%s)", [list(statuses)]),
            None if session is None else ("session = %s", [escape(session)]),
        )
        rows = await self.read(
            f"SELECT {EXECUTION_COLUMNS} FROM executions {clause} ORDER BY created_at, id",
            params,
        )
        return [_execution(row) for row in rows]

    async def locked_execution(self, tx: Transaction, execution_id: str) -> Execution | None:
        # FOR UPDATE: another process's status change waits for ours.
        row = await tx.fetchone(
            f"SELECT {EXECUTION_COLUMNS} FROM executions WHERE id = %s FOR UPDATE",
            (escape(execution_id),),
        )
        return None if row is None else _execution(row)

    async def set_status(
        self, tx: Transaction, execution_id: str, status: ExecutionStatus, error: str | None,
        now: float, held: int | None, froms: Sequence[ExecutionStatus],
        settle: tuple[StepState, str] | None,
    ) -> bool:  # fmt: skip
        # The UPDATE takes the row's lock: another process's status change waits for ours,
        # and one that committed first is what its WHERE sees. The settling is a statement
        # of its own (deferred: no round trip), so that its snapshot is taken after that
        # wait and sees every step committed before it.
        changed = await tx.execute(
            "UPDATE executions SET status = %s, error = %s, updated_at = %s WHERE id = %s "
            "AND generation = COALESCE(%s::bigint, generation) AND status = ANY(%s)",
            (status, maybe_escape(error), now, escape(execution_id), held, list(froms)),
        )
        if changed == 1 and settle is not None:
            await tx.defer(
                "UPDATE steps SET state = %s, error_json = %s, updated_at = %s "
                "WHERE execution_id = %s AND state = 'pending'",
                (*settle, now, escape(execution_id)),
            )
        return changed == 1

    async def idle_executions(self, tx: Transaction, cutoff: float) -> list[str]:
        # SKIP LOCKED: a run another process is changing right now is not idle.
        rows = await tx.fetchall(
            f"SELECT id FROM executions AS e WHERE {_IDLE} "
            "ORDER BY created_at, id FOR UPDATE SKIP LOCKED",
            (cutoff,) * 4,
        )
        if rows:
            rows = await _still(tx, _IDLE, rows, (cutoff,) * 4)
        return [unescape(str(row[0])) for row in rows]

    async def prune_finished(self, cutoff: float) -> int:
        # No foreign key deletes a run's steps and chunks (schema.py, migration 12):
        # the runs are locked first, so a write that fenced one before commits before
        # the deletes below (each statement sees it) and one after finds no run. A run
        # locked by another transaction right now is left to the next prune.
        finished = f"status = ANY(%s) AND created_at < %s AND {_QUIET}"
        params = (sorted(FINISHED_STATUSES), *(cutoff,) * 4)
        async with self.write() as tx:
            rows = await tx.fetchall(
                f"SELECT id FROM executions AS e WHERE {finished} FOR UPDATE SKIP LOCKED", params
            )
            if rows:
                rows = await _still(tx, finished, rows, params)
            if not rows:
                return 0
            ids = [row[0] for row in rows]
            for table in ("steps", "chunks"):
                await tx.execute(f"DELETE FROM {table} WHERE execution_id = ANY(%s)", (ids,))
            return await tx.execute("DELETE FROM executions WHERE id = ANY(%s)", (ids,))

    # steps

    async def insert_step(self, step: Step, held: int | None) -> bool:
        s = step
        inserted = await self.write_one(
            _RECORD_STEP,
            (
                escape(s.execution_id), s.seq, s.kind, escape(s.name), s.input_json,
                s.resolution, s.state, s.result_json, s.error_json, maybe_escape(s.request_id),
                s.attempts, s.created_at, s.updated_at, s.spec_json,
                s.target_connection, maybe_escape(s.target_client_id),
                escape(s.execution_id), held,
            ),
        )  # fmt: skip
        return bool(inserted)

    async def get_step(self, execution_id: str, seq: int) -> Step | None:
        rows = await self.read(
            f"SELECT {STEP_COLUMNS} FROM steps WHERE execution_id = %s AND seq = %s",
            (escape(execution_id), seq),
        )
        return _step(rows[0]) if rows else None

    async def step_by_request_id(self, request_id: str) -> Step | None:
        rows = await self.read(
            f"SELECT {STEP_COLUMNS} FROM steps WHERE request_id = %s ORDER BY created_at LIMIT 1",
            (escape(request_id),),
        )
        return _step(rows[0]) if rows else None

    async def steps(self, execution_id: str) -> list[Step]:
        rows = await self.read(
            f"SELECT {STEP_COLUMNS} FROM steps WHERE execution_id = %s ORDER BY seq",
            (escape(execution_id),),
        )
        return [_step(row) for row in rows]

    async def pending_steps(self, session: str | None, resolution: Resolution | None) -> list[Step]:
        clause, params = where(
            ("s.state = 'pending' AND e.status IN ('running', 'paused')", []),
            None if session is None else ("e.session = %s", [escape(session)]),
            None if resolution is None else ("s.resolution = %s", [resolution]),
        )
        rows = await self.read(
            f"SELECT {_STEP_OF_RUN} FROM steps AS s JOIN executions AS e ON e.id = s.execution_id "
            f"{clause} ORDER BY s.created_at, s.execution_id, s.seq",
            params,
        )
        return [_step(row) for row in rows]

    async def settle(
        self, execution_id: str, seq: int, field: Literal["result", "error"], state: StepState,
        value_json: str, now: float, held: int | None,
    ) -> Step | None:  # fmt: skip
        key = escape(execution_id)
        rows = await self.write_one(
            _SETTLE_SQL[field], (state, value_json, now, key, seq, key, held)
        )
        return _step(rows[0]) if rows else None

    async def add_attempt(
        self, execution_id: str, seq: int, now: float, target: tuple[str | None, str | None],
        held: int | None,
    ) -> int | None:  # fmt: skip
        connection, client_id = target
        key = escape(execution_id)
        rows = await self.write_one(
            "UPDATE steps SET attempts = attempts + 1, "
            "updated_at = CASE WHEN state = 'pending' THEN %s ELSE updated_at END, "
            "target_connection = %s, target_client_id = %s "
            f"WHERE execution_id = %s AND seq = %s AND {_FENCE} RETURNING attempts",
            (now, connection, maybe_escape(client_id), key, seq, key, held),
        )
        return int(rows[0][0]) if rows else None

    async def record_spec(
        self, execution_id: str, seq: int, spec_json: str, held: int | None
    ) -> Step | None:
        key = escape(execution_id)
        # The step as it stands after the update: the updated row, or else the one
        # that already had a spec (the statement's snapshot predates its update).
        rows = await self.write_one(
            f"WITH updated AS (UPDATE steps SET spec_json = %s "
            f"WHERE execution_id = %s AND seq = %s AND spec_json IS NULL AND {_FENCE} "
            f"RETURNING {STEP_COLUMNS}) "
            "SELECT * FROM updated UNION ALL "
            f"SELECT {STEP_COLUMNS} FROM steps WHERE execution_id = %s AND seq = %s "
            "AND NOT EXISTS (SELECT 1 FROM updated)",
            (spec_json, key, seq, key, held, key, seq),
        )
        return _step(rows[0]) if rows else None

    async def mark_approval(self, execution_id: str, seq: int, tool_call_id: str) -> None:
        await self.write_one(
            "UPDATE steps SET tool_call_id = %s WHERE execution_id = %s AND seq = %s "
            "AND resolution = 'approval' RETURNING 1",
            (escape(tool_call_id), escape(execution_id), seq),
        )

    async def approval_step(
        self, session: str, tool_call_id: str
    ) -> tuple[Step, str | None] | None:
        rows = await self.read(
            f"SELECT {_STEP_OF_RUN}, e.owner FROM steps AS s "
            "JOIN executions AS e ON e.id = s.execution_id "
            "WHERE s.state = 'pending' AND s.resolution = 'approval' AND s.tool_call_id = %s "
            "AND e.session = %s AND e.status IN ('running', 'paused') LIMIT 1",
            (escape(tool_call_id), escape(session)),
        )
        if not rows:
            return None
        *step, owner = rows[0]
        return _step(step), None if owner is None else str(owner)

    async def delivered_to(
        self, connection_ids: Collection[str]
    ) -> list[tuple[str, str, str | None]]:
        rows = await self.read(
            "SELECT s.request_id, s.target_connection, e.owner FROM steps AS s "
            "JOIN executions AS e ON e.id = s.execution_id "
            "WHERE s.state = 'pending' AND s.resolution = 'client' "
            "AND s.target_connection = ANY(%s) AND e.status IN ('running', 'paused')",
            (list(connection_ids),),
        )
        return [
            (unescape(str(r)), str(c), None if o is None else str(o))
            for r, c, o in rows
            if r is not None
        ]


class PostgresLedger(LedgerCore[Transaction]):
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
        leases = Leases(lease)
        self._pg = PostgresStore(conninfo, timeout=timeout, max_size=max_size, lease=lease)
        super().__init__(self._pg, leases)

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
        await ledger._pg.open()
        return ledger

    @property
    def conninfo(self) -> str:
        return self._pg.conninfo

    def channel(self, process_id: str | None) -> str:
        """The LISTEN channel of one process (None: of every process) in this schema."""
        return self._pg.channel(process_id)

    async def check_connections(self) -> None:
        """Replace the pooled connections a restart of the database closed."""
        await self._pg.check_connections()

    async def statement(self, sql: str, params: Sequence[object]) -> list[tuple[Any, ...]]:
        """Run one statement that is a whole read or write by itself; its rows."""
        return await self._pg.write_one(sql, params)

    # the shared chunk log of a chat's response (shared_stream.py)

    async def append_chunks(
        self, execution_id: str, rows: Sequence[ChunkRow], kind: str, notify: Sequence[str]
    ) -> int:
        """Write rows (those already there are skipped), fenced, and tell processes ``notify``.

        The notification (``kind``, the execution id) goes in the same statement,
        only if a row was new. Returns how many were; LeaseLost if another process
        took the run over.
        """
        held = self._held(execution_id)
        payload = encode(self.owner, kind, (execution_id,))
        key = escape(execution_id)
        [(inserted, _)] = await self._pg.write_one(
            _APPEND_CHUNKS,
            (
                key, [seq for seq, _ in rows], [text for _, text in rows], key, held, payload,
                [self.channel(p) for p in notify],
            ),
        )  # fmt: skip
        if not inserted:
            await self._check_lease(execution_id, held)  # raises if the fence refused them
        return int(inserted)

    async def read_chunks(
        self, execution_id: str, after: int
    ) -> tuple[ChunkHead | None, list[ChunkRow]]:
        """Where the execution stands and its rows of seq > ``after`` (None: no execution)."""
        found = await self._pg.read(_READ_CHUNKS, (after, escape(execution_id)))
        if not found:
            return None, []
        status, owner, updated_at = found[0][:3]
        head = (str(status), None if owner is None else str(owner), float(updated_at))
        return head, [(int(seq), text) for *_, seq, text in found if seq is not None]

    async def latest_of_chat(self, session: str, chat_id: str) -> tuple[str, ChunkHead] | None:
        """The newest execution of a session's chat: its id and where it stands."""
        found = await self._pg.read(_LATEST_OF_CHAT, (escape(session), escape(chat_id)))
        if not found:
            return None
        execution_id, status, owner, updated_at = found[0]
        head = (str(status), None if owner is None else str(owner), float(updated_at))
        return str(execution_id), head

    async def prune_chunks(self, cutoff: float) -> int:
        """Delete the chunks of responses that finished before ``cutoff``."""
        [(deleted,)] = await self._pg.write_one(
            _PRUNE_CHUNKS, (sorted(FINISHED_STATUSES), cutoff, cutoff)
        )
        return int(deleted)
