"""Browser tools as server tools: pending calls, delivery, timeouts, acks, approvals (S1-S6).

A run calls :meth:`CallProxy.call` with the ledger step of a ``client``
call. The call becomes a pending entry keyed by the step's unguessable
``requestId``; it is delivered as an invoke to the newest live connection of
the session that registered the tool (or waits for one), timed with an idle
clock that progress restarts and a hard cap, and settled in the ledger by the
first valid result, a timeout, an abort, a disconnect (policy ``fail``) or
expiry. Every result frame gets an ack: ``applied``, ``duplicate``, ``stale``
or ``invalid``. Nothing here raises on bad peer input.

A call's lifecycle in this process is the table ``DELIVERY_TRANSITIONS``
(``DeliveryState`` x ``DeliveryEvent``); ``LATE_RESULT`` says what a result that
comes after the call was settled gets. Every result, whatever its source (the
page the invoke went to, a page re-sending to a restarted server, a resolve
from outside through ``Hub.settle``), is applied by :meth:`CallProxy.apply`,
which checks it against the outputSchema recorded with the ledger step.

    tools = CallProxy(ledger, config, hub.find_peer, durable=config.db is not None)
    await tools.call("chat-1", step, call)           # returns once the step is settled
    peer.send(await tools.on_result(peer, frame))    # the ack for a result frame
    (await tools.apply(step, Settlement(output=3), by_page=False)).outcome   # "applied"

Every method that reads or writes the ledger is a coroutine. What happens in
one of them between two awaits is atomic, as on the event loop; across an
await another frame, timer or notification may have moved the call on, so
each checks the entry again before it acts on it (``settled``, ``target``).
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Literal, Protocol, cast

from pydantic import JsonValue

from clienttools.protocol import (
    AckOutcome,
    CancelFrame,
    CancelReason,
    InvokeFrame,
    ResultAckFrame,
    ToolProgressFrame,
    ToolResultFrame,
    ToolSpec,
    WireModel,
    json_size,
)

from ..agent.journal import RequestedCall
from ..calls.output_schemas import OutputSchemas
from ..canonical import canonical_json
from ..clock import SYSTEM_CLOCK, Clock, Timer
from ..cluster.routing import RemotePeer
from ..config import ServerConfig
from ..ledger import (
    LeaseLost,
    Ledger,
    LedgerUnavailable,
    OutcomeReason,
    Step,
)
from ..tasks import Background
from .settlement import Applied, Settlement, encode_error

logger = logging.getLogger(__name__)

# Error codes a call gets when the server settles it without a result; a late
# result for such a call is `stale`, for any other settled call `duplicate`.
_SETTLED_WITHOUT_RESULT = frozenset({"timeout", "cancelled", "disconnected", "expired", "denied"})
# Request ids of calls settled from outside, remembered after their entry is gone
# so the page's late result is `stale` (not `duplicate`); the oldest go first.
MAX_SUPERSEDED = 10_000


class DeliveryState(enum.Enum):
    """Where one pending browser call's delivery stands in this process, and how it ended.

    The server's side of a call; the page's own (running, completed, timed out) is
    ``clienttools.rules.CallState``.
    """

    # Delivered by an earlier process (a restart): the page that has it is
    # unknown here, so a result from any page of its session is taken.
    ORPHANED = "orphaned"
    # No live page has the invoke; it goes to the next one that registers the tool.
    WAITING = "waiting"
    # The invoke went to ``target``.
    DELIVERED = "delivered"
    # Settled by a page's result (an output or a tool error): a later result is `duplicate`.
    APPLIED = "applied"
    # Settled from outside (Hub.resolve, the HTTP routes): the page's result is `stale`.
    SUPERSEDED = "superseded"
    # Settled by the server (timeout, abort, disconnect, expiry): a later result is `stale`.
    CLOSED = "closed"


class DeliveryEvent(enum.Enum):
    DELIVER = "deliver"  # an invoke goes to a page
    NO_PAGE = "no_page"  # no live page offers the tool: wait for one
    RESULT = "result"  # a page's result was recorded
    OUTSIDE = "outside"  # the ledger step was settled from outside
    SERVER = "server"  # the server settled it without a result


_SETTLING = {
    DeliveryEvent.RESULT: DeliveryState.APPLIED,
    DeliveryEvent.OUTSIDE: DeliveryState.SUPERSEDED,
    DeliveryEvent.SERVER: DeliveryState.CLOSED,
}
DELIVERY_TRANSITIONS: dict[DeliveryState, dict[DeliveryEvent, DeliveryState]] = {
    DeliveryState.ORPHANED: {
        DeliveryEvent.DELIVER: DeliveryState.DELIVERED,
        DeliveryEvent.NO_PAGE: DeliveryState.ORPHANED,
        **_SETTLING,
    },
    DeliveryState.WAITING: {
        DeliveryEvent.DELIVER: DeliveryState.DELIVERED,
        DeliveryEvent.NO_PAGE: DeliveryState.WAITING,
        **_SETTLING,
    },
    DeliveryState.DELIVERED: {
        # Re-delivered (S4 wait, a new registration).
        DeliveryEvent.DELIVER: DeliveryState.DELIVERED,
        DeliveryEvent.NO_PAGE: DeliveryState.WAITING,
        **_SETTLING,
    },
    DeliveryState.APPLIED: {},
    DeliveryState.SUPERSEDED: {},
    DeliveryState.CLOSED: {},
}
# The ack of a result for a call that was settled already, by how it was settled.
LATE_RESULT: dict[DeliveryState, AckOutcome] = {
    DeliveryState.APPLIED: "duplicate",
    DeliveryState.SUPERSEDED: "stale",
    DeliveryState.CLOSED: "stale",
}


def next_delivery_state(state: DeliveryState, event: DeliveryEvent) -> DeliveryState:
    """The state ``event`` leads to; RuntimeError for a step the table does not list."""
    try:
        return DELIVERY_TRANSITIONS[state][event]
    except KeyError:
        raise RuntimeError(
            f"a call in state {state.value!r} cannot take event {event.value!r}"
        ) from None


class Peer(Protocol):
    """What the proxy needs of a connection."""

    @property
    def id(self) -> str: ...

    @property
    def session(self) -> str: ...

    @property
    def client_id(self) -> str | None: ...

    @property
    def is_open(self) -> bool: ...

    def send(self, frame: WireModel) -> None: ...

    def tool_spec(self, name: str) -> ToolSpec | None: ...


FindPeer = Callable[[str, str], Awaitable[Peer | None]]


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
    # The step as read for the invoke; the ledger's settle decides, not its state.
    step: Step
    last_progress: float | None = None


# How a step settled elsewhere was settled (the `settled` notification's last field).
SettledBy = Literal["page", "outside"]


@dataclass(eq=False, slots=True)
class PendingCall:
    request_id: str
    execution_id: str
    seq: int
    session: str
    call: RequestedCall
    future: asyncio.Future[None]
    state: DeliveryState = DeliveryState.WAITING
    # The page the invoke went to last, and its clientId (kept while it waits again).
    target: Peer | None = None
    client_id: str | None = None
    # The spec of the delivering page (its timeoutMs).
    spec: ToolSpec | None = None
    attempt: int = 0
    idle_timeout: float = 0.0
    last_progress: float | None = None
    idle_timer: Timer | None = None
    hard_timer: Timer | None = None
    # The step as this proxy's resolve or reject left it, so the run need not read it back.
    settled_step: Step | None = None
    # Someone waits for it (CallProxy._wait ran).
    awaited: bool = False
    # The outputSchema its results are checked against: the spec recorded with
    # the step (the one the call was made with), so the same after a restart.
    output_schema: dict[str, JsonValue] | None = None
    spec_recorded: bool = False
    # Counts deliveries begun: one that another overtook while it awaited stops.
    deliveries: int = 0
    # Its step is committed (a call started inside the run's batch is not until
    # the batch ends): until then no other task delivers or settles it.
    recorded: bool = True

    @property
    def timers(self) -> int:
        return (self.idle_timer is not None) + (self.hard_timer is not None)

    @property
    def settled(self) -> bool:
        return not DELIVERY_TRANSITIONS[self.state]

    def move(self, event: DeliveryEvent) -> None:
        self.state = next_delivery_state(self.state, event)


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


def _on_process(peer: Peer | None, process_id: str) -> bool:
    """Is ``peer`` a connection of process ``process_id`` (a remote peer)?"""
    return isinstance(peer, RemotePeer) and peer.process_id == process_id


def _settled_by_server(step: Step | None) -> bool:
    """Did the server settle this step without a result (a later result is then `stale`)?"""
    error = step.error() if step is not None else None
    return error is not None and error.get("code") in _SETTLED_WITHOUT_RESULT


def _ack(request_id: str, outcome: AckOutcome, message: str | None = None) -> ResultAckFrame:
    return ResultAckFrame(request_id=request_id, outcome=outcome, message=message)


def _settlement(frame: ToolResultFrame) -> Settlement:
    if frame.error is not None:
        return Settlement(error=frame.error.model_dump(mode="json", exclude_none=True))
    return Settlement(output=frame.output)


def _recorded_schema(step: Step) -> dict[str, JsonValue] | None:
    """The outputSchema of the spec recorded with the step, if any."""
    spec = step.spec()
    schema = spec.get("outputSchema") if spec is not None else None
    return cast("dict[str, JsonValue]", schema) if isinstance(schema, dict) else None


FindSpec = Callable[[str, str], Awaitable[ToolSpec | None]]


async def _no_spec(session: str, name: str) -> ToolSpec | None:
    return None


async def _is_open(peer: Peer) -> bool:
    """Is the peer there? A remote one is asked (a read), a local one knows."""
    return await peer.check() if isinstance(peer, RemotePeer) else peer.is_open


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
        self.schemas = schemas if schemas is not None else OutputSchemas()
        self.durable = durable
        self.clock = clock
        self.pending: dict[str, PendingCall] = {}
        self.superseded: OrderedDict[str, None] = OrderedDict()
        self.shutting_down = False
        # Executions another process took over: their calls end here unsaid.
        self.handed_over: set[str] = set()
        # Invokes relayed to this process's connections for runs on other processes.
        self.relayed: dict[str, Relay] = {}
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

    async def start(self, session: str, step: Step, call: RequestedCall) -> StartedCall:
        """Register the call of a pending step and deliver it now, without waiting.

        For a run that records a step and delivers it in one ledger batch: the
        attempt is part of the batch, and the invoke leaves once it committed
        (``after_commit``). The returned call's ``wait`` returns once it is
        settled; its ``abandon`` releases it when its waiter never ran.
        """
        self._check_new(step)
        assert step.request_id is not None
        entry = PendingCall(
            step.request_id, step.execution_id, step.seq, session, call,
            asyncio.get_running_loop().create_future(),
            state=DeliveryState.ORPHANED if step.attempts > 0 else DeliveryState.WAITING,
        )  # fmt: skip
        self.pending[entry.request_id] = entry
        entry.recorded = False
        self.ledger.after_commit(lambda: setattr(entry, "recorded", True))
        try:
            await self._record_spec(entry, step)
            await self._deliver(entry)
        except BaseException:
            self._release(entry)
            raise
        return StartedCall(self, entry)

    async def _record_spec(
        self, entry: PendingCall, step: Step | None, spec: ToolSpec | None = None
    ) -> None:
        """Take the step's recorded spec, or record the one the session knows now."""
        if step is not None and step.spec_json is not None:
            entry.output_schema = _recorded_schema(step)
            entry.spec_recorded = True
            return
        if spec is None:
            spec = await self.find_spec(entry.session, entry.call.tool_name)
        if spec is None:
            return
        wire = spec.model_dump(mode="json", by_alias=True, exclude_none=True)
        await self.ledger.record_spec(entry.execution_id, entry.seq, canonical_json(wire))
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

    async def _deliver(self, entry: PendingCall) -> None:
        entry.deliveries += 1
        delivery = entry.deliveries

        def overtaken() -> bool:
            # Settled, or delivered again by another task, while this one awaited.
            return entry.settled or entry.deliveries != delivery

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
            peer.send(frame)
        elif entry.target is peer:
            # It closed while the step was committed (its close skipped the call).
            self.background.call(self._target_gone, entry)

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

    def _settled(self, entry: PendingCall, step: Step | None, event: DeliveryEvent) -> None:
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

    def _entry_of(self, step: Step) -> PendingCall | None:
        entry = self.pending.get(step.request_id) if step.request_id is not None else None
        if entry is None or (entry.execution_id, entry.seq) != (step.execution_id, step.seq):
            return None
        return entry

    def remember_superseded(self, request_id: str | None) -> None:
        if request_id is None:
            return
        self.superseded[request_id] = None
        self.superseded.move_to_end(request_id)
        while len(self.superseded) > MAX_SUPERSEDED:
            self.superseded.popitem(last=False)

    # -- applying a result: the one path for every source -------------------------------

    async def apply(self, step: Step, settlement: Settlement, *, by_page: bool) -> Applied:
        """Apply ``settlement`` to ``step``: the one path every result takes.

        A page's result (live, or re-delivered to a restarted server) comes
        with ``by_page``; a resolve from outside (``Hub.resolve``, the HTTP
        routes) without. Each gets the same checks: the step must be pending,
        an output must fit the size limit and the outputSchema recorded with
        the step (compiled once, by jsonschema). A page's refused output
        settles the step with the error the model then reads
        (``invalid_output``, ``output_too_large``); a refused resolve from
        outside changes nothing. On ``applied`` the run waiting for the step
        wakes up, and a page that had the invoke of a call settled from
        outside gets a ``superseded`` cancel.
        """
        entry = self._entry_of(step)
        if step.state != "pending":
            return self._late(step, settlement, by_page=by_page, entry=entry)
        now = self.clock.now()
        if settlement.error is None:
            problem = self._check_output(settlement.output, step, entry)
            if problem is not None:
                code, message = problem
                if by_page:
                    await self._refused_by_page(step, entry, encode_error(code, message))
                reason: OutcomeReason = "too_large" if code == "output_too_large" else "invalid"
                return Applied("invalid", reason, message, step)
            try:
                result_json = canonical_json(settlement.output)
            except ValueError as exc:
                return Applied("invalid", "invalid", f"the output is not JSON: {exc}", step)
            outcome = await self.ledger.resolve(step.execution_id, step.seq, result_json, now)
        else:
            try:
                error_json = canonical_json(settlement.error)
            except ValueError as exc:
                return Applied("invalid", "invalid", f"the error is not JSON: {exc}", step)
            outcome = await self.ledger.reject(step.execution_id, step.seq, error_json, now)
        if not outcome.ok:
            if outcome.reason == "not_pending" and outcome.step is not None:
                return self._late(outcome.step, settlement, by_page=by_page, entry=entry)
            if outcome.reason == "not_found":
                return Applied("stale", "not_found", outcome.message)
            if by_page and settlement.error is None:
                # Over the stored-size limit: the model reads why instead.
                await self._refused_by_page(
                    step, entry, encode_error("output_too_large", outcome.message)
                )
                return Applied("invalid", outcome.reason, "the result is too large to be stored")
            return Applied("invalid", outcome.reason, outcome.message, outcome.step)
        if not by_page:
            self.remember_superseded(step.request_id)
        if entry is not None:
            self._settled(
                entry, outcome.step, DeliveryEvent.RESULT if by_page else DeliveryEvent.OUTSIDE
            )
        return Applied("applied", "applied", outcome.message, outcome.step)

    async def _refused_by_page(
        self, step: Step, entry: PendingCall | None, error_json: str
    ) -> None:
        outcome = await self.ledger.reject(
            step.execution_id, step.seq, error_json, self.clock.now()
        )
        if outcome.ok and entry is not None:
            self._settled(entry, outcome.step, DeliveryEvent.RESULT)

    def _late(
        self,
        step: Step,
        settlement: Settlement,
        *,
        by_page: bool,
        entry: PendingCall | None,
    ) -> Applied:
        """The outcome for a step settled already: `duplicate` if settled this way, else `stale`."""
        message = f"step {step.seq} of execution {step.execution_id} is already {step.state}"
        by_server = _settled_by_server(step)
        if by_page:
            if entry is not None and entry.settled:
                stale = LATE_RESULT[entry.state] == "stale"
            else:
                stale = by_server or step.request_id in self.superseded
        else:
            # From outside, "this way" is the same kind of answer: an output
            # after an output, an error after an error that was not the server's.
            same_kind = (step.state == "applied") == (settlement.error is None)
            stale = by_server or not same_kind
        return Applied("stale" if stale else "duplicate", "not_pending", message, step)

    def _check_output(
        self, output: JsonValue, step: Step, entry: PendingCall | None
    ) -> tuple[str, str] | None:
        try:
            size = json_size(output)
        except (TypeError, ValueError, RecursionError) as exc:
            return "invalid_output", f"the output is not JSON: {exc}"
        if size > self.config.max_result_bytes:
            return (
                "output_too_large",
                f"the result is {size:,} bytes as JSON; the limit is "
                f"{self.config.max_result_bytes:,} bytes",
            )
        schema = entry.output_schema if entry is not None else _recorded_schema(step)
        if schema is not None:
            errors = self.schemas.errors(schema, output)
            if errors:
                return "invalid_output", "the result does not match outputSchema: " + "; ".join(
                    errors
                )
        return None

    async def wake(self, execution_id: str, seq: int) -> bool:
        """The ledger step was settled from outside this proxy; release its call.

        ``Hub.resolve`` goes through :meth:`apply`, which does this itself;
        this is for a step settled in the ledger directly.
        """
        for entry in list(self.pending.values()):
            if (entry.execution_id, entry.seq) == (execution_id, seq) and not entry.settled:
                self.remember_superseded(entry.request_id)
                step = await self.ledger.get_step(execution_id, seq)
                self._settled(entry, step, DeliveryEvent.OUTSIDE)
                return True
        return False

    # -- the connections' side ---------------------------------------------------------

    async def on_result(self, peer: Peer, frame: ToolResultFrame) -> ResultAckFrame:
        """Settle a call from a result frame (S5); the returned ack goes back to ``peer``."""
        entry = self.pending.get(frame.request_id)
        if entry is None:
            relay = self.relayed.get(frame.request_id)
            if relay is not None:
                return await self._relayed_result(relay, peer, frame)
            return await self._result_without_entry(peer, frame)
        if entry.settled:
            late = LATE_RESULT[entry.state]
            return _ack(
                frame.request_id, late, "the call was already settled" if late == "stale" else None
            )
        if not await self._from_target(entry, peer):
            return _ack(frame.request_id, "invalid", "the invoke was not sent to this connection")
        step = await self.ledger.get_step(entry.execution_id, entry.seq)
        if step is None:
            return _ack(frame.request_id, "stale", "no such call")
        applied = await self.apply(step, _settlement(frame), by_page=True)
        return self._page_ack(frame.request_id, applied)

    @staticmethod
    def _page_ack(request_id: str, applied: Applied) -> ResultAckFrame:
        if applied.outcome == "duplicate":
            return _ack(request_id, "duplicate")
        if applied.outcome == "stale":
            return _ack(request_id, "stale", "the call was already settled")
        return _ack(request_id, applied.outcome, None if applied.ok else applied.message)

    async def _from_target(self, entry: PendingCall, peer: Peer) -> bool:
        if entry.state is DeliveryState.ORPHANED:
            # Delivered by an earlier process (a restart): the page is not known
            # here; only a page of the session it went to can know the unguessable id.
            return peer.session == entry.session
        if entry.target is peer:
            return True
        if entry.target is not None and await _is_open(entry.target):
            return False
        # The invoke's connection is gone. The same page (same clientId) may send
        # the result again from its new connection before the invoke is
        # re-delivered (C11).
        return (
            peer.session == entry.session
            and entry.client_id is not None
            and peer.client_id == entry.client_id
        )

    async def _result_without_entry(self, peer: Peer, frame: ToolResultFrame) -> ResultAckFrame:
        step = await self.ledger.step_by_request_id(frame.request_id)
        if step is None:
            return _ack(frame.request_id, "stale", "no such call")
        if step.state != "pending":
            applied = await self.apply(step, _settlement(frame), by_page=True)
            return self._page_ack(frame.request_id, applied)
        # The run that owns it is not waiting in this process: a restarted server
        # before replay, or a run on another process whose invoke went to a
        # connection that is gone. Record it; the run reads it (woken if elsewhere).
        execution = await self.ledger.get_execution(step.execution_id)
        if execution is None or execution.session != peer.session:
            return _ack(frame.request_id, "invalid", "the call belongs to another session")
        if not await self._from_recorded_target(step, peer):
            return _ack(frame.request_id, "invalid", "the invoke was not sent to this connection")
        applied = await self.apply(step, _settlement(frame), by_page=True)
        if execution.owner is not None:
            await self._tell_owner(execution.owner, step, "page")
        return self._page_ack(frame.request_id, applied)

    async def _from_recorded_target(self, step: Step, peer: Peer) -> bool:
        """S5 from the step's record of where its last invoke went (a shared ledger)."""
        if step.target_connection is None or step.target_connection == peer.id:
            return True  # not recorded (one process, after a restart): the session decides
        if await self.ledger.registered(step.target_connection, self.clock.now()):
            return False  # the invoke's connection is still there, on some process
        return peer.client_id is not None and peer.client_id == step.target_client_id

    async def _tell_owner(self, owner: str, step: Step, how: SettledBy) -> None:
        """Wake the run waiting for ``step`` on its process (this one has no entry for it)."""
        if owner != self.ledger.owner and step.request_id is not None:
            await self.ledger.notify(
                owner, "settled", step.request_id, step.execution_id, str(step.seq), how
            )

    # -- relaying for runs on other processes --------------------------------------------

    def relay_invoke(self, owner: str, peer: Peer, step: Step, frame: InvokeFrame) -> None:
        """Send a run's invoke (its process is ``owner``) to ``peer``, a connection here."""
        self.relayed[frame.request_id] = Relay(frame.request_id, owner, peer, peer.client_id, step)
        peer.send(frame)

    def relay_cancel(self, request_id: str, reason: CancelReason, peer: Peer | None) -> None:
        relay = self.relayed.get(request_id)
        if relay is not None and (peer is None or relay.peer is peer):
            del self.relayed[request_id]
        if reason == "superseded":
            self.remember_superseded(request_id)
        if peer is not None and peer.is_open:
            peer.send(CancelFrame(request_id=request_id, reason=reason))

    async def _relayed_result(
        self, relay: Relay, peer: Peer, frame: ToolResultFrame
    ) -> ResultAckFrame:
        if not (
            relay.peer is peer
            or (
                not relay.peer.is_open
                and relay.client_id is not None
                and peer.session == relay.peer.session
                and peer.client_id == relay.client_id
            )
        ):
            return _ack(frame.request_id, "invalid", "the invoke was not sent to this connection")
        step = relay.step
        applied = await self.apply(step, _settlement(frame), by_page=True)
        # Only once the ledger answered: if it could not (LedgerUnavailable), the
        # socket closes with 1013 and its close tells the owner, as for any call.
        self.relayed.pop(frame.request_id, None)
        # Whatever the ledger decided (applied, settled before, refused and settled
        # as invalid_output), the owner reads the step: a pending one it ignores.
        await self._tell_owner(relay.owner, step, "page")
        return self._page_ack(frame.request_id, applied)

    # -- the owner's side of a call relayed elsewhere -------------------------------------

    async def settled_elsewhere(
        self, request_id: str, execution_id: str, seq: int, how: str
    ) -> bool:
        """Another process settled the step of one of our calls: wake its run. True if ours."""
        entry = self.pending.get(request_id)
        if entry is None or (entry.execution_id, entry.seq) != (execution_id, seq):
            return False
        if entry.settled:
            return True
        step = await self.ledger.get_step(execution_id, seq)
        if entry.settled or step is None or step.state == "pending":
            return True
        if how == "outside":
            self.remember_superseded(request_id)
        self._settled(
            entry, step, DeliveryEvent.OUTSIDE if how == "outside" else DeliveryEvent.RESULT
        )
        return True

    def progressed_elsewhere(self, process_id: str, request_id: str, progress: float) -> None:
        entry = self.pending.get(request_id)
        if entry is not None and not entry.settled and _on_process(entry.target, process_id):
            self._progressed(entry, progress)

    async def gone_elsewhere(self, process_id: str, request_id: str, connection_id: str) -> None:
        """The connection on ``process_id`` that had the invoke closed: S4 for that call."""
        entry = self.pending.get(request_id)
        target = entry.target if entry is not None else None
        if entry is None or entry.settled or target is None or target.id != connection_id:
            return
        if isinstance(target, RemotePeer) and target.process_id == process_id:
            target.gone = True
            if entry.recorded:  # else its invoke is not out yet: _announce sees it gone
                await self._target_gone(entry)

    async def registered_elsewhere(self, session: str) -> None:
        """A connection of ``session`` registered tools on another process."""
        for entry in list(self.pending.values()):
            if (
                entry.session == session
                and entry.recorded
                and not entry.settled
                and (entry.target is None or not await _is_open(entry.target))
            ):
                await self._deliver(entry)

    async def targets_lost(self, live_processes: frozenset[str]) -> None:
        """Calls delivered to processes that are not alive any more: their pages are gone."""
        for entry in list(self.pending.values()):
            target = entry.target
            if (
                entry.recorded
                and not entry.settled
                and isinstance(target, RemotePeer)
                and target.process_id not in live_processes
            ):
                target.gone = True
                await self._target_gone(entry)

    async def resync(self) -> None:
        """After notifications may have been lost: re-read every call's step, deliver again."""
        for entry in list(self.pending.values()):
            if entry.settled or not entry.recorded:
                continue
            step = await self.ledger.get_step(entry.execution_id, entry.seq)
            if entry.settled:
                continue
            if step is not None and step.state != "pending":
                self._settled(entry, step, DeliveryEvent.RESULT)
            elif entry.target is None:
                await self._deliver(entry)
            elif not await _is_open(entry.target):
                await self._target_gone(entry)

    async def on_progress(self, peer: Peer, frame: ToolProgressFrame) -> None:
        entry = self.pending.get(frame.request_id)
        if entry is None:
            relay = self.relayed.get(frame.request_id)
            if relay is None or relay.peer is not peer:
                return
            if relay.last_progress is not None and frame.progress <= relay.last_progress:
                return
            relay.last_progress = frame.progress
            await self.ledger.notify(
                relay.owner, "progress", frame.request_id, repr(frame.progress)
            )
            return
        if entry.settled or entry.target is not peer:
            return
        self._progressed(entry, frame.progress)

    def _progressed(self, entry: PendingCall, progress: float) -> None:
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
            await self._target_gone(entry)
        for relay in [r for r in self.relayed.values() if r.peer is peer]:
            self.relayed.pop(relay.request_id, None)
            try:
                await self.ledger.notify(relay.owner, "gone", relay.request_id, peer.id)
            except LedgerUnavailable as exc:
                # The owner finds out by itself: its resync after the database is back.
                logger.warning("could not tell %s its call's page left: %s", relay.owner, exc)

    async def _target_gone(self, entry: PendingCall) -> None:
        self._stop_timers(entry)
        if self.config.disconnect_policy == "fail":
            await self._close(
                entry,
                encode_error("disconnected", "the browser disconnected while the tool ran"),
            )
        else:
            entry.target = None
            await self._deliver(entry)

    async def on_registered(self, peer: Peer) -> None:
        """Deliver the session's waiting calls whose tool ``peer`` now offers."""
        for entry in list(self.pending.values()):
            if (
                entry.session == peer.session
                and entry.recorded
                and not entry.settled
                and peer.tool_spec(entry.call.tool_name) is not None
                and (entry.target is None or not await _is_open(entry.target))
            ):
                await self._deliver(entry)

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
