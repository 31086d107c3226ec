"""Browser tools as server tools: pending calls, delivery, timeouts and cancels (S1-S6).

A run calls :meth:`CallProxy.call` with the ledger step of a ``client``
call. The call becomes a pending entry keyed by the step's unguessable
``requestId``; it is delivered as an invoke to the newest live connection of
the session that registered the tool (or waits for one), timed with an idle
clock that progress restarts and a hard cap, and settled in the ledger by the
first valid result, a timeout, an abort, a disconnect (policy ``fail``) or
expiry. Nothing here raises on bad peer input.

Its parts: the delivery states as a table (:mod:`.delivery`), the one path
every result takes and the page's ack (:class:`~.results.Results`, as
``proxy.results``), and the calls whose page or run is on another process
(:class:`~clienttools_server.cluster.relay.CallRelay`, as ``proxy.relay``).

    proxy = CallProxy(ledger, config, pages.find_peer, durable=config.db is not None)
    await proxy.call("chat-1", step, call)                   # returns once the step is settled
    peer.send(await proxy.results.on_result(peer, frame))    # the ack for a result frame
    await proxy.on_disconnect(peer)                          # S4 for the calls it had

Every method that reads or writes the ledger is a coroutine. What happens in
one of them between two awaits is atomic, as on the event loop; across an
await another frame, timer or notification may have moved the call on, so
each checks the entry again before it acts on it (``settled``, ``target``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass

from clienttools.protocol import (
    CancelFrame,
    CancelReason,
    InvokeFrame,
    ToolProgressFrame,
    ToolSpec,
)

from ..agent.journal import RequestedCall, recorded_spec
from ..clock import SYSTEM_CLOCK, Clock, Timer
from ..cluster.relay import CallRelay, is_open, send_invoke
from ..config import ServerConfig
from ..ledger import (
    LeaseLost,
    Ledger,
    Step,
)
from ..tasks import Background
from .delivery import (
    DeliveryEvent,
    DeliveryState,
    FindPeer,
    FindSpec,
    Peer,
    PendingCall,
    recorded_schema,
)
from .output_schemas import OutputSchemas
from .results import Results
from .settlement import encode_error

logger = logging.getLogger(__name__)


@dataclass(eq=False, slots=True)
class StartedCall:
    """A browser tool call already delivered (or waiting for a page); see CallProxy.start."""

    tools: CallProxy
    entry: PendingCall

    async def wait(self) -> Step | None:
        """Return once settled: the settled step, or None when it was settled from outside."""
        return await self.tools._wait(self.entry)

    async def abandon(self) -> None:
        """Release the call if ``wait`` never ran (a no-op otherwise)."""
        await self.tools._abandon(self.entry)


async def _no_spec(session: str, name: str) -> ToolSpec | None:
    return None


class CallProxy:
    """The pending map of browser tool calls of one server."""

    def __init__(
        self,
        ledger: Ledger,
        config: ServerConfig,
        find_peer: FindPeer,
        *,
        durable: bool,
        clock: Clock = SYSTEM_CLOCK,
        find_spec: FindSpec = _no_spec,
        schemas: OutputSchemas | None = None,
    ) -> None:
        self.ledger = ledger
        self.config = config
        self.find_peer = find_peer
        # The spec of a tool the session knows (a live page's, else a remembered one):
        # recorded with each call, so its outputSchema holds after a restart too.
        self.find_spec = find_spec
        self.durable = durable
        self.clock = clock
        self.pending: dict[str, PendingCall] = {}
        self.shutting_down = False
        # Executions another process took over: their calls end here unsaid.
        self.handed_over: set[str] = set()
        # Invokes relayed here for runs on other processes; this process's calls
        # delivered on other processes.
        self.relay = CallRelay(self, ledger)
        # Every result, whatever its source, is applied there.
        self.results = Results(self, schemas if schemas is not None else OutputSchemas())
        # Timeouts firing: each settles its call in the ledger, so it is a task.
        self.background = Background("browser calls")

    @property
    def timer_count(self) -> int:
        return sum(entry.timers for entry in self.pending.values())

    # -- the run's side ----------------------------------------------------------------

    async def call(self, session: str, step: Step, call: RequestedCall) -> Step | None:
        """Deliver the call (now or when a connection registers the tool); return once settled.

        Returns the settled step when this proxy settled it, else None (the
        caller reads it from the ledger).
        """
        self._check_new(step)
        fresh = await self.ledger.get_step(step.execution_id, step.seq)
        if fresh is None or fresh.state != "pending":
            # Settled between the run's planning and this call (Hub.resolve, an
            # outbox result after a restart, expiry): nothing to deliver.
            return fresh
        return await (await self.start(session, fresh, call)).wait()

    def _check_new(self, step: Step) -> None:
        if step.request_id is None:
            raise ValueError(f"step {step.seq} of {step.execution_id} has no request id")
        if step.request_id in self.pending:
            raise RuntimeError(f"request {step.request_id} is already pending")

    async def start(
        self, session: str, step: Step, call: RequestedCall, recorded_to: Peer | None = None
    ) -> StartedCall:
        """Register the call of a pending step and deliver it now, without waiting.

        For a run that records a step and delivers it in one ledger batch: the
        attempt is part of the batch, and the invoke leaves once it committed
        (``after_commit``). ``recorded_to``: the peer the step was recorded with
        as its first attempt (``find_peer``'s, just before), so the attempt is
        not counted again. The returned call's ``wait`` returns once it is
        settled; its ``abandon`` releases it when its waiter never ran.
        """
        self._check_new(step)
        assert step.request_id is not None
        orphaned = step.attempts > 0 and recorded_to is None
        entry = PendingCall(
            step.request_id, step.execution_id, step.seq, session, call,
            asyncio.get_running_loop().create_future(), step,
            state=DeliveryState.ORPHANED if orphaned else DeliveryState.WAITING,
        )  # fmt: skip
        self.pending[entry.request_id] = entry
        entry.recorded = False
        self.ledger.after_commit(lambda: setattr(entry, "recorded", True))
        try:
            await self._record_spec(entry, step)
            await self.deliver(entry, recorded_to)
        except BaseException:
            self._release(entry)
            raise
        return StartedCall(self, entry)

    async def _record_spec(
        self, entry: PendingCall, step: Step | None, spec: ToolSpec | None = None
    ) -> None:
        """Take the step's recorded spec, or record the one the session knows now."""
        if step is not None and step.spec_json is not None:
            entry.output_schema = recorded_schema(step)
            entry.spec_recorded = True
            return
        if spec is None:
            spec = await self.find_spec(entry.session, entry.call.tool_name)
        if spec is None:
            return
        recorded = await self.ledger.record_spec(entry.execution_id, entry.seq, recorded_spec(spec))
        if recorded is not None:
            entry.step = recorded
        entry.output_schema = spec.output_schema
        entry.spec_recorded = True

    async def _wait(self, entry: PendingCall) -> Step | None:
        entry.awaited = True
        try:
            await entry.future
            return entry.settled_step
        except asyncio.CancelledError:
            if not entry.settled:
                await self._on_cancelled(entry)
            raise
        finally:
            self._release(entry)

    async def _abandon(self, entry: PendingCall) -> None:
        # Its waiter was cancelled before it ran: settle it as _wait would have.
        if entry.awaited or self.pending.get(entry.request_id) is not entry:
            return
        try:
            if not entry.settled:
                await self._on_cancelled(entry)
        finally:
            self._release(entry)

    def _release(self, entry: PendingCall) -> None:
        self._stop_timers(entry)
        if self.pending.get(entry.request_id) is entry:
            del self.pending[entry.request_id]

    async def _on_cancelled(self, entry: PendingCall) -> None:
        if entry.execution_id in self.handed_over:
            # The run goes on in another process, which delivers the call again:
            # the page must not cancel the tool, and this process writes nothing.
            return
        if self.shutting_down:
            # A durable call outlives the process: the page may finish it and
            # send the result to the restarted server. Without a durable
            # ledger nothing will ever want that result.
            if not self.durable:
                self._send_cancel(entry, "shutdown")
            return
        lost = False
        try:
            await self.ledger.reject(
                entry.execution_id, entry.seq,
                encode_error("cancelled", "the response was aborted before this call finished"),
                self.clock.now(),
            )  # fmt: skip
        except LeaseLost:
            # The run stopped because another process took it over (a write of
            # its own was refused): as above, nothing for the page.
            lost = True
            self.handed_over.add(entry.execution_id)
        finally:
            if not lost and not entry.settled:
                self._send_cancel(entry, "aborted")
                entry.move(DeliveryEvent.SERVER)

    def _send_cancel(self, entry: PendingCall, reason: CancelReason) -> None:
        if entry.target is not None and entry.target.is_open:
            entry.target.send(CancelFrame(request_id=entry.request_id, reason=reason))

    async def deliver(self, entry: PendingCall, recorded_to: Peer | None = None) -> None:
        """Send the call to a page of its session; ``recorded_to``: see :meth:`start`."""
        if entry.execution_id in self.handed_over:
            return  # its run went on in another process, which delivers the call
        entry.deliveries += 1
        delivery = entry.deliveries

        def overtaken() -> bool:
            # Settled, or delivered again by another task, while this one awaited.
            return entry.settled or entry.deliveries != delivery

        peer = recorded_to
        if peer is None:
            peer = await self.find_peer(entry.session, entry.call.tool_name)
            if overtaken():
                return
        if peer is None:
            entry.target = None  # waits for the next connection that registers the tool
            entry.move(DeliveryEvent.NO_PAGE)
            return
        spec = peer.tool_spec(entry.call.tool_name)
        if not entry.spec_recorded:
            await self._record_spec(entry, None, spec)
            if overtaken():
                return
        wanted = (
            spec.timeout_ms / 1000
            if spec is not None and spec.timeout_ms
            else self.config.tool_timeout
        )
        entry.idle_timeout = min(wanted, self.config.max_tool_timeout)
        entry.target, entry.client_id, entry.spec = peer, peer.client_id, spec
        entry.move(DeliveryEvent.DELIVER)
        entry.last_progress = None
        if recorded_to is not None:
            attempt = 1  # counted in the step's insert
        else:
            attempt = await self.ledger.add_attempt(
                entry.execution_id, entry.seq, self.clock.now(),
                target_connection=peer.id, target_client_id=peer.client_id,
            )  # fmt: skip
            if overtaken():
                return
        entry.attempt = attempt
        frame = InvokeFrame(
            request_id=entry.request_id,
            tool_call_id=entry.call.tool_call_id,
            tool_name=entry.call.tool_name,
            input=entry.call.input,
            # The client enforces the hard cap; the server's idle clock,
            # which progress restarts, usually fires first.
            timeout_ms=round(self.config.max_tool_timeout * 1000),
            attempt=attempt,
        )
        # Inside the run's batch: once the attempt (and the step) are committed.
        self.ledger.after_commit(lambda: self._announce(entry, delivery, peer, frame))
        self._stop_timers(entry)
        entry.idle_timer = self._timer(entry.idle_timeout, entry)
        entry.hard_timer = self._timer(self.config.max_tool_timeout, entry)

    def _announce(self, entry: PendingCall, delivery: int, peer: Peer, frame: InvokeFrame) -> None:
        """Send the invoke once committed, unless the call moved on or its page left meanwhile."""
        if entry.settled or entry.deliveries != delivery:
            return
        if peer.is_open:
            send_invoke(peer, frame, entry.step)
        elif entry.target is peer:
            # It closed while the step was committed (its close skipped the call).
            self.background.call(self.target_gone, entry)

    def _timer(self, delay: float, entry: PendingCall) -> Timer:
        return self.clock.call_later(delay, self.background.call, self._time_out, entry)

    @staticmethod
    def _stop_timers(entry: PendingCall) -> None:
        for timer in (entry.idle_timer, entry.hard_timer):
            if timer is not None:
                timer.cancel()
        entry.idle_timer = entry.hard_timer = None

    async def _time_out(self, entry: PendingCall) -> None:
        if entry.settled:
            return
        limit = entry.idle_timeout
        closed = await self._close(
            entry,
            encode_error(
                "timeout",
                f"the tool {entry.call.tool_name!r} ran past its time limit "
                f"({limit:g} s without progress, at most {self.config.max_tool_timeout:g} s) "
                "and was cancelled",
            ),
        )
        # Only once the timeout is recorded: one the ledger could not take did not happen.
        if closed:
            self._send_cancel(entry, "timeout")

    async def _close(self, entry: PendingCall, error_json: str | None) -> bool:
        """The server settles the call without a result (None: the ledger already did).

        False if something else settled it first (while the ledger was written).
        """
        if error_json is not None:
            # Recorded first: if the ledger cannot be reached (it raises), the call
            # stays as it was, pending, so the page's result still counts.
            outcome = await self.ledger.reject(
                entry.execution_id, entry.seq, error_json, self.clock.now()
            )
            if entry.settled:
                return False  # a result won meanwhile: the ledger refused this one
            if outcome.ok:
                entry.settled_step = outcome.step
        if entry.settled:
            return False
        entry.move(DeliveryEvent.SERVER)
        self._stop_timers(entry)
        if not entry.future.done():
            entry.future.set_result(None)
        return True

    def mark_settled(self, entry: PendingCall, step: Step | None, event: DeliveryEvent) -> None:
        """The ledger step of a live entry was settled by ``event``: wake its run."""
        if entry.settled:
            return
        if event is DeliveryEvent.OUTSIDE:
            self._send_cancel(entry, "superseded")
        entry.move(event)
        self._stop_timers(entry)
        entry.settled_step = step
        if not entry.future.done():
            entry.future.set_result(None)

    async def on_progress(self, peer: Peer, frame: ToolProgressFrame) -> None:
        entry = self.pending.get(frame.request_id)
        if entry is None:
            await self.relay.progress(peer, frame)
            return
        if entry.settled or entry.target is not peer:
            return
        self.progressed(entry, frame.progress)

    def progressed(self, entry: PendingCall, progress: float) -> None:
        if entry.last_progress is not None and progress <= entry.last_progress:
            return
        entry.last_progress = progress
        if entry.idle_timer is not None:
            entry.idle_timer.cancel()
            entry.idle_timer = self._timer(entry.idle_timeout, entry)

    async def on_disconnect(self, peer: Peer) -> None:
        """S4: settle (policy fail) or re-deliver / park (policy wait) the peer's calls.

        Calls relayed to it for runs on other processes: their processes are told.
        """
        for entry in list(self.pending.values()):
            if entry.target is not peer or entry.settled or not entry.recorded:
                continue  # one not recorded yet: _announce finds its page gone
            await self.target_gone(entry)
        await self.relay.disconnected(peer)

    async def target_gone(self, entry: PendingCall) -> None:
        self._stop_timers(entry)
        if self.config.disconnect_policy == "fail":
            await self._close(
                entry,
                encode_error("disconnected", "the browser disconnected while the tool ran"),
            )
        else:
            entry.target = None
            await self.deliver(entry)

    async def on_registered(self, peer: Peer) -> None:
        """Deliver the session's waiting calls whose tool ``peer`` now offers."""
        for entry in list(self.pending.values()):
            if (
                entry.session == peer.session
                and entry.recorded
                and not entry.settled
                and peer.tool_spec(entry.call.tool_name) is not None
                and (entry.target is None or not await is_open(entry.target))
            ):
                await self.deliver(entry)

    async def wake_expired(self, execution_ids: Iterable[str]) -> None:
        """The ledger expired these executions; release their waiting calls."""
        expired = set(execution_ids)
        for entry in list(self.pending.values()):
            if entry.execution_id in expired and not entry.settled:
                self._send_cancel(entry, "timeout")
                await self._close(entry, None)

    async def close(self) -> None:
        """Stop the timeouts that are settling calls right now."""
        await self.background.close()
