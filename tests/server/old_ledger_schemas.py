"""The ledger's schemas as the code before one numbering for both dialects made them.

SQLite files went up to ``PRAGMA user_version`` 5 and PostgreSQL databases to
version 7, each with its own numbering. A migration test makes a database at
one of those versions with these statements, as the old code did, writes rows
into it, and opens it with today's ledger. A PostgreSQL database at a version of
the one numbering is made with that numbering's own migrations
(:func:`postgres_ledger_of_version`).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import psycopg

from clienttools_server.ledger.schema import MIGRATIONS, render

# SQLite: a new file got _SCHEMA and the chat tables at once (version 5); a file
# at version N had _SCHEMA_V1 and then _MIGRATIONS[0 : N - 1].
SQLITE_SCHEMA_5 = """
CREATE TABLE executions (
    id           TEXT PRIMARY KEY,
    session      TEXT NOT NULL,
    status       TEXT NOT NULL
                 CHECK (status IN ('running', 'paused', 'completed', 'error', 'expired')),
    request_json TEXT NOT NULL,
    error        TEXT,
    created_at   REAL NOT NULL,
    updated_at   REAL NOT NULL,
    owner        TEXT,
    generation   INTEGER NOT NULL DEFAULT 0,
    lease_until  REAL
);
CREATE INDEX executions_by_status ON executions (status, updated_at);
CREATE INDEX executions_by_session ON executions (session, status);

CREATE TABLE steps (
    execution_id TEXT NOT NULL REFERENCES executions (id) ON DELETE CASCADE,
    seq          INTEGER NOT NULL CHECK (seq >= 0),
    kind         TEXT NOT NULL CHECK (kind IN ('model', 'tool')),
    name         TEXT NOT NULL,
    input_json   TEXT NOT NULL,
    resolution   TEXT NOT NULL CHECK (resolution IN ('client', 'approval', 'server')),
    state        TEXT NOT NULL CHECK (state IN ('pending', 'applied', 'error', 'expired')),
    result_json  TEXT,
    error_json   TEXT,
    request_id   TEXT,
    attempts     INTEGER NOT NULL DEFAULT 0,
    created_at   REAL NOT NULL,
    updated_at   REAL NOT NULL,
    spec_json    TEXT,
    PRIMARY KEY (execution_id, seq)
);
-- Only pending steps are ever searched by state, and they are few.
CREATE INDEX steps_pending ON steps (resolution, execution_id) WHERE state = 'pending';
CREATE INDEX steps_by_request_id ON steps (request_id) WHERE request_id IS NOT NULL;

