"""The ledger's tables, one schema and one numbering of its migrations for both dialects.

``MIGRATIONS[n]`` takes the schema from version n to n + 1, on SQLite and on
PostgreSQL alike; :func:`render` writes a statement for one dialect (column
types, and the few statements only one dialect has). A store opens by asking
:func:`to_apply` what its database still lacks. Example::

    for statement in to_apply("sqlite", applied(found_version, "sqlite")):
        connection.execute(statement)
    # ... then record SCHEMA_VERSION as the database's version

SQLite files written before the two numberings were one (``PRAGMA
user_version`` 4 and 5) had the session owners and the chats before routing
and a chat's execution: :data:`_SQLITE_BEFORE_UNIFIED` says which migrations
those versions hold, so a file at 5 gains 4, 5 and 8. A database at this
code's version or newer is never one of them: the code migrates straight to
the newest version in one transaction.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Literal

Dialect = Literal["sqlite", "postgres"]

SCHEMA_VERSION = 13

# Per dialect: ids and sessions sort by byte (COLLATE "C" on PostgreSQL; SQLite's
# default BINARY collation is that already), whatever the database's locale.
_TYPES: dict[Dialect, dict[str, str]] = {
    "sqlite": {"text": "TEXT", "real": "REAL"},
    "postgres": {"text": 'TEXT COLLATE "C"', "real": "DOUBLE PRECISION"},
}

_PLACEHOLDER: dict[Dialect, str] = {"sqlite": "?", "postgres": "%s"}

# A statement for both dialects, or {dialect: statement} for one that differs
# (None: nothing to do on that dialect).
Statement = str | dict[Dialect, str | None]

MIGRATIONS: tuple[tuple[Statement, ...], ...] = (
    # 1: the runs and their steps.
    (
        """
        CREATE TABLE executions (
            id           {text} PRIMARY KEY,
            session      {text} NOT NULL,
            status       TEXT NOT NULL
                         CHECK (status IN ('running', 'paused', 'completed', 'error', 'expired')),
            request_json TEXT NOT NULL,
            error        TEXT,
            created_at   {real} NOT NULL,
            updated_at   {real} NOT NULL
        )
        """,
        "CREATE INDEX executions_by_status ON executions (status, updated_at)",
        "CREATE INDEX executions_by_session ON executions (session, status)",
        """
        CREATE TABLE steps (
            execution_id {text} NOT NULL REFERENCES executions (id) ON DELETE CASCADE,
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
            created_at   {real} NOT NULL,
            updated_at   {real} NOT NULL,
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
        "ALTER TABLE executions ADD COLUMN owner {text}",
        "ALTER TABLE executions ADD COLUMN generation BIGINT NOT NULL DEFAULT 0",
        "ALTER TABLE executions ADD COLUMN lease_until {real}",
    ),
    # 4: routing between processes: who is alive, which connection registered which
    # tools where (S2 across processes), where each call's last invoke went (S5).
    # (SQLite has one process: it keeps its registrations in memory; the tables are
    # there so that both schemas are one.)
    (
        "CREATE TABLE processes (id {text} PRIMARY KEY, alive_until {real} NOT NULL)",
        {"postgres": "CREATE SEQUENCE registration_order", "sqlite": None},
        """
        CREATE TABLE registrations (
            connection_id {text} PRIMARY KEY,
            session       {text} NOT NULL,
            process_id    {text} NOT NULL,
            registration  BIGINT NOT NULL {registration_default},
            client_id     {text},
            tools_json    TEXT NOT NULL
        )
        """,
        "CREATE INDEX registrations_by_session ON registrations (session, registration)",
        "CREATE INDEX registrations_by_process ON registrations (process_id)",
        "ALTER TABLE steps ADD COLUMN target_connection {text}",
        "ALTER TABLE steps ADD COLUMN target_client_id {text}",
        # An approval's tool call id: a chat on any process answers it by that id.
        "ALTER TABLE steps ADD COLUMN tool_call_id {text}",
    ),
    # 5: a chat's response across processes (shared_stream.py): the chat an execution
    # answers, at most one unfinished execution per chat, and the chunks streamed so far.
    (
        "ALTER TABLE executions ADD COLUMN chat_id {text}",
        "CREATE UNIQUE INDEX executions_streaming ON executions (session, chat_id) "
        "WHERE status IN ('running', 'paused')",
        "CREATE INDEX executions_by_chat ON executions (session, chat_id, created_at)",
        """
        CREATE TABLE chunks (
            execution_id {text} NOT NULL REFERENCES executions (id) ON DELETE CASCADE,
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
            session    {text} PRIMARY KEY,
            principal  {text} NOT NULL,
            created_at {real} NOT NULL
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
            id            {text} PRIMARY KEY,
            session       {text} NOT NULL,
            version       BIGINT NOT NULL,
            message_count INTEGER NOT NULL,
            streaming     {text},
            updated_at    {real} NOT NULL
        )
        """,
        "CREATE INDEX chats_by_age ON chats (updated_at, id)",
        "CREATE INDEX chats_by_session ON chats (session, updated_at, id)",
        """
        CREATE TABLE chat_messages (
            chat_id      {text} NOT NULL REFERENCES chats (id) ON DELETE CASCADE,
            position     INTEGER NOT NULL CHECK (position >= 0),
            message_json TEXT NOT NULL,
            PRIMARY KEY (chat_id, position)
        )
        """,
    ),
    # 8: both dialects on one numbering; the lookups of the routing by index: the
    # pending calls last invoked on a connection, an approval by its tool call id.
    (
        "CREATE INDEX steps_by_target ON steps (target_connection) "
        "WHERE state = 'pending' AND target_connection IS NOT NULL",
        "CREATE INDEX steps_by_tool_call_id ON steps (tool_call_id) "
        "WHERE state = 'pending' AND tool_call_id IS NOT NULL",
    ),
    # 9: which processes have a connection subscribed to which chat (H3 across
    # processes): a stored change is told to those, not to every process. (SQLite
    # has one process: it needs no row.)
    (
        """
        CREATE TABLE chat_subscribers (
            chat_id    {text} NOT NULL,
            process_id {text} NOT NULL,
            PRIMARY KEY (chat_id, process_id)
        )
        """,
        "CREATE INDEX chat_subscribers_by_process ON chat_subscribers (process_id)",
    ),
    # 10: the tools each session's pages registered (S2), kept past a restart: a run
    # resumed before any page of its session is back still offers the model its tools.
    (
        """
        CREATE TABLE session_tools (
            session    {text} NOT NULL,
            name       {text} NOT NULL,
            spec_json  TEXT NOT NULL,
            updated_at {real} NOT NULL,
            PRIMARY KEY (session, name)
        )
        """,
        "CREATE INDEX session_tools_by_age ON session_tools (updated_at)",
    ),
    # 11: the runs by status and creation, not by last change. A run's updated_at
    # changes with every step recorded or settled; now no index holds it, so
    # PostgreSQL writes those changes in place (a HOT update: no index entry, half
    # the WAL of a step's insert), given room on the row's page (the fillfactor).
    # A query for runs older than a cutoff asks created_at < cutoff besides
    # updated_at < cutoff: every run changed before the cutoff was created before it.
    # (Steps no longer write their run's row: a run's progress is quiet_since's.)
    (
        "DROP INDEX executions_by_status",
        "CREATE INDEX executions_by_status ON executions (status, created_at)",
        {"sqlite": None, "postgres": "ALTER TABLE executions SET (fillfactor = 70)"},
    ),
    # 12: on PostgreSQL, no foreign key from a step or a chunk to its run. Every insert
    # into either carries the fence, which finds the run and holds its row lock to the
    # end of the transaction, so the key's own check (a query and a lock of that row
    # for each row inserted: a chat's twenty-odd) only cost CPU. The cascade it gave is
    # the prune's own statements (PostgresStore.prune_finished). SQLite keeps both: it
    # writes one transaction at a time and deletes through the cascade.
    (
        {
            "sqlite": None,
            "postgres": "ALTER TABLE steps DROP CONSTRAINT IF EXISTS steps_execution_id_fkey",
        },
        {
            "sqlite": None,
            "postgres": "ALTER TABLE chunks DROP CONSTRAINT IF EXISTS chunks_execution_id_fkey",
        },
    ),
    # 13: a write of a response's chunks is one row (cluster/shared_streams.py, pack):
    # each row has the seq of its last chunk and {"from": first seq, "chunks": [...]}.
    # The rows of before, one chunk each, become such rows of one chunk.
    (
        "UPDATE chunks SET chunk_json = "
        "'{{\"from\":' || seq || ',\"chunks\":[' || chunk_json || ']}}' "
        "WHERE chunk_json IS NOT NULL",
    ),
)
assert len(MIGRATIONS) == SCHEMA_VERSION

