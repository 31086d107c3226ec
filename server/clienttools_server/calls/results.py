"""Results of browser calls: the one path every result takes, and the page's ack.

A page's result (live, relayed, or re-sent to a restarted server) and a
settlement from outside (:class:`~clienttools_server.calls.settlement.OutsideSettlement`)
are applied by :meth:`Results.apply`: the step must be pending, an output must
fit the size limit and the outputSchema recorded with the step (S5). A result
frame from a page is first judged by where its invoke went (the connection,
or the same page by its clientId) and always gets an ack: ``applied``,
``duplicate``, ``stale`` or ``invalid``.

    results = proxy.results
    peer.send(await results.on_result(peer, frame))       # the ack for a result frame
    (await results.apply(step, Settlement(output=3), by_page=False)).outcome   # "applied"
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

from pydantic import JsonValue

from clienttools.protocol import ResultAckFrame, ToolResultFrame, json_size

from ..canonical import canonical_json
from ..cluster.relay import is_open
from ..ledger import Outcome, OutcomeReason, Step
from .delivery import (
    LATE_RESULT,
    DeliveryEvent,
    DeliveryState,
    Peer,
    PendingCall,
    recorded_schema,
    settled_by_server,
)
from .output_schemas import OutputSchemas
from .settlement import Applied, Settlement, ack, encode_error, page_ack, settlement_of

if TYPE_CHECKING:
    from .proxy import CallProxy

# Request ids of calls settled from outside, remembered after their entry is gone
# so the page's late result is `stale` (not `duplicate`); the oldest go first.
MAX_SUPERSEDED = 10_000


class Results:
    """Applies the results of one proxy's calls and acks the pages' result frames."""

    def __init__(self, proxy: CallProxy, schemas: OutputSchemas) -> None:
        self.proxy = proxy
        self.ledger = proxy.ledger
        self.clock = proxy.clock
        self.config = proxy.config
        self.schemas = schemas
        self.superseded: OrderedDict[str, None] = OrderedDict()

    def _entry_of(self, step: Step) -> PendingCall | None:
        entry = self.proxy.pending.get(step.request_id) if step.request_id is not None else None
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
        return await self._settle(step.execution_id, step.seq, step, entry, settlement, by_page)

    async def _settle(
        self,
        execution_id: str,
        seq: int,
        step: Step | None,
        entry: PendingCall | None,
        settlement: Settlement,
        by_page: bool,
    ) -> Applied:
        """Settle step ``seq`` of the execution; ``step`` as last read (None: not read,
        then ``entry`` has its outputSchema, and the ledger's own check that the step is
        pending is the only one)."""
        now = self.clock.now()
        if settlement.error is None:
            problem = self._check_output(settlement.output, step, entry)
            if problem is not None:
                code, message = problem
                after = step
                if by_page:
                    refused = await self._refused_by_page(
                        execution_id, seq, entry, encode_error(code, message)
                    )
                    if refused.reason == "not_pending" and refused.step is not None:
                        return self._late(refused.step, settlement, by_page=True, entry=entry)
                    if refused.ok:
                        after = refused.step  # settled with the error the model reads
                reason: OutcomeReason = "too_large" if code == "output_too_large" else "invalid"
                return Applied("invalid", reason, message, after)
            try:
                result_json = canonical_json(settlement.output)
            except ValueError as exc:
                return Applied("invalid", "invalid", f"the output is not JSON: {exc}", step)
            outcome = await self.ledger.resolve(execution_id, seq, result_json, now)
        else:
            try:
                error_json = canonical_json(settlement.error)
            except ValueError as exc:
                return Applied("invalid", "invalid", f"the error is not JSON: {exc}", step)
            outcome = await self.ledger.reject(execution_id, seq, error_json, now)
        if not outcome.ok:
            if outcome.reason == "not_pending" and outcome.step is not None:
                return self._late(outcome.step, settlement, by_page=by_page, entry=entry)
            if outcome.reason == "not_found":
                return Applied("stale", "not_found", outcome.message)
            if by_page and settlement.error is None:
                # Over the stored-size limit: the model reads why instead.
                refused = await self._refused_by_page(
                    execution_id, seq, entry, encode_error("output_too_large", outcome.message)
                )
                return Applied(
                    "invalid",
                    outcome.reason,
                    "the result is too large to be stored",
                    refused.step if refused.ok else None,
                )
            return Applied("invalid", outcome.reason, outcome.message, outcome.step)
        if not by_page:
            assert step is not None  # a resolve from outside comes through apply(), read
            self.remember_superseded(step.request_id)
        if entry is not None:
            self.proxy.mark_settled(
                entry, outcome.step, DeliveryEvent.RESULT if by_page else DeliveryEvent.OUTSIDE
            )
        return Applied("applied", "applied", outcome.message, outcome.step)

    async def _refused_by_page(
        self, execution_id: str, seq: int, entry: PendingCall | None, error_json: str
    ) -> Outcome:
        outcome = await self.ledger.reject(execution_id, seq, error_json, self.clock.now())
        if outcome.ok and entry is not None:
            self.proxy.mark_settled(entry, outcome.step, DeliveryEvent.RESULT)
        return outcome

    def _late(
        self,
        step: Step,
        settlement: Settlement,
        *,
        by_page: bool,
        entry: PendingCall | None,
    ) -> Applied:
        """The outcome for a step settled already: `duplicate` if settled this way, else `stale`.

        A live entry still waiting for that step wakes now. Its step was settled
        by a path that found no entry: a page's result that came while the run
        was between reading the step (pending) and registering the call, so
        nothing would wake the run, and every result after it is late too.
        """
        message = f"step {step.seq} of execution {step.execution_id} is already {step.state}"
        by_server = settled_by_server(step)
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
        if entry is not None and not entry.settled:
            event = (
                DeliveryEvent.SERVER if by_server
                else DeliveryEvent.RESULT if by_page
                else DeliveryEvent.OUTSIDE
            )  # fmt: skip
            self.proxy.mark_settled(entry, step, event)
        return Applied("stale" if stale else "duplicate", "not_pending", message, step)

    def _check_output(
        self, output: JsonValue, step: Step | None, entry: PendingCall | None
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
        if entry is not None:
            schema = entry.output_schema
        else:
            assert step is not None  # read, when no entry waits for it
            schema = recorded_schema(step)
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
        for entry in list(self.proxy.pending.values()):
            if (entry.execution_id, entry.seq) == (execution_id, seq) and not entry.settled:
                self.remember_superseded(entry.request_id)
                step = await self.ledger.get_step(execution_id, seq)
                self.proxy.mark_settled(entry, step, DeliveryEvent.OUTSIDE)
                return True
        return False

    # -- the connections' side ---------------------------------------------------------

    async def on_result(self, peer: Peer, frame: ToolResultFrame) -> ResultAckFrame:
        """Settle a call from a result frame (S5); the returned ack goes back to ``peer``."""
        entry = self.proxy.pending.get(frame.request_id)
        if entry is None:
            relay = self.proxy.relay.relayed.get(frame.request_id)
            if relay is not None:
                return await self.proxy.relay.result(relay, peer, frame)
            return await self._result_without_entry(peer, frame)
        if entry.settled:
            late = LATE_RESULT[entry.state]
            return ack(
                frame.request_id, late, "the call was already settled" if late == "stale" else None
            )
        if not await self._from_target(entry, peer):
            return ack(frame.request_id, "invalid", "the invoke was not sent to this connection")
        # The step is not read first: the ledger settles it only if it is pending.
        applied = await self._settle(
            entry.execution_id, entry.seq, None, entry, settlement_of(frame), by_page=True
        )
        return page_ack(frame.request_id, applied)

    async def _from_target(self, entry: PendingCall, peer: Peer) -> bool:
        if entry.state is DeliveryState.ORPHANED:
            # Delivered by an earlier process (a restart): the page is not known
            # here; only a page of the session it went to can know the unguessable id.
            return peer.session == entry.session
        if entry.target is peer:
            return True
        if entry.target is not None and await is_open(entry.target):
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
            return ack(frame.request_id, "stale", "no such call")
        if step.state != "pending":
            applied = await self.apply(step, settlement_of(frame), by_page=True)
            return page_ack(frame.request_id, applied)
        # The run that owns it is not waiting in this process: a restarted server
        # before replay, or a run on another process whose invoke went to a
        # connection that is gone. Record it; the run reads it (woken if elsewhere).
        execution = await self.ledger.get_execution(step.execution_id)
        if execution is None or execution.session != peer.session:
            return ack(frame.request_id, "invalid", "the call belongs to another session")
        if not await self._from_recorded_target(step, peer):
            return ack(frame.request_id, "invalid", "the invoke was not sent to this connection")
        applied = await self.apply(step, settlement_of(frame), by_page=True)
        if execution.owner is not None:
            await self.proxy.relay.tell_owner(execution.owner, applied.step or step, "page")
        return page_ack(frame.request_id, applied)

    async def _from_recorded_target(self, step: Step, peer: Peer) -> bool:
        """S5 from the step's record of where its last invoke went (a shared ledger)."""
        if step.target_connection is None or step.target_connection == peer.id:
            return True  # not recorded (one process, after a restart): the session decides
        if await self.ledger.registered(step.target_connection, self.clock.now()):
            return False  # the invoke's connection is still there, on some process
        return peer.client_id is not None and peer.client_id == step.target_client_id
