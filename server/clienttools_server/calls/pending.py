"""Pending calls answered from outside the page: list, resolve, approve, reject (S8).

The durable pause of a run, made public: an app, an operator or a webhook
lists the executions that wait for a browser call or a human approval and
settles one. What the HTTP routes (:mod:`clienttools_server.wire.pending_routes`) call;
each operation never raises, and only an ``applied`` answer changes the ledger.

    pending = app.state.pending                       # or server.pending (running_server)
    [execution] = await pending.executions(status="paused", session="demo")
    step = execution["pending"][0]
    answer = await pending.resolve(execution["executionId"], step["seq"], {"lat": 52.5})
    answer.outcome, answer.status                     # ("applied", 200)
    again = await pending.resolve(execution["executionId"], step["seq"], {"lat": 0})
    again.outcome                                     # "duplicate"

An execution is ``paused`` while it waits for a ``client`` or ``approval``
step (the ledger keeps such a run as running); ``running`` otherwise, until
it is ``completed``, ``error`` or ``expired``.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Literal, TypeAlias, cast, get_args

from pydantic import JsonValue

from ..agent.journal import approval_name
from ..ledger import Execution, ExecutionStatus, Ledger, Resolution, Step
from .settlement import Applied, OutsideSettlement, Settlement

Answered: TypeAlias = Literal["applied", "duplicate", "stale", "invalid", "not_found"]

EXECUTION_STATUSES: tuple[ExecutionStatus, ...] = get_args(ExecutionStatus)
DEFAULT_LIMIT = 100
MAX_LIMIT = 1_000
# The error code of a reject that names none.
DEFAULT_REJECT_CODE = "tool_error"

HTTP_STATUS: dict[Answered, int] = {
    "applied": 200,
    "duplicate": 409,
    "stale": 409,
    "invalid": 422,
    "not_found": 404,
}

_APPROVAL_PREFIX = approval_name("")


@dataclass(frozen=True, slots=True)
class Answer:
    """What one resolve, approve or reject did; ``status`` is its HTTP status code."""

    outcome: Answered
    message: str | None = None

    @property
    def ok(self) -> bool:
        return self.outcome == "applied"

    @property
    def status(self) -> int:
        return HTTP_STATUS[self.outcome]

    def body(self) -> dict[str, JsonValue]:
        """The JSON body: ``{"outcome", "message"?}``; only ``{"message"}`` for ``not_found``."""
        body: dict[str, JsonValue] = {}
        if self.outcome != "not_found":
            body["outcome"] = self.outcome
        if self.message is not None:
            body["message"] = self.message
        return body


class InvalidQuery(ValueError):
    """A listing asked with a status, limit or cursor that does not exist."""


def iso_time(seconds: float) -> str:
    """Seconds since the epoch as ISO 8601 UTC, to the millisecond: ``2026-12-01T06:00:00.000Z``."""
    moment = datetime.datetime.fromtimestamp(seconds, datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _tool_name(step: Step) -> str | None:
    if step.kind == "model":
        return None
    if step.resolution == "approval" and step.name.startswith(_APPROVAL_PREFIX):
        return step.name[len(_APPROVAL_PREFIX) :]
    return step.name


def _pending_json(step: Step) -> dict[str, JsonValue]:
    return {
        "seq": step.seq,
        "toolName": _tool_name(step),
        "input": cast(JsonValue, json.loads(step.input_json)),
        "resolution": step.resolution,
        "requestId": step.request_id,
        "attempts": step.attempts,
        "createdAt": iso_time(step.created_at),
    }


def _step_json(step: Step) -> dict[str, JsonValue]:
    found: dict[str, JsonValue] = {
        "seq": step.seq,
        "kind": step.kind,
        "toolName": _tool_name(step),
        "resolution": step.resolution,
        "state": step.state,
    }
    if step.result_json is not None:
        found["result"] = cast(JsonValue, json.loads(step.result_json))
    if step.error_json is not None:
        found["error"] = cast(JsonValue, json.loads(step.error_json))
    return found


def _answerable(steps: Iterable[Step]) -> list[Step]:
    return [s for s in steps if s.state == "pending" and s.resolution in ("client", "approval")]


class PendingCalls:
    """The executions of one server and their pending steps, settled from outside.

    Every method is a coroutine and never raises on what a caller sends (an
    unknown id, a settled step, an output that breaks the tool's
    outputSchema): it answers. ``resolve`` settles a ``client`` step with an
    output, checked by the same function as a page's result (size, the
    outputSchema recorded with the step); ``approve`` answers an ``approval``
    step; ``reject`` settles either with an error the model reads. On
    ``applied`` the run waiting for the step goes on at once: the page's chat
    stream continues (or a later ``resume`` sees it), and a page that had the
    invoke gets a ``superseded`` cancel.
    """

    def __init__(self, outside: OutsideSettlement, ledger: Ledger) -> None:
        self.outside = outside
        self.ledger = ledger

    # -- reading ------------------------------------------------------------------------

    async def executions(
        self,
        status: str | None = None,
        session: str | None = None,
        limit: int = DEFAULT_LIMIT,
        before: str | None = None,
        sessions: Collection[str] | None = None,
    ) -> list[dict[str, JsonValue]]:
        """Executions newest first, each with its pending steps; InvalidQuery for a bad query.

        ``before`` is a cursor: the ``executionId`` of the last execution of
        the previous page; the page after it starts with the next older one.
        ``sessions``: only the executions of these sessions (a principal's own,
        O2); None: of every session.
        """
        if status is not None and status not in EXECUTION_STATUSES:
            raise InvalidQuery(
                f"status must be one of {', '.join(EXECUTION_STATUSES)}, not {status[:64]!r}"
            )
        if not 1 <= limit <= MAX_LIMIT:
            raise InvalidQuery(f"limit must be between 1 and {MAX_LIMIT}, not {limit}")
        unfinished: tuple[ExecutionStatus, ...] = ("running", "paused")
        statuses: tuple[ExecutionStatus, ...] | None
        if status is None:
            statuses = None
        elif status in unfinished:
            statuses = unfinished
        else:
            statuses = (status,)
        found = await self.ledger.executions(statuses, session)
        if sessions is not None:
            found = [e for e in found if e.session in sessions]
        waiting: dict[str, list[Step]] = {}
        for step in _answerable(await self.ledger.pending_steps(session=session)):
            waiting.setdefault(step.execution_id, []).append(step)
        found.sort(key=lambda e: (e.created_at, e.id), reverse=True)
        if before is not None:
            keys = [e.id for e in found]
            if before not in keys:
                cursor = await self.ledger.get_execution(before)
                if cursor is None or (sessions is not None and cursor.session not in sessions):
                    raise InvalidQuery(f"no execution {before[:64]!r} to page from")
                found = [e for e in found if (e.created_at, e.id) < (cursor.created_at, cursor.id)]
            else:
                found = found[keys.index(before) + 1 :]
        listed: list[dict[str, JsonValue]] = []
        for execution in found:
            view = self._execution_json(execution, waiting.get(execution.id, []))
            if status is None or view["status"] == status:
                listed.append(view)
                if len(listed) == limit:
                    break
        return listed

    async def session_of(self, execution_id: str) -> str | None:
        """The session an execution belongs to; None for an unknown execution."""
        execution = await self.ledger.get_execution(execution_id)
        return None if execution is None else execution.session

    async def execution(self, execution_id: str) -> dict[str, JsonValue] | None:
        """One execution as listed, plus ``steps``: every recorded step in seq order."""
        execution = await self.ledger.get_execution(execution_id)
        if execution is None:
            return None
        steps = await self.ledger.steps(execution_id)
        view = self._execution_json(execution, _answerable(steps))
        view["steps"] = [_step_json(step) for step in steps]
        return view

    @staticmethod
    def _execution_json(execution: Execution, waiting: list[Step]) -> dict[str, JsonValue]:
        status: str = execution.status
        if not execution.finished:
            status = "paused" if waiting else "running"
        return {
            "executionId": execution.id,
            "session": execution.session,
            "status": status,
            "createdAt": iso_time(execution.created_at),
            "updatedAt": iso_time(execution.updated_at),
            "pending": [_pending_json(step) for step in sorted(waiting, key=lambda s: s.seq)],
        }

    # -- settling -----------------------------------------------------------------------

    async def resolve(self, execution_id: str, seq: int, output: JsonValue) -> Answer:
        """Settle a pending ``client`` step with ``output``."""
        return await self._settle(execution_id, seq, "client", Settlement(output=output))

    async def approve(
        self, execution_id: str, seq: int, approved: bool, reason: str | None = None
    ) -> Answer:
        """Answer a pending ``approval`` step: the call runs (approved) or is denied."""
        verdict: dict[str, JsonValue] = {"approved": approved}
        if reason is not None:
            verdict["reason"] = reason
        return await self._settle(execution_id, seq, "approval", Settlement(output=verdict))

    async def reject(
        self, execution_id: str, seq: int, message: str, code: str = DEFAULT_REJECT_CODE
    ) -> Answer:
        """Settle a pending ``client`` or ``approval`` step with an error the model reads.

        A rejected approval denies the call, with ``message`` as the reason.
        """
        return await self._settle(execution_id, seq, None, Settlement.failure(code, message))

    async def find_step(self, execution_id: str, seq: int) -> Step | Answer:
        """The step, or the ``not_found`` answer that names what is missing."""
        if await self.ledger.get_execution(execution_id) is None:
            return Answer("not_found", f"no execution {execution_id[:64]!r}")
        step = await self.ledger.get_step(execution_id, seq)
        if step is None:
            return Answer("not_found", f"no step {seq} in execution {execution_id}")
        return step

    async def _settle(
        self, execution_id: str, seq: int, kind: Resolution | None, settlement: Settlement
    ) -> Answer:
        step = await self.find_step(execution_id, seq)
        if isinstance(step, Answer):
            return step
        if kind is not None and step.resolution != kind:
            verb = "resolve" if kind == "client" else "approve"
            return Answer(
                "invalid",
                f"step {seq} of execution {execution_id} is a {step.resolution} step; "
                f"{verb} answers only {kind} steps",
            )
        if step.resolution == "server":
            return Answer(
                "invalid",
                f"step {seq} of execution {execution_id} is a {step.kind} step the server "
                "settles itself; only client and approval steps can be settled from outside",
            )
        return _answer(await self.outside.settle(execution_id, seq, settlement))


def _answer(applied: Applied) -> Answer:
    if applied.reason == "not_found":
        return Answer("not_found", applied.message)
    return Answer(applied.outcome, None if applied.ok else applied.message)
