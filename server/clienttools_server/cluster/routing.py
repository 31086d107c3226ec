"""Which connection a browser call goes to when several processes share the ledger (S2).

Every connection that registers tools is a row of the ledger's
``registrations`` (its process, its session, its registration order, drawn
from one sequence for the whole cluster, and its tools). The session's most
recent live registration that offers a tool gets the call: a connection of
this process, or a :class:`RemotePeer` on another one. A remote peer looks like
any other :class:`~clienttools_server.calls.proxy.Peer` to the proxy; its
``invoke`` (or ``send``) turns the invoke or the cancel into a notification to
its process, which sends the real frame to its socket. A send is synchronous,
as a socket's is: the :class:`Outbox` sends its notifications in order, one
after the other, from a task of its own.

Notifications name rows by their ids. An ``invoke`` and a ``settled`` also carry
what the receiver would read next (the step as the run's process recorded it; the
settled step's state and value) when that fits in ``CARRIED_BYTES``, well under
PostgreSQL's 8,000-byte payload: a call across processes then takes no read on
either side. Anything larger goes by its ids, and the receiver reads the row.

Notification kinds of the routing (``ledger.notify``; args are strings):

- ``invoke`` to the page's process: connection, request id, tool call id,
  timeout ms, attempt, and the step (JSON) when it fits. It reads the step if
  not carried, sends the invoke to that connection and remembers it relayed
  the call, for which process (a ``Relay``).
- ``cancel`` to the page's process: connection, request id, reason. It sends
  the cancel to the page.
- ``settled`` to the run's owner (or all, for a settle from outside): request
  id, execution id, seq, ``page`` or ``outside``, and the step's state and
  value (its result or error JSON) when known and it fits. It takes those, or
  reads the step, and wakes the run waiting for it.
- ``progress`` to the run's owner: request id, progress. It restarts the
  call's idle clock.
- ``gone`` to the run's owner: request id, connection. The invoke's
  connection closed: S4 (re-deliver, or fail).
- ``registered`` to all: session. Each delivers the session's waiting calls
  (S4 wait; S2 picks the newest), and reads its registrations again.
- ``unregistered`` to all: session. A connection of it closed: each reads its
  registrations again.
- ``expired`` to all: execution ids. Each releases their calls and approvals.

    peers = Peers(ledger, local_tools, now)
    for registration, tools in await peers.live(session): ...   # oldest first
    peer = peers.remote(registration)                  # a connection on another process
    peer.invoke(InvokeFrame(...), step)                # a notification, sent by the outbox
    await peers.close()                                # sends what is queued
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields

from pydantic import ValidationError

from clienttools.protocol import CancelFrame, InvokeFrame, ToolSpec, WireModel

from ..ledger import Ledger, LedgerUnavailable, Registration, Step

logger = logging.getLogger(__name__)

# Parsed tool lists of registrations, by (connection, order): a row's tools never
# change under one order, so parsing them once per process is enough.
MAX_PARSED = 4_096
# Notification kinds (see the table above).
INVOKE, CANCEL, SETTLED, PROGRESS, GONE, REGISTERED, UNREGISTERED, EXPIRED = (
    "invoke", "cancel", "settled", "progress", "gone", "registered", "unregistered", "expired",
)  # fmt: skip
# Expired execution ids per notification: well under PostgreSQL's 8,000-byte payload.
EXPIRED_PER_NOTIFICATION = 100
# The most a notification's args may take, as JSON, with what it carries besides
# ids: the rest of PostgreSQL's 8,000 bytes is room for the sender and the kind.
CARRIED_BYTES = 7_000


def fits(*args: str) -> bool:
    """Do ``args`` fit in a notification that carries more than ids?"""
    return len(json.dumps(args, separators=(",", ":"))) <= CARRIED_BYTES


_STEP_FIELDS = frozenset(f.name for f in fields(Step))


def step_json(step: Step) -> str:
    """A step as an ``invoke`` carries it: JSON of its fields by name."""
    return json.dumps(asdict(step), separators=(",", ":"))


def step_of_json(text: str) -> Step | None:
    """The step an ``invoke`` carried; None for one this code did not write (other
    fields than a step's, as a process of another version would send)."""
    try:
        carried = json.loads(text)
        if not isinstance(carried, dict) or carried.keys() != _STEP_FIELDS:
            return None
        return Step(**carried)
    except (ValueError, TypeError):
        return None


def tools_json(tools: Mapping[str, ToolSpec]) -> str:
    """A registration's tools as the ledger stores them: a JSON list of wire specs."""
    return json.dumps(
        [spec.model_dump(mode="json", by_alias=True, exclude_none=True) for spec in tools.values()],
        separators=(",", ":"),
    )


class Outbox:
    """Notifications queued by synchronous code, sent in order by one task.

    One the database could not take is sent again every ``RETRY_DELAY`` seconds,
    the ones after it waiting behind it, until it gets through or the outbox
    closes (then what is left is logged and dropped: the runs' calls are
    delivered again by whoever takes them over).
    """

    RETRY_DELAY = 0.5

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self._queue: deque[tuple[str | None, str, tuple[str, ...]]] = deque()
        self._task: asyncio.Task[None] | None = None
        self._closing = False

    def send(self, process_id: str | None, kind: str, *args: str) -> None:
        self._queue.append((process_id, kind, args))
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        while self._queue:
            process_id, kind, args = self._queue[0]
            try:
                await self.ledger.notify(process_id, kind, *args)
            except LedgerUnavailable as exc:
                if not self._closing:
                    logger.warning("could not send %s to %s yet: %s", kind, process_id, exc)
                    await asyncio.sleep(self.RETRY_DELAY)
                    continue
                logger.warning("dropping %s to %s at shutdown: %s", kind, process_id, exc)
            except Exception:
                logger.exception("sending %s to %s failed", kind, process_id)
            self._queue.popleft()

    async def close(self) -> None:
        """Send what is queued (a shutdown; no more retries), then stop."""
        self._closing = True
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None


@dataclass(eq=False, slots=True)
class RemotePeer:
    """A connection on another process, as the proxy sees it (a ``Peer``)."""

    outbox: Outbox
    process_id: str
    connection_id: str
    session: str
    client_id: str | None
    tools: Mapping[str, ToolSpec]
    # Known to be gone: its process told us (``gone``, ``unregistered``), died
    # (the heartbeat), or :meth:`check` found no registration row.
    gone: bool = False
    now: Callable[[], float] = field(default=lambda: 0.0)

    @property
    def id(self) -> str:
        return self.connection_id

    @property
    def is_open(self) -> bool:
        """Not known to be gone (no read; :meth:`check` reads)."""
        return not self.gone

    async def check(self) -> bool:
        """Read whether its process is alive and its registration row is there."""
        if not self.gone and not await self.outbox.ledger.registered(
            self.connection_id, self.now()
        ):
            self.gone = True
        return not self.gone

    def tool_spec(self, name: str) -> ToolSpec | None:
        return self.tools.get(name)

    def invoke(self, frame: InvokeFrame, step: Step | None = None) -> None:
        """Send ``frame`` to its process, with ``step`` (as recorded) when it fits."""
        args: tuple[str, ...] = (
            self.connection_id, frame.request_id, frame.tool_call_id,
            str(frame.timeout_ms or 0), str(frame.attempt),
        )  # fmt: skip
        if step is not None and fits(*args, carried := step_json(step)):
            args = (*args, carried)
        self.outbox.send(self.process_id, INVOKE, *args)

    def send(self, frame: WireModel) -> None:
        if isinstance(frame, InvokeFrame):
            self.invoke(frame)
        elif isinstance(frame, CancelFrame):
            self.outbox.send(
                self.process_id, CANCEL, self.connection_id, frame.request_id, frame.reason
            )
        else:
            raise TypeError(f"a remote peer relays invokes and cancels, not {type(frame).__name__}")


class Peers:
    """The session's registrations across the cluster, as peers to send calls to."""

    def __init__(
        self,
        ledger: Ledger,
        local: Callable[[str], Mapping[str, ToolSpec] | None],
        now: Callable[[], float],
    ) -> None:
        self.ledger = ledger
        self.outbox = Outbox(ledger)
        # The tools of one of this process's open connections, by id (None: not open here).
        self._local = local
        self._now = now
        self._parsed: OrderedDict[tuple[str, int], dict[str, ToolSpec]] = OrderedDict()
        # The registrations of each session as last read: a browser call reads none
        # (a round trip to the database each). Forgotten when a process
        # says the session's registrations changed, and all at each heartbeat.
        # (A process that died meanwhile is found out at the heartbeat: its calls
        # are delivered again, from registrations read again.)
        self._cache: dict[str, list[Registration]] = {}
        # Counts forget() and refresh(): a read that one overtook is not cached.
        self._changes = 0

    def forget(self, session: str) -> None:
        """The session's registrations changed (here, or a process said so)."""
        self._changes += 1
        self._cache.pop(session, None)

    def refresh(self) -> None:
        """At each heartbeat: read every session's registrations again."""
        self._changes += 1
        self._cache.clear()

    def tools_of(self, registration: Registration) -> dict[str, ToolSpec]:
        key = (registration.connection_id, registration.order)
        tools = self._parsed.get(key)
        if tools is None:
            tools = {}
            try:
                for raw in json.loads(registration.tools_json):
                    spec = ToolSpec.model_validate(raw)
                    tools[spec.name] = spec
            except (ValueError, ValidationError):
                logger.warning("ignoring unreadable tools of %s", registration.connection_id)
            self._parsed[key] = tools
            while len(self._parsed) > MAX_PARSED:
                self._parsed.popitem(last=False)
        else:
            self._parsed.move_to_end(key)
        return tools

    async def live(self, session: str) -> list[tuple[Registration, Mapping[str, ToolSpec]]]:
        """The session's live registrations, oldest first, each with its tools.

        One of this process's connections counts only while it is open here.
        """
        registrations = self._cache.get(session)
        if registrations is None:
            changes = self._changes
            registrations = await self.ledger.registrations(session, self._now())
            if changes == self._changes:
                self._cache[session] = registrations
        found: list[tuple[Registration, Mapping[str, ToolSpec]]] = []
        for registration in registrations:
            if registration.process_id == self.ledger.owner:
                tools = self._local(registration.connection_id)
                if tools is not None:
                    found.append((registration, tools))
            else:
                found.append((registration, self.tools_of(registration)))
        return found

    def remote(self, registration: Registration) -> RemotePeer:
        return RemotePeer(
            self.outbox, registration.process_id, registration.connection_id,
            registration.session, registration.client_id, self.tools_of(registration),
            now=self._now,
        )  # fmt: skip

    async def close(self) -> None:
        await self.outbox.close()
