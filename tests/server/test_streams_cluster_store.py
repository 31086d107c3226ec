"""The shared chunk log's rows in PostgreSQL: one unfinished execution per chat, chunks
written once and fenced by the lease, the rows of ended responses pruned after the grace."""

from __future__ import annotations

import psycopg
import pytest

from clienttools_server.cluster.shared_streams import ChunkStore
from clienttools_server.ledger import ChatBusy, LeaseLost, SqliteLedger, UnknownExecution
from clienttools_server.ledger.postgres import PostgresLedger
from tests.server.old_ledger_schemas import postgres_ledger_of_version
from tests.support.postgres import PostgresServer, foreign_key_tables

T0 = 1_700_000_000.0


async def test_a_chat_has_one_unfinished_execution_on_a_shared_ledger(
    postgres: PostgresServer,
) -> None:
    url = postgres.fresh_url()
    async with await PostgresLedger.connect(url) as one, await PostgresLedger.connect(url) as other:
        first = await one.start_execution("s", "{}", T0, chat_id="c")
        with pytest.raises(ChatBusy):
            await other.start_execution("s", "{}", T0, chat_id="c")
        await other.start_execution("s", "{}", T0, chat_id="d")  # another chat
        await other.start_execution("t", "{}", T0, chat_id="c")  # the same chat id, another session
        await other.start_execution("s", "{}", T0)  # no chat: nothing to refuse
        await other.start_execution("s", "{}", T0)
        await one.set_status(first.id, "completed", T0 + 1)
        again = await other.start_execution("s", "{}", T0 + 2, chat_id="c")
        running = await one.executions(["running"], "s")
        assert [e.id for e in running if e.id == again.id] == [again.id]


async def test_one_process_refuses_a_second_start_of_a_streaming_chat_too() -> None:
    # A SQLite ledger serves one process, whose hub refuses a second send for a chat that
    # streams before the ledger sees it (test_server_chat.py, "already streaming"); the
    # ledger refuses it as well, as a shared one does: the same input, the same exception.
    async with SqliteLedger(":memory:") as ledger:
        first = await ledger.start_execution("s", "{}", T0, chat_id="c")
        with pytest.raises(ChatBusy):
            await ledger.start_execution("s", "{}", T0, chat_id="c")
        running = await ledger.executions(["running"], "s")
        assert [e.id for e in running] == [first.id]


async def test_chunks_are_written_once_and_read_after_a_sequence(postgres: PostgresServer) -> None:
    async with await PostgresLedger.connect(postgres.fresh_url()) as ledger:
        store = ChunkStore(ledger)
        execution = await ledger.start_execution("s", "{}", T0, chat_id="c")
        assert await store.append(execution.id, [(0, '{"type":"start"}'), (1, "{}")], []) == 1
        assert await store.append(execution.id, [(0, '{"type":"start"}'), (1, "{}")], []) == 0
        # A write tried again (its first answer was lost), with what came meanwhile: a
        # row of its own over the same first chunks, each of which is read once.
        assert await store.append(execution.id, [(1, "{}"), (2, '{"n":2}'), (3, None)], []) == 2
        head, chunks = await store.read(execution.id, 0)
        assert chunks == [(1, {}), (2, {"n": 2}), (3, None)]
        assert (await store.read(execution.id, -1))[1][0] == (0, {"type": "start"})
        assert (await store.read(execution.id, 2))[1] == [(3, None)]
        assert head is not None and (head.status, head.owner) == ("running", ledger.owner)
        [(rows,)] = await ledger.statement("SELECT count(*) FROM chunks", ())
        assert rows == 3  # a row a write, and the end's
        latest = await store.latest("s", "c")
        assert latest is not None and latest.execution_id == execution.id
        assert await store.latest("s", "nope") is None
        assert await store.read("nope", -1) == (None, [])


async def test_a_process_that_lost_the_run_writes_no_chunk(postgres: PostgresServer) -> None:
    url = postgres.fresh_url()
    async with (
        await PostgresLedger.connect(url, lease=1.0) as stale,
        await PostgresLedger.connect(url, lease=1.0) as new,
    ):
        execution = await stale.start_execution("s", "{}", T0, chat_id="c")
        await ChunkStore(stale).append(execution.id, [(0, "{}")], [])
        [taken] = await new.take_over(T0 + 5)  # the stale one's lease lapsed
        with pytest.raises(LeaseLost):
            await ChunkStore(stale).append(execution.id, [(1, '{"stale":true}')], [])
        assert await ChunkStore(new).append(execution.id, [(1, "{}")], []) == 1
        assert (await ChunkStore(new).read(taken.id, -1))[1] == [(0, {}), (1, {})]


