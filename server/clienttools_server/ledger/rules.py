"""The ledger's rules, without I/O: what may be stored, what is refused, what a replay must match.

Both stores (SQLite, PostgreSQL) run every value through these before any SQL,
so the same input is refused the same way on each. Example::

    assert prepare_input("t", '{ "b": 1, "a": 2 }') == '{"a":2,"b":1}'
    assert isinstance(prepare_result("{x"), Outcome)  # refused: not JSON
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Collection

from ..canonical import Canonical, canonical_json, canonicalize
from .records import (
    MAX_STORED_BYTES,
    STATUS_TRANSITIONS,
    Divergence,
    Execution,
    ExecutionStatus,
    InvalidTransition,
    LeaseLost,
    Outcome,
    Step,
    StepKind,
    StepState,
)


def _stored_size(text: str) -> int:
    return len(text.encode("utf-8"))


def check_replay(recorded: Step, kind: StepKind, name: str, input_json: str) -> None:
    """Raise :class:`Divergence` unless the step asked for matches the record.

    ``input_json`` is compared in canonical form, so key order and whitespace
    do not matter. Resolution is not compared: whether a tool needs approval is
    configuration, and changing it must not break runs already recorded.
    """
    asked_input = canonicalize(input_json)
    if (recorded.kind, recorded.name, recorded.input_json) != (kind, name, asked_input):
        raise Divergence(recorded, kind, name, asked_input)


def prepare_input(name: str, input_json: str) -> str:
    try:
        canonical = canonicalize(input_json)
    except ValueError as exc:
        raise ValueError(f"input of {name!r} is not valid JSON: {exc}") from exc
    size = _stored_size(canonical)
    if size > MAX_STORED_BYTES:
        # Worded for the model: the runtime may hand this message to it as is.
        raise ValueError(
            f"input of {name!r} is {size:,} bytes as JSON; at most {MAX_STORED_BYTES:,} "
            "bytes can be stored. Call it with a smaller input."
        )
    return canonical


def prepare_result(result_json: str) -> str | Outcome:
    """Canonical result to store, or the refusing Outcome."""
    try:
        canonical = canonicalize(result_json)
    except ValueError as exc:
        return Outcome(False, "invalid", f"result is not valid JSON: {exc}")
    size = _stored_size(canonical)
    if size > MAX_STORED_BYTES:
        return Outcome(
            False,
            "too_large",
            f"result is {size:,} bytes as JSON; at most {MAX_STORED_BYTES:,} bytes can be stored",
        )
    return canonical


def prepare_recorded_result(result_json: str | None) -> tuple[StepState, str | None]:
    """State and stored result of a step recorded with ``result_json`` (None: pending)."""
    if result_json is None:
        return "pending", None
    prepared = prepare_result(result_json)
    if isinstance(prepared, Outcome):
        raise ValueError(prepared.message)
    return "applied", prepared


def prepare_error(error_json: str) -> str | Outcome:
    """Canonical error to store, or the refusing Outcome."""
    try:
        value = json.loads(error_json)
        canonical = error_json if type(error_json) is Canonical else canonical_json(value)
    except (ValueError, RecursionError) as exc:
        return Outcome(False, "invalid", f"error is not valid JSON: {exc}")
    if not (
        isinstance(value, dict)
        and isinstance(value.get("code"), str)
        and isinstance(value.get("message"), str)
    ):
        return Outcome(
            False, "invalid", 'error must be a JSON object with string "code" and "message"'
        )
    size = _stored_size(canonical)
    if size > MAX_STORED_BYTES:
        return Outcome(
            False,
            "too_large",
            f"error is {size:,} bytes as JSON; at most {MAX_STORED_BYTES:,} bytes can be stored",
        )
    return canonical


def refusal(step: Step | None, execution_id: str, seq: int) -> Outcome | None:
    """The Outcome for settling a step that is missing or already settled, else None."""
    if step is None:
        return Outcome(False, "not_found", f"no step {seq} in execution {execution_id}")
    if step.state != "pending":
        return Outcome(
            False,
            "not_pending",
            f"step {seq} of execution {execution_id} is already {step.state}",
            step,
        )
    return None


def check_statuses(statuses: Collection[ExecutionStatus] | None) -> None:
    # A bare string is a Collection too, and "paused" would match "p", "a", ...
    if isinstance(statuses, str):
        raise TypeError(f"statuses must be a collection of statuses, not the string {statuses!r}")


def check_transition(execution: Execution, status: ExecutionStatus) -> None:
    if status not in STATUS_TRANSITIONS[execution.status]:
        raise InvalidTransition(
            f"execution {execution.id} is {execution.status}; it cannot become {status}"
        )


def closing_error(status: ExecutionStatus, ttl: float | None = None) -> tuple[StepState, str]:
    """State and error JSON for the pending steps of an execution that finishes with ``status``."""
    if status == "expired":
        message = (
            f"this call waited longer than its time to live ({ttl:g} s) and expired"
            if ttl is not None
            else "this call expired before it was resolved"
        )
        return "expired", canonical_json({"code": "expired", "message": message})
    return "error", canonical_json(
        {"code": "cancelled", "message": f"the run ended ({status}) before this call was resolved"}
    )


class Leases:
    """The executions one ledger instance owns, each at the generation it took it at.

    Shared bookkeeping of both stores. An execution it lost stays fenced (every
    write for it raises :class:`LeaseLost`, without asking the database) until
    this instance takes it over again. Each loss is also kept for the next
    renewal to report (:meth:`reported`), however it was found: a write refused
    by the fence may be met in any task, not only in the run's own.
    """

    def __init__(self, seconds: float) -> None:
        if not seconds > 0:
            raise ValueError(f"the lease must be positive, not {seconds}")
        self.seconds = seconds
        self.owner = uuid.uuid4().hex
        self.held: dict[str, int] = {}
        self.lost: dict[str, int] = {}
        self._unreported: dict[str, None] = {}  # lost since the last reported(), in order

    def generation(self, execution_id: str) -> int | None:
        """The generation held for the execution, None if it is not ours; LeaseLost if lost."""
        lost = self.lost.get(execution_id)
        if lost is not None:
            raise LeaseLost(execution_id, lost, None)
        return self.held.get(execution_id)

    def hold(self, execution_id: str, generation: int) -> None:
        self.held[execution_id] = generation
        self.lost.pop(execution_id, None)
        self._unreported.pop(execution_id, None)

    def lose(self, execution_id: str, current: int | None) -> LeaseLost:
        held = self.held.pop(execution_id, 0)
        self.lost[execution_id] = held
        self._unreported[execution_id] = None
        return LeaseLost(execution_id, held, current)

    def reported(self) -> list[str]:
        """The executions lost since the last call, each once: their runs must stop."""
        lost, self._unreported = list(self._unreported), {}
        return lost

    def release(self, execution_id: str) -> None:
        """Stop holding: the run ended here. A lost lease stays fenced."""
        self.held.pop(execution_id, None)
