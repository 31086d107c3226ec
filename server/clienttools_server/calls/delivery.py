"""A browser call's delivery in this process: its states as a table, the pending entry, the peer.

A call's lifecycle here is the table ``DELIVERY_TRANSITIONS``
(``DeliveryState`` x ``DeliveryEvent``); a missing entry raises, so a call
never moves back. ``LATE_RESULT`` says what a result that comes after the call
was settled gets. A :class:`Peer` is what a call can be delivered to: a
connection of this process, or a
:class:`~clienttools_server.cluster.routing.RemotePeer` on another one.

    >>> next_delivery_state(DeliveryState.WAITING, DeliveryEvent.DELIVER)
    <DeliveryState.DELIVERED: 'delivered'>
    >>> LATE_RESULT[DeliveryState.SUPERSEDED]
    'stale'
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal, Protocol, cast

from pydantic import JsonValue

from clienttools.protocol import AckOutcome, ToolSpec, WireModel

from ..agent.journal import RequestedCall
from ..clock import Timer
from ..ledger import Step

# Error codes a call gets when the server settles it without a result; a late
# result for such a call is `stale`, for any other settled call `duplicate`.
SETTLED_WITHOUT_RESULT = frozenset({"timeout", "cancelled", "disconnected", "expired", "denied"})


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


FindSpec = Callable[[str, str], Awaitable[ToolSpec | None]]

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
    # The step as recorded when the call started (with its spec once recorded): what
    # a relayed invoke carries, and what a settled notification's outcome completes.
    step: Step
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


def settled_by_server(step: Step | None) -> bool:
    """Did the server settle this step without a result (a later result is then `stale`)?"""
    error = step.error() if step is not None else None
    return error is not None and error.get("code") in SETTLED_WITHOUT_RESULT


def recorded_schema(step: Step) -> dict[str, JsonValue] | None:
    """The outputSchema of the spec recorded with the step, if any."""
    spec = step.spec()
    schema = spec.get("outputSchema") if spec is not None else None
    return cast("dict[str, JsonValue]", schema) if isinstance(schema, dict) else None
