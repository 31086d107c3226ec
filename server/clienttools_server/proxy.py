"""Browser tools as server tools: pending calls, delivery, timeouts, acks, approvals (S1-S6).

A run calls :meth:`BrowserTools.call` with the ledger step of a ``client``
call. The call becomes a pending entry keyed by the step's unguessable
``requestId``; it is delivered as an invoke to the newest live connection of
the session that registered the tool (or waits for one), timed with an idle
clock that progress restarts and a hard cap, and settled in the ledger by the
first valid result, a timeout, an abort, a disconnect (policy ``fail``) or
expiry. Every result frame gets an ack: ``applied``, ``duplicate``, ``stale``
or ``invalid``. Nothing here raises on bad peer input.

    tools = BrowserTools(ledger, config, hub.find_peer, durable=config.db is not None)
    await tools.call("chat-1", step, call)     # returns once the step is settled
    peer.send(tools.on_result(peer, frame))    # the ack for a result frame
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal, Protocol

from pydantic import JsonValue

from clienttools.protocol import (
    AckOutcome,
    CancelFrame,
    CancelReason,
    InvokeFrame,
    ResultAckFrame,
    ToolApprovalFrame,
    ToolProgressFrame,
    ToolResultFrame,
    ToolSpec,
    WireModel,
    json_size,
)

from .config import ServerConfig
from .ledger import Ledger, Step, canonical_json
from .models import ToolCall
from .schema import schema_errors

logger = logging.getLogger(__name__)

# Error codes a call gets when the server settles it without a result; a late
# result for such a call is `stale`, for any other settled call `duplicate`.
_SETTLED_WITHOUT_RESULT = frozenset({"timeout", "cancelled", "disconnected", "expired", "denied"})


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


FindPeer = Callable[[str, str], Peer | None]


@dataclass(eq=False, slots=True)
class PendingCall:
    request_id: str
    execution_id: str
    seq: int
    session: str
    call: ToolCall
    future: asyncio.Future[None]
    target: Peer | None = None
    client_id: str | None = None
    spec: ToolSpec | None = None
    attempt: int = 0
    idle_timeout: float = 0.0
    last_progress: float | None = None
    idle_timer: asyncio.TimerHandle | None = None
    hard_timer: asyncio.TimerHandle | None = None
    settled_by: Literal["result", "server"] | None = None
    # The step as this proxy's resolve or reject left it, so the run need not read it back.
    settled_step: Step | None = None
    # Someone waits for it (BrowserTools._wait ran).
    awaited: bool = False
    # Delivered by an earlier process (a restart): the page it went to is unknown here.
    delivered_before: bool = False

    @property
    def timers(self) -> int:
        return (self.idle_timer is not None) + (self.hard_timer is not None)


@dataclass(eq=False, slots=True)
class StartedCall:
    """A browser tool call already delivered (or waiting for a page); see BrowserTools.start."""

    tools: BrowserTools
    entry: PendingCall

    async def wait(self) -> Step | None:
        """Return once settled: the settled step, or None when it was settled from outside."""
        return await self.tools._wait(self.entry)

    def abandon(self) -> None:
        """Release the call if ``wait`` never ran (a no-op otherwise)."""
        self.tools._abandon(self.entry)


def _settled_by_server(step: Step | None) -> bool:
    """Did the server settle this step without a result (a later result is then `stale`)?"""
    error = step.error() if step is not None else None
    return error is not None and error.get("code") in _SETTLED_WITHOUT_RESULT


def _ack(request_id: str, outcome: AckOutcome, message: str | None = None) -> ResultAckFrame:
    return ResultAckFrame(request_id=request_id, outcome=outcome, message=message)


def _error_json(code: str, message: str, data: JsonValue = None) -> str:
    error: dict[str, JsonValue] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return canonical_json(error)


class BrowserTools:
    """The pending map of browser tool calls of one server."""

    def __init__(
        self,
        ledger: Ledger,
        config: ServerConfig,
        find_peer: FindPeer,
        *,
        durable: bool,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.ledger = ledger
        self.config = config
        self.find_peer = find_peer
        self.durable = durable
        self.clock = clock
        self.pending: dict[str, PendingCall] = {}
        self.shutting_down = False

    @property
    def timer_count(self) -> int:
        return sum(entry.timers for entry in self.pending.values())

    # -- the run's side ----------------------------------------------------------------

    async def call(self, session: str, step: Step, call: ToolCall) -> Step | None:
        """Deliver the call (now or when a connection registers the tool); return once settled.

        Returns the settled step when this proxy settled it, else None (the
        caller reads it from the ledger).
        """
        self._check_new(step)
        fresh = self.ledger.get_step(step.execution_id, step.seq)
        if fresh is None or fresh.state != "pending":
            # Settled between the run's planning and this call (Hub.resolve, an
            # outbox result after a restart, expiry): nothing to deliver.
            return fresh
        return await self.start(session, step, call).wait()

    def _check_new(self, step: Step) -> None:
        if step.request_id is None:
            raise ValueError(f"step {step.seq} of {step.execution_id} has no request id")
        if step.request_id in self.pending:
            raise RuntimeError(f"request {step.request_id} is already pending")

    def start(self, session: str, step: Step, call: ToolCall) -> StartedCall:
        """Register the call of a pending step and deliver it now, without waiting.

        For a run that records a step and delivers it in one synchronous
        stretch (one ledger batch, whose commit then precedes the invoke on
        the wire). The returned call's ``wait`` returns once it is settled; its
        ``abandon`` releases it when its waiter never ran.
        """
        self._check_new(step)
        assert step.request_id is not None
        entry = PendingCall(
            step.request_id, step.execution_id, step.seq, session, call,
            asyncio.get_running_loop().create_future(), delivered_before=step.attempts > 0,
        )  # fmt: skip
        self.pending[entry.request_id] = entry
        try:
            self._deliver(entry)
        except BaseException:
            self._release(entry)
            raise
        return StartedCall(self, entry)

    async def _wait(self, entry: PendingCall) -> Step | None:
        entry.awaited = True
        try:
            await entry.future
            return entry.settled_step
        except asyncio.CancelledError:
            if entry.settled_by is None:
                self._on_cancelled(entry)
            raise
        finally:
            self._release(entry)

    def _abandon(self, entry: PendingCall) -> None:
        # Its waiter was cancelled before it ran: settle it as _wait would have.
        if entry.awaited or self.pending.get(entry.request_id) is not entry:
            return
        if entry.settled_by is None:
            self._on_cancelled(entry)
        self._release(entry)

    def _release(self, entry: PendingCall) -> None:
        self._stop_timers(entry)
        if self.pending.get(entry.request_id) is entry:
            del self.pending[entry.request_id]

    def _on_cancelled(self, entry: PendingCall) -> None:
        if self.shutting_down:
            # A durable call outlives the process: the page may finish it and
            # send the result to the restarted server. Without a durable
            # ledger nothing will ever want that result.
            if not self.durable:
                self._send_cancel(entry, "shutdown")
            return
        self._send_cancel(entry, "aborted")
        entry.settled_by = "server"
        self.ledger.reject(
            entry.execution_id, entry.seq,
            _error_json("cancelled", "the response was aborted before this call finished"),
            self.clock(),
        )  # fmt: skip

    def _send_cancel(self, entry: PendingCall, reason: CancelReason) -> None:
        if entry.target is not None and entry.target.is_open:
            entry.target.send(CancelFrame(request_id=entry.request_id, reason=reason))

    def _deliver(self, entry: PendingCall) -> None:
        peer = self.find_peer(entry.session, entry.call.tool_name)
        if peer is None:
            entry.target = None  # waits for the next connection that registers the tool
            return
        spec = peer.tool_spec(entry.call.tool_name)
        wanted = (
            spec.timeout_ms / 1000
            if spec is not None and spec.timeout_ms
            else self.config.tool_timeout
        )
        entry.idle_timeout = min(wanted, self.config.max_tool_timeout)
        entry.target, entry.client_id, entry.spec = peer, peer.client_id, spec
        entry.last_progress = None
        entry.attempt = self.ledger.add_attempt(entry.execution_id, entry.seq, self.clock())
        peer.send(
            InvokeFrame(
                request_id=entry.request_id,
                tool_call_id=entry.call.tool_call_id,
                tool_name=entry.call.tool_name,
                input=entry.call.input,
                # The client enforces the hard cap; the server's idle clock,
                # which progress restarts, usually fires first.
                timeout_ms=round(self.config.max_tool_timeout * 1000),
                attempt=entry.attempt,
            )
        )
        loop = asyncio.get_running_loop()
        self._stop_timers(entry)
        entry.idle_timer = loop.call_later(entry.idle_timeout, self._time_out, entry)
        entry.hard_timer = loop.call_later(self.config.max_tool_timeout, self._time_out, entry)

    @staticmethod
    def _stop_timers(entry: PendingCall) -> None:
        for timer in (entry.idle_timer, entry.hard_timer):
            if timer is not None:
                timer.cancel()
        entry.idle_timer = entry.hard_timer = None

    def _time_out(self, entry: PendingCall) -> None:
        if entry.settled_by is not None:
            return
        self._send_cancel(entry, "timeout")
        limit = entry.idle_timeout
        self._settle(
            entry, "server", None,
            _error_json(
                "timeout",
                f"the tool {entry.call.tool_name!r} ran past its time limit "
                f"({limit:g} s without progress, at most {self.config.max_tool_timeout:g} s) "
                "and was cancelled",
            ),
        )  # fmt: skip

    def _settle(
        self,
        entry: PendingCall,
        by: Literal["result", "server"],
        result_json: str | None,
        error_json: str | None,
    ) -> bool:
        """Record the outcome and wake the run; False when the ledger refused the result.

        Recorded first: if the ledger cannot be reached (it raises), the call stays
        as it was, unsettled and timed, so the page's resent result still counts.
        """
        now = self.clock()
        stored = True
        if result_json is not None:
            outcome = self.ledger.resolve(entry.execution_id, entry.seq, result_json, now)
            if not outcome.ok:
                # Over the stored-size limit: the model reads why instead.
                stored = False
                outcome = self.ledger.reject(
                    entry.execution_id, entry.seq, _error_json("output_too_large", outcome.message),
                    now,
                )  # fmt: skip
        elif error_json is not None:
            outcome = self.ledger.reject(entry.execution_id, entry.seq, error_json, now)
        else:
            outcome = None
        entry.settled_by = by
        self._stop_timers(entry)
        if outcome is not None and outcome.ok:
            entry.settled_step = outcome.step
        if not entry.future.done():
            entry.future.set_result(None)
        return stored

    def wake(self, execution_id: str, seq: int) -> bool:
        """The ledger step was settled from outside (``Hub.resolve``); release its call."""
        for entry in self.pending.values():
            if (entry.execution_id, entry.seq) == (execution_id, seq) and entry.settled_by is None:
                self._send_cancel(entry, "superseded")
                # The page's late result gets the ack it would get once this entry
                # is gone and only the ledger answers (_result_without_entry):
                # `duplicate` after an output or a tool error, `stale` after an
                # error the server settles calls with (expired, cancelled, ...).
                step = self.ledger.get_step(execution_id, seq)
                entry.settled_by = "server" if _settled_by_server(step) else "result"
                self._stop_timers(entry)
                if not entry.future.done():
                    entry.future.set_result(None)
                return True
        return False

    # -- the connections' side ---------------------------------------------------------

    def on_result(self, peer: Peer, frame: ToolResultFrame) -> ResultAckFrame:
        """Settle a call from a result frame (S5); the returned ack goes back to ``peer``."""
        entry = self.pending.get(frame.request_id)
        if entry is None:
            return self._result_without_entry(peer, frame)
        if entry.settled_by == "result":
            return _ack(frame.request_id, "duplicate")
        if entry.settled_by == "server":
            return _ack(frame.request_id, "stale", "the call was already settled")
        if not self._from_target(entry, peer):
            return _ack(frame.request_id, "invalid", "the invoke was not sent to this connection")
        if frame.error is not None:
            error = frame.error.model_dump(mode="json", exclude_none=True)
            self._settle(entry, "result", None, canonical_json(error))
            return _ack(frame.request_id, "applied")
        problem = self._check_output(frame.output, entry.spec)
        if problem is not None:
            code, message = problem
            self._settle(entry, "result", None, _error_json(code, message))
            return _ack(frame.request_id, "invalid", message)
        if not self._settle(entry, "result", canonical_json(frame.output), None):
            return _ack(frame.request_id, "invalid", "the result is too large to be stored")
        return _ack(frame.request_id, "applied")

    def _check_output(self, output: JsonValue, spec: ToolSpec | None) -> tuple[str, str] | None:
        size = json_size(output)
        if size > self.config.max_result_bytes:
            return (
                "output_too_large",
                f"the result is {size:,} bytes as JSON; the limit is "
                f"{self.config.max_result_bytes:,} bytes",
            )
        if spec is not None and spec.output_schema is not None:
            errors = schema_errors(spec.output_schema, output)
            if errors:
                return "invalid_output", "the result does not match outputSchema: " + "; ".join(
                    errors
                )
        return None

    def _from_target(self, entry: PendingCall, peer: Peer) -> bool:
        if entry.target is peer:
            return True
        if entry.target is not None and entry.target.is_open:
            return False
        if peer.session != entry.session:
            return False
        # The invoke's connection is gone. The same page (same clientId) may send
        # the result again from its new connection before the invoke is
        # re-delivered (C11). After a restart the page is not known here; only a
        # page of the session it was delivered to can know the unguessable id.
        if entry.client_id is not None:
            return peer.client_id == entry.client_id
        return entry.delivered_before

    def _result_without_entry(self, peer: Peer, frame: ToolResultFrame) -> ResultAckFrame:
        step = self.ledger.step_by_request_id(frame.request_id)
        if step is None:
            return _ack(frame.request_id, "stale", "no such call")
        if step.state == "pending":
            # The run that owns it is not waiting in this process (yet): a
            # restarted server, before replay. Record it; the replay reads it.
            execution = self.ledger.get_execution(step.execution_id)
            if execution is None or execution.session != peer.session:
                return _ack(frame.request_id, "invalid", "the call belongs to another session")
            now = self.clock()
            if frame.error is not None:
                error = frame.error.model_dump(mode="json", exclude_none=True)
                self.ledger.reject(step.execution_id, step.seq, canonical_json(error), now)
                return _ack(frame.request_id, "applied")
            problem = self._check_output(frame.output, None)
            if problem is not None:
                self.ledger.reject(step.execution_id, step.seq, _error_json(*problem), now)
                return _ack(frame.request_id, "invalid", problem[1])
            outcome = self.ledger.resolve(
                step.execution_id, step.seq, canonical_json(frame.output), now
            )
            if not outcome.ok:
                return _ack(frame.request_id, "invalid", outcome.message)
            return _ack(frame.request_id, "applied")
        if _settled_by_server(step):
            return _ack(frame.request_id, "stale", "the call was already settled")
        return _ack(frame.request_id, "duplicate")

    def on_progress(self, peer: Peer, frame: ToolProgressFrame) -> None:
        entry = self.pending.get(frame.request_id)
        if entry is None or entry.settled_by is not None or entry.target is not peer:
            return
        if entry.last_progress is not None and frame.progress <= entry.last_progress:
            return
        entry.last_progress = frame.progress
        if entry.idle_timer is not None:
            entry.idle_timer.cancel()
            entry.idle_timer = asyncio.get_running_loop().call_later(
                entry.idle_timeout, self._time_out, entry
            )

    def on_disconnect(self, peer: Peer) -> None:
        """S4: settle (policy fail) or re-deliver / park (policy wait) the peer's calls."""
        for entry in list(self.pending.values()):
            if entry.target is not peer or entry.settled_by is not None:
                continue
            self._stop_timers(entry)
            if self.config.disconnect_policy == "fail":
                self._settle(
                    entry, "server", None,
                    _error_json("disconnected", "the browser disconnected while the tool ran"),
                )  # fmt: skip
            else:
                entry.target = None
                self._deliver(entry)

    def on_registered(self, peer: Peer) -> None:
        """Deliver the session's waiting calls whose tool ``peer`` now offers."""
        for entry in list(self.pending.values()):
            if (
                entry.session == peer.session
                and entry.settled_by is None
                and (entry.target is None or not entry.target.is_open)
                and peer.tool_spec(entry.call.tool_name) is not None
            ):
                self._deliver(entry)

    def wake_expired(self, execution_ids: Iterable[str]) -> None:
        """The ledger expired these executions; release their waiting calls."""
        expired = set(execution_ids)
        for entry in list(self.pending.values()):
            if entry.execution_id in expired and entry.settled_by is None:
                self._send_cancel(entry, "timeout")
                self._settle(entry, "server", None, None)


