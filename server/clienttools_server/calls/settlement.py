"""Settling a browser call's step: what settles it, what that did, and settling from outside.

A step of a ``client`` or ``approval`` call is settled by a :class:`Settlement`
(an output or an error). A page's result and a resolve from outside both go
through :meth:`~clienttools_server.calls.results.Results.apply`, which answers
with :class:`Applied`. :class:`OutsideSettlement` is the one place a step is
settled from outside the page (S8): ``Hub.resolve``, ``Hub.reject`` and the
HTTP routes (:class:`~clienttools_server.calls.pending.PendingCalls`) end here.

    outside = OutsideSettlement(ledger, proxy, approvals, answering, shared=False)
    applied = await outside.settle("exec-1", 3, Settlement(output={"lat": 52.5}))
    applied.outcome                      # "applied", "duplicate", "stale" or "invalid"
    (await outside.resolve("exec-1", 3, 1)).ok      # False: settled already
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pydantic import JsonValue

from clienttools.protocol import AckOutcome, ResultAckFrame, ToolResultFrame

from ..canonical import canonical_json
from ..cluster.routing import SETTLED
from ..ledger import Ledger, Outcome, OutcomeReason, Step

if TYPE_CHECKING:
    from .approvals import Approvals
    from .proxy import CallProxy


@dataclass(frozen=True, slots=True)
class Settlement:
    """What settles a step: an ``output``, or an ``error`` ({"code", "message", "data"?})."""

    output: JsonValue = None
    error: dict[str, JsonValue] | None = None

    @classmethod
    def failure(cls, code: str, message: str) -> Settlement:
        return cls(error={"code": code, "message": message})


@dataclass(frozen=True, slots=True)
class Applied:
    """What applying a settlement did: the ack outcome, why, and the step as it stands after.

    ``reason`` is the ledger's word for it (``applied``, ``not_found``,
    ``not_pending``, ``too_large``, ``invalid``), as :class:`Outcome` has it.
    """

    outcome: AckOutcome
    reason: OutcomeReason
    message: str | None = None
    step: Step | None = None

    @property
    def ok(self) -> bool:
        return self.outcome == "applied"

    def as_outcome(self) -> Outcome:
        """As the ledger's :class:`Outcome` (what ``Hub.resolve`` returns)."""
        message = self.message or ("applied" if self.ok else self.outcome)
        return Outcome(self.ok, self.reason, message, self.step)


# The seq of the model answer a run of this process is producing now, by execution
# id (None: the execution has no run here, or its run is not answering).
Answering = Callable[[str], int | None]


class OutsideSettlement:
    """Settle a pending ``client`` or ``approval`` step from outside the page; never raises.

    ``answering(execution_id)`` is the seq of the model answer a run of this
    process is producing for the execution (None if none): that step is not in
    the ledger yet, and only the run settles it.
    """

    def __init__(
        self,
        ledger: Ledger,
        proxy: CallProxy,
        approvals: Approvals,
        answering: Answering,
        *,
        shared: bool,
    ) -> None:
        self._ledger = ledger
        self._proxy = proxy
        self._approvals = approvals
        self._answering = answering
        self._shared = shared

    async def resolve(self, execution_id: str, seq: int, output: JsonValue) -> Outcome:
        """Settle a pending step with an output and wake its run; never raises.

        Anything but a pending step (settled, unknown, too large to store,
        not JSON, breaking the outputSchema recorded with the step) comes back
        as an Outcome with ``ok`` False, and the ledger is unchanged.
        """
        return (await self.settle(execution_id, seq, Settlement(output=output))).as_outcome()

    async def reject(self, execution_id: str, seq: int, code: str, message: str) -> Outcome:
        """Settle a pending step with an error and wake its run; never raises."""
        settlement = Settlement.failure(code, message)
        return (await self.settle(execution_id, seq, settlement)).as_outcome()

    async def settle(self, execution_id: str, seq: int, settlement: Settlement) -> Applied:
        """Settle a pending ``client`` or ``approval`` step from outside; never raises.

        What ``resolve``, ``reject`` and the HTTP routes call. The outcome is
        ``applied`` (the run wakes up and goes on; a page that had the invoke
        gets a ``superseded`` cancel and its late result ``stale``),
        ``duplicate`` (settled already the same way), ``stale`` (settled
        otherwise, or ``reason`` ``not_found``) or ``invalid``. Only
        ``applied`` changes the ledger.
        """
        step = await self._ledger.get_step(execution_id, seq)
        refused = self._not_resolvable(execution_id, seq, step)
        if refused is not None:
            return refused
        if step is None:
            return Applied("stale", "not_found", f"no step {seq} in execution {execution_id}")
        applied = await self._proxy.results.apply(step, settlement, by_page=False)
        if applied.ok and step.resolution == "approval":
            self._approvals.wake(execution_id, seq)
        if applied.ok and self._shared:
            # The run may wait on another process: every process hears it (no read
            # of the owner), and each remembers the call as superseded.
            await self._ledger.notify(
                None, SETTLED, step.request_id or "", execution_id, str(seq), "outside"
            )
        return applied

    def _not_resolvable(self, execution_id: str, seq: int, step: Step | None) -> Applied | None:
        # S8 resolves `client` and `approval` entries. A pending `server` step is
        # a model answer or a server tool this process is producing right now:
        # settling it from outside would race the run that owns it.
        if step is not None and step.state == "pending" and step.resolution == "server":
            kind = step.kind
        elif step is None and self._answering(execution_id) == seq:
            # A model answer in progress is recorded only once it is complete.
            kind = "model"
        else:
            return None
        return Applied(
            "invalid", "invalid",
            f"step {seq} of execution {execution_id} is a {kind} step the server "
            "settles itself; only client and approval steps can be resolved",
            step,
        )  # fmt: skip


def encode_error(code: str, message: str, data: JsonValue = None) -> str:
    """A step's error as the ledger stores it: canonical JSON of {"code", "message", "data"?}."""
    error: dict[str, JsonValue] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return canonical_json(error)


def settlement_of(frame: ToolResultFrame) -> Settlement:
    """What a page's result frame settles its step with."""
    if frame.error is not None:
        return Settlement(error=frame.error.model_dump(mode="json", exclude_none=True))
    return Settlement(output=frame.output)


def ack(request_id: str, outcome: AckOutcome, message: str | None = None) -> ResultAckFrame:
    return ResultAckFrame(request_id=request_id, outcome=outcome, message=message)


def page_ack(request_id: str, applied: Applied) -> ResultAckFrame:
    """The ack a page's result gets for what applying it did."""
    if applied.outcome == "duplicate":
        return ack(request_id, "duplicate")
    if applied.outcome == "stale":
        return ack(request_id, "stale", "the call was already settled")
    return ack(request_id, applied.outcome, None if applied.ok else applied.message)
