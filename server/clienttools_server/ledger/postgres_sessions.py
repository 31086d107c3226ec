"""The PostgreSQL dialect of what is shared about sessions: the processes and their
registrations (S2 across processes), session owners (O1), the tools each session's
pages registered, and the stored chats (H1-H5). :class:`PostgresStore` (``postgres.py``)
is this with the runs, their steps and leases.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Sequence
from typing import Any

from ..cluster.bus import encode
from .postgres_pool import Connections, Transaction
from .postgres_text import escape, maybe_escape, maybe_unescape, unescape
from .records import CHAT_CHANGED, ChatSummary, Registration, StoredChat
from .schema import prune_session_tools, trim_session_tools, where

# A process counts as alive while its row's alive_until has not passed; its own
# registrations always count for itself.
_LIVE_PROCESS = (
    "(r.process_id = %s OR EXISTS (SELECT 1 FROM processes AS p "
    "WHERE p.id = r.process_id AND p.alive_until >= %s))"
)
_TRIM_SESSION_TOOLS = trim_session_tools("postgres")
_PRUNE_SESSION_TOOLS = prune_session_tools("postgres")
# A CTE: the notice of a chat's change to the processes subscribed to it but the
# sender (channel prefix, payload, chat id, sender); PostgreSQL runs it only if the
# statement reads ``told``. In a statement after the chat's row lock: it sees every
# subscription that held the lock before (``subscribe_chat``).
_TELL_SUBSCRIBERS = (
    "told AS (SELECT pg_notify(%s || process_id, %s) FROM chat_subscribers "
    "WHERE chat_id = %s AND process_id <> %s)"
)


# The lock a chat's first save holds (exclusive) and a subscribe takes (shared): a
# chat not made yet has no row to lock. Keyed by a hash of the id: two chats that
# share one only wait for each other.
_NEW_CHAT_LOCK = "pg_advisory_xact_lock{mode}(hashtextextended(%s, 0))"
_GET_CHAT = (
    "SELECT session, version, updated_at, streaming, "
    "(SELECT array_agg(message_json ORDER BY position) FROM chat_messages "
    " WHERE chat_id = chats.id) FROM chats WHERE id = %s"
)


def _stored_chat(chat_id: str, rows: Sequence[tuple[Any, ...]]) -> StoredChat | None:
    if not rows:
        return None
    session, version, updated_at, streaming, messages = rows[0]
    return StoredChat(
        chat_id, unescape(session), int(version), updated_at, tuple(messages or ()), streaming
    )


def _namespace(database: str, schema: str) -> str:
    """A short tag of the ledger's database and schema: channel names stay within 63 bytes."""
    return hashlib.sha256(f"{database}\x00{schema}".encode()).hexdigest()[:12]