_EVERY = frozenset(range(1, SCHEMA_VERSION + 1))

# What the SQLite versions of before the one numbering hold (the versions they share
# with it, 1 to 3, hold what they say).
_SQLITE_BEFORE_UNIFIED: dict[int, frozenset[int]] = {
    4: frozenset({1, 2, 3, 6}),
    5: frozenset({1, 2, 3, 6, 7}),
}


def applied(version: int, dialect: Dialect) -> frozenset[int]:
    """The migrations a database at ``version`` holds; RuntimeError past this code's."""
    if not 0 <= version <= SCHEMA_VERSION:
        raise RuntimeError(
            f"ledger schema version {version} is not supported "
            f"(this code knows version {SCHEMA_VERSION})"
        )
    if dialect == "sqlite" and version in _SQLITE_BEFORE_UNIFIED:
        return _SQLITE_BEFORE_UNIFIED[version]
    return frozenset(range(1, version + 1))


def to_apply(dialect: Dialect, done: Collection[int]) -> list[str]:
    """The statements that bring a database holding migrations ``done`` to SCHEMA_VERSION."""
    return [
        statement
        for number in sorted(_EVERY - set(done))
        for statement in (render(s, dialect) for s in MIGRATIONS[number - 1])
        if statement is not None
    ]


def render(statement: Statement, dialect: Dialect) -> str | None:
    """The statement as ``dialect`` runs it; None if that dialect has nothing to do."""
    text = statement.get(dialect) if isinstance(statement, dict) else statement
    if text is None:
        return None
    default = "DEFAULT nextval('registration_order')" if dialect == "postgres" else "DEFAULT 0"
    return text.format(**_TYPES[dialect], registration_default=default)


