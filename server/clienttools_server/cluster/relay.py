"""Browser calls across processes on one ledger: invokes relayed, and calls delivered elsewhere.

Two sides of one call whose run and page are on different processes:

- the pages' process relays: the run's process (``owner``) asks it over the bus
  to send an invoke to one of its connections (:meth:`CallRelay.invoke`); it
  keeps a :class:`Relay` (what S5 needs to judge the page's result), applies
  the page's result in the ledger and tells the owner;
- the run's process follows: its call's target is a
  :class:`~clienttools_server.cluster.routing.RemotePeer`, and what happens to
  the call on the other process (settled, progressed, the page gone, a new
  page registered, the process gone) reaches it here and moves its pending
  entry in the proxy.

    relay = CallRelay(proxy, ledger)
    relay.invoke(owner, connection, step, invoke_frame)       # pages' process
    await relay.settled_elsewhere(request_id, execution_id, seq, "page")   # run's process
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, cast, get_args

from clienttools.protocol import (
    CancelFrame,
    CancelReason,
    InvokeFrame,
    ResultAckFrame,
    ToolProgressFrame,
    ToolResultFrame,
)

from ..calls.delivery import DeliveryEvent, Peer, SettledBy
from ..calls.settlement import ack, page_ack, settlement_of
from ..ledger import Ledger, LedgerUnavailable, Step, StepState
from .routing import SETTLED, RemotePeer, fits

if TYPE_CHECKING:
    from ..calls.proxy import CallProxy

logger = logging.getLogger(__name__)

# How many calls settled here for runs elsewhere are remembered (settled_here).
MAX_TOLD = 4_096
# The states a ``settled`` notification's outcome may name: every one but pending.
SETTLED_STATES: frozenset[str] = frozenset(get_args(StepState)) - {"pending"}


@dataclass(eq=False, slots=True)
class Relay:
    """An invoke this process sent to one of its connections for a run on another process.

    The run's process (``owner``) keeps the pending entry; this process keeps
    what S5 needs to judge the page's result (the connection it went to, its
    clientId), applies the result, and tells the owner.
    """

    request_id: str
    owner: str
    peer: Peer
    client_id: str | None
    # The step as the invoke carried it, or as read; the ledger's settle decides,
    # not its state.
    step: Step
    last_progress: float | None = None


def on_process(peer: Peer | None, process_id: str) -> bool:
    """Is ``peer`` a connection of process ``process_id`` (a remote peer)?"""
    return isinstance(peer, RemotePeer) and peer.process_id == process_id


async def is_open(peer: Peer) -> bool:
    """Is the peer there? A remote one is asked (a read), a local one knows."""
    return await peer.check() if isinstance(peer, RemotePeer) else peer.is_open


def send_invoke(peer: Peer, frame: InvokeFrame, step: Step) -> None:
    """Send an invoke to ``peer``; a connection on another process gets ``step`` with it."""
    if isinstance(peer, RemotePeer):
        peer.invoke(frame, step)
    else:
        peer.send(frame)


def settled_outcome(step: Step) -> tuple[str, str] | None:
    """A settled step's (state, result or error JSON), as ``settled`` carries it."""
    value = step.result_json if step.state == "applied" else step.error_json
    return None if step.state == "pending" or value is None else (step.state, value)


