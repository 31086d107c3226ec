"""The ledger (rule S8): every store passes the same tests, so they behave the same.

"sqlite" is a ledger file (``--db``); "memory" is SQLite's ``:memory:``, the
ledger of a server without ``--db``; "postgres" is a PostgreSQL database that
several server processes share (``--db postgresql://...``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clienttools_server.canonical import canonical_json
from clienttools_server.ledger import (
    MAX_STORED_BYTES,
    ChatBusy,
    Divergence,
    InvalidTransition,
    LeaseLost,
    Ledger,
    LedgerClosed,
    LedgerUnavailable,
    SqliteLedger,
    Step,
    UnknownExecution,
    UnknownStep,
    check_replay,
)
from clienttools_server.ledger.postgres import SCHEMA_VERSION, PostgresLedger
from tests.server.old_ledger_schemas import (
    old_postgres_ledger,
    old_sqlite_ledger,
    postgres_ledger_of_version,
)
from tests.support.postgres import PostgresServer, foreign_key_tables

HOUR = 3600.0
DAY = 24 * HOUR
T0 = 1_700_000_000.0

STORES = ["sqlite", "memory", "postgres"]


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str]:
    """(store, where): a ledger file, memory, or a fresh PostgreSQL schema's URL."""
    if request.param == "sqlite":
        return "sqlite", str(tmp_path / "ledger.sqlite3")
    if request.param == "postgres":
        return "postgres", request.getfixturevalue("postgres").fresh_url()
    return "memory", ":memory:"


@pytest.fixture(params=["sqlite", "postgres"])
def open_durable_ledger(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str]:
    """(store, where): a SQLite file or a PostgreSQL URL, for tests that reopen or kill."""
    if request.param == "sqlite":
        return "sqlite", str(tmp_path / "ledger.sqlite3")
    return "postgres", request.getfixturevalue("postgres").fresh_url()


async def _open(store: str, where: str) -> Ledger:
    """A ledger on the store; opened again on the same ``where``, the same ledger (a restart)."""
    if store == "postgres":
        return await PostgresLedger.connect(where)
    return SqliteLedger(where)


@contextlib.asynccontextmanager
async def _opened(store: str, where: str) -> AsyncIterator[Ledger]:
    ledger = await _open(store, where)
    try:
        yield ledger
    finally:
        await ledger.close()


@pytest.fixture
async def ledger(store: tuple[str, str]) -> AsyncIterator[Ledger]:
    opened = await _open(*store)
    yield opened
    await opened.close()


async def _tool_step(ledger: Ledger, session: str = "chat-1") -> tuple[str, int]:
    """A running execution with one pending client tool call at seq 0."""
    execution = await ledger.start_execution(session, '{"messages":[]}', now=T0)
    await ledger.record_step(
        execution.id, 0, "tool", "get_location", '{"precise":true}', "client", T0
    )
    return execution.id, 0


# --------------------------------------------------------------------------- canonical JSON


def test_canonical_json_sorts_keys_without_whitespace() -> None:
    assert (
        canonical_json({"b": 1, "a": {"d": [1, 2], "c": None}})
        == '{"a":{"c":null,"d":[1,2]},"b":1}'
    )


def test_canonical_json_keeps_non_ascii() -> None:
    assert canonical_json({"city": "Zürich"}) == '{"city":"Zürich"}'


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, {"x": [math.nan]}])
def test_canonical_json_refuses_nan_and_infinity(value: object) -> None:
    with pytest.raises(ValueError):
        canonical_json(value)


@pytest.mark.parametrize("value", [{1, 2}, object(), b"bytes", {"f": print}])
def test_canonical_json_refuses_non_json_values(value: object) -> None:
    with pytest.raises(ValueError, match="not a JSON value"):
        canonical_json(value)


# --------------------------------------------------------------------------- executions


async def test_start_and_get_execution(ledger: Ledger) -> None:
    execution = await ledger.start_execution("chat-1", '{"messages":[1]}', now=T0)
    assert len(execution.id) == 32 and int(execution.id, 16) >= 0
    assert execution.status == "running"
    assert execution.session == "chat-1"
    assert execution.request_json == '{"messages":[1]}'
    assert execution.error is None
    assert execution.created_at == execution.updated_at == T0
    assert await ledger.get_execution(execution.id) == execution
    assert await ledger.get_execution("nope") is None


async def test_execution_ids_are_unique(ledger: Ledger) -> None:
    ids = {(await ledger.start_execution("chat-1", "{}", now=T0)).id for _ in range(50)}
    assert len(ids) == 50


async def test_start_execution_refuses_invalid_request_json(ledger: Ledger) -> None:
    with pytest.raises(ValueError):
        await ledger.start_execution("chat-1", "{not json", now=T0)


async def test_executions_filters_by_status_and_session(ledger: Ledger) -> None:
    first = await ledger.start_execution("chat-1", "{}", now=T0)
    second = await ledger.start_execution("chat-2", "{}", now=T0 + 1)
    third = await ledger.start_execution("chat-1", "{}", now=T0 + 2)
    await ledger.set_status(second.id, "paused", now=T0 + 3)
    await ledger.set_status(third.id, "completed", now=T0 + 4)

    assert [e.id for e in await ledger.executions()] == [first.id, second.id, third.id]
    assert [e.id for e in await ledger.executions(["running", "paused"])] == [first.id, second.id]
    assert [e.id for e in await ledger.executions(session="chat-1")] == [first.id, third.id]
    assert [e.id for e in await ledger.executions({"completed"}, session="chat-1")] == [third.id]
    assert await ledger.executions(["expired"]) == []
    assert await ledger.executions([]) == []


async def test_executions_refuses_a_bare_string(ledger: Ledger) -> None:
    with pytest.raises(TypeError):
        await ledger.executions("paused")  # type: ignore[arg-type]


async def test_set_status_records_status_error_and_time(ledger: Ledger) -> None:
    execution = await ledger.start_execution("chat-1", "{}", now=T0)
    await ledger.set_status(execution.id, "paused", now=T0 + 5)
    paused = await ledger.get_execution(execution.id)
    assert paused is not None
    assert (paused.status, paused.updated_at, paused.created_at) == ("paused", T0 + 5, T0)

    await ledger.set_status(execution.id, "running", now=T0 + 6)
    await ledger.set_status(execution.id, "error", now=T0 + 7, error="model unavailable")
    failed = await ledger.get_execution(execution.id)
    assert failed is not None
    assert (failed.status, failed.error, failed.updated_at) == (
        "error",
        "model unavailable",
        T0 + 7,
    )


async def test_finished_execution_does_not_come_back(ledger: Ledger) -> None:
    execution = await ledger.start_execution("chat-1", "{}", now=T0)
    await ledger.set_status(execution.id, "completed", now=T0 + 1)
    with pytest.raises(InvalidTransition, match="completed"):
        await ledger.set_status(execution.id, "running", now=T0 + 2)
    # The same finished status again is a no-op, not an error.
    await ledger.set_status(execution.id, "completed", now=T0 + 3)
    done = await ledger.get_execution(execution.id)
    assert done is not None and done.updated_at == T0 + 1


async def test_set_status_of_unknown_execution_raises(ledger: Ledger) -> None:
    with pytest.raises(UnknownExecution):
        await ledger.set_status("nope", "paused", now=T0)


async def test_finishing_an_execution_settles_its_pending_steps(ledger: Ledger) -> None:
    execution_id, seq = await _tool_step(ledger)
    await ledger.set_status(execution_id, "completed", now=T0 + 1)

    step = await ledger.get_step(execution_id, seq)
    assert step is not None and step.state == "error"
    error = step.error()
    assert error is not None and error["code"] == "cancelled"
    # A late result for it is refused: the runtime answers "stale".
    outcome = await ledger.resolve(execution_id, seq, "{}", now=T0 + 2)
    assert (outcome.ok, outcome.reason) == (False, "not_pending")


# --------------------------------------------------------------------------- steps


async def test_record_step_creates_a_pending_step(ledger: Ledger) -> None:
    execution = await ledger.start_execution("chat-1", "{}", now=T0)
    step = await ledger.record_step(
        execution.id, 0, "tool", "search", '{ "q": "x", "limit": 3 }', "client", T0 + 1, "req-1"
    )
    assert step.state == "pending"
    assert step.input_json == '{"limit":3,"q":"x"}'  # stored canonical
    assert (step.kind, step.name, step.resolution, step.request_id) == (
        "tool",
        "search",
        "client",
        "req-1",
    )
    assert (step.result_json, step.error_json, step.attempts) == (None, None, 0)
    assert step.created_at == step.updated_at == T0 + 1
    assert await ledger.get_step(execution.id, 0) == step
    assert await ledger.get_step(execution.id, 1) is None
    assert await ledger.step_by_request_id("req-1") == step
    assert await ledger.step_by_request_id("req-2") is None


async def test_record_step_is_idempotent_on_replay(ledger: Ledger) -> None:
    execution = await ledger.start_execution("chat-1", "{}", now=T0)
    first = await ledger.record_step(
        execution.id, 0, "tool", "search", '{"a":1,"b":2}', "client", T0
    )
    await ledger.resolve(execution.id, 0, '{"hits":[]}', now=T0 + 1)

    # Replay an hour later, keys in another order: the recorded step, unchanged.
    replayed = await ledger.record_step(
        execution.id, 0, "tool", "search", '{"b":2, "a":1}', "client", T0 + HOUR, "req-new"
    )
    assert replayed.state == "applied"
    assert replayed.result() == {"hits": []}
    assert replayed.created_at == first.created_at
    assert replayed.request_id is None
    assert len(await ledger.steps(execution.id)) == 1


async def test_record_step_records_its_spec_and_a_replay_keeps_the_first(ledger: Ledger) -> None:
    execution = await ledger.start_execution("chat-1", "{}", now=T0)
    spec = '{ "name": "search", "outputSchema": {"type": "integer"} }'
    step = await ledger.record_step(
        execution.id, 0, "tool", "search", "{}", "client", T0, "req-1", spec_json=spec
    )
    canonical = '{"name":"search","outputSchema":{"type":"integer"}}'
    assert step.spec_json == canonical
    replayed = await ledger.record_step(
        execution.id, 0, "tool", "search", "{}", "client", T0, "req-2",
        spec_json='{"name":"search"}',
    )  # fmt: skip
    assert replayed.spec_json == canonical
    assert (await ledger.get_step(execution.id, 0)) == step
    with pytest.raises(ValueError):
        await ledger.record_step(
            execution.id, 1, "tool", "search", "{}", "client", T0, "req-3", spec_json="{"
        )
    assert await ledger.get_step(execution.id, 1) is None


