"""The ledger (rule S8): every store passes the same tests, so they behave the same.

"sqlite" is a ledger file (``--db``); "memory" is SQLite's ``:memory:``, the
ledger of a server without ``--db``; "postgres" is a PostgreSQL database that
several server processes share (``--db postgresql://...``).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import json
import math
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clienttools_server.ledger import (
    MAX_STORED_BYTES,
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
    canonical_json,
    check_replay,
)
from clienttools_server.ledger_postgres import SCHEMA_VERSION, PostgresLedger
from tests.support.postgres import PostgresServer

HOUR = 3600.0
DAY = 24 * HOUR
T0 = 1_700_000_000.0

LedgerFactory = Callable[[], Ledger]

STORES = ["sqlite", "memory", "postgres"]


@pytest.fixture(params=STORES)
def open_ledger(request: pytest.FixtureRequest, tmp_path: Path) -> LedgerFactory:
    """Opens a ledger on one store; called again, the same store (a restart)."""
    if request.param == "sqlite":
        path = tmp_path / "ledger.sqlite3"
        return lambda: SqliteLedger(path)
    if request.param == "postgres":
        url = request.getfixturevalue("postgres").fresh_url()
        return lambda: PostgresLedger(url)
    return lambda: SqliteLedger(":memory:")


@pytest.fixture(params=["sqlite", "postgres"])
def open_durable_ledger(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str]:
    """(store, where): a SQLite file or a PostgreSQL URL, for tests that reopen or kill."""
    if request.param == "sqlite":
        return "sqlite", str(tmp_path / "ledger.sqlite3")
    return "postgres", request.getfixturevalue("postgres").fresh_url()


def _open(store: str, where: str) -> Ledger:
    return SqliteLedger(where) if store == "sqlite" else PostgresLedger(where)


@pytest.fixture
def ledger(open_ledger: LedgerFactory) -> Iterator[Ledger]:
    opened = open_ledger()
    yield opened
    opened.close()


def _tool_step(ledger: Ledger, session: str = "chat-1") -> tuple[str, int]:
    """A running execution with one pending client tool call at seq 0."""
    execution = ledger.start_execution(session, '{"messages":[]}', now=T0)
    ledger.record_step(execution.id, 0, "tool", "get_location", '{"precise":true}', "client", T0)
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


def test_start_and_get_execution(ledger: Ledger) -> None:
    execution = ledger.start_execution("chat-1", '{"messages":[1]}', now=T0)
    assert len(execution.id) == 32 and int(execution.id, 16) >= 0
    assert execution.status == "running"
    assert execution.session == "chat-1"
    assert execution.request_json == '{"messages":[1]}'
    assert execution.error is None
    assert execution.created_at == execution.updated_at == T0
    assert ledger.get_execution(execution.id) == execution
    assert ledger.get_execution("nope") is None


def test_execution_ids_are_unique(ledger: Ledger) -> None:
    ids = {ledger.start_execution("chat-1", "{}", now=T0).id for _ in range(50)}
    assert len(ids) == 50


def test_start_execution_refuses_invalid_request_json(ledger: Ledger) -> None:
    with pytest.raises(ValueError):
        ledger.start_execution("chat-1", "{not json", now=T0)


def test_executions_filters_by_status_and_session(ledger: Ledger) -> None:
    first = ledger.start_execution("chat-1", "{}", now=T0)
    second = ledger.start_execution("chat-2", "{}", now=T0 + 1)
    third = ledger.start_execution("chat-1", "{}", now=T0 + 2)
    ledger.set_status(second.id, "paused", now=T0 + 3)
    ledger.set_status(third.id, "completed", now=T0 + 4)

    assert [e.id for e in ledger.executions()] == [first.id, second.id, third.id]
    assert [e.id for e in ledger.executions(["running", "paused"])] == [first.id, second.id]
    assert [e.id for e in ledger.executions(session="chat-1")] == [first.id, third.id]
    assert [e.id for e in ledger.executions({"completed"}, session="chat-1")] == [third.id]
    assert ledger.executions(["expired"]) == []
    assert ledger.executions([]) == []


def test_executions_refuses_a_bare_string(ledger: Ledger) -> None:
    with pytest.raises(TypeError):
        ledger.executions("paused")  # type: ignore[arg-type]


def test_set_status_records_status_error_and_time(ledger: Ledger) -> None:
    execution = ledger.start_execution("chat-1", "{}", now=T0)
    ledger.set_status(execution.id, "paused", now=T0 + 5)
    paused = ledger.get_execution(execution.id)
    assert paused is not None
    assert (paused.status, paused.updated_at, paused.created_at) == ("paused", T0 + 5, T0)

    ledger.set_status(execution.id, "running", now=T0 + 6)
    ledger.set_status(execution.id, "error", now=T0 + 7, error="model unavailable")
    failed = ledger.get_execution(execution.id)
    assert failed is not None
    assert (failed.status, failed.error, failed.updated_at) == (
        "error",
        "model unavailable",
        T0 + 7,
    )


def test_finished_execution_does_not_come_back(ledger: Ledger) -> None:
    execution = ledger.start_execution("chat-1", "{}", now=T0)
    ledger.set_status(execution.id, "completed", now=T0 + 1)
    with pytest.raises(InvalidTransition, match="completed"):
        ledger.set_status(execution.id, "running", now=T0 + 2)
    # The same finished status again is a no-op, not an error.
    ledger.set_status(execution.id, "completed", now=T0 + 3)
    done = ledger.get_execution(execution.id)
    assert done is not None and done.updated_at == T0 + 1


def test_set_status_of_unknown_execution_raises(ledger: Ledger) -> None:
    with pytest.raises(UnknownExecution):
        ledger.set_status("nope", "paused", now=T0)


def test_finishing_an_execution_settles_its_pending_steps(ledger: Ledger) -> None:
    execution_id, seq = _tool_step(ledger)
    ledger.set_status(execution_id, "completed", now=T0 + 1)

    step = ledger.get_step(execution_id, seq)
    assert step is not None and step.state == "error"
    error = step.error()
    assert error is not None and error["code"] == "cancelled"
    # A late result for it is refused: the runtime answers "stale".
    outcome = ledger.resolve(execution_id, seq, "{}", now=T0 + 2)
    assert (outcome.ok, outcome.reason) == (False, "not_pending")


# --------------------------------------------------------------------------- steps


def test_record_step_creates_a_pending_step(ledger: Ledger) -> None:
    execution = ledger.start_execution("chat-1", "{}", now=T0)
    step = ledger.record_step(
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
    assert ledger.get_step(execution.id, 0) == step
    assert ledger.get_step(execution.id, 1) is None
    assert ledger.step_by_request_id("req-1") == step
    assert ledger.step_by_request_id("req-2") is None


def test_record_step_is_idempotent_on_replay(ledger: Ledger) -> None:
    execution = ledger.start_execution("chat-1", "{}", now=T0)
    first = ledger.record_step(execution.id, 0, "tool", "search", '{"a":1,"b":2}', "client", T0)
    ledger.resolve(execution.id, 0, '{"hits":[]}', now=T0 + 1)

    # Replay an hour later, keys in another order: the recorded step, unchanged.
    replayed = ledger.record_step(
        execution.id, 0, "tool", "search", '{"b":2, "a":1}', "client", T0 + HOUR, "req-new"
    )
    assert replayed.state == "applied"
    assert replayed.result() == {"hits": []}
    assert replayed.created_at == first.created_at
    assert replayed.request_id is None
    assert len(ledger.steps(execution.id)) == 1


@pytest.mark.parametrize(
    ("kind", "name", "input_json"),
    [
        ("tool", "search", '{"q":"y"}'),
        ("tool", "lookup", '{"q":"x"}'),
        ("model", "search", '{"q":"x"}'),
    ],
    ids=["different-input", "different-name", "different-kind"],
)
def test_record_step_raises_divergence(
    ledger: Ledger, kind: str, name: str, input_json: str
) -> None:
    recorded_input = '{"q":"x"}'
    execution = ledger.start_execution("chat-1", "{}", now=T0)
    ledger.record_step(execution.id, 0, "model", "gpt", '{"turn":0}', "server", T0)
    ledger.record_step(execution.id, 1, "tool", "search", '{"q":"x"}', "client", T0)

    with pytest.raises(Divergence) as raised:
        ledger.record_step(execution.id, 1, kind, name, input_json, "client", T0)  # type: ignore[arg-type]
    message = str(raised.value)
    assert execution.id in message
    assert "seq 1" in message
    assert f"recorded tool 'search' with input {recorded_input}" in message
    assert f"asked {kind} {name!r} with input {input_json}" in message
    assert (raised.value.execution_id, raised.value.seq) == (execution.id, 1)
    # The record is untouched.
    step = ledger.get_step(execution.id, 1)
    assert step is not None and (step.kind, step.name, step.input_json) == (
        "tool",
        "search",
        '{"q":"x"}',
    )


def test_check_replay_compares_canonical_input(ledger: Ledger) -> None:
    execution = ledger.start_execution("chat-1", "{}", now=T0)
    step = ledger.record_step(execution.id, 0, "tool", "t", '{"a":1,"b":[1,2]}', "client", T0)
    check_replay(step, "tool", "t", '{ "b": [1, 2], "a": 1 }')
    with pytest.raises(Divergence):
        check_replay(step, "tool", "t", '{"a":1,"b":[2,1]}')


def test_divergence_message_is_short_for_huge_inputs(ledger: Ledger) -> None:
    execution = ledger.start_execution("chat-1", "{}", now=T0)
    big = json.dumps({"text": "x" * 100_000})
    ledger.record_step(execution.id, 0, "tool", "t", big, "client", T0)
    with pytest.raises(Divergence) as raised:
        ledger.record_step(execution.id, 0, "tool", "t", '{"text":"y"}', "client", T0)
    assert len(str(raised.value)) < 1000


def test_record_step_refuses_oversize_input(ledger: Ledger) -> None:
    execution = ledger.start_execution("chat-1", "{}", now=T0)
    huge = json.dumps({"text": "x" * MAX_STORED_BYTES})
    with pytest.raises(ValueError, match=r"at most 1,000,000 bytes") as raised:
        ledger.record_step(execution.id, 0, "tool", "upload", huge, "client", T0)
    assert "'upload'" in str(raised.value)
    assert ledger.get_step(execution.id, 0) is None


def test_record_step_refuses_invalid_input_and_unknown_execution(ledger: Ledger) -> None:
    execution = ledger.start_execution("chat-1", "{}", now=T0)
    with pytest.raises(ValueError, match="not valid JSON"):
        ledger.record_step(execution.id, 0, "tool", "t", "{oops", "client", T0)
    with pytest.raises(ValueError, match="seq"):
        ledger.record_step(execution.id, -1, "tool", "t", "{}", "client", T0)
    with pytest.raises(UnknownExecution):
        ledger.record_step("nope", 0, "tool", "t", "{}", "client", T0)


def test_record_step_with_a_result_records_it_applied(ledger: Ledger) -> None:
    execution = ledger.start_execution("chat-1", "{}", now=T0)
    step = ledger.record_step(
        execution.id, 0, "model", "m", "{}", "server", T0, result_json='{"b": 1, "a": 2}'
    )
    assert (step.state, step.result_json, step.attempts) == ("applied", '{"a":2,"b":1}', 0)
    assert ledger.get_step(execution.id, 0) == step
    # Replay: the record comes back as it was, whatever result is offered.
    again = ledger.record_step(execution.id, 0, "model", "m", "{}", "server", T0, result_json="3")
    assert again == step
    with pytest.raises(ValueError, match="not valid JSON"):
        ledger.record_step(execution.id, 1, "model", "m", "{}", "server", T0, result_json="{oops")
    assert ledger.get_step(execution.id, 1) is None


def test_a_batch_keeps_what_was_written_before_a_divergence(ledger: Ledger) -> None:
    execution = ledger.start_execution("chat-1", "{}", now=T0)
    ledger.record_step(execution.id, 1, "tool", "a", "{}", "client", T0)
    with pytest.raises(Divergence), ledger.batch():
        ledger.record_step(execution.id, 0, "model", "m", "{}", "server", T0, result_json="1")
        ledger.record_step(execution.id, 1, "tool", "b", "{}", "client", T0)
    assert [(s.seq, s.state) for s in ledger.steps(execution.id)] == [
        (0, "applied"),
        (1, "pending"),
    ]


def test_a_sqlite_batch_commits_once_at_its_end(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    with SqliteLedger(path) as ledger:
        execution = ledger.start_execution("chat-1", "{}", now=T0)
        reader = sqlite3.connect(path)
        try:
            with ledger.batch():
                ledger.record_step(execution.id, 0, "model", "m", "{}", "server", T0, None, "1")
                with ledger.batch():  # nested: still the outer batch's transaction
                    ledger.record_step(execution.id, 1, "tool", "t", "{}", "client", T0)
                assert ledger.get_step(execution.id, 1) is not None
                assert reader.execute("SELECT count(*) FROM steps").fetchone() == (0,)
            assert reader.execute("SELECT count(*) FROM steps").fetchone() == (2,)
        finally:
            reader.close()


def test_steps_are_ordered_by_seq(ledger: Ledger) -> None:
    execution = ledger.start_execution("chat-1", "{}", now=T0)
    for seq in (2, 0, 1):
        ledger.record_step(execution.id, seq, "tool", f"t{seq}", "{}", "server", T0)
    assert [step.seq for step in ledger.steps(execution.id)] == [0, 1, 2]
    assert ledger.steps("nope") == []


def test_pending_steps_filters_session_resolution_and_finished_runs(ledger: Ledger) -> None:
    one = ledger.start_execution("chat-1", "{}", now=T0)
    two = ledger.start_execution("chat-2", "{}", now=T0)
    done = ledger.start_execution("chat-1", "{}", now=T0)
    ledger.record_step(one.id, 0, "tool", "a", "{}", "client", T0 + 1)
    ledger.record_step(one.id, 1, "tool", "b", "{}", "approval", T0 + 2)
    ledger.record_step(two.id, 0, "tool", "c", "{}", "client", T0 + 3)
    ledger.record_step(done.id, 0, "tool", "d", "{}", "client", T0 + 4)
    ledger.record_step(one.id, 2, "tool", "e", "{}", "client", T0 + 5)
    ledger.resolve(one.id, 2, "1", now=T0 + 6)
    ledger.set_status(two.id, "paused", now=T0 + 7)
    ledger.set_status(done.id, "completed", now=T0 + 8)

    assert [s.name for s in ledger.pending_steps()] == ["a", "b", "c"]
    assert [s.name for s in ledger.pending_steps(session="chat-1")] == ["a", "b"]
    assert [s.name for s in ledger.pending_steps(resolution="client")] == ["a", "c"]
    assert [s.name for s in ledger.pending_steps("chat-2", "approval")] == []


# --------------------------------------------------------------------------- resolve / reject


def test_resolve_applies_a_pending_step(ledger: Ledger) -> None:
    execution_id, seq = _tool_step(ledger)
    outcome = ledger.resolve(execution_id, seq, '{"lon": 13.4, "lat": 52.5}', now=T0 + 1)
    assert (outcome.ok, outcome.reason) == (True, "applied")
    step = ledger.get_step(execution_id, seq)
    assert step is not None
    assert outcome.step == step
    assert step.state == "applied"
    assert step.result_json == '{"lat":52.5,"lon":13.4}'
    assert step.result() == {"lat": 52.5, "lon": 13.4}
    assert step.error() is None
    assert step.updated_at == T0 + 1


def test_resolve_twice_is_not_pending(ledger: Ledger) -> None:
    execution_id, seq = _tool_step(ledger)
    ledger.resolve(execution_id, seq, "1", now=T0 + 1)
    duplicate = ledger.resolve(execution_id, seq, "2", now=T0 + 2)
    assert (duplicate.ok, duplicate.reason) == (False, "not_pending")
    # The runtime tells "duplicate" from "stale" by the step's state.
    assert duplicate.step is not None and duplicate.step.state == "applied"
    step = ledger.get_step(execution_id, seq)
    assert step is not None and step.result() == 1


def test_resolve_unknown_step_is_not_found(ledger: Ledger) -> None:
    execution_id, _ = _tool_step(ledger)
    for outcome in (
        ledger.resolve(execution_id, 7, "1", now=T0),
        ledger.resolve("nope", 0, "1", now=T0),
        ledger.reject("nope", 0, '{"code":"x","message":"y"}', now=T0),
    ):
        assert (outcome.ok, outcome.reason, outcome.step) == (False, "not_found", None)
        assert outcome.message


def test_reject_applies_an_error(ledger: Ledger) -> None:
    execution_id, seq = _tool_step(ledger)
    error = {"code": "tool_error", "message": "boom", "data": {"exception": "RuntimeError"}}
    outcome = ledger.reject(execution_id, seq, json.dumps(error), now=T0 + 1)
    assert (outcome.ok, outcome.reason) == (True, "applied")
    step = ledger.get_step(execution_id, seq)
    assert step is not None and step.state == "error"
    assert step.error() == error
    assert step.result_json is None
    with pytest.raises(ValueError, match="no result"):
        step.result()


def test_reject_after_resolve_is_not_pending(ledger: Ledger) -> None:
    execution_id, seq = _tool_step(ledger)
    ledger.resolve(execution_id, seq, '"ok"', now=T0 + 1)
    outcome = ledger.reject(execution_id, seq, '{"code":"timeout","message":"late"}', now=T0 + 2)
    assert (outcome.ok, outcome.reason) == (False, "not_pending")
    step = ledger.get_step(execution_id, seq)
    assert step is not None and step.state == "applied" and step.result() == "ok"


def test_resolve_after_reject_is_not_pending(ledger: Ledger) -> None:
    execution_id, seq = _tool_step(ledger)
    ledger.reject(execution_id, seq, '{"code":"timeout","message":"too slow"}', now=T0 + 1)
    outcome = ledger.resolve(execution_id, seq, "1", now=T0 + 2)
    assert (outcome.ok, outcome.reason) == (False, "not_pending")
    assert outcome.step is not None and outcome.step.state == "error"


def test_too_large_result_leaves_the_step_pending(ledger: Ledger) -> None:
    execution_id, seq = _tool_step(ledger)
    huge = json.dumps("x" * MAX_STORED_BYTES)  # MAX + 2 bytes with the quotes
    outcome = ledger.resolve(execution_id, seq, huge, now=T0 + 1)
    assert (outcome.ok, outcome.reason) == (False, "too_large")
    assert "1,000,000" in outcome.message
    step = ledger.get_step(execution_id, seq)
    assert step is not None and step.state == "pending"
    # The call can still be settled, for instance with output_too_large.
    rejected = ledger.reject(
        execution_id, seq, '{"code":"output_too_large","message":"too big"}', now=T0 + 2
    )
    assert rejected.ok


def test_size_is_measured_in_utf8_bytes_of_the_canonical_form(ledger: Ledger) -> None:
    execution_id, seq = _tool_step(ledger)
    # Whitespace does not count: canonical form is exactly the limit.
    padded = '[  "' + "x" * (MAX_STORED_BYTES - 4) + '"  ]'
    assert ledger.resolve(execution_id, seq, padded, now=T0).reason == "applied"

    execution_id, seq = _tool_step(ledger)
    # Under the limit in characters, over it in UTF-8 bytes.
    accented = json.dumps("é" * (MAX_STORED_BYTES // 2), ensure_ascii=False)
    assert ledger.resolve(execution_id, seq, accented, now=T0).reason == "too_large"


@pytest.mark.parametrize("bad", ["{oops", "", "NaN", "[Infinity]", "1e999", "[" * 100_000])
def test_invalid_result_json_is_invalid(ledger: Ledger, bad: str) -> None:
    execution_id, seq = _tool_step(ledger)
    outcome = ledger.resolve(execution_id, seq, bad, now=T0 + 1)
    assert (outcome.ok, outcome.reason) == (False, "invalid")
    step = ledger.get_step(execution_id, seq)
    assert step is not None and step.state == "pending"


@pytest.mark.parametrize(
    "bad",
    ["{oops", '"just a string"', '{"code":"x"}', '{"message":"y"}', '{"code":1,"message":"y"}'],
)
def test_invalid_error_json_is_invalid(ledger: Ledger, bad: str) -> None:
    execution_id, seq = _tool_step(ledger)
    outcome = ledger.reject(execution_id, seq, bad, now=T0 + 1)
    assert (outcome.ok, outcome.reason) == (False, "invalid")
    step = ledger.get_step(execution_id, seq)
    assert step is not None and step.state == "pending"


def test_resolve_keeps_the_execution_from_expiring(ledger: Ledger) -> None:
    execution_id, seq = _tool_step(ledger)
    ledger.resolve(execution_id, seq, "1", now=T0 + HOUR)
    execution = ledger.get_execution(execution_id)
    assert execution is not None and execution.updated_at == T0 + HOUR


# --------------------------------------------------------------------------- attempts


def test_add_attempt_counts_deliveries(ledger: Ledger) -> None:
    execution_id, seq = _tool_step(ledger)
    assert ledger.add_attempt(execution_id, seq, now=T0 + 1) == 1
    assert ledger.add_attempt(execution_id, seq, now=T0 + 2) == 2
    step = ledger.get_step(execution_id, seq)
    assert step is not None and step.attempts == 2 and step.state == "pending"
    with pytest.raises(UnknownStep):
        ledger.add_attempt(execution_id, 9, now=T0)


# --------------------------------------------------------------------------- expiry


def test_paused_run_expires_after_its_ttl(ledger: Ledger) -> None:
    execution_id, seq = _tool_step(ledger)
    ledger.set_status(execution_id, "paused", now=T0)

    assert ledger.expire_paused(ttl=1.0, now=T0 + 1.0) == []  # not yet: strictly older
    assert ledger.expire_paused(ttl=1.0, now=T0 + 1.5) == [execution_id]

    execution = ledger.get_execution(execution_id)
    assert execution is not None and execution.status == "expired" and execution.error
    step = ledger.get_step(execution_id, seq)
    assert step is not None and step.state == "expired"
    error = step.error()
    assert error is not None and error["code"] == "expired" and error["message"]
    assert ledger.pending_steps() == []
    assert ledger.resolve(execution_id, seq, "1", now=T0 + 2).reason == "not_pending"
    assert ledger.expire_paused(ttl=1.0, now=T0 + 10) == []  # once only


def test_hour_old_paused_run_survives_a_day_ttl(ledger: Ledger) -> None:
    execution_id, _ = _tool_step(ledger)
    ledger.set_status(execution_id, "paused", now=T0)
    assert ledger.expire_paused(ttl=DAY, now=T0 + HOUR) == []
    execution = ledger.get_execution(execution_id)
    assert execution is not None and execution.status == "paused"
    assert len(ledger.pending_steps()) == 1
    assert ledger.expire_paused(ttl=DAY, now=T0 + DAY + 1) == [execution_id]


def test_expiry_covers_running_runs_waiting_on_a_step_only(ledger: Ledger) -> None:
    waiting, _ = _tool_step(ledger)  # running, one pending step
    busy = ledger.start_execution("chat-1", "{}", now=T0)  # running, nothing pending
    finished = ledger.start_execution("chat-1", "{}", now=T0)
    ledger.set_status(finished.id, "completed", now=T0)

    assert ledger.expire_paused(ttl=1.0, now=T0 + 5) == [waiting]
    assert [e.id for e in ledger.executions(["running"])] == [busy.id]
    completed = ledger.get_execution(finished.id)
    assert completed is not None and completed.status == "completed"


def test_prune_deletes_finished_executions_past_the_retention_only(ledger: Ledger) -> None:
    done, done_seq = _tool_step(ledger, "chat-1")
    ledger.resolve(done, done_seq, '"ok"', now=T0 + 1)
    ledger.set_status(done, "completed", now=T0 + 2)
    failed = ledger.start_execution("chat-2", "{}", now=T0)
    ledger.set_status(failed.id, "error", now=T0 + 2, error="boom")
    expired, _ = _tool_step(ledger, "chat-3")
    ledger.set_status(expired, "paused", now=T0)
    assert ledger.expire_paused(ttl=1.0, now=T0 + 2) == [expired]
    recent = ledger.start_execution("chat-4", "{}", now=T0 + 50)
    ledger.set_status(recent.id, "completed", now=T0 + 50)
    old_paused, _ = _tool_step(ledger, "chat-5")
    ledger.set_status(old_paused, "paused", now=T0)
    old_running = ledger.start_execution("chat-6", "{}", now=T0)

    # Strictly older than the retention, like expiry's TTL.
    assert ledger.prune_finished(retention=100.0, now=T0 + 102) == 0
    assert ledger.prune_finished(retention=100.0, now=T0 + 102.5) == 3
    for gone in (done, failed.id, expired):
        assert ledger.get_execution(gone) is None
        assert ledger.steps(gone) == []
    assert ledger.get_step(done, done_seq) is None
    remaining = {e.id: e.status for e in ledger.executions()}
    assert remaining == {recent.id: "completed", old_paused: "paused", old_running.id: "running"}
    assert [s.execution_id for s in ledger.pending_steps()] == [old_paused]
    assert ledger.prune_finished(retention=100.0, now=T0 + 102.5) == 0  # once only
    assert ledger.prune_finished(retention=0.0, now=T0 + 51) == 1  # the recent one
    with pytest.raises(ValueError):
        ledger.prune_finished(retention=-1.0, now=T0)


# --------------------------------------------------------------------------- durability


def test_a_durable_ledger_keeps_everything_across_a_restart(
    open_durable_ledger: tuple[str, str],
) -> None:
    before = _open(*open_durable_ledger)
    execution = before.start_execution("chat-1", '{"messages":["hi"]}', now=T0)
    before.record_step(execution.id, 0, "model", "scripted", '{"turn":0}', "server", T0)
    before.resolve(execution.id, 0, '{"text":"calling a tool"}', now=T0 + 1)
    before.record_step(execution.id, 1, "tool", "get_location", "{}", "client", T0 + 2, "req-1")
    before.add_attempt(execution.id, 1, now=T0 + 2)
    before.set_status(execution.id, "paused", now=T0 + 3)
    executions_before = before.executions()
    steps_before = before.steps(execution.id)
    before.close()

    after = _open(*open_durable_ledger)
    try:
        assert after.executions() == executions_before
        assert after.steps(execution.id) == steps_before
        assert [s.request_id for s in after.pending_steps(resolution="client")] == ["req-1"]
        # Replay after the restart: same steps give back the records.
        model = after.record_step(execution.id, 0, "model", "scripted", '{"turn":0}', "server", T0)
        assert model.result() == {"text": "calling a tool"}
        assert after.resolve(execution.id, 1, '{"lat":1}', now=T0 + 4).ok
    finally:
        after.close()


_KILLED_WRITER = """
import os, signal, sys
from clienttools_server.ledger import SqliteLedger
from clienttools_server.ledger_postgres import PostgresLedger