async def test_the_chunks_of_a_response_go_once_it_ended_longer_than_the_grace_ago(
    postgres: PostgresServer,
) -> None:
    async with await PostgresLedger.connect(postgres.fresh_url()) as ledger:
        store = ChunkStore(ledger)
        ended = await ledger.start_execution("s", "{}", T0, chat_id="ended")
        going = await ledger.start_execution("s", "{}", T0, chat_id="going")
        await store.append(ended.id, [(0, "{}"), (1, "{}"), (2, None)], [])
        await store.append(going.id, [(0, "{}"), (1, "{}")], [])
        await ledger.set_status(ended.id, "completed", T0 + 10)
        assert await store.prune(T0 + 10) == 0  # ended just now: a page may still resume it
        assert await store.prune(T0 + 11) == 2  # its chunks' row and its end's
        assert (await store.read(ended.id, -1))[1] == []
        assert len((await store.read(going.id, -1))[1]) == 2  # still streaming: kept, however old


async def test_pruning_a_finished_run_deletes_its_steps_and_chunks_and_skips_a_locked_one(
    postgres: PostgresServer,
) -> None:
    # No foreign key cascades on PostgreSQL (schema.py, migration 12): the prune deletes
    # a run's steps and chunks itself, and leaves a run another transaction holds.
    url = postgres.fresh_url()
    async with await PostgresLedger.connect(url) as ledger:
        store = ChunkStore(ledger)
        runs = [await ledger.start_execution("s", "{}", T0, chat_id=c) for c in ("a", "b")]
        for run in runs:
            await ledger.record_step(run.id, 0, "tool", "t", "{}", "client", T0)
            await store.append(run.id, [(0, "{}"), (1, None)], [])
            await ledger.set_status(run.id, "completed", T0 + 1)
        with psycopg.connect(url) as holder:
            holder.execute("SELECT 1 FROM executions WHERE id = %s FOR UPDATE", (runs[1].id,))
            assert await ledger.prune_finished(retention=1.0, now=T0 + 5) == 1  # not waiting
        assert await ledger.get_execution(runs[0].id) is None
        assert await ledger.get_execution(runs[1].id) is not None
        assert await ledger.prune_finished(retention=1.0, now=T0 + 5) == 1  # released: its turn
        with psycopg.connect(url) as raw:
            for table in ("executions", "steps", "chunks"):
                assert raw.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,)


async def test_no_step_or_chunk_is_written_for_a_run_that_is_not_there(
    postgres: PostgresServer,
) -> None:
    url = postgres.fresh_url()
    async with await PostgresLedger.connect(url) as ledger:
        with pytest.raises(UnknownExecution):
            await ledger.record_step("nope", 0, "tool", "t", "{}", "client", T0)
        assert await ChunkStore(ledger).append("nope", [(0, "{}")], []) == 0
        with psycopg.connect(url) as raw:
            for table in ("steps", "chunks"):
                assert raw.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,)
            assert foreign_key_tables(raw) == ["chat_messages"]  # a chat's messages keep theirs


async def test_the_chunks_of_a_postgres_ledger_of_version_12_are_read_after_the_upgrade(
    postgres: PostgresServer,
) -> None:
    # Version 12 wrote a row a chunk; from 13 a row is a write's chunks (shared_streams.pack).
    url = postgres.fresh_url()
    postgres_ledger_of_version(url, 12)
    with psycopg.connect(url, autocommit=True) as raw:
        raw.execute(
            "INSERT INTO executions (id, session, status, request_json, created_at, updated_at, "
            "chat_id) VALUES ('e', 's', 'running', '{}', %s, %s, 'c')",
            (T0, T0),
        )
        raw.execute(
            "INSERT INTO chunks (execution_id, seq, chunk_json) VALUES "
            """('e', 0, '{"type":"start"}'), ('e', 1, '{"n":1}')"""
        )
    async with await PostgresLedger.connect(url) as ledger:
        store = ChunkStore(ledger)
        assert (await store.read("e", -1))[1] == [(0, {"type": "start"}), (1, {"n": 1})]
        await ledger.take_over(T0)  # a run of a process gone: this one writes on
        assert await store.append("e", [(2, '{"n":2}'), (3, None)], []) == 2
        assert (await store.read("e", 0))[1] == [(1, {"n": 1}), (2, {"n": 2}), (3, None)]
