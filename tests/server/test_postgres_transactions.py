"""The PostgreSQL ledger's transactions: BEGIN and deferred statements ride with the next
statement awaited, or with COMMIT, in one round trip; an error in one still rolls back
the whole transaction; a stalled batch still ends at the server's idle timeout. On a
real PostgreSQL; round trips are counted on the real connection."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest

from clienttools_server.ledger.postgres import PostgresLedger
from clienttools_server.ledger.postgres_pool import Connections, Transaction
from tests.support.postgres import PostgresServer


class RoundTrips:
    """Counts the exchanges that wait for the server: a statement outside a pipeline, and
    each Sync of a pipeline (``sync()``, and the one its end sends)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        execute = psycopg.AsyncConnection.execute
        sync = psycopg.AsyncPipeline.sync
        end = psycopg.AsyncPipeline.__aexit__

        async def counted_execute(
            connection: psycopg.AsyncConnection[Any], *args: Any, **kwargs: Any
        ) -> Any:
            if connection._pipeline is None:
                self.count += 1
            return await execute(connection, *args, **kwargs)

        async def counted_sync(pipeline: psycopg.AsyncPipeline) -> None:
            self.count += 1
            await sync(pipeline)

        async def counted_end(pipeline: psycopg.AsyncPipeline, *exc: Any) -> None:
            self.count += 1
            await end(pipeline, *exc)

        monkeypatch.setattr(psycopg.AsyncConnection, "execute", counted_execute)
        monkeypatch.setattr(psycopg.AsyncPipeline, "sync", counted_sync)
        monkeypatch.setattr(psycopg.AsyncPipeline, "__aexit__", counted_end)


@pytest.fixture
async def connections(postgres: PostgresServer) -> AsyncIterator[Connections]:
    pool = Connections(postgres.fresh_url(), timeout=5.0, max_size=2, lease=10.0)
    await pool.open()
    async with pool.write() as tx:
        await tx.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT NOT NULL)")
    yield pool
    await pool.close()


async def _ids(connections: Connections) -> list[int]:
    return [row[0] for row in await connections.read("SELECT id FROM t ORDER BY id")]


async def test_deferred_statements_and_begin_and_commit_go_in_one_round_trip(
    connections: Connections, monkeypatch: pytest.MonkeyPatch
) -> None:
    trips = RoundTrips(monkeypatch)
    async with connections.write() as tx:
        await tx.defer("INSERT INTO t VALUES (1, 'a')")
        await tx.defer("INSERT INTO t VALUES (2, 'b')")
        assert trips.count == 0
    assert trips.count == 1
    assert await _ids(connections) == [1, 2]


async def test_a_statement_awaited_carries_begin_and_what_was_deferred_before_it(
    connections: Connections, monkeypatch: pytest.MonkeyPatch
) -> None:
    trips = RoundTrips(monkeypatch)
    async with connections.write() as tx:
        await tx.defer("INSERT INTO t VALUES (1, 'a')")
        # It sees the deferred insert: sent before it, in the same transaction.
        row = await tx.fetchone("SELECT count(*) FROM t")
        assert row == (1,)
        assert trips.count == 1
        await tx.defer("UPDATE t SET v = 'z' WHERE id = 1")
    assert trips.count == 2  # the update and COMMIT
    assert await connections.read("SELECT v FROM t") == [("z",)]


async def test_a_write_that_wrote_nothing_sends_nothing(
    connections: Connections, monkeypatch: pytest.MonkeyPatch
) -> None:
    trips = RoundTrips(monkeypatch)
    async with connections.write():
        pass
    async with connections.open_batch():
        pass
    assert trips.count == 0


