"""The shared chunk log's rows in PostgreSQL: one unfinished execution per chat, chunks
written once and fenced by the lease, the rows of ended responses pruned after the grace."""

from __future__ import annotations

import pytest

from clienttools_server.ledger import ChatBusy, LeaseLost, SqliteLedger
from clienttools_server.ledger_postgres import PostgresLedger
from clienttools_server.shared_stream import ChunkStore
from tests.support.postgres import PostgresServer

T0 = 1_700_000_000.0


def test_a_chat_has_one_unfinished_execution_on_a_shared_ledger(postgres: PostgresServer) -> None:
    url = postgres.fresh_url()
    with PostgresLedger(url) as one, PostgresLedger(url) as other:
        first = one.start_execution("s", "{}", T0, chat_id="c")
        with pytest.raises(ChatBusy):
            other.start_execution("s", "{}", T0, chat_id="c")
        other.start_execution("s", "{}", T0, chat_id="d")  # another chat
        other.start_execution("t", "{}", T0, chat_id="c")  # the same chat id, another session
        other.start_execution("s", "{}", T0)  # no chat: nothing to refuse
        other.start_execution("s", "{}", T0)
        one.set_status(first.id, "completed", T0 + 1)
        again = other.start_execution("s", "{}", T0 + 2, chat_id="c")
        assert [e.id for e in one.executions(["running"], "s") if e.id == again.id] == [again.id]


def test_one_process_knows_its_streaming_chats_itself() -> None:
    with SqliteLedger(":memory:") as ledger:
        ledger.start_execution("s", "{}", T0, chat_id="c")
        ledger.start_execution("s", "{}", T0, chat_id="c")  # the hub refuses before


def test_chunks_are_written_once_and_read_after_a_sequence(postgres: PostgresServer) -> None:
    with PostgresLedger(postgres.fresh_url()) as ledger:
        store = ChunkStore(ledger)
        execution = ledger.start_execution("s", "{}", T0, chat_id="c")
        assert store.append(execution.id, [(0, '{"type":"start"}'), (1, "{}")], []) == 2
        # A batch written again (its first write's answer was lost) adds only what is new.
        assert store.append(execution.id, [(1, "{}"), (2, None)], []) == 1
        head, rows = store.read(execution.id, 0)
        assert rows == [(1, "{}"), (2, None)]
        assert head is not None and (head.status, head.owner) == ("running", ledger.owner)
        latest = store.latest("s", "c")
        assert latest is not None and latest.execution_id == execution.id
        assert store.latest("s", "nope") is None
        assert store.read("nope", -1) == (None, [])


def test_a_process_that_lost_the_run_writes_no_chunk(postgres: PostgresServer) -> None:
    url = postgres.fresh_url()
    with PostgresLedger(url, lease=1.0) as stale, PostgresLedger(url, lease=1.0) as new:
        execution = stale.start_execution("s", "{}", T0, chat_id="c")
        ChunkStore(stale).append(execution.id, [(0, "{}")], [])
        [taken] = new.take_over(T0 + 5)  # the stale one's lease lapsed
        with pytest.raises(LeaseLost):
            ChunkStore(stale).append(execution.id, [(1, '{"stale":true}')], [])
        assert ChunkStore(new).append(execution.id, [(1, "{}")], []) == 1
        assert ChunkStore(new).read(taken.id, -1)[1] == [(0, "{}"), (1, "{}")]


def test_the_chunks_of_a_response_go_once_it_ended_longer_than_the_grace_ago(
    postgres: PostgresServer,
) -> None:
    with PostgresLedger(postgres.fresh_url()) as ledger:
        store = ChunkStore(ledger)
        ended = ledger.start_execution("s", "{}", T0, chat_id="ended")
        going = ledger.start_execution("s", "{}", T0, chat_id="going")
        for execution in (ended, going):
            store.append(execution.id, [(0, "{}"), (1, "{}")], [])
        ledger.set_status(ended.id, "completed", T0 + 10)
        assert store.prune(T0 + 10) == 0  # ended just now: a page may still resume it
        assert store.prune(T0 + 11) == 2
        assert store.read(ended.id, -1)[1] == []
        assert len(store.read(going.id, -1)[1]) == 2  # still streaming: kept, however old