store, where = sys.argv[1:]
ledger = SqliteLedger(where) if store == "sqlite" else PostgresLedger(where)
execution = ledger.start_execution("chat-1", "{}", now=1.0)
ledger.record_step(execution.id, 0, "tool", "get_location", "{}", "client", 2.0)
ledger.resolve(execution.id, 0, '{"lat":52.5}', now=3.0)
ledger.record_step(execution.id, 1, "tool", "get_time", "{}", "client", 4.0)
print(execution.id, flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # no close, no atexit, no flush of anything else
"""


def test_a_durable_ledger_loses_nothing_acknowledged_when_killed(
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

    with contextlib.closing(_open(*open_durable_ledger)) as reopened:
        steps = reopened.steps(execution_id)
        assert [(s.seq, s.state) for s in steps] == [(0, "applied"), (1, "pending")]
        assert steps[0].result() == {"lat": 52.5}
        assert [s.name for s in reopened.pending_steps()] == ["get_time"]


def test_sqlite_ledger_sets_its_pragmas_and_schema_version(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    SqliteLedger(path).close()
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert raw.execute("PRAGMA user_version").fetchone()[0] == 3
    raw.close()


def test_a_version_1_ledger_gains_the_spec_column_and_keeps_its_steps(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    with SqliteLedger(path) as ledger:
        execution_id, seq = _tool_step(ledger)
    raw = sqlite3.connect(path)
    for column in ("owner", "generation", "lease_until"):
        raw.execute(f"ALTER TABLE executions DROP COLUMN {column}")
    raw.execute("ALTER TABLE steps DROP COLUMN spec_json")  # as version 1 made it
    raw.execute("PRAGMA user_version = 1")
    raw.close()
    with SqliteLedger(path) as ledger:
        step = ledger.get_step(execution_id, seq)
        assert step is not None and step.spec_json is None and step.state == "pending"
        recorded = ledger.record_spec(execution_id, seq, '{"name": "t", "outputSchema": {}}')
        assert recorded is not None and recorded.spec() == {"name": "t", "outputSchema": {}}
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == 3
    raw.close()


def test_a_version_1_postgres_ledger_gains_the_spec_column(postgres: PostgresServer) -> None:
    url = postgres.fresh_url()
    with PostgresLedger(url) as ledger:
        execution_id, seq = _tool_step(ledger)
    with psycopg.connect(url) as raw:
        raw.execute("DROP TABLE chunks")
        for column in ("owner", "generation", "lease_until", "chat_id"):
            raw.execute(f"ALTER TABLE executions DROP COLUMN {column}")
        raw.execute("ALTER TABLE steps DROP COLUMN spec_json")  # as version 1 made it
        for column in ("target_connection", "target_client_id", "tool_call_id"):
            raw.execute(f"ALTER TABLE steps DROP COLUMN {column}")
        raw.execute("DROP TABLE processes, registrations")
        raw.execute("DROP SEQUENCE registration_order")
        raw.execute("UPDATE ledger_schema SET version = 1")
    with PostgresLedger(url) as ledger:
        step = ledger.get_step(execution_id, seq)
        assert step is not None and step.spec_json is None and step.state == "pending"
        recorded = ledger.record_spec(execution_id, seq, '{"name": "t", "outputSchema": {}}')
        assert recorded is not None and recorded.spec() == {"name": "t", "outputSchema": {}}
    with psycopg.connect(url) as raw:
        assert raw.execute("SELECT version FROM ledger_schema").fetchall() == [(SCHEMA_VERSION,)]


def test_the_spec_of_a_step_is_recorded_once(ledger: Ledger) -> None:
    execution_id, seq = _tool_step(ledger)
    first = ledger.record_spec(execution_id, seq, '{"name":"t","outputSchema":{"type":"integer"}}')
    again = ledger.record_spec(execution_id, seq, '{"name":"t"}')
    assert first is not None and again is not None
    assert first.spec_json == again.spec_json == '{"name":"t","outputSchema":{"type":"integer"}}'
    assert ledger.get_step(execution_id, seq) == again
    assert ledger.record_spec(execution_id, 99, "{}") is None


def test_sqlite_ledger_refuses_a_newer_schema(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    raw = sqlite3.connect(path)
    raw.execute("PRAGMA user_version = 99")
    raw.close()
    with pytest.raises(RuntimeError, match="99"):
        SqliteLedger(path)


def test_postgres_batch_commits_once_at_its_end(postgres: PostgresServer) -> None:
    url = postgres.fresh_url()
    with PostgresLedger(url) as ledger, psycopg.connect(url, autocommit=True) as reader:
        execution = ledger.start_execution("chat-1", "{}", now=T0)

        def committed_steps() -> object:
            row = reader.execute("SELECT count(*) FROM steps").fetchone()
            return None if row is None else row[0]

        with ledger.batch():
            ledger.record_step(execution.id, 0, "model", "m", "{}", "server", T0, None, "1")
            with ledger.batch():  # nested: still the outer batch's transaction
                ledger.record_step(execution.id, 1, "tool", "t", "{}", "client", T0)
            assert ledger.get_step(execution.id, 1) is not None
            assert committed_steps() == 0
        assert committed_steps() == 2


def test_a_postgres_batch_keeps_going_after_an_unknown_execution(postgres: PostgresServer) -> None:
    with PostgresLedger(postgres.fresh_url()) as ledger:
        execution = ledger.start_execution("chat-1", "{}", now=T0)
        with ledger.batch():
            ledger.record_step(execution.id, 0, "model", "m", "{}", "server", T0, None, "1")
            with pytest.raises(UnknownExecution):
                ledger.record_step("nope", 0, "tool", "t", "{}", "client", T0)
            ledger.record_step(execution.id, 1, "tool", "t", "{}", "client", T0)
        assert [s.seq for s in ledger.steps(execution.id)] == [0, 1]


def test_postgres_ledger_records_its_schema_version(postgres: PostgresServer) -> None:
    url = postgres.fresh_url()
    PostgresLedger(url).close()
    PostgresLedger(url).close()  # opening again migrates nothing
    with psycopg.connect(url) as raw:
        assert raw.execute("SELECT version FROM ledger_schema").fetchall() == [(SCHEMA_VERSION,)]


def test_postgres_ledger_refuses_a_newer_schema(postgres: PostgresServer) -> None:
    url = postgres.fresh_url()
    PostgresLedger(url).close()
    with psycopg.connect(url) as raw:
        raw.execute("UPDATE ledger_schema SET version = 99")
    with pytest.raises(RuntimeError, match="99"):
        PostgresLedger(url)


def test_postgres_ledgers_opened_together_migrate_once(postgres: PostgresServer) -> None:
    url = postgres.fresh_url()
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        opened = list(pool.map(lambda _: PostgresLedger(url), range(4)))
    try:
        execution = opened[0].start_execution("chat-1", "{}", now=T0)
        # Every process sees every other's writes: one ledger, shared.
        assert all(other.get_execution(execution.id) == execution for other in opened)
    finally:
        for ledger in opened:
            ledger.close()


def test_two_processes_settling_one_step_settle_it_once(postgres: PostgresServer) -> None:
    url = postgres.fresh_url()
    first, second = PostgresLedger(url), PostgresLedger(url)
    try:
        execution = first.start_execution("chat-1", "{}", now=T0)
        seqs = range(40)
        for seq in seqs:
            first.record_step(execution.id, seq, "tool", "t", "{}", "client", T0)
        barrier = threading.Barrier(2)

        def settle_all(ledger: Ledger, value: str) -> list[bool]:
            barrier.wait()
            return [ledger.resolve(execution.id, seq, value, T0 + 1).ok for seq in seqs]

        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            one = pool.submit(settle_all, first, '"first"')
            two = pool.submit(settle_all, second, '"second"')
            won = list(zip(one.result(), two.result(), strict=True))
        # Every step was applied by exactly one of the two, and holds that one's value.
        assert all(a != b for a, b in won)
        for seq, (first_won, _) in zip(seqs, won, strict=True):
            step = second.get_step(execution.id, seq)
            assert step is not None and step.result() == ("first" if first_won else "second")
    finally:
        first.close()
        second.close()


def test_text_postgres_cannot_hold_round_trips(postgres: PostgresServer) -> None:
    with PostgresLedger(postgres.fresh_url()) as ledger:
        session, name, request_id = "a\x00b\\0", "t\x00", "r\\\x00"
        execution = ledger.start_execution(session, "{}", now=T0)
        step = ledger.record_step(execution.id, 0, "tool", name, "{}", "client", T0, request_id)
        ledger.set_status(execution.id, "error", now=T0, error="boom\x00")
        assert ledger.get_execution(execution.id) == dataclasses.replace(
            execution, status="error", error="boom\x00"
        )
        assert ledger.executions(session=session) == [ledger.get_execution(execution.id)]
        assert ledger.executions(session="a") == []
        found = ledger.step_by_request_id(request_id)
        assert found is not None and (found.name, found.request_id) == (name, request_id)
        assert found.seq == step.seq


def test_calls_fail_clearly_while_the_database_is_away(postgres: PostgresServer) -> None:
    with PostgresLedger(postgres.fresh_url(), timeout=1.0) as ledger:
        execution_id, seq = _tool_step(ledger)
        postgres.stop()
        try:
            started = time.monotonic()
            with pytest.raises(LedgerUnavailable, match="unreachable"):
                ledger.resolve(execution_id, seq, "1", now=T0 + 1)
            with pytest.raises(LedgerUnavailable):
                ledger.get_step(execution_id, seq)
            # Failing is quick: the timeout, not a hang.
            assert time.monotonic() - started < 30
        finally:
            postgres.start_again()
        # Back again: the pool reconnects, and nothing was written while it was away.
        step = wait_for(lambda: ledger.get_step(execution_id, seq))
        assert step.state == "pending"
        assert ledger.resolve(execution_id, seq, "1", now=T0 + 2).ok


def test_a_postgres_ledger_with_no_database_fails_to_open_clearly(tmp_path: Path) -> None:
    with pytest.raises(LedgerUnavailable, match="could not connect"):
        PostgresLedger(f"postgresql://nobody@/none?host={tmp_path}", timeout=0.5)


def wait_for(read: Callable[[], Step | None], timeout: float = 30.0) -> Step:
    """What ``read`` returns once the ledger answers again (each try waits the ledger's timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            found = read()
        except LedgerUnavailable:
            if time.monotonic() > deadline:
                raise
            continue
        assert found is not None
        return found


def test_sqlite_ledger_works_in_memory() -> None:
    with SqliteLedger(":memory:") as in_memory:
        execution_id, seq = _tool_step(in_memory)
        assert in_memory.resolve(execution_id, seq, "1", now=T0).ok


def test_a_closed_ledger_refuses_calls(ledger: Ledger) -> None:
    ledger.close()
    ledger.close()  # closing twice is fine
    with pytest.raises(LedgerClosed):
        ledger.executions()
    with pytest.raises(LedgerClosed):
        ledger.start_execution("chat-1", "{}", now=T0)


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
    # a fresh SQLite ledger per example.
    url = request.getfixturevalue("postgres").fresh_url() if kind == "postgres" else ""
    files: pytest.TempPathFactory = request.getfixturevalue("tmp_path_factory")

    def fresh() -> Ledger:
        if kind == "postgres":
            return PostgresLedger(url)
        if kind == "sqlite":
            return SqliteLedger(files.mktemp("settle") / "ledger.sqlite3")
        return SqliteLedger(":memory:")

    @settings(max_examples=60, deadline=None)
    @given(calls=st.lists(settle_call, max_size=8))
    def check(calls: list[tuple[str, str]]) -> None:
        with contextlib.closing(fresh()) as ledger:
            settled_at_most_once(ledger, calls)

    check()


def settled_at_most_once(ledger: Ledger, calls: list[tuple[str, str]]) -> None:
    execution_id, seq = _tool_step(ledger)
    applied: list[tuple[str, str]] = []
    for number, (method, payload) in enumerate(calls):
        settle = ledger.resolve if method == "resolve" else ledger.reject
        outcome = settle(execution_id, seq, payload, T0 + number)
        if outcome.ok:
            applied.append((method, payload))
        else:
            assert outcome.reason in {"not_pending", "too_large", "invalid"}
    assert len(applied) <= 1
    step = ledger.get_step(execution_id, seq)
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


def test_a_started_execution_is_held_and_its_lease_renewed(ledger: Ledger) -> None:
    execution = ledger.start_execution("chat-1", "{}", now=T0)
    assert (execution.generation, execution.lease_until) == (1, T0 + 10)
    stored = ledger.get_execution(execution.id)
    assert stored is not None and stored.owner == execution.owner is not None
    assert ledger.renew(T0 + 5) == []
    renewed = ledger.get_execution(execution.id)
    assert renewed is not None and (renewed.generation, renewed.lease_until) == (1, T0 + 15)


def test_a_lapsed_lease_is_taken_over_and_the_old_owner_writes_nothing(
    open_durable_ledger: tuple[str, str],
) -> None:
    old, new = _open(*open_durable_ledger), _open(*open_durable_ledger)
    try:
        execution = old.start_execution("chat-1", "{}", now=T0)
        old.record_step(execution.id, 0, "tool", "get_location", "{}", "client", T0)
        [taken] = new.take_over(T0 + 11)
        assert (taken.id, taken.generation, taken.owner) != (execution.id, 1, execution.owner)
        assert taken.id == execution.id and taken.generation == 2
        before = (new.get_execution(execution.id), new.steps(execution.id))
        writes: list[Callable[[], object]] = [
            lambda: old.record_step(execution.id, 1, "model", "m", "{}", "server", T0 + 12),
            lambda: old.resolve(execution.id, 0, '{"lat":1}', T0 + 12),
            lambda: old.reject(execution.id, 0, '{"code":"x","message":"y"}', T0 + 12),
            lambda: old.add_attempt(execution.id, 0, T0 + 12),
            lambda: old.record_spec(execution.id, 0, '{"name":"get_location"}'),
            lambda: old.set_status(execution.id, "completed", T0 + 12),
        ]
        for write in writes:
            with pytest.raises(LeaseLost, match="another process took the run over"):
                write()
        assert old.renew(T0 + 12) == []  # known lost already: nothing left to renew
        assert (new.get_execution(execution.id), new.steps(execution.id)) == before
        # The new owner writes as before, and renews what it holds.
        assert new.resolve(execution.id, 0, '{"lat":1}', T0 + 13).ok
        assert new.renew(T0 + 14) == []
        new.set_status(execution.id, "completed", T0 + 15)
        finished = new.get_execution(execution.id)
        assert finished is not None and finished.status == "completed"
    finally:
        old.close()
        new.close()


def test_a_lease_lost_is_found_by_the_next_renewal(open_durable_ledger: tuple[str, str]) -> None:
    old, new = _open(*open_durable_ledger), _open(*open_durable_ledger)
    try:
        execution = old.start_execution("chat-1", "{}", now=T0)
        assert [e.id for e in new.take_over(T0 + 11)] == [execution.id]
        assert old.renew(T0 + 12) == [execution.id]
        with pytest.raises(LeaseLost):
            old.set_status(execution.id, "error", T0 + 12, "stale")
        # Taking it back (the new owner's lease lapsed in turn) lifts the fence.
        [back] = old.take_over(T0 + 30)
        assert back.generation == 3
        old.set_status(execution.id, "completed", T0 + 31)
        with pytest.raises(LeaseLost):
            new.set_status(execution.id, "error", T0 + 31)
    finally:
        old.close()
        new.close()


def test_finished_executions_are_never_taken_over(ledger: Ledger) -> None:
    execution = ledger.start_execution("chat-1", "{}", now=T0)
    ledger.set_status(execution.id, "completed", T0 + 1)
    assert ledger.take_over(T0 + HOUR) == []


def test_a_live_lease_on_postgres_is_not_taken_over(postgres: PostgresServer) -> None:
    """Many processes share PostgreSQL: a run whose owner renews stays with it."""
    url = postgres.fresh_url()
    with PostgresLedger(url) as owner, PostgresLedger(url) as other:
        execution = owner.start_execution("chat-1", "{}", now=T0)
        assert other.take_over(T0 + 5) == []
        assert owner.renew(T0 + 9) == []
        assert other.take_over(T0 + 15) == []
        assert [e.id for e in other.take_over(T0 + 20)] == [execution.id]


def test_a_sqlite_file_takes_over_what_another_instance_held(tmp_path: Path) -> None:
    """A SQLite file has one server process: an instance before it on the file is gone."""
    path = tmp_path / "ledger.sqlite3"
    with SqliteLedger(path) as before:
        execution = before.start_execution("chat-1", "{}", now=T0)
    with SqliteLedger(path) as after:
        [taken] = after.take_over(T0 + 1)
        assert (taken.id, taken.generation) == (execution.id, 2)
        assert after.take_over(T0 + 2) == []  # its own, live


# --------------------------------------------------------------------------- registrations (S2)


def test_registrations_are_ordered_and_a_page_that_moved_leaves_its_old_one(
    ledger: Ledger,
) -> None:
    ledger.keep_alive(T0)
    first = ledger.register("conn-1", "s", "page-a", '[{"name":"t"}]')
    second = ledger.register("conn-2", "s", "page-b", "[]")
    ledger.register("conn-9", "other", "page-a", "[]")  # another session: untouched
    assert first < second
    assert [r.connection_id for r in ledger.registrations("s", T0)] == ["conn-1", "conn-2"]
    [one] = [r for r in ledger.registrations("s", T0) if r.connection_id == "conn-1"]
    assert (one.session, one.process_id, one.client_id, one.tools_json) == (
        "s", ledger.owner, "page-a", '[{"name":"t"}]',
    )  # fmt: skip
    # page-a again, on a new connection: its old registration goes; the new one is newest.
    third = ledger.register("conn-3", "s", "page-a", "[]")
    assert third > second
    assert [r.connection_id for r in ledger.registrations("s", T0)] == ["conn-2", "conn-3"]
    assert not ledger.registered("conn-1", T0) and ledger.registered("conn-3", T0)
    # The same connection registering again is newest again.
    assert ledger.register("conn-2", "s", "page-b", "[]") > third
    assert [r.connection_id for r in ledger.registrations("s", T0)] == ["conn-3", "conn-2"]
    ledger.unregister("conn-2")
    ledger.unregister("conn-2")  # twice: nothing more
    assert [r.connection_id for r in ledger.registrations("s", T0)] == ["conn-3"]
    assert [r.connection_id for r in ledger.registrations("other", T0)] == ["conn-9"]


def test_keep_alive_names_this_process_alive(ledger: Ledger) -> None:
    assert ledger.owner in ledger.keep_alive(T0)


def test_the_registrations_of_a_dead_process_do_not_count(postgres: PostgresServer) -> None:
    url = postgres.fresh_url()
    lease = 10.0
    with PostgresLedger(url, lease=lease) as a, PostgresLedger(url, lease=lease) as b:
        assert a.keep_alive(T0) == {a.owner}
        assert b.keep_alive(T0) == {a.owner, b.owner}
        a.register("on-a", "s", "page-a", "[]")
        b.register("on-b", "s", "page-b", "[]")
        assert [r.process_id for r in b.registrations("s", T0 + 1)] == [a.owner, b.owner]
        # a stops renewing: past its lease it is dead to b, though its rows are there.
        later = T0 + lease + 1
        assert b.keep_alive(later) == {b.owner}
        assert [r.connection_id for r in b.registrations("s", later)] == ["on-b"]
        assert not b.registered("on-a", later) and b.registered("on-b", later)
        # A process counts its own registrations whatever its row says.
        assert [r.connection_id for r in a.registrations("s", later)] == ["on-a", "on-b"]
        # Back from a stall (SIGSTOP): its registrations count again.
        a.keep_alive(later)
        assert [r.connection_id for r in b.registrations("s", later)] == ["on-a", "on-b"]
        # Then dead for ten leases (past its renewal to later + lease): its rows go.
        b.keep_alive(later + 11 * lease + 1)
        with psycopg.connect(url) as raw:
            assert raw.execute("SELECT connection_id FROM registrations").fetchall() == [("on-b",)]
            assert raw.execute("SELECT id FROM processes").fetchall() == [(b.owner,)]


def test_an_attempt_records_where_its_invoke_went(postgres: PostgresServer) -> None:
    with PostgresLedger(postgres.fresh_url()) as ledger:
        execution_id, seq = _tool_step(ledger)
        ledger.add_attempt(execution_id, seq, T0, target_connection="c1", target_client_id="p")
        step = ledger.get_step(execution_id, seq)
        assert step is not None and (step.target_connection, step.target_client_id) == ("c1", "p")
        ledger.add_attempt(execution_id, seq, T0, target_connection="c2", target_client_id="p\x00")
        [again] = ledger.steps(execution_id)
        assert (again.attempts, again.target_connection, again.target_client_id) == (
            2, "c2", "p\x00",
        )  # fmt: skip


def test_the_pending_calls_last_invoked_on_a_connection(postgres: PostgresServer) -> None:
    with PostgresLedger(postgres.fresh_url()) as ledger:
        execution_id, _ = _tool_step(ledger)
        ledger.record_step(execution_id, 1, "tool", "t", "{}", "client", T0, "req-1")
        ledger.record_step(execution_id, 2, "tool", "t", "{}", "client", T0, "req-2")
        ledger.add_attempt(execution_id, 1, T0, target_connection="c1", target_client_id="p")
        ledger.add_attempt(execution_id, 2, T0, target_connection="c2", target_client_id="p")
        assert ledger.delivered_to(["c1", "c9"]) == [("req-1", "c1", ledger.owner)]
        ledger.resolve(execution_id, 1, "1", T0)
        assert ledger.delivered_to(["c1", "c2"]) == [("req-2", "c2", ledger.owner)]
        assert ledger.delivered_to([]) == []
    with SqliteLedger(":memory:") as sqlite:
        assert sqlite.delivered_to(["c1"]) == []


def test_an_approval_is_found_by_its_tool_call_id_in_its_session(postgres: PostgresServer) -> None:
    with PostgresLedger(postgres.fresh_url()) as ledger:
        execution = ledger.start_execution("s", "{}", now=T0)
        ledger.record_step(execution.id, 0, "tool", "approval:t", "{}", "approval", T0)
        assert ledger.approval_step("s", "call-1") is None  # not marked yet
        ledger.mark_approval(execution.id, 0, "call-1")
        found = ledger.approval_step("s", "call-1")
        assert found is not None and (found[0].seq, found[1]) == (0, ledger.owner)
        assert ledger.approval_step("other", "call-1") is None
        ledger.resolve(execution.id, 0, '{"approved":true}', T0)
        assert ledger.approval_step("s", "call-1") is None  # answered: pending no more