async def test_an_error_in_a_deferred_statement_rolls_back_the_whole_transaction(
    connections: Connections,
) -> None:
    await connections.write_later("INSERT INTO t VALUES (1, 'a')", ())
    with pytest.raises(psycopg.errors.UniqueViolation):
        async with connections.write() as tx:
            await tx.execute("INSERT INTO t VALUES (2, 'b')")
            await tx.defer("INSERT INTO t VALUES (1, 'again')")  # fails when sent, at COMMIT
    assert await _ids(connections) == [1]
    # The connection went back to the pool clean: the next write works.
    async with connections.write() as tx:
        await tx.defer("INSERT INTO t VALUES (3, 'c')")
    assert await _ids(connections) == [1, 3]


async def test_a_failed_commit_is_rolled_back_on_its_connection(postgres: PostgresServer) -> None:
    url = postgres.fresh_url()
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as connection:
        await connection.execute("CREATE TABLE t (id INTEGER PRIMARY KEY)")
        await connection.execute("INSERT INTO t VALUES (1)")
        tx = Transaction(connection)
        await tx.defer("INSERT INTO t VALUES (1)")
        with pytest.raises(psycopg.errors.UniqueViolation):
            await tx.commit()
        await tx.rollback()
        assert connection.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


async def test_a_refusal_inside_a_write_drops_what_was_deferred(connections: Connections) -> None:
    with pytest.raises(LookupError):
        async with connections.write() as tx:
            await tx.execute("INSERT INTO t VALUES (1, 'a')")
            await tx.defer("INSERT INTO t VALUES (2, 'b')")
            raise LookupError("refused")
    assert await _ids(connections) == []


async def test_a_batch_sends_its_deferred_statements_with_its_commit(
    connections: Connections, monkeypatch: pytest.MonkeyPatch
) -> None:
    trips = RoundTrips(monkeypatch)
    async with connections.open_batch() as batch:
        await connections.write_later("INSERT INTO t VALUES (1, 'a')", ())
        async with connections.write() as tx:
            await tx.defer("INSERT INTO t VALUES (2, 'b')")
        assert trips.count == 0
        # A read in the batch sees them: they go first.
        assert await connections.read("SELECT count(*) FROM t") == [(2,)]
        await connections.write_later("INSERT INTO t VALUES (3, 'c')", ())
    assert trips.count == 2  # the read (with BEGIN and both inserts), then the last and COMMIT
    assert batch.committed
    assert await _ids(connections) == [1, 2, 3]


async def test_a_database_error_in_a_batch_rolls_back_what_it_had_deferred(
    connections: Connections,
) -> None:
    await connections.write_later("INSERT INTO t VALUES (1, 'a')", ())
    with pytest.raises(psycopg.errors.UniqueViolation):
        async with connections.open_batch() as batch:
            await connections.write_later("INSERT INTO t VALUES (2, 'b')", ())
            await connections.write_one("INSERT INTO t VALUES (1, 'again') RETURNING id", ())
    assert not batch.committed
    assert await _ids(connections) == [1]


async def test_write_later_outside_a_batch_is_written_at_once(connections: Connections) -> None:
    await connections.write_later("INSERT INTO t VALUES (1, 'a')", ())
    assert await _ids(connections) == [1]


async def test_a_new_chats_first_save_waits_for_the_server_twice(
    postgres: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Told the chat is new, the save makes its row under the new chat's lock and gets it
    back in one round trip, then commits: no read of a row that is not there first."""
    message = '{"id":"m0","parts":[],"role":"user"}'
    ledger = await PostgresLedger.connect(postgres.fresh_url())
    try:
        await ledger.save_chat("warm", "s1", 0, [message], 1.0, streaming=None)  # the pool
        trips = RoundTrips(monkeypatch)
        assert await ledger.save_chat("c1", "s1", 0, [message], 2.0, streaming=None, new=True) == 1
        assert trips.count == 2
        trips.count = 0
        assert await ledger.save_chat("c2", "s1", 0, [message], 3.0, streaming=None) == 1
        assert trips.count == 3  # not told: the read that finds nothing, the insert, COMMIT
        chat = await ledger.get_chat("c1")
        assert chat is not None and chat.session == "s1" and chat.messages == (message,)
    finally:
        await ledger.close()