@dataclass(eq=False, slots=True)
class _ApprovalWait:
    execution_id: str
    seq: int
    future: asyncio.Future[None]


@dataclass(slots=True)
class Approvals:
    """Pending approvals of needsApproval tools, keyed by (session, toolCallId)."""

    ledger: Ledger
    clock: Callable[[], float] = time.time
    waiting: dict[tuple[str, str], _ApprovalWait] = field(default_factory=dict)

    async def wait(self, session: str, step: Step, call: ToolCall) -> None:
        key = (session, call.tool_call_id)
        wait = _ApprovalWait(
            step.execution_id, step.seq, asyncio.get_running_loop().create_future()
        )
        self.waiting[key] = wait
        try:
            await wait.future
        finally:
            if self.waiting.get(key) is wait:
                del self.waiting[key]

    def on_approval(self, peer: Peer, frame: ToolApprovalFrame) -> str | None:
        """Settle an approval; a message for a protocol error when nothing waits for it."""
        wait = self.waiting.get((peer.session, frame.tool_call_id))
        if wait is None or wait.future.done():
            return f"no approval is pending for tool call {frame.tool_call_id[:64]!r}"
        verdict: dict[str, JsonValue] = {"approved": frame.approved}
        if frame.reason is not None:
            verdict["reason"] = frame.reason
        outcome = self.ledger.resolve(
            wait.execution_id, wait.seq, canonical_json(verdict), self.clock()
        )
        if not outcome.ok:
            self.ledger.reject(
                wait.execution_id, wait.seq, _error_json("invalid_output", outcome.message),
                self.clock(),
            )  # fmt: skip
        wait.future.set_result(None)
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