class CallRelay:
    """The relayed invokes of this process, and its calls delivered on other processes."""

    def __init__(self, proxy: CallProxy, ledger: Ledger) -> None:
        self.proxy = proxy
        self.ledger = ledger
        # Invokes relayed to this process's connections for runs on other processes.
        self.relayed: dict[str, Relay] = {}
        # The calls this process settled for a run elsewhere and told its owner of,
        # the latest MAX_TOLD: an invoke of one of them (from a new owner that read
        # the step before) is judged from the row, not from the step it carries.
        self._told: OrderedDict[str, None] = OrderedDict()

    def settled_here(self, request_id: str) -> bool:
        """Did this process settle the call, or hear it was resolved from outside?"""
        return request_id in self._told or request_id in self.proxy.results.superseded

    # -- the pages' side: invokes relayed to connections here --------------------------

    async def tell_owner(self, owner: str, step: Step, how: SettledBy) -> None:
        """Wake the run waiting for ``step`` on its process (this one has no entry for it).

        A settled ``step`` goes with its outcome when that fits, so the owner reads nothing.
        """
        if owner == self.ledger.owner or step.request_id is None:
            return
        self._told[step.request_id] = None
        self._told.move_to_end(step.request_id)
        while len(self._told) > MAX_TOLD:
            self._told.popitem(last=False)
        args: tuple[str, ...] = (step.request_id, step.execution_id, str(step.seq), how)
        outcome = settled_outcome(step)
        if outcome is not None and fits(*args, *outcome):
            args = (*args, *outcome)
        await self.ledger.notify(owner, SETTLED, *args)

    def invoke(self, owner: str, peer: Peer, step: Step, frame: InvokeFrame) -> None:
        """Send a run's invoke (its process is ``owner``) to ``peer``, a connection here."""
        self.relayed[frame.request_id] = Relay(frame.request_id, owner, peer, peer.client_id, step)
        peer.send(frame)

    def cancel(self, request_id: str, reason: CancelReason, peer: Peer | None) -> None:
        relay = self.relayed.get(request_id)
        if relay is not None and (peer is None or relay.peer is peer):
            del self.relayed[request_id]
        if reason == "superseded":
            self.proxy.results.remember_superseded(request_id)
        if peer is not None and peer.is_open:
            peer.send(CancelFrame(request_id=request_id, reason=reason))

    async def result(self, relay: Relay, peer: Peer, frame: ToolResultFrame) -> ResultAckFrame:
        if not (
            relay.peer is peer
            or (
                not relay.peer.is_open
                and relay.client_id is not None
                and peer.session == relay.peer.session
                and peer.client_id == relay.client_id
            )
        ):
            return ack(frame.request_id, "invalid", "the invoke was not sent to this connection")
        applied = await self.proxy.results.apply(relay.step, settlement_of(frame), by_page=True)
        # Only once the ledger answered: if it could not (LedgerUnavailable), the
        # socket closes with 1013 and its close tells the owner, as for any call.
        self.relayed.pop(frame.request_id, None)
        # Whatever the ledger decided (applied, settled before, refused and settled
        # as invalid_output), the owner is told: with the settled step when the
        # ledger answered with it, else it reads the step (a pending one it ignores).
        await self.tell_owner(relay.owner, applied.step or relay.step, "page")
        return page_ack(frame.request_id, applied)

    async def progress(self, peer: Peer, frame: ToolProgressFrame) -> None:
        """A relayed call's page reports progress: tell the run's process."""
        relay = self.relayed.get(frame.request_id)
        if relay is None or relay.peer is not peer:
            return
        if relay.last_progress is not None and frame.progress <= relay.last_progress:
            return
        relay.last_progress = frame.progress
        await self.ledger.notify(relay.owner, "progress", frame.request_id, repr(frame.progress))

    async def disconnected(self, peer: Peer) -> None:
        """The calls relayed to ``peer``: their processes are told it is gone."""
        for relay in [r for r in self.relayed.values() if r.peer is peer]:
            self.relayed.pop(relay.request_id, None)
            try:
                await self.ledger.notify(relay.owner, "gone", relay.request_id, peer.id)
            except LedgerUnavailable as exc:
                # The owner finds out by itself: its resync after the database is back.
                logger.warning("could not tell %s its call's page left: %s", relay.owner, exc)

    # -- the owner's side: calls of runs here, delivered on other processes ------------

    async def settled_elsewhere(
        self,
        request_id: str,
        execution_id: str,
        seq: int,
        how: str,
        outcome: tuple[str, str] | None = None,
    ) -> bool:
        """Another process settled the step of one of our calls: wake its run. True if ours.

        ``outcome``: the settled step's state and value, when the notification carried
        them; else the step is read.
        """
        entry = self.proxy.pending.get(request_id)
        if entry is None or (entry.execution_id, entry.seq) != (execution_id, seq):
            return False
        if entry.settled:
            return True
        if outcome is not None and outcome[0] in SETTLED_STATES:
            state, value = cast("StepState", outcome[0]), outcome[1]
            step: Step | None = replace(
                entry.step,
                state=state,
                result_json=value if state == "applied" else None,
                error_json=None if state == "applied" else value,
                attempts=entry.attempt,
            )
        else:
            step = await self.ledger.get_step(execution_id, seq)
        if entry.settled or step is None or step.state == "pending":
            return True
        if how == "outside":
            self.proxy.results.remember_superseded(request_id)
        self.proxy.mark_settled(
            entry, step, DeliveryEvent.OUTSIDE if how == "outside" else DeliveryEvent.RESULT
        )
        return True

    def progressed_elsewhere(self, process_id: str, request_id: str, progress: float) -> None:
        entry = self.proxy.pending.get(request_id)
        if entry is not None and not entry.settled and on_process(entry.target, process_id):
            self.proxy.progressed(entry, progress)

    async def gone_elsewhere(self, process_id: str, request_id: str, connection_id: str) -> None:
        """The connection on ``process_id`` that had the invoke closed: S4 for that call."""
        entry = self.proxy.pending.get(request_id)
        target = entry.target if entry is not None else None
        if entry is None or entry.settled or target is None or target.id != connection_id:
            return
        if isinstance(target, RemotePeer) and target.process_id == process_id:
            target.gone = True
            if entry.recorded:  # else its invoke is not out yet: CallProxy._announce sees it gone
                await self.proxy.target_gone(entry)

    async def registered_elsewhere(self, session: str) -> None:
        """A connection of ``session`` registered tools on another process."""
        for entry in list(self.proxy.pending.values()):
            if (
                entry.session == session
                and entry.recorded
                and not entry.settled
                and (entry.target is None or not await is_open(entry.target))
            ):
                await self.proxy.deliver(entry)

    async def targets_lost(self, live_processes: frozenset[str]) -> None:
        """Calls delivered to processes that are not alive any more: their pages are gone."""
        for entry in list(self.proxy.pending.values()):
            target = entry.target
            if (
                entry.recorded
                and not entry.settled
                and isinstance(target, RemotePeer)
                and target.process_id not in live_processes
            ):
                target.gone = True
                await self.proxy.target_gone(entry)

    async def resync(self) -> None:
        """After notifications may have been lost: re-read every call's step, deliver again."""
        for entry in list(self.proxy.pending.values()):
            if entry.settled or not entry.recorded:
                continue
            step = await self.ledger.get_step(entry.execution_id, entry.seq)
            if entry.settled:
                continue
            if step is not None and step.state != "pending":
                self.proxy.mark_settled(entry, step, DeliveryEvent.RESULT)
            elif entry.target is None:
                await self.proxy.deliver(entry)
            elif not await is_open(entry.target):
                await self.proxy.target_gone(entry)