# The columns an execution and a step are read with, in the order of their fields.
EXECUTION_COLUMNS = (
    "id, session, status, request_json, error, created_at, updated_at, "
    "owner, generation, lease_until"
)
STEP_COLUMNS = (
    "execution_id, seq, kind, name, input_json, resolution, state, result_json, "
    "error_json, request_id, attempts, created_at, updated_at, spec_json, "
    "target_connection, target_client_id"
)


def quiet_since(dialect: Dialect) -> str:
    """The condition that run ``e`` made no progress since a cutoff; parameters: it, 3 times.

    A run's progress is its own row's last change (its start, its status) and its
    steps' (each recorded at its ``created_at``, each settled at its ``updated_at``;
    a delivery attempt is not progress, and leaves a settled step's time alone). A step's
    write does not change its run's row: that write, at every step, cost more of
    PostgreSQL's CPU than this read of the run's steps at expiry and pruning.
    """
    p = _PLACEHOLDER[dialect]
    return (
        f"e.updated_at < {p} AND NOT EXISTS (SELECT 1 FROM steps AS q WHERE "
        f"q.execution_id = e.id AND (q.created_at >= {p} "
        f"OR (q.state <> 'pending' AND q.updated_at >= {p})))"
    )


def waiting_quiet_since(dialect: Dialect) -> str:
    """The condition that run ``e`` waits (for a page, an approval) with no progress
    since a cutoff: expiry's; parameters: the cutoff, 4 times."""
    return (
        f"e.created_at < {_PLACEHOLDER[dialect]} AND {quiet_since(dialect)} AND ("
        "e.status = 'paused' OR (e.status = 'running' AND EXISTS ("
        "SELECT 1 FROM steps WHERE execution_id = e.id AND state = 'pending')))"
    )


def fence(dialect: Dialect) -> str:
    """The condition every write for an execution carries; parameters: its id, the generation held.

    It holds only while the execution is at the generation this instance holds
    (NULL: not one of ours, no fence), and is false for an execution that does
    not exist. On PostgreSQL it takes the row lock: a take-over waits for this
    write, or this write waits for the take-over and then sees the new
    generation. NO KEY UPDATE, the lock the execution's own UPDATE takes anyway:
    two writers for one execution queue up on it instead of both sharing it and
    then deadlocking on the upgrade. SQLite writes one transaction at a time
    (BEGIN IMMEDIATE), which is that lock already.
    """
    if dialect == "postgres":
        return (
            "EXISTS (SELECT 1 FROM executions WHERE id = %s "
            "AND generation = COALESCE(%s::bigint, generation) FOR NO KEY UPDATE)"
        )
    return "EXISTS (SELECT 1 FROM executions WHERE id = ? AND generation = COALESCE(?, generation))"


# One condition of a listing's WHERE and its parameters; None: that filter is not asked for.
Condition = tuple[str, Sequence[object]] | None


def where(*conditions: Condition) -> tuple[str, list[object]]:
    """``WHERE a AND b ...`` of the conditions asked for (empty if none), and their parameters.

    Each dialect writes its own conditions (placeholders, ``IN`` or ``= ANY``);
    this only joins them, in order::

        where(("session = ?", ["s"]), None)  # ("WHERE session = ?", ["s"])
    """
    asked = [condition for condition in conditions if condition is not None]
    params = [param for _, values in asked for param in values]
    return (f"WHERE {' AND '.join(sql for sql, _ in asked)}" if asked else ""), params


def trim_session_tools(dialect: Dialect) -> str:
    """Deletes a session's remembered tools but its ``keep`` newest (in the order they are
    read back, oldest first); parameters: the session, the session again, ``keep``."""
    p = _PLACEHOLDER[dialect]
    return (
        f"DELETE FROM session_tools WHERE session = {p} AND name NOT IN ("
        f" SELECT name FROM session_tools WHERE session = {p}"
        f" ORDER BY updated_at DESC, name DESC LIMIT {p})"
    )


def prune_session_tools(dialect: Dialect) -> str:
    """Deletes the remembered tools last registered before the cutoff (the parameter) of
    the sessions with no unfinished run: no replay can ask for them any more."""
    p = _PLACEHOLDER[dialect]
    return (
        f"DELETE FROM session_tools WHERE updated_at < {p} AND NOT EXISTS ("
        " SELECT 1 FROM executions WHERE executions.session = session_tools.session"
        " AND status IN ('running', 'paused'))"
    )