async def test_record_step_counts_a_first_attempt_it_is_recorded_with(ledger: Ledger) -> None:
    execution = await ledger.start_execution("chat-1", "{}", now=T0)
    step = await ledger.record_step(
        execution.id, 0, "tool", "search", "{}", "client", T0, "req-1",
        target_connection="conn-1", target_client_id="page\\1",
    )  # fmt: skip
    assert (step.attempts, step.target_connection, step.target_client_id) == (
        1, "conn-1", "page\\1",
    )  # fmt: skip
    assert (await ledger.get_step(execution.id, 0)) == step
    # A replay names no attempt of its own: the step stays as first recorded.
    replayed = await ledger.record_step(
        execution.id, 0, "tool", "search", "{}", "client", T0, "req-2",
        target_connection="conn-2", target_client_id="page-2",
    )  # fmt: skip
    assert replayed == step
    # The next attempt counts on from it.
    assert await ledger.add_attempt(execution.id, 0, T0 + 1, target_connection="conn-2") == 2
    plain = await ledger.record_step(execution.id, 1, "tool", "search", "{}", "client", T0, "r3")
    assert (plain.attempts, plain.target_connection) == (0, None)
    assert (await ledger.get_step(execution.id, 1)) == plain


@pytest.mark.parametrize(
    ("kind", "name", "input_json"),
    [
        ("tool", "search", '{"q":"y"}'),
        ("tool", "lookup", '{"q":"x"}'),
        ("model", "search", '{"q":"x"}'),
    ],
    ids=["different-input", "different-name", "different-kind"],
)
async def test_record_step_raises_divergence(
    ledger: Ledger, kind: str, name: str, input_json: str
) -> None:
    recorded_input = '{"q":"x"}'
    execution = await ledger.start_execution("chat-1", "{}", now=T0)
    await ledger.record_step(execution.id, 0, "model", "gpt", '{"turn":0}', "server", T0)
    await ledger.record_step(execution.id, 1, "tool", "search", '{"q":"x"}', "client", T0)

    with pytest.raises(Divergence) as raised:
        await ledger.record_step(execution.id, 1, kind, name, input_json, "client", T0)  # type: ignore[arg-type]
    message = str(raised.value)
    assert execution.id in message
    assert "seq 1" in message
    assert f"recorded tool 'search' with input {recorded_input}" in message
    assert f"asked {kind} {name!r} with input {input_json}" in message
    assert (raised.value.execution_id, raised.value.seq) == (execution.id, 1)
    # The record is untouched.
    step = await ledger.get_step(execution.id, 1)
    assert step is not None and (step.kind, step.name, step.input_json) == (
        "tool",
        "search",
        '{"q":"x"}',
    )


async def test_check_replay_compares_canonical_input(ledger: Ledger) -> None:
    execution = await ledger.start_execution("chat-1", "{}", now=T0)
    step = await ledger.record_step(execution.id, 0, "tool", "t", '{"a":1,"b":[1,2]}', "client", T0)
    check_replay(step, "tool", "t", '{ "b": [1, 2], "a": 1 }')
    with pytest.raises(Divergence):
        check_replay(step, "tool", "t", '{"a":1,"b":[2,1]}')


async def test_divergence_message_is_short_for_huge_inputs(ledger: Ledger) -> None:
    execution = await ledger.start_execution("chat-1", "{}", now=T0)
    big = json.dumps({"text": "x" * 100_000})
    await ledger.record_step(execution.id, 0, "tool", "t", big, "client", T0)
    with pytest.raises(Divergence) as raised:
        await ledger.record_step(execution.id, 0, "tool", "t", '{"text":"y"}', "client", T0)
    assert len(str(raised.value)) < 1000


async def test_record_step_refuses_oversize_input(ledger: Ledger) -> None:
    execution = await ledger.start_execution("chat-1", "{}", now=T0)
    huge = json.dumps({"text": "x" * MAX_STORED_BYTES})
    with pytest.raises(ValueError, match=r"at most 1,000,000 bytes") as raised:
        await ledger.record_step(execution.id, 0, "tool", "upload", huge, "client", T0)
    assert "'upload'" in str(raised.value)
    assert await ledger.get_step(execution.id, 0) is None


async def test_record_step_refuses_invalid_input_and_unknown_execution(ledger: Ledger) -> None:
    execution = await ledger.start_execution("chat-1", "{}", now=T0)
    with pytest.raises(ValueError, match="not valid JSON"):
        await ledger.record_step(execution.id, 0, "tool", "t", "{oops", "client", T0)
    with pytest.raises(ValueError, match="seq"):
        await ledger.record_step(execution.id, -1, "tool", "t", "{}", "client", T0)
    with pytest.raises(UnknownExecution):
        await ledger.record_step("nope", 0, "tool", "t", "{}", "client", T0)


async def test_record_step_with_a_result_records_it_applied(ledger: Ledger) -> None:
    execution = await ledger.start_execution("chat-1", "{}", now=T0)
    step = await ledger.record_step(
        execution.id, 0, "model", "m", "{}", "server", T0, result_json='{"b": 1, "a": 2}'
    )
    assert (step.state, step.result_json, step.attempts) == ("applied", '{"a":2,"b":1}', 0)
    assert await ledger.get_step(execution.id, 0) == step
    # Replay: the record comes back as it was, whatever result is offered.
    again = await ledger.record_step(
        execution.id, 0, "model", "m", "{}", "server", T0, result_json="3"
    )
    assert again == step
    with pytest.raises(ValueError, match="not valid JSON"):
        await ledger.record_step(
            execution.id, 1, "model", "m", "{}", "server", T0, result_json="{oops"
        )
    assert await ledger.get_step(execution.id, 1) is None


async def test_a_batch_keeps_what_was_written_before_a_divergence(ledger: Ledger) -> None:
    execution = await ledger.start_execution("chat-1", "{}", now=T0)
    await ledger.record_step(execution.id, 1, "tool", "a", "{}", "client", T0)
    with pytest.raises(Divergence):
        async with ledger.batch():
            await ledger.record_step(
                execution.id, 0, "model", "m", "{}", "server", T0, result_json="1"
            )
            await ledger.record_step(execution.id, 1, "tool", "b", "{}", "client", T0)
    assert [(s.seq, s.state) for s in await ledger.steps(execution.id)] == [
        (0, "applied"),
        (1, "pending"),
    ]


