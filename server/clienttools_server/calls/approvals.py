"""Approvals of ``needsApproval`` tools: a run waits for a human's answer (S3).

A run that calls a tool the page registered with ``needsApproval`` first
records an ``approval`` step and waits here, keyed by (session, toolCallId),
until the page's chat answers (a ``tool-approval`` frame), someone answers from
outside (:class:`~clienttools_server.calls.settlement.OutsideSettlement`), or
the run expires. With several processes the chat that answers may be on
another one: the answer is written to the ledger and the run's process woken.

    approvals = Approvals(ledger, clock)
    await approvals.wait("desk", step, call)         # returns once answered
    problem = await approvals.on_approval(peer, frame)   # None when it answered one
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass, field

from pydantic import JsonValue

from clienttools.protocol import ToolApprovalFrame

from ..agent.journal import RequestedCall
from ..canonical import canonical_json
from ..clock import SYSTEM_CLOCK, Clock
from ..ledger import Ledger, Step
from .delivery import Peer
from .settlement import encode_error


@dataclass(eq=False, slots=True)
class _ApprovalWait:
    execution_id: str
    seq: int
    future: asyncio.Future[None]


@dataclass(slots=True)
class Approvals:
    """Pending approvals of needsApproval tools, keyed by (session, toolCallId)."""

    ledger: Ledger
    clock: Clock = SYSTEM_CLOCK
    waiting: dict[tuple[str, str], _ApprovalWait] = field(default_factory=dict)
    # Several processes on the ledger: the chat that answers may be on another one.
    shared: bool = False

    async def wait(self, session: str, step: Step, call: RequestedCall) -> None:
        key = (session, call.tool_call_id)
        wait = _ApprovalWait(
            step.execution_id, step.seq, asyncio.get_running_loop().create_future()
        )
        # Waiting first: an answer that comes while the mark is written finds it.
        self.waiting[key] = wait
        try:
            if self.shared:
                await self.ledger.mark_approval(step.execution_id, step.seq, call.tool_call_id)
            await wait.future
        finally:
            if self.waiting.get(key) is wait:
                del self.waiting[key]

    async def on_approval(self, peer: Peer, frame: ToolApprovalFrame) -> str | None:
        """Settle an approval; a message for a protocol error when nothing waits for it."""
        wait = self.waiting.get((peer.session, frame.tool_call_id))
        if wait is None or wait.future.done():
            return await self._elsewhere(peer, frame)
        await self._answer(wait.execution_id, wait.seq, frame)
        if not wait.future.done():
            wait.future.set_result(None)
        return None

    async def _answer(self, execution_id: str, seq: int, frame: ToolApprovalFrame) -> bool:
        verdict: dict[str, JsonValue] = {"approved": frame.approved}
        if frame.reason is not None:
            verdict["reason"] = frame.reason
        outcome = await self.ledger.resolve(
            execution_id, seq, canonical_json(verdict), self.clock.now()
        )
        if not outcome.ok:
            outcome = await self.ledger.reject(
                execution_id, seq, encode_error("invalid_output", outcome.message),
                self.clock.now(),
            )  # fmt: skip
        return outcome.ok

    async def _elsewhere(self, peer: Peer, frame: ToolApprovalFrame) -> str | None:
        """An approval for a run on another process: answered in the ledger, its run woken."""
        problem = f"no approval is pending for tool call {frame.tool_call_id[:64]!r}"
        if not self.shared:
            return problem
        found = await self.ledger.approval_step(peer.session, frame.tool_call_id)
        if found is None:
            return problem
        step, owner = found
        if not await self._answer(step.execution_id, step.seq, frame):
            return problem  # answered meanwhile
        if owner is not None and owner != self.ledger.owner:
            await self.ledger.notify(owner, "settled", "", step.execution_id, str(step.seq), "page")
        return None

    def wake(self, execution_id: str, seq: int) -> bool:
        for wait in self.waiting.values():
            if (wait.execution_id, wait.seq) == (execution_id, seq) and not wait.future.done():
                wait.future.set_result(None)
                return True
        return False

    def wake_expired(self, execution_ids: Iterable[str]) -> None:
        expired = set(execution_ids)
        for wait in self.waiting.values():
            if wait.execution_id in expired and not wait.future.done():
                wait.future.set_result(None)
