"""What an ``invoke`` and a ``settled`` notification carry besides ids, and what does not fit."""

from __future__ import annotations

import json
from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from clienttools_server.cluster.bus import decode, encode
from clienttools_server.cluster.relay import settled_outcome
from clienttools_server.cluster.routing import CARRIED_BYTES, fits, step_json, step_of_json
from clienttools_server.ledger import Step

PENDING = Step(
    execution_id="run-1",
    seq=2,
    kind="tool",
    name="work",
    input_json='{"n":3,"tag":"é\\"x"}',
    resolution="client",
    state="pending",
    result_json=None,
    error_json=None,
    request_id="req-1",
    attempts=1,
    created_at=1765100000.125,
    updated_at=1765100000.5,
    spec_json='{"name":"work","outputSchema":{"type":"object"}}',
    target_connection="conn-1",
    target_client_id=None,
)

texts = st.text(max_size=40)


@given(
    input_json=texts,
    spec_json=st.none() | texts,
    created_at=st.floats(allow_nan=False, allow_infinity=False),
    client_id=st.none() | texts,
)
def test_a_step_comes_back_as_it_was_sent_through_a_notification(
    input_json: str, spec_json: str | None, created_at: float, client_id: str | None
) -> None:

    step = replace(
        PENDING,
        input_json=input_json,
        spec_json=spec_json,
        created_at=created_at,
        target_client_id=client_id,
    )
    decoded = decode(encode("sender", "invoke", ("conn", step_json(step))))
    assert decoded is not None
    assert step_of_json(decoded[2][1]) == step


def test_what_this_code_did_not_write_is_no_step() -> None:
    for text in ("", "{", "[]", '["run-1", 2]', json.dumps({"execution_id": "x"}), "[1,2,3]"):
        assert step_of_json(text) is None


def test_what_fits_leaves_room_under_postgresqls_payload_limit() -> None:
    big = "x" * CARRIED_BYTES
    assert fits("a", "b") and not fits(big)
    # The longest args that fit, with the sender and the kind, under 8,000 bytes.
    edge = "y" * (CARRIED_BYTES - len(json.dumps(["a", ""])))
    assert fits("a", edge)
    assert len(encode("p" * 32, "settled", ("a", edge)).encode()) < 8_000
    # Quotes and non-ASCII text count as they are escaped.
    assert not fits('"' * (CARRIED_BYTES // 2 + 1))
    assert not fits("é" * (CARRIED_BYTES // 6 + 1))


def test_a_settled_step_carries_its_state_and_value_and_a_pending_one_nothing() -> None:

    assert settled_outcome(PENDING) is None
    applied = replace(PENDING, state="applied", result_json='{"sq":9}')
    assert settled_outcome(applied) == ("applied", '{"sq":9}')
    failed = replace(PENDING, state="error", error_json='{"code":"tool_error","message":"no"}')
    assert settled_outcome(failed) == ("error", '{"code":"tool_error","message":"no"}')
    expired = replace(PENDING, state="expired", error_json='{"code":"expired","message":"late"}')
    assert settled_outcome(expired) == ("expired", '{"code":"expired","message":"late"}')
