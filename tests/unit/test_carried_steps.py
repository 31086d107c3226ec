"""What an ``invoke`` and a ``settled`` notification carry besides ids, and what does not fit."""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import asdict, replace
from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st

from clienttools.protocol import InvokeFrame
from clienttools_server.cluster.bus import decode, encode
from clienttools_server.cluster.handlers import BusHandlers
from clienttools_server.cluster.relay import CallRelay, settled_outcome
from clienttools_server.cluster.routing import (
    CARRIED_BYTES,
    Outbox,
    RemotePeer,
    fits,
    step_json,
    step_of_json,
)
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
    fields = asdict(PENDING)
    other_versions = [
        {**fields, "lease": 3},  # a field this code does not know
        {k: v for k, v in fields.items() if k != "spec_json"},  # one it misses
        list(fields.values()),
    ]
    for text in ("", "{", "[]", "null", '"step"', *map(json.dumps, other_versions)):
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


class Notices:
    """The ledger as the outbox and the relay use it: its process id and its notify."""

    owner = "run-process"

    def __init__(self) -> None:
        self.sent: list[tuple[str | None, str, tuple[str, ...]]] = []

    async def notify(self, process_id: str | None, kind: str, *args: str) -> None:
        self.sent.append((process_id, kind, args))


INVOKE_FRAME = InvokeFrame(
    request_id="req-1", tool_call_id="call-1", tool_name="work", input={"n": 3}, attempt=2
)


async def test_an_invoke_carries_its_step_when_it_fits_and_goes_by_ids_when_not() -> None:
    ledger = Notices()
    outbox = Outbox(ledger)  # type: ignore[arg-type]
    peer = RemotePeer(outbox, "page-process", "conn-1", "s1", None, {})
    peer.invoke(INVOKE_FRAME, PENDING)
    peer.invoke(INVOKE_FRAME, replace(PENDING, input_json=json.dumps({"t": "x" * CARRIED_BYTES})))
    peer.send(INVOKE_FRAME)
    await outbox.close()
    ids = ("conn-1", "req-1", "call-1", "0", "2")
    carried, too_large, by_send = ledger.sent
    assert carried[:2] == ("page-process", "invoke") and carried[2][:5] == ids
    assert step_of_json(carried[2][5]) == PENDING
    assert too_large == by_send == ("page-process", "invoke", ids)


async def test_the_owner_is_told_a_settled_steps_outcome_when_it_fits() -> None:
    ledger = Notices()
    relay = CallRelay(proxy=None, ledger=ledger)  # type: ignore[arg-type]
    ids = ("req-1", "run-1", "2", "page")
    applied = replace(PENDING, state="applied", result_json='{"sq":9}')
    await relay.tell_owner("other", applied, "page")
    await relay.tell_owner("other", PENDING, "page")
    await relay.tell_owner(
        "other", replace(applied, result_json=json.dumps("x" * CARRIED_BYTES)), "page"
    )
    await relay.tell_owner(ledger.owner, applied, "page")  # its own run: woken already
    assert ledger.sent == [
        ("other", "settled", (*ids, "applied", '{"sq":9}')),
        ("other", "settled", ids),
        ("other", "settled", ids),
    ]


class Page:
    client_id = None
    is_open = True

    def __init__(self) -> None:
        self.frames: list[object] = []

    def send(self, frame: object) -> None:
        self.frames.append(frame)


class Rows(Notices):
    """Notices, and the one step row the handler may read (counted)."""

    def __init__(self, step: Step) -> None:
        super().__init__()
        self.step, self.reads = step, 0

    async def step_by_request_id(self, request_id: str) -> Step | None:
        self.reads += 1
        return self.step


def pages_process(row: Step) -> tuple[BusHandlers, Rows, Page, SimpleNamespace]:
    """The page's process, as far as an ``invoke`` reaches: its connection and relay."""
    ledger, page = Rows(row), Page()
    proxy = SimpleNamespace(results=SimpleNamespace(superseded=OrderedDict()))
    proxy.relay = CallRelay(proxy=proxy, ledger=ledger)  # type: ignore[arg-type]
    pages = SimpleNamespace(connections={"conn-1": page})
    handlers = BusHandlers(ledger, pages, proxy, approvals=None)  # type: ignore[arg-type]
    return handlers, ledger, page, proxy


INVOKE_ARGS = ("conn-1", "req-1", "call-1", "0", "1", step_json(PENDING))


async def test_a_carried_step_is_invoked_without_a_read() -> None:
    handlers, ledger, page, _ = pages_process(PENDING)
    await handlers._on_invoke("run-process", INVOKE_ARGS)
    assert ledger.reads == 0
    [frame] = page.frames
    assert isinstance(frame, InvokeFrame) and frame.input == {"n": 3, "tag": 'é"x'}


async def test_a_call_this_process_knows_settled_is_judged_from_its_row() -> None:
    """An invoke from a run's new owner, which read the step before this process applied
    the page's result for the old owner (or before a resolve from outside): the row
    says it is settled, the new owner is told, and the page gets nothing."""
    applied = replace(PENDING, state="applied", result_json='{"sq":9}')
    for knows in ("told the old owner", "resolved from outside"):
        handlers, ledger, page, proxy = pages_process(applied)
        if knows == "told the old owner":
            await proxy.relay.tell_owner("old-owner", applied, "page")
        else:
            proxy.results.superseded["req-1"] = None
        await handlers._on_invoke("new-owner", INVOKE_ARGS)
        assert (ledger.reads, page.frames) == (1, [])
        assert ledger.sent[-1] == (
            "new-owner",
            "settled",
            ("req-1", "run-1", "2", "page", "applied", '{"sq":9}'),
        )
