"""What this process does when another one tells it something over the bus.

Each notification (:mod:`clienttools_server.cluster.routing` names them)
carries ids, and an ``invoke`` or a ``settled`` what fits of the rows they name;
a handler reads the rest from the ledger. As the pages' process: run a relayed
invoke or cancel on one of its connections. As the run's process: wake the run
whose call was settled, progressed or lost elsewhere. After the bus was away,
both sides resync from the rows.

    BusHandlers(ledger, pages, proxy, approvals).listen(bus)
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, cast

from clienttools.protocol import CancelReason, InvokeFrame

from ..calls.approvals import Approvals
from ..calls.pages import Pages
from ..calls.proxy import CallProxy
from ..ledger import Ledger
from .routing import (
    CANCEL,
    EXPIRED,
    GONE,
    INVOKE,
    PROGRESS,
    REGISTERED,
    SETTLED,
    UNREGISTERED,
    step_of_json,
)

if TYPE_CHECKING:
    from .bus import Bus


class BusHandlers:
    """The handlers of one hub's notifications."""

    def __init__(
        self, ledger: Ledger, pages: Pages, proxy: CallProxy, approvals: Approvals
    ) -> None:
        self.ledger = ledger
        self.pages = pages
        self.proxy = proxy
        self.approvals = approvals

    def listen(self, bus: Bus) -> None:
        bus.on(INVOKE, self._on_invoke)
        bus.on(CANCEL, self._on_cancel)
        bus.on(SETTLED, self._on_settled)
        bus.on(PROGRESS, self._on_progress)
        bus.on(GONE, self._on_gone)
        bus.on(REGISTERED, self._on_registered)
        bus.on(UNREGISTERED, self._on_unregistered)
        bus.on(EXPIRED, self._on_expired)
        bus.on_reconnect(self._on_reconnect)

    async def _on_invoke(self, sender: str, args: tuple[str, ...]) -> None:
        connection_id, request_id, tool_call_id, timeout_ms, attempt, *carried = args
        connections = self.pages.connections
        client = connections.get(connection_id)
        if client is None or not client.is_open:
            # A row left behind (its unregister failed): gone for good, so that the
            # run's process does not pick it again.
            await self.ledger.unregister(connection_id)
            await self.ledger.notify(sender, GONE, request_id, connection_id)
            return
        # The step as the run's process recorded it, unless this process knows the
        # call was settled meanwhile (a result it applied for the run's previous
        # owner, a resolve from outside): then the row says how.
        step = step_of_json(carried[0]) if carried else None
        if step is None or self.proxy.relay.settled_here(request_id):
            step = await self.ledger.step_by_request_id(request_id)
        if connections.get(connection_id) is not client or not client.is_open:
            # It closed while the step was read, and its close told nobody of this call.
            await self.ledger.notify(sender, GONE, request_id, connection_id)
            return
        if step is None:
            return
        if step.state != "pending":
            # Settled meanwhile (the page's result reached us for the run's previous
            # owner, say): nothing to run, but the run must wake.
            await self.proxy.relay.tell_owner(sender, step, "page")
            return
        frame = InvokeFrame(
            request_id=request_id,
            tool_call_id=tool_call_id,
            tool_name=step.name,
            input=json.loads(step.input_json),
            timeout_ms=int(timeout_ms) or None,
            attempt=int(attempt),
        )
        self.proxy.relay.invoke(sender, client, step, frame)

    async def _on_cancel(self, sender: str, args: tuple[str, ...]) -> None:
        connection_id, request_id, reason = args
        self.proxy.relay.cancel(
            request_id, cast("CancelReason", reason), self.pages.connections.get(connection_id)
        )

    async def _on_settled(self, sender: str, args: tuple[str, ...]) -> None:
        request_id, execution_id, seq, how, *carried = args
        if how == "outside" and request_id:
            self.proxy.results.remember_superseded(request_id)
        if sender == self.ledger.owner:
            return  # settled here: woken already
        outcome = (carried[0], carried[1]) if len(carried) == 2 else None
        if not await self.proxy.relay.settled_elsewhere(
            request_id, execution_id, int(seq), how, outcome
        ):
            self.approvals.wake(execution_id, int(seq))  # an approval answered elsewhere

    async def _on_progress(self, sender: str, args: tuple[str, ...]) -> None:
        request_id, progress = args
        self.proxy.relay.progressed_elsewhere(sender, request_id, float(progress))

    async def _on_gone(self, sender: str, args: tuple[str, ...]) -> None:
        request_id, connection_id = args
        entry = self.proxy.pending.get(request_id)
        if entry is not None:
            self.pages.forget(entry.session)  # the connection may be one we still had
        await self.proxy.relay.gone_elsewhere(sender, request_id, connection_id)

    async def _on_registered(self, sender: str, args: tuple[str, ...]) -> None:
        if sender != self.ledger.owner:
            (session,) = args
            self.pages.forget(session)
            await self.proxy.relay.registered_elsewhere(session)

    async def _on_unregistered(self, sender: str, args: tuple[str, ...]) -> None:
        if sender != self.ledger.owner:
            (session,) = args
            self.pages.forget(session)

    async def _on_reconnect(self) -> None:
        """Notifications were lost while the bus was away: resync both sides from the rows.

        As the run's process: re-read the steps of our calls, deliver what waits.
        As the pages' process: a call whose last invoke went to one of our
        connections but that we never relayed had its invoke lost; its run's
        process delivers it again once told the invoke's connection does not have it.
        """
        if self.pages.peers is not None:
            self.pages.peers.refresh()
        await self.proxy.relay.resync()
        delivered = await self.ledger.delivered_to(list(self.pages.connections))
        for request_id, connection_id, owner in delivered:
            if request_id not in self.proxy.relay.relayed and owner not in (
                None,
                self.ledger.owner,
            ):
                await self.ledger.notify(owner, GONE, request_id, connection_id)

    async def _on_expired(self, sender: str, args: tuple[str, ...]) -> None:
        if sender != self.ledger.owner:
            await self.proxy.wake_expired(args)
            self.approvals.wake_expired(args)