CREATE TABLE session_owners (
    session    TEXT PRIMARY KEY,
    principal  TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE INDEX session_owners_by_principal ON session_owners (principal, session);
"""

_SQLITE_CHAT_TABLES = (
    """
    CREATE TABLE chats (
        id            TEXT PRIMARY KEY,
        session       TEXT NOT NULL,
        version       INTEGER NOT NULL,
        message_count INTEGER NOT NULL,
        streaming     TEXT,
        updated_at    REAL NOT NULL
    )
    """,
    "CREATE INDEX chats_by_age ON chats (updated_at, id)",
    "CREATE INDEX chats_by_session ON chats (session, updated_at, id)",
    """
    CREATE TABLE chat_messages (
        chat_id      TEXT NOT NULL REFERENCES chats (id) ON DELETE CASCADE,
        position     INTEGER NOT NULL CHECK (position >= 0),
        message_json TEXT NOT NULL,
        PRIMARY KEY (chat_id, position)
    )
    """,
)

SQLITE_MIGRATIONS: tuple[tuple[str, ...], ...] = (
    # 2: the tool spec a client call was made with, for the outputSchema after a restart.
    ("ALTER TABLE steps ADD COLUMN spec_json TEXT",),
    # 3: run ownership: the lease's owner, its generation (fencing), until when it holds.
    (
        "ALTER TABLE executions ADD COLUMN owner TEXT",
        "ALTER TABLE executions ADD COLUMN generation INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE executions ADD COLUMN lease_until REAL",
    ),
    # 4: who owns each session (O1). The sessions already in the ledger were used by the
    # one principal there was, the holders of the shared token: they keep them.
    (
        "CREATE TABLE session_owners (session TEXT PRIMARY KEY, principal TEXT NOT NULL, "
        "created_at REAL NOT NULL)",
        "CREATE INDEX session_owners_by_principal ON session_owners (principal, session)",
        "INSERT INTO session_owners (session, principal, created_at) "
        "SELECT session, 'shared', MIN(created_at) FROM executions GROUP BY session",
    ),
    # 5: the conversations stored on the server.
    _SQLITE_CHAT_TABLES,
)

SQLITE_SCHEMA_1 = """
CREATE TABLE executions (
    id           TEXT PRIMARY KEY,
    session      TEXT NOT NULL,
    status       TEXT NOT NULL
                 CHECK (status IN ('running', 'paused', 'completed', 'error', 'expired')),
    request_json TEXT NOT NULL,
    error        TEXT,
    created_at   REAL NOT NULL,
    updated_at   REAL NOT NULL
);
CREATE INDEX executions_by_status ON executions (status, updated_at);
CREATE INDEX executions_by_session ON executions (session, status);

CREATE TABLE steps (
    execution_id TEXT NOT NULL REFERENCES executions (id) ON DELETE CASCADE,
    seq          INTEGER NOT NULL CHECK (seq >= 0),
    kind         TEXT NOT NULL CHECK (kind IN ('model', 'tool')),
    name         TEXT NOT NULL,
    input_json   TEXT NOT NULL,
    resolution   TEXT NOT NULL CHECK (resolution IN ('client', 'approval', 'server')),
    state        TEXT NOT NULL CHECK (state IN ('pending', 'applied', 'error', 'expired')),
    result_json  TEXT,
    error_json   TEXT,
    request_id   TEXT,
    attempts     INTEGER NOT NULL DEFAULT 0,
    created_at   REAL NOT NULL,
    updated_at   REAL NOT NULL,
    PRIMARY KEY (execution_id, seq)
);
CREATE INDEX steps_pending ON steps (resolution, execution_id) WHERE state = 'pending';
CREATE INDEX steps_by_request_id ON steps (request_id) WHERE request_id IS NOT NULL;
"""

# PostgreSQL: POSTGRES_MIGRATIONS[n] took a database from version n to n + 1.
POSTGRES_MIGRATIONS: tuple[tuple[str, ...], ...] = (
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


def old_sqlite_ledger(path: Path, version: int) -> sqlite3.Connection:
    """A SQLite file at ``version`` (1 to 5) as the old code made it; the open connection."""
    raw = sqlite3.connect(path, isolation_level=None)
    if version == 5:
        raw.executescript(SQLITE_SCHEMA_5)
        for statement in _SQLITE_CHAT_TABLES:
            raw.execute(statement)
    else:
        raw.executescript(SQLITE_SCHEMA_1)
        for statements in SQLITE_MIGRATIONS[: version - 1]:
            for statement in statements:
                raw.execute(statement)
    raw.execute(f"PRAGMA user_version = {version}")
    return raw


def old_postgres_ledger(url: str, version: int) -> None:
    """A PostgreSQL database at ``version`` (1 to 7) as the old code made it."""
    _postgres_at(url, version, [s for m in POSTGRES_MIGRATIONS[:version] for s in m])


def postgres_ledger_of_version(url: str, version: int) -> None:
    """A PostgreSQL database at ``version`` of the one numbering, as that code made it."""
    rendered = (render(s, "postgres") for m in MIGRATIONS[:version] for s in m)
    _postgres_at(url, version, [text for text in rendered if text is not None])


def _postgres_at(url: str, version: int, statements: list[str]) -> None:
    with psycopg.connect(url, autocommit=True) as raw:
        for statement in statements:
            raw.execute(statement)
        raw.execute("CREATE TABLE ledger_schema (version INTEGER NOT NULL)")
        raw.execute("INSERT INTO ledger_schema (version) VALUES (%s)", (version,))