async def test_a_sqlite_batch_commits_once_at_its_end(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    async with SqliteLedger(path) as ledger:
        execution = await ledger.start_execution("chat-1", "{}", now=T0)
        reader = sqlite3.connect(path)
        try:
            async with ledger.batch():
                await ledger.record_step(
                    execution.id, 0, "model", "m", "{}", "server", T0, None, "1"
                )
                async with ledger.batch():  # nested: still the outer batch's transaction
                    await ledger.record_step(execution.id, 1, "tool", "t", "{}", "client", T0)
                assert await ledger.get_step(execution.id, 1) is not None
                assert reader.execute("SELECT count(*) FROM steps").fetchone() == (0,)
            assert reader.execute("SELECT count(*) FROM steps").fetchone() == (2,)
        finally:
            reader.close()


async def test_steps_are_ordered_by_seq(ledger: Ledger) -> None:
    execution = await ledger.start_execution("chat-1", "{}", now=T0)
    for seq in (2, 0, 1):
        await ledger.record_step(execution.id, seq, "tool", f"t{seq}", "{}", "server", T0)
    assert [step.seq for step in await ledger.steps(execution.id)] == [0, 1, 2]
    assert await ledger.steps("nope") == []


async def test_pending_steps_filters_session_resolution_and_finished_runs(ledger: Ledger) -> None:
    one = await ledger.start_execution("chat-1", "{}", now=T0)
    two = await ledger.start_execution("chat-2", "{}", now=T0)
    done = await ledger.start_execution("chat-1", "{}", now=T0)
    await ledger.record_step(one.id, 0, "tool", "a", "{}", "client", T0 + 1)
    await ledger.record_step(one.id, 1, "tool", "b", "{}", "approval", T0 + 2)
    await ledger.record_step(two.id, 0, "tool", "c", "{}", "client", T0 + 3)
    await ledger.record_step(done.id, 0, "tool", "d", "{}", "client", T0 + 4)
    await ledger.record_step(one.id, 2, "tool", "e", "{}", "client", T0 + 5)
    await ledger.resolve(one.id, 2, "1", now=T0 + 6)
    await ledger.set_status(two.id, "paused", now=T0 + 7)
    await ledger.set_status(done.id, "completed", now=T0 + 8)

    assert [s.name for s in await ledger.pending_steps()] == ["a", "b", "c"]
    assert [s.name for s in await ledger.pending_steps(session="chat-1")] == ["a", "b"]
    assert [s.name for s in await ledger.pending_steps(resolution="client")] == ["a", "c"]
    assert [s.name for s in await ledger.pending_steps("chat-2", "approval")] == []


# --------------------------------------------------------------------------- resolve / reject


async def test_resolve_applies_a_pending_step(ledger: Ledger) -> None:
    execution_id, seq = await _tool_step(ledger)
    outcome = await ledger.resolve(execution_id, seq, '{"lon": 13.4, "lat": 52.5}', now=T0 + 1)
    assert (outcome.ok, outcome.reason) == (True, "applied")
    step = await ledger.get_step(execution_id, seq)
    assert step is not None
    assert outcome.step == step
    assert step.state == "applied"
    assert step.result_json == '{"lat":52.5,"lon":13.4}'
    assert step.result() == {"lat": 52.5, "lon": 13.4}
    assert step.error() is None
    assert step.updated_at == T0 + 1


async def test_resolve_twice_is_not_pending(ledger: Ledger) -> None:
    execution_id, seq = await _tool_step(ledger)
    await ledger.resolve(execution_id, seq, "1", now=T0 + 1)
    duplicate = await ledger.resolve(execution_id, seq, "2", now=T0 + 2)
    assert (duplicate.ok, duplicate.reason) == (False, "not_pending")
    # The runtime tells "duplicate" from "stale" by the step's state.
    assert duplicate.step is not None and duplicate.step.state == "applied"
    step = await ledger.get_step(execution_id, seq)
    assert step is not None and step.result() == 1


async def test_resolve_unknown_step_is_not_found(ledger: Ledger) -> None:
    execution_id, _ = await _tool_step(ledger)
    for outcome in (
        await ledger.resolve(execution_id, 7, "1", now=T0),
        await ledger.resolve("nope", 0, "1", now=T0),
        await ledger.reject("nope", 0, '{"code":"x","message":"y"}', now=T0),
    ):
        assert (outcome.ok, outcome.reason, outcome.step) == (False, "not_found", None)
        assert outcome.message


async def test_reject_applies_an_error(ledger: Ledger) -> None:
    execution_id, seq = await _tool_step(ledger)
    error = {"code": "tool_error", "message": "boom", "data": {"exception": "RuntimeError"}}
    outcome = await ledger.reject(execution_id, seq, json.dumps(error), now=T0 + 1)
    assert (outcome.ok, outcome.reason) == (True, "applied")
    step = await ledger.get_step(execution_id, seq)
    assert step is not None and step.state == "error"
    assert step.error() == error
    assert step.result_json is None
    with pytest.raises(ValueError, match="no result"):
        step.result()


async def test_reject_after_resolve_is_not_pending(ledger: Ledger) -> None:
    execution_id, seq = await _tool_step(ledger)
    await ledger.resolve(execution_id, seq, '"ok"', now=T0 + 1)
    outcome = await ledger.reject(
        execution_id, seq, '{"code":"timeout","message":"late"}', now=T0 + 2
    )
    assert (outcome.ok, outcome.reason) == (False, "not_pending")
    step = await ledger.get_step(execution_id, seq)
    assert step is not None and step.state == "applied" and step.result() == "ok"


async def test_resolve_after_reject_is_not_pending(ledger: Ledger) -> None:
    execution_id, seq = await _tool_step(ledger)
    await ledger.reject(execution_id, seq, '{"code":"timeout","message":"too slow"}', now=T0 + 1)
    outcome = await ledger.resolve(execution_id, seq, "1", now=T0 + 2)
    assert (outcome.ok, outcome.reason) == (False, "not_pending")
    assert outcome.step is not None and outcome.step.state == "error"


async def test_too_large_result_leaves_the_step_pending(ledger: Ledger) -> None:
    execution_id, seq = await _tool_step(ledger)
    huge = json.dumps("x" * MAX_STORED_BYTES)  # MAX + 2 bytes with the quotes
    outcome = await ledger.resolve(execution_id, seq, huge, now=T0 + 1)
    assert (outcome.ok, outcome.reason) == (False, "too_large")
    assert "1,000,000" in outcome.message
    step = await ledger.get_step(execution_id, seq)
    assert step is not None and step.state == "pending"
    # The call can still be settled, for instance with output_too_large.
    rejected = await ledger.reject(
        execution_id, seq, '{"code":"output_too_large","message":"too big"}', now=T0 + 2
    )
    assert rejected.ok


async def test_size_is_measured_in_utf8_bytes_of_the_canonical_form(ledger: Ledger) -> None:
    execution_id, seq = await _tool_step(ledger)
    # Whitespace does not count: canonical form is exactly the limit.
    padded = '[  "' + "x" * (MAX_STORED_BYTES - 4) + '"  ]'
    assert (await ledger.resolve(execution_id, seq, padded, now=T0)).reason == "applied"

    execution_id, seq = await _tool_step(ledger)
    # Under the limit in characters, over it in UTF-8 bytes.
    accented = json.dumps("é" * (MAX_STORED_BYTES // 2), ensure_ascii=False)
    assert (await ledger.resolve(execution_id, seq, accented, now=T0)).reason == "too_large"


@pytest.mark.parametrize("bad", ["{oops", "", "NaN", "[Infinity]", "1e999", "[" * 100_000])
async def test_invalid_result_json_is_invalid(ledger: Ledger, bad: str) -> None:
    execution_id, seq = await _tool_step(ledger)
    outcome = await ledger.resolve(execution_id, seq, bad, now=T0 + 1)
    assert (outcome.ok, outcome.reason) == (False, "invalid")
    step = await ledger.get_step(execution_id, seq)
    assert step is not None and step.state == "pending"


@pytest.mark.parametrize(
    "bad",
    ["{oops", '"just a string"', '{"code":"x"}', '{"message":"y"}', '{"code":1,"message":"y"}'],
)
async def test_invalid_error_json_is_invalid(ledger: Ledger, bad: str) -> None:
    execution_id, seq = await _tool_step(ledger)
    outcome = await ledger.reject(execution_id, seq, bad, now=T0 + 1)
    assert (outcome.ok, outcome.reason) == (False, "invalid")
    step = await ledger.get_step(execution_id, seq)
    assert step is not None and step.state == "pending"


async def test_a_step_recorded_or_settled_keeps_its_run_from_expiring(ledger: Ledger) -> None:
    # Progress by the steps' own timestamps: the run's row is not written by them.
    recorded = await ledger.start_execution("chat-1", "{}", now=T0)
    await ledger.record_step(recorded.id, 0, "tool", "t", "{}", "client", T0 + HOUR)
    settled, seq = await _tool_step(ledger, "chat-2")
    await ledger.record_step(settled, seq + 1, "tool", "t", "{}", "client", T0)
    await ledger.resolve(settled, seq, "1", now=T0 + HOUR)
    attempted, seq = await _tool_step(ledger, "chat-3")
    assert await ledger.add_attempt(attempted, seq, now=T0 + HOUR) == 1  # a delivery: not progress
    run = await ledger.get_execution(recorded.id)
    assert run is not None and run.updated_at == T0
    assert await ledger.expire_paused(ttl=HOUR / 2, now=T0 + HOUR + 1) == [attempted]
    assert sorted(await ledger.expire_paused(ttl=HOUR / 2, now=T0 + 2 * HOUR)) == sorted(
        [recorded.id, settled]
    )


# --------------------------------------------------------------------------- attempts


async def test_add_attempt_counts_deliveries(ledger: Ledger) -> None:
    execution_id, seq = await _tool_step(ledger)
    assert await ledger.add_attempt(execution_id, seq, now=T0 + 1) == 1
    assert await ledger.add_attempt(execution_id, seq, now=T0 + 2) == 2
    step = await ledger.get_step(execution_id, seq)
    assert step is not None and step.attempts == 2 and step.state == "pending"
    with pytest.raises(UnknownStep):
        await ledger.add_attempt(execution_id, 9, now=T0)


# --------------------------------------------------------------------------- expiry


async def test_paused_run_expires_after_its_ttl(ledger: Ledger) -> None:
    execution_id, seq = await _tool_step(ledger)
    await ledger.set_status(execution_id, "paused", now=T0)

    assert await ledger.expire_paused(ttl=1.0, now=T0 + 1.0) == []  # not yet: strictly older
    assert await ledger.expire_paused(ttl=1.0, now=T0 + 1.5) == [execution_id]

    execution = await ledger.get_execution(execution_id)
    assert execution is not None and execution.status == "expired" and execution.error
    step = await ledger.get_step(execution_id, seq)
    assert step is not None and step.state == "expired"
    error = step.error()
    assert error is not None and error["code"] == "expired" and error["message"]
    assert await ledger.pending_steps() == []
    assert (await ledger.resolve(execution_id, seq, "1", now=T0 + 2)).reason == "not_pending"
    assert await ledger.expire_paused(ttl=1.0, now=T0 + 10) == []  # once only


async def test_hour_old_paused_run_survives_a_day_ttl(ledger: Ledger) -> None:
    execution_id, _ = await _tool_step(ledger)
    await ledger.set_status(execution_id, "paused", now=T0)
    assert await ledger.expire_paused(ttl=DAY, now=T0 + HOUR) == []
    execution = await ledger.get_execution(execution_id)
    assert execution is not None and execution.status == "paused"
    assert len(await ledger.pending_steps()) == 1
    assert await ledger.expire_paused(ttl=DAY, now=T0 + DAY + 1) == [execution_id]


async def test_expiry_covers_running_runs_waiting_on_a_step_only(ledger: Ledger) -> None:
    waiting, _ = await _tool_step(ledger)  # running, one pending step
    busy = await ledger.start_execution("chat-1", "{}", now=T0)  # running, nothing pending
    finished = await ledger.start_execution("chat-1", "{}", now=T0)
    await ledger.set_status(finished.id, "completed", now=T0)

    assert await ledger.expire_paused(ttl=1.0, now=T0 + 5) == [waiting]
    assert [e.id for e in await ledger.executions(["running"])] == [busy.id]
    completed = await ledger.get_execution(finished.id)
    assert completed is not None and completed.status == "completed"


async def test_prune_deletes_finished_executions_past_the_retention_only(ledger: Ledger) -> None:
    done, done_seq = await _tool_step(ledger, "chat-1")
    await ledger.resolve(done, done_seq, '"ok"', now=T0 + 1)
    await ledger.set_status(done, "completed", now=T0 + 2)
    failed = await ledger.start_execution("chat-2", "{}", now=T0)
    await ledger.set_status(failed.id, "error", now=T0 + 2, error="boom")
    expired, _ = await _tool_step(ledger, "chat-3")
    await ledger.set_status(expired, "paused", now=T0)
    assert await ledger.expire_paused(ttl=1.0, now=T0 + 2) == [expired]
    recent = await ledger.start_execution("chat-4", "{}", now=T0 + 50)
    await ledger.set_status(recent.id, "completed", now=T0 + 50)
    # Started with the first ones, finished with the recent one: its finish counts.
    late = await ledger.start_execution("chat-7", "{}", now=T0)
    await ledger.set_status(late.id, "completed", now=T0 + 50)
    old_paused, _ = await _tool_step(ledger, "chat-5")
    await ledger.set_status(old_paused, "paused", now=T0)
    old_running = await ledger.start_execution("chat-6", "{}", now=T0)

    # Strictly older than the retention, like expiry's TTL.
    assert await ledger.prune_finished(retention=100.0, now=T0 + 102) == 0
    assert await ledger.prune_finished(retention=100.0, now=T0 + 102.5) == 3
    for gone in (done, failed.id, expired):
        assert await ledger.get_execution(gone) is None
        assert await ledger.steps(gone) == []
    assert await ledger.get_step(done, done_seq) is None
    remaining = {e.id: e.status for e in await ledger.executions()}
    assert remaining == {
        recent.id: "completed",
        late.id: "completed",
        old_paused: "paused",
        old_running.id: "running",
    }
    assert [s.execution_id for s in await ledger.pending_steps()] == [old_paused]
    assert await ledger.prune_finished(retention=100.0, now=T0 + 102.5) == 0  # once only
    assert await ledger.prune_finished(retention=0.0, now=T0 + 51) == 2  # the recent ones
    with pytest.raises(ValueError):
        await ledger.prune_finished(retention=-1.0, now=T0)


async def test_a_step_recorded_or_settled_leaves_its_run_row_alone_on_postgres(
    postgres: PostgresServer,
) -> None:
    # Progress is read from the steps (quiet_since), so the run's row keeps its one
    # version: no row version written beside it, no dead one for the vacuum.
    url = postgres.fresh_url()
    async with _opened("postgres", url) as ledger:
        execution_id, seq = await _tool_step(ledger)
        await ledger.resolve(execution_id, seq, "1", now=T0 + 1)
        await ledger.record_step(execution_id, seq + 1, "model", "m", "{}", "server", T0 + 2)
    with psycopg.connect(url, autocommit=True) as raw:
        raw.execute("CREATE EXTENSION IF NOT EXISTS pageinspect SCHEMA public")
        versions = raw.execute(
            "SELECT t_xmin FROM public.heap_page_items(public.get_raw_page('executions', 0))"
        ).fetchall()
    assert len(versions) == 1


# --------------------------------------------------------------------------- durability


async def test_a_durable_ledger_keeps_everything_across_a_restart(
    open_durable_ledger: tuple[str, str],
) -> None:
    before = await _open(*open_durable_ledger)
    execution = await before.start_execution("chat-1", '{"messages":["hi"]}', now=T0)
    await before.record_step(execution.id, 0, "model", "scripted", '{"turn":0}', "server", T0)
    await before.resolve(execution.id, 0, '{"text":"calling a tool"}', now=T0 + 1)
    await before.record_step(
        execution.id, 1, "tool", "get_location", "{}", "client", T0 + 2, "req-1"
    )
    await before.add_attempt(execution.id, 1, now=T0 + 2)
    await before.set_status(execution.id, "paused", now=T0 + 3)
    executions_before = await before.executions()
    steps_before = await before.steps(execution.id)
    await before.close()

    after = await _open(*open_durable_ledger)
    try:
        assert await after.executions() == executions_before
        assert await after.steps(execution.id) == steps_before
        assert [s.request_id for s in await after.pending_steps(resolution="client")] == ["req-1"]
        # Replay after the restart: same steps give back the records.
        model = await after.record_step(
            execution.id, 0, "model", "scripted", '{"turn":0}', "server", T0
        )
        assert model.result() == {"text": "calling a tool"}
        assert (await after.resolve(execution.id, 1, '{"lat":1}', now=T0 + 4)).ok
    finally:
        await after.close()


_KILLED_WRITER = """
import asyncio, os, signal, sys
from clienttools_server.ledger import SqliteLedger
from clienttools_server.ledger.postgres import PostgresLedger

async def main(store, where):
    ledger = SqliteLedger(where) if store == "sqlite" else await PostgresLedger.connect(where)
    execution = await ledger.start_execution("chat-1", "{}", now=1.0)
    await ledger.record_step(execution.id, 0, "tool", "get_location", "{}", "client", 2.0)
    await ledger.resolve(execution.id, 0, '{"lat":52.5}', now=3.0)
    await ledger.record_step(execution.id, 1, "tool", "get_time", "{}", "client", 4.0)
    print(execution.id, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # no close, no atexit, no flush of anything else

asyncio.run(main(*sys.argv[1:]))
"""


@pytest.mark.process
async def test_a_durable_ledger_loses_nothing_acknowledged_when_killed(
    open_durable_ledger: tuple[str, str],
) -> None:
    killed = subprocess.run(
        [sys.executable, "-c", _KILLED_WRITER, *open_durable_ledger],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    execution_id = killed.stdout.strip()

    async with _opened(*open_durable_ledger) as reopened:
        steps = await reopened.steps(execution_id)
        assert [(s.seq, s.state) for s in steps] == [(0, "applied"), (1, "pending")]
        assert steps[0].result() == {"lat": 52.5}
        assert [s.name for s in await reopened.pending_steps()] == ["get_time"]


async def test_sqlite_ledger_sets_its_pragmas_and_schema_version(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    await SqliteLedger(path).close()
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    raw.close()


def _old_sqlite_with_a_step(path: Path, version: int) -> None:
    """A file at ``version`` of the old numbering with one pending client step at seq 0."""
    raw = old_sqlite_ledger(path, version)
    raw.execute(
        "INSERT INTO executions (id, session, status, request_json, error, created_at, "
        "updated_at) VALUES ('e1', 'old', 'running', '{}', NULL, ?, ?)",
        (T0, T0),
    )
    raw.execute(
        "INSERT INTO steps (execution_id, seq, kind, name, input_json, resolution, state, "
        "result_json, error_json, request_id, attempts, created_at, updated_at) "
        "VALUES ('e1', 0, 'tool', 'get_location', '{}', 'client', 'pending', NULL, NULL, "
        "'req-1', 0, ?, ?)",
        (T0, T0),
    )
    raw.close()


async def test_a_version_1_ledger_gains_the_spec_column_and_keeps_its_steps(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    _old_sqlite_with_a_step(path, 1)
    async with SqliteLedger(path) as ledger:
        step = await ledger.get_step("e1", 0)
        assert step is not None and step.spec_json is None and step.state == "pending"
        recorded = await ledger.record_spec("e1", 0, '{"name": "t", "outputSchema": {}}')
        assert recorded is not None and recorded.spec() == {"name": "t", "outputSchema": {}}
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    raw.close()


@pytest.mark.parametrize("version", [1, 2, 3, 4, 5])
async def test_a_sqlite_file_of_any_old_version_comes_to_the_one_schema(
    tmp_path: Path, version: int
) -> None:
    """Versions 4 and 5 of the old SQLite numbering had owners and chats, not routing."""
    path = tmp_path / "ledger.sqlite3"
    _old_sqlite_with_a_step(path, version)
    async with SqliteLedger(path) as ledger:
        # Versions 4 and 5 had the owners: a session used after that has none yet.
        assert await ledger.session_owner("old") == ("shared" if version < 4 else None)
        # What version 5 lacked: the chat of an execution, where an invoke went.
        first = await ledger.start_execution("old", "{}", T0, chat_id="c")
        with pytest.raises(ChatBusy):
            await ledger.start_execution("old", "{}", T0, chat_id="c")
        await ledger.add_attempt("e1", 0, T0, target_connection="conn-1")
        assert await ledger.delivered_to(["conn-1"]) == [("req-1", "conn-1", None)]
        assert await ledger.save_chat("c", "old", 0, ['{"id":"m"}'], T0, streaming=first.id) == 1
    with contextlib.closing(sqlite3.connect(path)) as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        tables = {row[0] for row in raw.execute("SELECT name FROM sqlite_master")}
    async with SqliteLedger(path) as again:  # opening again migrates nothing
        assert [s.seq for s in await again.steps("e1")] == [0]
    with contextlib.closing(sqlite3.connect(path)) as raw:
        assert {row[0] for row in raw.execute("SELECT name FROM sqlite_master")} == tables


@pytest.mark.parametrize("version", [1, 5, 6, 7])
async def test_a_postgres_ledger_of_an_old_version_comes_to_the_one_schema(
    postgres: PostgresServer, version: int
) -> None:
    url = postgres.fresh_url()
    old_postgres_ledger(url, version)
    with psycopg.connect(url) as raw:
        raw.execute(
            "INSERT INTO executions (id, session, status, request_json, error, created_at, "
            "updated_at) VALUES ('e1', 'old', 'running', '{}', NULL, %s, %s)",
            (T0, T0),
        )
    async with await PostgresLedger.connect(url) as ledger:
        assert await ledger.session_owner("old") == ("shared" if version < 6 else None)
        await ledger.start_execution("old", "{}", T0, chat_id="c")
        with pytest.raises(ChatBusy):
            await ledger.start_execution("old", "{}", T0, chat_id="c")
    with psycopg.connect(url) as raw:
        assert raw.execute("SELECT version FROM ledger_schema").fetchall() == [(SCHEMA_VERSION,)]
        assert foreign_key_tables(raw) == ["chat_messages"]


async def test_a_postgres_ledger_of_version_11_loses_the_keys_of_steps_and_chunks(
    postgres: PostgresServer,
) -> None:
    url = postgres.fresh_url()
    postgres_ledger_of_version(url, 11)
    with psycopg.connect(url) as raw:
        assert foreign_key_tables(raw) == ["chat_messages", "chunks", "steps"]
    async with await PostgresLedger.connect(url) as ledger:
        await _tool_step(ledger)
        assert await ledger.prune_finished(retention=0.0, now=T0 + 1) == 0
    with psycopg.connect(url) as raw:
        assert raw.execute("SELECT version FROM ledger_schema").fetchall() == [(SCHEMA_VERSION,)]
        assert foreign_key_tables(raw) == ["chat_messages"]


async def test_a_delivery_attempt_leaves_a_settled_step_as_it_was(ledger: Ledger) -> None:
    execution_id, seq = await _tool_step(ledger)
    await ledger.resolve(execution_id, seq, "1", now=T0 + 1)
    await ledger.add_attempt(execution_id, seq, now=T0 + HOUR)  # a late one (another process)
    step = await ledger.get_step(execution_id, seq)
    assert step is not None and step.state == "applied" and step.updated_at == T0 + 1


async def test_both_dialects_make_the_same_tables_and_columns(
    tmp_path: Path, postgres: PostgresServer
) -> None:
    path, url = tmp_path / "ledger.sqlite3", postgres.fresh_url()
    await SqliteLedger(path).close()
    await (await PostgresLedger.connect(url)).close()
    with contextlib.closing(sqlite3.connect(path)) as raw:
        tables = [r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        sqlite_columns = {
            (table, column[1])
            for table in tables
            for column in raw.execute(f"PRAGMA table_info({table})")
        }
    with psycopg.connect(url) as pg:
        rows = pg.execute(
            "SELECT table_name, column_name FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND table_name <> 'ledger_schema'"
        ).fetchall()
    assert sqlite_columns == set(rows)


async def test_a_version_1_postgres_ledger_gains_the_spec_column(postgres: PostgresServer) -> None:
    url = postgres.fresh_url()
    old_postgres_ledger(url, 1)
    with psycopg.connect(url) as raw:
        raw.execute(
            "INSERT INTO executions (id, session, status, request_json, error, created_at, "
            "updated_at) VALUES ('e1', 's', 'running', '{}', NULL, %s, %s)",
            (T0, T0),
        )
        raw.execute(
            "INSERT INTO steps (execution_id, seq, kind, name, input_json, resolution, state, "
            "attempts, created_at, updated_at) "
            "VALUES ('e1', 0, 'tool', 't', '{}', 'client', 'pending', 0, %s, %s)",
            (T0, T0),
        )
    async with await PostgresLedger.connect(url) as ledger:
        step = await ledger.get_step("e1", 0)
        assert step is not None and step.spec_json is None and step.state == "pending"
        recorded = await ledger.record_spec("e1", 0, '{"name": "t", "outputSchema": {}}')
        assert recorded is not None and recorded.spec() == {"name": "t", "outputSchema": {}}
    with psycopg.connect(url) as raw:
        assert raw.execute("SELECT version FROM ledger_schema").fetchall() == [(SCHEMA_VERSION,)]


async def test_the_spec_of_a_step_is_recorded_once(ledger: Ledger) -> None:
    execution_id, seq = await _tool_step(ledger)
    first = await ledger.record_spec(
        execution_id, seq, '{"name":"t","outputSchema":{"type":"integer"}}'
    )
    again = await ledger.record_spec(execution_id, seq, '{"name":"t"}')
    assert first is not None and again is not None
    assert first.spec_json == again.spec_json == '{"name":"t","outputSchema":{"type":"integer"}}'
    assert await ledger.get_step(execution_id, seq) == again
    assert await ledger.record_spec(execution_id, 99, "{}") is None


def test_sqlite_ledger_refuses_a_newer_schema(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    raw = sqlite3.connect(path)
    raw.execute("PRAGMA user_version = 99")
    raw.close()
    with pytest.raises(RuntimeError, match="99"):
        SqliteLedger(path)


async def test_postgres_batch_commits_once_at_its_end(postgres: PostgresServer) -> None:
    url = postgres.fresh_url()
    async with (
        await PostgresLedger.connect(url) as ledger,
        await psycopg.AsyncConnection.connect(url, autocommit=True) as reader,
    ):
        execution = await ledger.start_execution("chat-1", "{}", now=T0)

        async with ledger.batch():
            await ledger.record_step(execution.id, 0, "model", "m", "{}", "server", T0, None, "1")
            async with ledger.batch():  # nested: still the outer batch's transaction
                await ledger.record_step(execution.id, 1, "tool", "t", "{}", "client", T0)
            assert await ledger.get_step(execution.id, 1) is not None
            assert await _count(reader, "steps") == 0
        assert await _count(reader, "steps") == 2


async def _running(reader: psycopg.AsyncConnection[tuple[int]], statement: str) -> bool:
    """Is the statement running at the database, on some connection?"""
    cursor = await reader.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND query = %s",
        (statement,),
    )
    row = await cursor.fetchone()
    return row is not None and row[0] > 0


async def _count(reader: psycopg.AsyncConnection[tuple[int]], table: str) -> int:
    """The committed rows of a table, as another connection sees them."""
    cursor = await reader.execute(f"SELECT count(*) FROM {table}")
    row = await cursor.fetchone()
    assert row is not None
    return row[0]


async def test_a_postgres_batch_keeps_going_after_an_unknown_execution(
    postgres: PostgresServer,
) -> None:
    async with await PostgresLedger.connect(postgres.fresh_url()) as ledger:
        execution = await ledger.start_execution("chat-1", "{}", now=T0)
        async with ledger.batch():
            await ledger.record_step(execution.id, 0, "model", "m", "{}", "server", T0, None, "1")
            with pytest.raises(UnknownExecution):
                await ledger.record_step("nope", 0, "tool", "t", "{}", "client", T0)
            await ledger.record_step(execution.id, 1, "tool", "t", "{}", "client", T0)
        assert [s.seq for s in await ledger.steps(execution.id)] == [0, 1]


async def test_postgres_ledger_records_its_schema_version(postgres: PostgresServer) -> None:
    url = postgres.fresh_url()
    await (await PostgresLedger.connect(url)).close()
    await (await PostgresLedger.connect(url)).close()  # opening again migrates nothing
    with psycopg.connect(url) as raw:
        assert raw.execute("SELECT version FROM ledger_schema").fetchall() == [(SCHEMA_VERSION,)]


async def test_postgres_ledger_refuses_a_newer_schema(postgres: PostgresServer) -> None:
    url = postgres.fresh_url()
    await (await PostgresLedger.connect(url)).close()
    with psycopg.connect(url) as raw:
        raw.execute("UPDATE ledger_schema SET version = 99")
    with pytest.raises(RuntimeError, match="99"):
        await PostgresLedger.connect(url)


async def test_postgres_ledgers_opened_together_migrate_once(postgres: PostgresServer) -> None:
    url = postgres.fresh_url()
    opened = await asyncio.gather(*(PostgresLedger.connect(url) for _ in range(4)))
    try:
        execution = await opened[0].start_execution("chat-1", "{}", now=T0)
        # Every process sees every other's writes: one ledger, shared.
        assert [await other.get_execution(execution.id) for other in opened] == [execution] * 4
    finally:
        for ledger in opened:
            await ledger.close()


async def test_two_processes_settling_one_step_settle_it_once(postgres: PostgresServer) -> None:
    url = postgres.fresh_url()
    first, second = await PostgresLedger.connect(url), await PostgresLedger.connect(url)
    try:
        execution = await first.start_execution("chat-1", "{}", now=T0)
        seqs = range(40)
        for seq in seqs:
            await first.record_step(execution.id, seq, "tool", "t", "{}", "client", T0)

        async def settle_all(ledger: Ledger, value: str) -> list[bool]:
            return [(await ledger.resolve(execution.id, seq, value, T0 + 1)).ok for seq in seqs]

        # Two processes' pools at once: their statements interleave at the database.
        one, two = await asyncio.gather(
            settle_all(first, '"first"'), settle_all(second, '"second"')
        )
        won = list(zip(one, two, strict=True))
        # Every step was applied by exactly one of the two, and holds that one's value.
        assert all(a != b for a, b in won)
        for seq, (first_won, _) in zip(seqs, won, strict=True):
            step = await second.get_step(execution.id, seq)
            assert step is not None and step.result() == ("first" if first_won else "second")
    finally:
        await first.close()
        await second.close()


async def test_text_postgres_cannot_hold_round_trips(postgres: PostgresServer) -> None:
    async with await PostgresLedger.connect(postgres.fresh_url()) as ledger:
        session, name, request_id = "a\x00b\\0", "t\x00", "r\\\x00"
        execution = await ledger.start_execution(session, "{}", now=T0)
        step = await ledger.record_step(
            execution.id, 0, "tool", name, "{}", "client", T0, request_id
        )
        await ledger.set_status(execution.id, "error", now=T0, error="boom\x00")
        assert await ledger.get_execution(execution.id) == dataclasses.replace(
            execution, status="error", error="boom\x00"
        )
        assert await ledger.executions(session=session) == [
            await ledger.get_execution(execution.id)
        ]
        assert await ledger.executions(session="a") == []
        found = await ledger.step_by_request_id(request_id)
        assert found is not None and (found.name, found.request_id) == (name, request_id)
        assert found.seq == step.seq


async def test_calls_fail_clearly_while_the_database_is_away(postgres: PostgresServer) -> None:
    async with await PostgresLedger.connect(postgres.fresh_url(), timeout=1.0) as ledger:
        execution_id, seq = await _tool_step(ledger)
        postgres.stop()
        try:
            started = time.monotonic()
            with pytest.raises(LedgerUnavailable, match="unreachable"):
                await ledger.resolve(execution_id, seq, "1", now=T0 + 1)
            with pytest.raises(LedgerUnavailable):
                await ledger.get_step(execution_id, seq)
            # Failing is quick: the timeout, not a hang.
            assert time.monotonic() - started < 30
        finally:
            postgres.start_again()
        # Back again: the pool reconnects, and nothing was written while it was away.
        step = await wait_for(lambda: ledger.get_step(execution_id, seq))
        assert step.state == "pending"
        assert (await ledger.resolve(execution_id, seq, "1", now=T0 + 2)).ok


async def test_a_postgres_ledger_with_no_database_fails_to_open_clearly(tmp_path: Path) -> None:
    with pytest.raises(LedgerUnavailable, match="could not connect"):
        await PostgresLedger.connect(f"postgresql://nobody@/none?host={tmp_path}", timeout=0.5)


async def wait_for(read: Callable[[], Awaitable[Step | None]], timeout: float = 30.0) -> Step:
    """What ``read`` returns once the ledger answers again (each try waits the ledger's timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            found = await read()
        except LedgerUnavailable:
            if time.monotonic() > deadline:
                raise
            continue
        assert found is not None
        return found


async def test_sqlite_ledger_works_in_memory() -> None:
    async with SqliteLedger(":memory:") as in_memory:
        execution_id, seq = await _tool_step(in_memory)
        assert (await in_memory.resolve(execution_id, seq, "1", now=T0)).ok


async def test_a_closed_ledger_refuses_calls(ledger: Ledger) -> None:
    await ledger.close()
    await ledger.close()  # closing twice is fine
    with pytest.raises(LedgerClosed):
        await ledger.executions()
    with pytest.raises(LedgerClosed):
        await ledger.start_execution("chat-1", "{}", now=T0)


# --------------------------------------------------------------------------- property

settle_call = st.tuples(
    st.sampled_from(["resolve", "reject"]),
    st.one_of(
        st.just("1"),
        st.just('{"code":"tool_error","message":"boom"}'),
        st.just("{oops"),
        st.just('"' + "x" * MAX_STORED_BYTES + '"'),
        st.text(max_size=20),
    ),
)


@pytest.mark.parametrize("kind", STORES)
def test_a_step_is_settled_at_most_once(kind: str, request: pytest.FixtureRequest) -> None:
    # One PostgreSQL schema for every example (each example starts its own execution);
    # a fresh SQLite ledger per example. Each example runs in an event loop of its own.
    url = request.getfixturevalue("postgres").fresh_url() if kind == "postgres" else ""
    files: pytest.TempPathFactory = request.getfixturevalue("tmp_path_factory")

    def fresh() -> tuple[str, str]:
        if kind == "sqlite":
            return "sqlite", str(files.mktemp("settle") / "ledger.sqlite3")
        return kind, url if kind == "postgres" else ":memory:"

    async def example(calls: list[tuple[str, str]]) -> None:
        async with _opened(*fresh()) as ledger:
            await settled_at_most_once(ledger, calls)

    @settings(max_examples=60, deadline=None)
    @given(calls=st.lists(settle_call, max_size=8))
    def check(calls: list[tuple[str, str]]) -> None:
        asyncio.run(example(calls))

    check()


async def settled_at_most_once(ledger: Ledger, calls: list[tuple[str, str]]) -> None:
    execution_id, seq = await _tool_step(ledger)
    applied: list[tuple[str, str]] = []
    for number, (method, payload) in enumerate(calls):
        settle = ledger.resolve if method == "resolve" else ledger.reject
        outcome = await settle(execution_id, seq, payload, T0 + number)
        if outcome.ok:
            applied.append((method, payload))
        else:
            assert outcome.reason in {"not_pending", "too_large", "invalid"}
    assert len(applied) <= 1
    step = await ledger.get_step(execution_id, seq)
    assert step is not None
    if not applied:
        assert step.state == "pending"
    elif applied[0][0] == "resolve":
        assert step.state == "applied"
        assert step.result() == json.loads(applied[0][1])
    else:
        assert step.state == "error"
        assert step.error() == json.loads(applied[0][1])


# -- leases: one owner per running execution, fenced by its generation


async def test_a_started_execution_is_held_and_its_lease_renewed(ledger: Ledger) -> None:
    execution = await ledger.start_execution("chat-1", "{}", now=T0)
    assert (execution.generation, execution.lease_until) == (1, T0 + 10)
    stored = await ledger.get_execution(execution.id)
    assert stored is not None and stored.owner == execution.owner is not None
    assert await ledger.renew(T0 + 5) == []
    renewed = await ledger.get_execution(execution.id)
    assert renewed is not None and (renewed.generation, renewed.lease_until) == (1, T0 + 15)


async def test_an_execution_started_in_a_batch_is_held_once_the_batch_commits(
    ledger: Ledger,
) -> None:
    # A renewal meanwhile (another task: on PostgreSQL another connection, which does
    # not see the row yet) must not take the uncommitted start for a lost lease.
    started = asyncio.Event()
    finish = asyncio.Event()

    async def start() -> str:
        async with ledger.batch():
            execution = await ledger.start_execution("chat-1", "{}", now=T0)
            started.set()
            await finish.wait()
        return execution.id

    starting = asyncio.create_task(start())
    await started.wait()
    assert await ledger.renew(T0 + 1) == []
    finish.set()
    execution_id = await starting
    assert await ledger.renew(T0 + 5) == []
    renewed = await ledger.get_execution(execution_id)
    assert renewed is not None and (renewed.generation, renewed.lease_until) == (1, T0 + 15)
    await ledger.set_status(execution_id, "completed", T0 + 6)


async def test_a_lapsed_lease_is_taken_over_and_the_old_owner_writes_nothing(
    open_durable_ledger: tuple[str, str],
) -> None:
    async with _opened(*open_durable_ledger) as old, _opened(*open_durable_ledger) as new:
        execution = await old.start_execution("chat-1", "{}", now=T0)
        await old.record_step(execution.id, 0, "tool", "get_location", "{}", "client", T0)
        [taken] = await new.take_over(T0 + 11)
        assert (taken.id, taken.generation, taken.owner) != (execution.id, 1, execution.owner)
        assert taken.id == execution.id and taken.generation == 2
        before = (await new.get_execution(execution.id), await new.steps(execution.id))
        writes: list[Callable[[], Awaitable[object]]] = [
            lambda: old.record_step(execution.id, 1, "model", "m", "{}", "server", T0 + 12),
            lambda: old.resolve(execution.id, 0, '{"lat":1}', T0 + 12),
            lambda: old.reject(execution.id, 0, '{"code":"x","message":"y"}', T0 + 12),
            lambda: old.add_attempt(execution.id, 0, T0 + 12),
            lambda: old.record_spec(execution.id, 0, '{"name":"get_location"}'),
            lambda: old.set_status(execution.id, "completed", T0 + 12),
        ]
        for write in writes:
            with pytest.raises(LeaseLost, match="another process took the run over"):
                await write()
        # The writes found it lost: the next renewal reports it, once, so that its run
        # stops even when the task that met the LeaseLost was not the run's own.
        assert await old.renew(T0 + 12) == [execution.id]
        assert await old.renew(T0 + 13) == []
        assert (await new.get_execution(execution.id), await new.steps(execution.id)) == before
        # The new owner writes as before, and renews what it holds.
        assert (await new.resolve(execution.id, 0, '{"lat":1}', T0 + 13)).ok
        assert await new.renew(T0 + 14) == []
        await new.set_status(execution.id, "completed", T0 + 15)
        finished = await new.get_execution(execution.id)
        assert finished is not None and finished.status == "completed"


async def test_a_lease_lost_is_found_by_the_next_renewal(
    open_durable_ledger: tuple[str, str],
) -> None:
    async with _opened(*open_durable_ledger) as old, _opened(*open_durable_ledger) as new:
        execution = await old.start_execution("chat-1", "{}", now=T0)
        assert [e.id for e in await new.take_over(T0 + 11)] == [execution.id]
        assert await old.renew(T0 + 12) == [execution.id]
        with pytest.raises(LeaseLost):
            await old.set_status(execution.id, "error", T0 + 12, "stale")
        # Taking it back (the new owner's lease lapsed in turn) lifts the fence.
        [back] = await old.take_over(T0 + 30)
        assert back.generation == 3
        await old.set_status(execution.id, "completed", T0 + 31)
        with pytest.raises(LeaseLost):
            await new.set_status(execution.id, "error", T0 + 31)


async def test_a_lease_lost_and_taken_back_before_a_renewal_is_not_reported(
    open_durable_ledger: tuple[str, str],
) -> None:
    async with _opened(*open_durable_ledger) as old, _opened(*open_durable_ledger) as new:
        execution = await old.start_execution("chat-1", "{}", now=T0)
        await new.take_over(T0 + 11)
        with pytest.raises(LeaseLost):  # found by a write, in some task
            await old.set_status(execution.id, "error", T0 + 12, "stale")
        [back] = await old.take_over(T0 + 30)  # ours again before any renewal
        assert back.id == execution.id
        assert await old.renew(T0 + 31) == []  # its run goes on: nothing to stop


async def test_finished_executions_are_never_taken_over(ledger: Ledger) -> None:
    execution = await ledger.start_execution("chat-1", "{}", now=T0)
    await ledger.set_status(execution.id, "completed", T0 + 1)
    assert await ledger.take_over(T0 + HOUR) == []


async def test_a_live_lease_on_postgres_is_not_taken_over(postgres: PostgresServer) -> None:
    """Many processes share PostgreSQL: a run whose owner renews stays with it."""
    url = postgres.fresh_url()
    async with (
        await PostgresLedger.connect(url) as owner,
        await PostgresLedger.connect(url) as other,
    ):
        execution = await owner.start_execution("chat-1", "{}", now=T0)
        assert await other.take_over(T0 + 5) == []
        assert await owner.renew(T0 + 9) == []
        assert await other.take_over(T0 + 15) == []
        assert [e.id for e in await other.take_over(T0 + 20)] == [execution.id]


async def test_a_sqlite_file_takes_over_what_another_instance_held(tmp_path: Path) -> None:
    """A SQLite file has one server process: an instance before it on the file is gone."""
    path = tmp_path / "ledger.sqlite3"
    async with SqliteLedger(path) as before:
        execution = await before.start_execution("chat-1", "{}", now=T0)
    async with SqliteLedger(path) as after:
        [taken] = await after.take_over(T0 + 1)
        assert (taken.id, taken.generation) == (execution.id, 2)
        assert await after.take_over(T0 + 2) == []  # its own, live


# --------------------------------------------------------------------------- registrations (S2)


async def test_registrations_are_ordered_and_a_page_that_moved_leaves_its_old_one(
    ledger: Ledger,
) -> None:
    await ledger.keep_alive(T0)
    first = await ledger.register("conn-1", "s", "page-a", '[{"name":"t"}]')
    second = await ledger.register("conn-2", "s", "page-b", "[]")
    await ledger.register("conn-9", "other", "page-a", "[]")  # another session: untouched
    assert first < second
    assert [r.connection_id for r in await ledger.registrations("s", T0)] == ["conn-1", "conn-2"]
    [one] = [r for r in await ledger.registrations("s", T0) if r.connection_id == "conn-1"]
    assert (one.session, one.process_id, one.client_id, one.tools_json) == (
        "s", ledger.owner, "page-a", '[{"name":"t"}]',
    )  # fmt: skip
    # page-a again, on a new connection: its old registration goes; the new one is newest.
    third = await ledger.register("conn-3", "s", "page-a", "[]")
    assert third > second
    assert [r.connection_id for r in await ledger.registrations("s", T0)] == ["conn-2", "conn-3"]
    assert not await ledger.registered("conn-1", T0) and await ledger.registered("conn-3", T0)
    # The same connection registering again is newest again.
    assert await ledger.register("conn-2", "s", "page-b", "[]") > third
    assert [r.connection_id for r in await ledger.registrations("s", T0)] == ["conn-3", "conn-2"]
    await ledger.unregister("conn-2")
    await ledger.unregister("conn-2")  # twice: nothing more
    assert [r.connection_id for r in await ledger.registrations("s", T0)] == ["conn-3"]
    assert [r.connection_id for r in await ledger.registrations("other", T0)] == ["conn-9"]


async def test_keep_alive_names_this_process_alive(ledger: Ledger) -> None:
    assert ledger.owner in await ledger.keep_alive(T0)


async def test_the_registrations_of_a_dead_process_do_not_count(postgres: PostgresServer) -> None:
    url = postgres.fresh_url()
    lease = 10.0
    async with (
        await PostgresLedger.connect(url, lease=lease) as a,
        await PostgresLedger.connect(url, lease=lease) as b,
    ):
        assert await a.keep_alive(T0) == {a.owner}
        assert await b.keep_alive(T0) == {a.owner, b.owner}
        await a.register("on-a", "s", "page-a", "[]")
        await b.register("on-b", "s", "page-b", "[]")
        assert [r.process_id for r in await b.registrations("s", T0 + 1)] == [a.owner, b.owner]
        # a stops renewing: past its lease it is dead to b, though its rows are there.
        later = T0 + lease + 1
        assert await b.keep_alive(later) == {b.owner}
        assert [r.connection_id for r in await b.registrations("s", later)] == ["on-b"]
        assert not await b.registered("on-a", later) and await b.registered("on-b", later)
        # A process counts its own registrations whatever its row says.
        assert [r.connection_id for r in await a.registrations("s", later)] == ["on-a", "on-b"]
        # Back from a stall (SIGSTOP): its registrations count again.
        await a.keep_alive(later)
        assert [r.connection_id for r in await b.registrations("s", later)] == ["on-a", "on-b"]
        # Then dead for ten leases (past its renewal to later + lease): its rows go.
        await b.keep_alive(later + 11 * lease + 1)
        with psycopg.connect(url) as raw:
            assert raw.execute("SELECT connection_id FROM registrations").fetchall() == [("on-b",)]
            assert raw.execute("SELECT id FROM processes").fetchall() == [(b.owner,)]


async def test_an_attempt_records_where_its_invoke_went(postgres: PostgresServer) -> None:
    async with await PostgresLedger.connect(postgres.fresh_url()) as ledger:
        execution_id, seq = await _tool_step(ledger)
        await ledger.add_attempt(
            execution_id, seq, T0, target_connection="c1", target_client_id="p"
        )
        step = await ledger.get_step(execution_id, seq)
        assert step is not None and (step.target_connection, step.target_client_id) == ("c1", "p")
        await ledger.add_attempt(
            execution_id, seq, T0, target_connection="c2", target_client_id="p\x00"
        )
        [again] = await ledger.steps(execution_id)
        assert (again.attempts, again.target_connection, again.target_client_id) == (
            2, "c2", "p\x00",
        )  # fmt: skip


async def test_the_pending_calls_last_invoked_on_a_connection(postgres: PostgresServer) -> None:
    async with await PostgresLedger.connect(postgres.fresh_url()) as ledger:
        execution_id, _ = await _tool_step(ledger)
        await ledger.record_step(execution_id, 1, "tool", "t", "{}", "client", T0, "req-1")
        await ledger.record_step(execution_id, 2, "tool", "t", "{}", "client", T0, "req-2")
        await ledger.add_attempt(execution_id, 1, T0, target_connection="c1", target_client_id="p")
        await ledger.add_attempt(execution_id, 2, T0, target_connection="c2", target_client_id="p")
        assert await ledger.delivered_to(["c1", "c9"]) == [("req-1", "c1", ledger.owner)]
        await ledger.resolve(execution_id, 1, "1", T0)
        assert await ledger.delivered_to(["c1", "c2"]) == [("req-2", "c2", ledger.owner)]
        assert await ledger.delivered_to([]) == []
    async with SqliteLedger(":memory:") as sqlite:
        assert await sqlite.delivered_to(["c1"]) == []


async def test_an_approval_is_found_by_its_tool_call_id_in_its_session(
    postgres: PostgresServer,
) -> None:
    async with await PostgresLedger.connect(postgres.fresh_url()) as ledger:
        execution = await ledger.start_execution("s", "{}", now=T0)
        await ledger.record_step(execution.id, 0, "tool", "approval:t", "{}", "approval", T0)
        assert await ledger.approval_step("s", "call-1") is None  # not marked yet
        await ledger.mark_approval(execution.id, 0, "call-1")
        found = await ledger.approval_step("s", "call-1")
        assert found is not None and (found[0].seq, found[1]) == (0, ledger.owner)
        assert await ledger.approval_step("other", "call-1") is None
        await ledger.resolve(execution.id, 0, '{"approved":true}', T0)
        assert await ledger.approval_step("s", "call-1") is None  # answered: pending no more


# ----------------------------------------------------------- after_commit, batches and tasks


async def test_after_commit_outside_a_batch_runs_at_once(ledger: Ledger) -> None:
    ran: list[str] = []
    ledger.after_commit(lambda: ran.append("now"))
    assert ran == ["now"]


async def test_after_commit_in_a_batch_runs_after_the_commit_in_order(ledger: Ledger) -> None:
    execution = await ledger.start_execution("chat-1", "{}", now=T0)
    ran: list[str] = []
    async with ledger.batch():
        await ledger.record_step(execution.id, 0, "tool", "t", "{}", "client", T0)
        ledger.after_commit(lambda: ran.append("first"))
        await ledger.record_step(execution.id, 1, "tool", "t", "{}", "client", T0)
        ledger.after_commit(lambda: ran.append("second"))
        assert ran == []
    assert ran == ["first", "second"]
    # The batch is over: the next action runs at once again.
    ledger.after_commit(lambda: ran.append("third"))
    assert ran == ["first", "second", "third"]


async def test_after_commit_in_nested_batches_waits_for_the_outermost(ledger: Ledger) -> None:
    execution = await ledger.start_execution("chat-1", "{}", now=T0)
    ran: list[str] = []
    async with ledger.batch():
        ledger.after_commit(lambda: ran.append("outer"))
        async with ledger.batch():
            await ledger.record_step(execution.id, 0, "tool", "t", "{}", "client", T0)
            ledger.after_commit(lambda: ran.append("inner"))
        assert ran == []  # the inner batch ended, but nothing is committed yet
        ledger.after_commit(lambda: ran.append("after inner"))
    assert ran == ["outer", "inner", "after inner"]


async def test_after_commit_runs_when_a_refusal_leaves_the_writes_before_it(
    ledger: Ledger,
) -> None:
    execution = await ledger.start_execution("chat-1", "{}", now=T0)
    await ledger.record_step(execution.id, 1, "tool", "a", "{}", "client", T0)
    ran: list[str] = []
    with pytest.raises(Divergence):
        async with ledger.batch():
            await ledger.record_step(execution.id, 0, "model", "m", "{}", "server", T0, None, "1")
            ledger.after_commit(lambda: ran.append("model step"))
            await ledger.record_step(execution.id, 1, "tool", "b", "{}", "client", T0)
            ledger.after_commit(lambda: ran.append("never registered"))
    # The model step was committed, so what announces it goes.
    assert ran == ["model step"]
    assert [s.seq for s in await ledger.steps(execution.id)] == [0, 1]


_FAILING_SETTLE_SQLITE = (
    "CREATE TRIGGER no_settling BEFORE UPDATE OF state ON steps "
    "BEGIN SELECT RAISE(ABORT, 'no settling today'); END"
)
_FAILING_SETTLE_POSTGRES = (
    "CREATE FUNCTION no_settling() RETURNS trigger LANGUAGE plpgsql AS "
    "$$ BEGIN RAISE EXCEPTION 'no settling today'; END $$",
    "CREATE TRIGGER no_settling BEFORE UPDATE OF state ON steps "
    "FOR EACH ROW EXECUTE FUNCTION no_settling()",
)


async def test_after_commit_is_dropped_when_a_database_error_rolls_the_batch_back(
    open_durable_ledger: tuple[str, str],
) -> None:
    store, where = open_durable_ledger
    async with _opened(store, where) as ledger:
        execution_id, seq = await _tool_step(ledger)
        # The database refuses to settle steps: finishing the run fails halfway
        # through its writes, which takes the whole batch back.
        if store == "sqlite":
            with contextlib.closing(sqlite3.connect(where)) as raw:
                raw.execute(_FAILING_SETTLE_SQLITE)
        else:
            with psycopg.connect(where, autocommit=True) as pg:
                for statement in _FAILING_SETTLE_POSTGRES:
                    pg.execute(statement)
        ran: list[str] = []
        with pytest.raises((sqlite3.DatabaseError, psycopg.Error), match="no settling today"):
            async with ledger.batch():
                await ledger.record_step(execution_id, 1, "tool", "t", "{}", "client", T0)
                ledger.after_commit(lambda: ran.append("step 1"))
                await ledger.set_status(execution_id, "completed", T0 + 1)
        assert ran == []
        assert [s.seq for s in await ledger.steps(execution_id)] == [seq]
        execution = await ledger.get_execution(execution_id)
        assert execution is not None and execution.status == "running"


async def test_after_commit_sees_the_batch_committed(open_durable_ledger: tuple[str, str]) -> None:
    store, where = open_durable_ledger

    def committed_steps() -> int:
        """Counted on a connection of its own: what is committed, not the batch's view."""
        if store == "sqlite":
            with contextlib.closing(sqlite3.connect(where)) as raw:
                row = raw.execute("SELECT count(*) FROM steps").fetchone()
        else:
            with psycopg.connect(where) as pg:
                row = pg.execute("SELECT count(*) FROM steps").fetchone()
        assert row is not None
        return int(row[0])

    async with _opened(store, where) as ledger:
        execution = await ledger.start_execution("chat-1", "{}", now=T0)
        seen: list[int] = []
        async with ledger.batch():
            await ledger.record_step(execution.id, 0, "tool", "t", "{}", "client", T0)
            await ledger.record_step(execution.id, 1, "tool", "t", "{}", "client", T0)
            ledger.after_commit(lambda: seen.append(committed_steps()))
            assert committed_steps() == 0
        assert seen == [2]


async def test_two_tasks_hold_a_postgres_batch_each_apart(postgres: PostgresServer) -> None:
    async with await PostgresLedger.connect(postgres.fresh_url()) as ledger:
        mine = await ledger.start_execution("chat-1", "{}", now=T0)
        theirs = await ledger.start_execution("chat-2", "{}", now=T0)
        written = {mine.id: asyncio.Event(), theirs.id: asyncio.Event()}
        read = {mine.id: asyncio.Event(), theirs.id: asyncio.Event()}
        ran: list[str] = []

        async def in_a_batch(own: str, other: str) -> tuple[bool, bool]:
            async with ledger.batch():
                await ledger.record_step(own, 0, "tool", "t", "{}", "client", T0)
                ledger.after_commit(lambda: ran.append(own))
                written[own].set()
                await written[other].wait()  # both batches are open now, both have written
                sees_own = await ledger.get_step(own, 0) is not None
                sees_other = await ledger.get_step(other, 0) is not None
                read[own].set()
                await read[other].wait()  # neither commits before both have read
                assert own not in ran  # its own commit waits for its batch to end
            return sees_own, sees_other

        both = await asyncio.wait_for(
            asyncio.gather(in_a_batch(mine.id, theirs.id), in_a_batch(theirs.id, mine.id)),
            timeout=30,
        )
        # Each saw its own uncommitted write and not the other's.
        assert list(both) == [(True, False), (True, False)]
        assert sorted(ran) == sorted([mine.id, theirs.id])
        assert await ledger.get_step(mine.id, 0) is not None
        assert await ledger.get_step(theirs.id, 0) is not None


async def test_another_tasks_calls_are_not_part_of_a_postgres_batch(
    postgres: PostgresServer,
) -> None:
    url = postgres.fresh_url()
    async with (
        await PostgresLedger.connect(url) as ledger,
        await psycopg.AsyncConnection.connect(url, autocommit=True) as reader,
    ):
        batched = await ledger.start_execution("chat-1", "{}", now=T0)
        alone = await ledger.start_execution("chat-2", "{}", now=T0)
        ran: list[str] = []

        async def another_task() -> bool:
            # Spawned inside the batch (its context holds the batch), yet not in it.
            sees_the_batch = await ledger.get_step(batched.id, 0) is not None
            await ledger.record_step(alone.id, 0, "tool", "t", "{}", "client", T0)
            ledger.after_commit(lambda: ran.append("alone"))
            return sees_the_batch

        async with ledger.batch():
            await ledger.record_step(batched.id, 0, "tool", "t", "{}", "client", T0)
            ledger.after_commit(lambda: ran.append("batched"))
            spawned = asyncio.create_task(another_task())
            assert await spawned is False
            # The other task's write is committed already, the batch's is not.
            assert ran == ["alone"]
            assert await _count(reader, "steps") == 1
        assert ran == ["alone", "batched"]
        assert await _count(reader, "steps") == 2


async def test_a_task_spawned_in_a_postgres_batch_does_not_use_it_once_ended(
    postgres: PostgresServer,
) -> None:
    url = postgres.fresh_url()
    async with (
        await PostgresLedger.connect(url) as ledger,
        await psycopg.AsyncConnection.connect(url, autocommit=True) as reader,
    ):
        execution = await ledger.start_execution("chat-1", "{}", now=T0)
        ended = asyncio.Event()

        async def later() -> None:
            await ended.wait()
            await ledger.record_step(execution.id, 1, "tool", "t", "{}", "client", T0)

        async with ledger.batch():
            await ledger.record_step(execution.id, 0, "tool", "t", "{}", "client", T0)
            spawned = asyncio.create_task(later())
        ended.set()
        await asyncio.wait_for(spawned, timeout=30)
        # Its write was committed on a connection of its own, not left in a
        # transaction on the batch's connection, back in the pool.
        assert await _count(reader, "steps") == 2


@pytest.mark.process
async def test_a_postgres_batch_cancelled_mid_statement_commits_nothing(
    postgres: PostgresServer,
) -> None:
    url = postgres.fresh_url()
    async with (
        await PostgresLedger.connect(url) as ledger,
        await psycopg.AsyncConnection.connect(url, autocommit=True) as reader,
    ):
        execution = await ledger.start_execution("chat-1", "{}", now=T0)
        ran: list[str] = []

        async def slow_batch() -> None:
            async with ledger.batch():
                await ledger.record_step(execution.id, 0, "tool", "t", "{}", "client", T0)
                ledger.after_commit(lambda: ran.append("step 0"))
                await ledger.statement("SELECT pg_sleep(60)", ())

        task = asyncio.create_task(slow_batch())
        async with asyncio.timeout(30):
            while not await _running(reader, "SELECT pg_sleep(60)"):
                await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, timeout=30)
        # The interrupted statement aborted the transaction: nothing of it stays,
        # and nothing announces it.
        assert ran == []
        assert await _count(reader, "steps") == 0
        # The ledger goes on.
        await ledger.record_step(execution.id, 0, "tool", "t", "{}", "client", T0)
        assert await _count(reader, "steps") == 1


async def test_a_postgres_batch_idle_past_the_lease_lets_its_run_go(
    postgres: PostgresServer,
) -> None:
    """A process stopped inside a batch must not keep its run locked from the next owner."""
    url = postgres.fresh_url()
    lease = 1.0
    async with (
        await PostgresLedger.connect(url, lease=lease) as stalled,
        await PostgresLedger.connect(url, lease=lease) as other,
    ):
        execution = await stalled.start_execution("chat-1", "{}", now=T0)
        with pytest.raises(LedgerUnavailable):
            async with stalled.batch():
                # The fence locks the run's row until the batch ends.
                await stalled.record_step(execution.id, 0, "tool", "t", "{}", "client", T0)
                assert await other.take_over(T0 + 2 * lease) == []  # locked: skipped
                # Stalled past its lease inside the batch: the server ends the session.
                async with asyncio.timeout(30):
                    while not (taken := await other.take_over(T0 + 2 * lease)):
                        await asyncio.sleep(0.05)
                assert [e.id for e in taken] == [execution.id]
        # Nothing of the batch was committed.
        assert await other.steps(execution.id) == []


# --------------------------------------------------------------------------- session owners (O1)


async def test_the_first_principal_to_claim_a_session_owns_it(ledger: Ledger) -> None:
    assert await ledger.session_owner("desk") is None
    assert await ledger.claim_session("desk", "alice", T0) == "alice"
    # A later claim changes nothing and names the owner.
    assert await ledger.claim_session("desk", "bob", T0 + 1) == "alice"
    assert await ledger.claim_session("desk", "alice", T0 + 2) == "alice"
    assert await ledger.session_owner("desk") == "alice"
    assert await ledger.claim_session("bench", "bob", T0) == "bob"
    assert await ledger.claim_session("attic", "alice", T0) == "alice"
    assert await ledger.sessions_owned_by("alice") == ["attic", "desk"]
    assert await ledger.sessions_owned_by("bob") == ["bench"]
    assert await ledger.sessions_owned_by("carol") == []


async def test_owners_round_trip_any_text(ledger: Ledger) -> None:
    session, principal = "s\x00\\0é", "p\x00\\"
    assert await ledger.claim_session(session, principal, T0) == principal
    assert await ledger.session_owner(session) == principal
    assert await ledger.sessions_owned_by(principal) == [session]


async def test_owners_survive_a_restart(open_durable_ledger: tuple[str, str]) -> None:
    async with _opened(*open_durable_ledger) as ledger:
        await ledger.claim_session("desk", "alice", T0)
    async with _opened(*open_durable_ledger) as ledger:
        assert await ledger.session_owner("desk") == "alice"
        assert await ledger.claim_session("desk", "bob", T0) == "alice"


# --------------------------------------------------------------------------- remembered tools


async def test_a_sessions_tools_are_kept_newest_last_and_capped(ledger: Ledger) -> None:
    await ledger.remember_tools("desk", {"b": '{"n":1}', "a": '{"n":1}'}, T0, keep=3)
    await ledger.remember_tools("desk", {"b": '{"n":2}'}, T0 + 1, keep=3)
    await ledger.remember_tools("desk", {"c": '{"n":1}'}, T0 + 2, keep=3)
    await ledger.remember_tools("bench", {"x": "{}"}, T0, keep=3)
    assert list((await ledger.remembered_tools("desk")).items()) == [
        ("a", '{"n":1}'),
        ("b", '{"n":2}'),
        ("c", '{"n":1}'),
    ]
    await ledger.remember_tools("desk", {"d": "{}"}, T0 + 3, keep=3)  # the oldest goes
    assert list(await ledger.remembered_tools("desk")) == ["b", "c", "d"]
    assert await ledger.remembered_tools("bench") == {"x": "{}"}
    assert await ledger.remembered_tools("attic") == {}
    await ledger.remember_tools("desk", {}, T0 + 4, keep=3)  # nothing to write
    assert list(await ledger.remembered_tools("desk")) == ["b", "c", "d"]
    with pytest.raises(ValueError):
        await ledger.remember_tools("desk", {"e": "{}"}, T0, keep=0)


async def test_remembered_tools_round_trip_any_text(ledger: Ledger) -> None:
    session, name, spec = "s\x00\\0é", "t\x00", '{"d":"\\u0000 \\\\ é"}'
    await ledger.remember_tools(session, {name: spec}, T0, keep=1)
    assert await ledger.remembered_tools(session) == {name: spec}


async def test_remembered_tools_survive_a_restart(open_durable_ledger: tuple[str, str]) -> None:
    async with _opened(*open_durable_ledger) as ledger:
        await ledger.remember_tools("desk", {"t": "{}"}, T0, keep=4)
    async with _opened(*open_durable_ledger) as ledger:
        assert await ledger.remembered_tools("desk") == {"t": "{}"}


async def test_remembered_tools_go_once_old_and_no_run_of_their_session_is_unfinished(
    ledger: Ledger,
) -> None:
    for session in ("idle", "paused", "recent"):
        await ledger.remember_tools(session, {"t": "{}"}, T0, keep=4)
    await ledger.remember_tools("recent", {"t": "{}"}, T0 + 100, keep=4)
    await ledger.start_execution("paused", "{}", T0)
    done = await ledger.start_execution("idle", "{}", T0)
    await ledger.set_status(done.id, "completed", T0 + 1)
    with pytest.raises(ValueError):
        await ledger.prune_session_tools(-1, T0)
    assert await ledger.prune_session_tools(50, T0 + 100) == 1
    assert await ledger.remembered_tools("idle") == {}
    assert await ledger.remembered_tools("paused") == {"t": "{}"}
    assert await ledger.remembered_tools("recent") == {"t": "{}"}


async def test_processes_claiming_one_session_at_once_agree_on_one_owner(
    postgres: PostgresServer,
) -> None:
    url = postgres.fresh_url()
    ledgers = [await PostgresLedger.connect(url) for _ in range(4)]
    try:
        for round_ in range(10):
            session = f"s{round_}"
            owners = await asyncio.gather(
                *(ledger.claim_session(session, f"p{i}", T0) for i, ledger in enumerate(ledgers))
            )
            assert len(set(owners)) == 1
            assert await ledgers[0].session_owner(session) == owners[0]
    finally:
        for ledger in ledgers:
            await ledger.close()


async def test_sessions_of_an_older_ledger_go_to_the_shared_principal(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    raw = old_sqlite_ledger(path, 3)  # before the owners
    for created_at in (T0, T0 + 5):
        raw.execute(
            "INSERT INTO executions (id, session, status, request_json, error, created_at, "
            "updated_at) VALUES (?, 'old', 'completed', '{}', NULL, ?, ?)",
            (f"e{created_at}", created_at, created_at),
        )
    raw.close()
    async with SqliteLedger(path) as ledger:
        assert await ledger.session_owner("old") == "shared"
        assert await ledger.sessions_owned_by("shared") == ["old"]


async def test_sessions_of_an_older_postgres_ledger_go_to_the_shared_principal(
    postgres: PostgresServer,
) -> None:
    url = postgres.fresh_url()
    old_postgres_ledger(url, 5)  # before the owners
    with psycopg.connect(url) as raw:
        raw.execute(
            "INSERT INTO executions (id, session, status, request_json, error, created_at, "
            "updated_at) VALUES ('e1', 'old', 'completed', '{}', NULL, %s, %s)",
            (T0, T0),
        )
    async with await PostgresLedger.connect(url) as ledger:
        assert await ledger.session_owner("old") == "shared"