class PostgresSessions(Connections):
    """The PostgreSQL dialect of the processes, registrations, session owners, their
    tools and chats."""

    # processes and registrations (S2 across processes)

    namespace = ""  # set once connected: the channels' prefix for this schema

    async def open(self) -> None:
        await super().open()
        try:
            [(database, schema)] = await self.read("SELECT current_database(), current_schema()")
        except BaseException:
            await self.close()
            raise
        self.namespace = _namespace(str(database), str(schema))

    async def keep_alive(
        self, owner: str, now: float, until: float, forget_before: float
    ) -> frozenset[str]:
        # One statement: this process's row renewed, the registrations (and rows) of
        # processes dead for long deleted, and who is alive now. Not at once: a
        # process that was only stalled (SIGSTOP, a long pause) and comes back
        # finds its registrations there again, counted once its row is renewed.
        rows = await self.write_one(
            "WITH me AS (INSERT INTO processes (id, alive_until) VALUES (%s, %s) "
            "ON CONFLICT (id) DO UPDATE SET alive_until = EXCLUDED.alive_until), "
            "dead AS (DELETE FROM processes WHERE alive_until < %s AND id <> %s RETURNING id), "
            "unregistered AS (DELETE FROM registrations WHERE process_id IN "
            "(SELECT id FROM dead)), "
            "unsubscribed AS (DELETE FROM chat_subscribers WHERE process_id IN "
            "(SELECT id FROM dead)) "
            "SELECT id FROM processes WHERE alive_until >= %s AND id <> %s",
            (owner, until, forget_before, owner, now, owner),
        )
        return frozenset({owner, *(str(row[0]) for row in rows)})

    async def register(
        self, owner: str, connection_id: str, session: str, client_id: str | None, tools: str
    ) -> int:
        # Another connection of the same page (session, clientId) is one it left.
        [(order,)] = await self.write_one(
            "WITH moved AS (DELETE FROM registrations WHERE session = %s AND client_id = %s "
            "AND connection_id <> %s) "
            "INSERT INTO registrations (connection_id, session, process_id, client_id, tools_json) "
            "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (connection_id) DO UPDATE SET "
            "client_id = EXCLUDED.client_id, tools_json = EXCLUDED.tools_json, "
            "registration = EXCLUDED.registration RETURNING registration",
            (
                escape(session), maybe_escape(client_id), connection_id, connection_id,
                escape(session), owner, maybe_escape(client_id), tools,
            ),
        )  # fmt: skip
        return int(order)

    async def unregister(self, connection_id: str) -> None:
        await self.write_one(
            "DELETE FROM registrations WHERE connection_id = %s RETURNING 1", (connection_id,)
        )

    async def registrations(self, owner: str, session: str, now: float) -> list[Registration]:
        rows = await self.read(
            "SELECT r.connection_id, r.session, r.process_id, r.registration, r.client_id, "
            f"r.tools_json FROM registrations AS r WHERE r.session = %s AND {_LIVE_PROCESS} "
            "ORDER BY r.registration",
            (escape(session), owner, now),
        )
        return [
            Registration(
                str(connection_id),
                unescape(str(name)),
                str(process_id),
                int(order),
                maybe_unescape(client_id),
                str(tools_json),
            )
            for connection_id, name, process_id, order, client_id, tools_json in rows
        ]

    async def registered(self, owner: str, connection_id: str, now: float) -> bool:
        rows = await self.read(
            f"SELECT 1 FROM registrations AS r WHERE r.connection_id = %s AND {_LIVE_PROCESS}",
            (connection_id, owner, now),
        )
        return bool(rows)

    async def notify(
        self, owner: str, process_id: str | None, kind: str, args: Sequence[str]
    ) -> None:
        # Sent when the transaction it is part of commits: in a batch, with its commit.
        payload = encode(owner, kind, tuple(args))
        await self.write_later("SELECT pg_notify(%s, %s)", (self.channel(process_id), payload))

    def channel(self, process_id: str | None) -> str:
        """The LISTEN channel of one process (None: of every process) in this schema."""
        return f"ct_{self.namespace}_{'all' if process_id is None else process_id}"

    # who owns each session (O1)

    async def claim_session(self, session: str, principal: str, now: float) -> str:
        async with self.write() as tx:
            await tx.execute(
                "INSERT INTO session_owners (session, principal, created_at) "
                "VALUES (%s, %s, %s) ON CONFLICT (session) DO NOTHING",
                (escape(session), escape(principal), now),
            )
            # A statement of its own: in READ COMMITTED it sees the row of a claim
            # that won the race and committed while the insert above waited for it.
            row = await tx.fetchone(
                "SELECT principal FROM session_owners WHERE session = %s", (escape(session),)
            )
        assert row is not None
        return unescape(str(row[0]))

    async def session_owner(self, session: str) -> str | None:
        rows = await self.read(
            "SELECT principal FROM session_owners WHERE session = %s", (escape(session),)
        )
        return unescape(str(rows[0][0])) if rows else None

    async def sessions_owned_by(self, principal: str) -> list[str]:
        rows = await self.read(
            "SELECT session FROM session_owners WHERE principal = %s ORDER BY session",
            (escape(principal),),
        )
        return [unescape(str(session)) for (session,) in rows]

    # the tools each session's pages registered (S2)

    async def remember_tools(
        self, session: str, specs: Sequence[tuple[str, str]], now: float, keep: int
    ) -> None:
        async with self.write() as tx:
            await tx.defer(
                "INSERT INTO session_tools (session, name, spec_json, updated_at) "
                "SELECT %s, name, spec, %s FROM unnest(%s::text[], %s::text[]) AS t (name, spec) "
                "ON CONFLICT (session, name) DO UPDATE SET "
                "spec_json = EXCLUDED.spec_json, updated_at = EXCLUDED.updated_at",
                (
                    escape(session), now,
                    [escape(name) for name, _ in specs], [escape(spec) for _, spec in specs],
                ),
            )  # fmt: skip
            await tx.defer(_TRIM_SESSION_TOOLS, (escape(session), escape(session), keep))

    async def remembered_tools(self, session: str) -> list[tuple[str, str]]:
        rows = await self.read(
            "SELECT name, spec_json FROM session_tools WHERE session = %s "
            "ORDER BY updated_at, name",
            (escape(session),),
        )
        return [(unescape(str(name)), unescape(str(spec))) for name, spec in rows]

    async def prune_session_tools(self, cutoff: float) -> int:
        async with self.write() as tx:
            return await tx.execute(_PRUNE_SESSION_TOOLS, (cutoff,))

    # the conversations (H1-H5)

    async def get_chat(self, chat_id: str) -> StoredChat | None:
        return _stored_chat(chat_id, await self.read(_GET_CHAT, (escape(chat_id),)))

    async def subscribe_chat(self, owner: str, chat_id: str) -> StoredChat | None:
        key = escape(chat_id)
        async with self.write() as tx:
            # The row, and the chat's lock: the row lock, or for a chat not made
            # yet the lock its first save takes (_NEW_CHAT_LOCK). A save that holds
            # either has committed when the read below begins (a statement of its
            # own, so it sees that save whole); one that comes later waits for this
            # commit, so it finds the row and tells this process.
            await tx.defer(f"SELECT {_NEW_CHAT_LOCK.format(mode='_shared')}", (key,))
            await tx.fetchall(
                "WITH subscribed AS (INSERT INTO chat_subscribers (chat_id, process_id) "
                "VALUES (%s, %s) ON CONFLICT DO NOTHING) "
                "SELECT 1 FROM chats WHERE id = %s FOR SHARE",
                (key, owner, key),
            )
            return _stored_chat(chat_id, await tx.fetchall(_GET_CHAT, (key,)))

    async def unsubscribe_chat(self, owner: str, chat_id: str) -> None:
        await self.write_later(
            "DELETE FROM chat_subscribers WHERE chat_id = %s AND process_id = %s",
            (escape(chat_id), owner),
        )

    async def locked_chat(
        self, tx: Transaction, chat_id: str, session: str, now: float, new: bool
    ) -> tuple[str, int, int]:
        key = escape(chat_id)
        row = None
        if not new:
            row = await tx.fetchone(
                "SELECT session, version, message_count FROM chats WHERE id = %s FOR UPDATE",
                (key,),
            )
        if row is None:
            # A new chat: made at version 0 under its lock; one another process made
            # since it was read is locked (the no-op update) and returned as it is.
            await tx.defer(f"SELECT {_NEW_CHAT_LOCK.format(mode='')}", (key,))
            row = await tx.fetchone(
                "INSERT INTO chats (id, session, version, message_count, streaming, updated_at) "
                "VALUES (%s, %s, 0, 0, NULL, %s) "
                "ON CONFLICT (id) DO UPDATE SET updated_at = chats.updated_at "
                "RETURNING session, version, message_count",
                (key, escape(session), now),
            )
        assert row is not None
        return unescape(str(row[0])), int(row[1]), int(row[2])

    async def store_chat(
        self, owner: str, tx: Transaction, chat_id: str, keep: int, messages: Sequence[str],
        version: int, streaming: str | None, now: float, count: int,
    ) -> None:  # fmt: skip
        # One statement: the chat's row; the messages from the new end on, gone; the new
        # ones written over what was at their positions. Three disjoint sets of rows, so
        # the order in which PostgreSQL carries out the parts does not matter. And the
        # notice to the chat's other subscribers, delivered when the save commits.
        key, end = escape(chat_id), keep + len(messages)
        await tx.defer(
            "WITH chat AS (UPDATE chats SET version = %s, message_count = %s, streaming = %s, "
            " updated_at = %s WHERE id = %s), "
            "gone AS (DELETE FROM chat_messages WHERE chat_id = %s AND position >= %s), "
            "put AS (INSERT INTO chat_messages (chat_id, position, message_json) "
            "SELECT %s, %s + ord - 1, m FROM unnest(%s::text[]) WITH ORDINALITY AS t(m, ord) "
            "ON CONFLICT (chat_id, position) DO UPDATE SET message_json = EXCLUDED.message_json), "
            f"{_TELL_SUBSCRIBERS} SELECT count(*) FROM told",
            # JSON text: never a raw NUL
            (
                version, end, streaming, now, key, key, end, key, keep, list(messages),
                *self._telling(owner, chat_id),
            ),
        )  # fmt: skip

    def _telling(self, owner: str, chat_id: str) -> tuple[str, str, str, str]:
        """The parameters of :data:`_TELL_SUBSCRIBERS`."""
        payload = encode(owner, CHAT_CHANGED, (chat_id,))
        return self.channel(""), payload, escape(chat_id), owner

    async def delete_chat(self, owner: str, chat_id: str) -> bool:
        key = escape(chat_id)
        async with self.write() as tx:
            # The row lock first, as a save takes it: the delete's own statement then
            # begins after any subscription that held it has committed, and sees it.
            if await tx.fetchone("SELECT 1 FROM chats WHERE id = %s FOR UPDATE", (key,)) is None:
                return False
            await tx.defer(
                "WITH gone AS (DELETE FROM chats WHERE id = %s), "
                f"{_TELL_SUBSCRIBERS} SELECT count(*) FROM told",
                (key, *self._telling(owner, chat_id)),
            )
        return True

    async def chats(
        self, session: str | None, limit: int, before: tuple[float, str] | None,
        sessions: Collection[str] | None,
    ) -> list[ChatSummary]:  # fmt: skip
        clause, params = where(
            None if session is None else ("session = %s", [escape(session)]),
            None if sessions is None else ("session = ANY(%s)", [[escape(s) for s in sessions]]),
            None
            if before is None
            else ("(updated_at, id) < (%s, %s)", [before[0], escape(before[1])]),
        )
        rows = await self.read(
            "SELECT id, session, message_count, version, updated_at FROM chats "
            f"{clause} ORDER BY updated_at DESC, id DESC LIMIT %s",
            (*params, limit),
        )
        return [
            ChatSummary(unescape(r[0]), unescape(r[1]), int(r[2]), int(r[3]), r[4]) for r in rows
        ]

    async def prune_chats(self, cutoff: float) -> int:
        rows = await self.write_one(
            "DELETE FROM chats WHERE updated_at < %s AND (streaming IS NULL OR NOT EXISTS ("
            " SELECT 1 FROM executions WHERE id = streaming "
            " AND status IN ('running', 'paused'))) RETURNING id",
            (cutoff,),
        )
        return len(rows)
