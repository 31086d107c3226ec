"""Sessions, their connections and runs: what connects the sockets to the agent runs.

The hub owns every piece of per-server state (no module globals): the live
connections of each session and the tools each registered, the active
response of each chat, the run tasks, the browser-tool proxy and the
approvals. Connections call it with parsed frames; runs reach tools through a
:class:`SessionTools` host.

    hub = Hub(config, ledger, Agent(), scripted_model(), default_server_tools(), durable=False)
    await hub.start()
    hub.attach(connection)
    await hub.start_run(connection, send_frame)
    await hub.close()

What reads or writes the ledger is a coroutine: a frame's handler awaits it,
and each connection handles its frames one after the other.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, cast

from pydantic import JsonValue
from pydantic_ai import Agent
from pydantic_ai.models import Model
from pydantic_ai.toolsets import FunctionToolset

from clienttools.protocol import (
    MAX_TOOL_SPEC_BYTES,
    MAX_TOOLS_PER_CONNECTION,
    AbortFrame,
    CancelReason,
    ChatClearFrame,
    ChatSubscribeFrame,
    ClientToolsFrame,
    ErrorFrame,
    InvokeFrame,
    NoActiveFrame,
    ProtocolErrorFrame,
    RejectedTool,
    ResultAckFrame,
    ResumeFrame,
    SendFrame,
    ToolApprovalFrame,
    ToolProgressFrame,
    ToolResultFrame,
    ToolsAckFrame,
    ToolSpec,
    WireModel,
    json_size,
)

from .agent.chunk_log import Chunk, ChunkLog, FinishedResponses
from .agent.conversations import OTHER_SESSION, Conversations, Prepared, Refusal, ResponseRecorder
from .agent.journal import RequestedCall
from .agent.runs import Run, RunRequest
from .agent.server_tools import ServerTool, ServerToolset
from .calls.proxy import Applied, Approvals, CallProxy, Peer, Settlement, StartedCall
from .calls.remembered import RememberedTools
from .clock import SYSTEM_CLOCK, Clock, sleep
from .cluster.routing import (
    CANCEL,
    EXPIRED,
    EXPIRED_PER_NOTIFICATION,
    GONE,
    INVOKE,
    PROGRESS,
    REGISTERED,
    SETTLED,
    UNREGISTERED,
    Peers,
    tools_json,
)
from .config import ServerConfig
from .ledger import ChatBusy, Ledger, LedgerUnavailable, Outcome, Step

if TYPE_CHECKING:
    from .cluster.bus import Bus
    from .cluster.shared_streams import SharedStreams

logger = logging.getLogger(__name__)

# The error text of a send for a chat whose response still streams (HTTP: 409).
BUSY = "a response is already streaming for this chat"


class Client(Peer, Protocol):
    """A connection as the hub sees it: a peer that can hold a tool registration."""

    @property
    def tools(self) -> Mapping[str, ToolSpec]: ...

    @property
    def registration(self) -> int: ...

    def set_tools(self, client_id: str, tools: dict[str, ToolSpec], registration: int) -> None: ...


@dataclass(slots=True)
class SessionState:
    """The server's side of one session: its live connections and streaming responses."""

    name: str
    clients: list[Client] = field(default_factory=list)
    # chat id -> the response streaming for it
    logs: dict[str, ChunkLog] = field(default_factory=dict)


@dataclass(slots=True)
class ActiveRun:
    run: Run
    task: asyncio.Task[None]
    log: ChunkLog
    session: str


class Hub:
    def __init__(
        self,
        config: ServerConfig,
        ledger: Ledger,
        agent: Agent[None, Any],
        model: Model,
        server_tools: Mapping[str, ServerTool],
        *,
        durable: bool,
        clock: Clock = SYSTEM_CLOCK,
        bus: Bus | None = None,
    ) -> None:
        self.config = config
        self.ledger = ledger
        self.agent = agent
        self.model = model
        self.server_tools = dict(server_tools)
        self.server_toolset = ServerToolset(self.server_tools)
        # Names a page tool cannot take: the server's tools and the agent's own.
        self.reserved_names = frozenset(self.server_tools) | agent_tool_names(agent)
        self.clock = clock
        self.sessions: dict[str, SessionState] = {}
        # Every live connection of this process, by id (a relayed invoke names one).
        self.connections: dict[str, Client] = {}
        self.runs: dict[str, ActiveRun] = {}
        self.browser = CallProxy(
            ledger, config, self.find_peer, durable=durable, clock=clock, find_spec=self.tool_spec
        )
        self.approvals = Approvals(ledger, clock, shared=bus is not None)
        self._registrations = itertools.count(1)
        self._closing = False
        self._expiry_task: asyncio.Task[None] | None = None
        self._lease_task: asyncio.Task[None] | None = None
        self.remembered = RememberedTools()
        self.finished = FinishedResponses(config.resume_grace, clock.now)
        # Several processes on one ledger (PostgreSQL): registrations live in the
        # ledger and calls are routed between processes over the bus. None: this
        # process is the whole server (SQLite), everything stays in memory.
        self.bus = bus
        self.peers: Peers | None = None
        if bus is not None:
            self.peers = Peers(ledger, self._local_tools, clock.now)
            self._listen(bus)
        # The chats' stored messages (H1-H5); on the bus too with several processes.
        self.conversations = Conversations(ledger, clock, bus=bus)
        # The chat streams across processes (cluster/shared_streams.py), on the bus too.
        self.shared: SharedStreams | None = None
        if bus is not None:
            from .cluster.shared_streams import SharedStreams  # psycopg: only with a shared ledger

            self.shared = SharedStreams(
                cast(Any, ledger), bus, clock, grace=config.resume_grace, poll=config.lease,
                abort_run=self.abort_run, lease_lost=self.lease_lost,
            )  # fmt: skip

    # -- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        """Expire what outlived its TTL, take over and resume unfinished runs whose lease
        lapsed (S8), start the expiry clock and the lease's heartbeat."""
        await self.ledger.keep_alive(self.clock.now())
        await self.expire_now()
        await self.prune_now()
        await self.take_over_now()
        self._expiry_task = asyncio.create_task(self._expire_periodically())
        self._lease_task = asyncio.create_task(self._keep_leases())
        if self.shared is not None:
            self.shared.start()

    async def close(self) -> None:
        """Stop every task; unfinished runs stay resumable in the ledger.

        Their leases are not given up: another process takes them over once they
        lapse, or this one when it starts again on the same SQLite file.
        """
        self._closing = True
        self.browser.shutting_down = True
        tasks = [active.task for active in self.runs.values()]
        for background in (self._expiry_task, self._lease_task):
            if background is not None:
                tasks.append(background)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._expiry_task = self._lease_task = None
        await self.browser.close()
        if self.shared is not None:
            await self.shared.close()
        if self.peers is not None:
            await self.peers.close()

    # -- run ownership (leases) -------------------------------------------------------

    async def take_over_now(self) -> list[str]:
        """Resume every unfinished run whose lease lapsed: it is this process's now.

        Replay does the rest: recorded steps are not asked for again, a pending
        call is delivered again to the session's page once one registers here.
        """
        resumed: list[str] = []
        for execution in await self.ledger.take_over(self.clock.now()):
            self.browser.handed_over.discard(execution.id)
            if execution.id in self.runs:
                continue  # our own lease, renewed late: the run goes on as it was
            try:
                request = RunRequest.from_json(execution.request_json)
            except (ValueError, KeyError, TypeError):
                await self.ledger.set_status(
                    execution.id, "error", self.clock.now(), "its request could not be read"
                )
                continue
            logger.info(
                "resuming run %s of session %s (lease generation %d)",
                execution.id, execution.session, execution.generation,
            )  # fmt: skip
            await self._launch(execution.id, execution.session, request)
            resumed.append(execution.id)
        return resumed

    async def renew_now(self) -> list[str]:
        """Renew the leases of this process's runs; stop those another process took over."""
        lost = await self.ledger.renew(self.clock.now())
        for execution_id in lost:
            self.lease_lost(execution_id)
        return lost

    def lease_lost(self, execution_id: str) -> None:
        """Another process owns the run now: stop it here without a word to the ledger or page.

        Its pending calls are not cancelled at the page (the new owner delivers
        them again and takes the page's results), and its response does not end
        here: it goes on where the run went.
        """
        self.browser.handed_over.add(execution_id)
        active = self.runs.get(execution_id)
        if active is not None and not active.run.lost:
            logger.warning("run %s: lease lost, another process runs it now", execution_id)
            active.run.lost = True
            active.task.cancel()

    async def _keep_leases(self) -> None:
        # A third of the lease: two renewals may be late (a busy loop, a slow
        # database) before the lease lapses.
        period = self.config.lease / 3
        while True:
            await sleep(self.clock, period)
            try:
                live = await self.ledger.keep_alive(self.clock.now())
                if self.peers is not None:
                    self.peers.refresh()
                await self.browser.targets_lost(live)
                await self.renew_now()
                await self.take_over_now()
            except LedgerUnavailable as exc:
                logger.warning("renewing or taking over leases: %s", exc)
            except Exception:
                logger.exception("renewing or taking over leases failed")

    async def expire_now(self) -> list[str]:
        expired = await self.ledger.expire_paused(self.config.ttl, self.clock.now())
        if expired:
            logger.info("expired runs: %s", ", ".join(expired))
            await self.browser.wake_expired(expired)
            self.approvals.wake_expired(expired)
            if self.bus is not None:
                for start in range(0, len(expired), EXPIRED_PER_NOTIFICATION):
                    chunk = expired[start : start + EXPIRED_PER_NOTIFICATION]
                    await self.ledger.notify(None, EXPIRED, *chunk)
        return expired

    async def prune_now(self) -> int:
        """Forget finished executions past the retention, and finished responses past grace."""
        self.finished.prune()
        if self.shared is not None:
            await self.shared.prune(self.clock.now())
        pruned = await self.ledger.prune_finished(self.config.finished_retention, self.clock.now())
        if pruned:
            logger.debug("pruned %d finished executions", pruned)
        # A chat lives the same retention after its last change.
        chats = await self.conversations.prune(self.config.finished_retention)
        if chats:
            logger.debug("pruned %d chats", chats)
        return pruned

    async def _expire_periodically(self) -> None:
        # A TTL (or retention) shorter than the check interval would otherwise be
        # overrun by up to a whole interval (a 1 s TTL checked once a minute).
        config = self.config
        period = min(config.expiry_interval, config.ttl / 2, config.finished_retention / 2)
        while True:
            await sleep(self.clock, period)
            try:
                await self.expire_now()
                await self.prune_now()
            except Exception:
                logger.exception("expiring runs failed")

    def stats(self) -> dict[str, int]:
        """Counts of live state; all but sessions are 0 when nothing runs (tests assert it)."""
        return {
            "runs": len(self.runs),
            "pending_calls": len(self.browser.pending),
            "timers": self.browser.timer_count,
            "approvals": len(self.approvals.waiting),
            "relayed": len(self.browser.relayed),
            "active_responses": sum(len(s.logs) for s in self.sessions.values()),
            "published_responses": len(self.shared.publishers) if self.shared is not None else 0,
            "followed_responses": len(self.shared.followers) if self.shared is not None else 0,
            "sessions": len(self.sessions),
        }

    # -- settling from outside (S8) --------------------------------------------------

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
        step = await self.ledger.get_step(execution_id, seq)
        refused = self._not_resolvable(execution_id, seq, step)
        if refused is not None:
            return refused
        if step is None:
            return Applied("stale", "not_found", f"no step {seq} in execution {execution_id}")
        applied = await self.browser.apply(step, settlement, by_page=False)
        if applied.ok and step.resolution == "approval":
            self.approvals.wake(execution_id, seq)
        if applied.ok and self.bus is not None:
            # The run may wait on another process: every process hears it (no read
            # of the owner), and each remembers the call as superseded.
            await self.ledger.notify(
                None, SETTLED, step.request_id or "", execution_id, str(seq), "outside"
            )
        return applied

    def _not_resolvable(self, execution_id: str, seq: int, step: Step | None) -> Applied | None:
        # S8 resolves `client` and `approval` entries. A pending `server` step is
        # a model answer or a server tool this process is producing right now:
        # settling it from outside would race the run that owns it.
        if step is not None and step.state == "pending" and step.resolution == "server":
            kind = step.kind
        elif step is None and (active := self.runs.get(execution_id)) is not None:
            # A model answer in progress is recorded only once it is complete.
            if active.run.answering != seq:
                return None
            kind = "model"
        else:
            return None
        return Applied(
            "invalid", "invalid",
            f"step {seq} of execution {execution_id} is a {kind} step the server "
            "settles itself; only client and approval steps can be resolved",
            step,
        )  # fmt: skip

    # -- connections ------------------------------------------------------------------

    def _session(self, name: str) -> SessionState:
        session = self.sessions.get(name)
        if session is None:
            session = self.sessions[name] = SessionState(name)
        return session

    def _forget_if_idle(self, session: SessionState) -> None:
        if not session.clients and not session.logs:
            self.sessions.pop(session.name, None)

    def attach(self, client: Client) -> None:
        self._session(client.session).clients.append(client)
        self.connections[client.id] = client

    async def detach(self, client: Client) -> None:
        if self.connections.get(client.id) is client:
            del self.connections[client.id]
        self.conversations.drop(client)
        if self.peers is not None and client.registration:
            self.peers.forget(client.session)
            try:
                # First: whoever re-delivers this connection's calls must not find it.
                await self.ledger.unregister(client.id)
                await self.ledger.notify(None, UNREGISTERED, client.session)
            except LedgerUnavailable as exc:
                # Its row stays until a relayed invoke finds the connection gone.
                logger.warning("could not unregister %s: %s", client.id, exc)
        session = self.sessions.get(client.session)
        if session is None:
            return
        if client in session.clients:
            session.clients.remove(client)
        for log in session.logs.values():
            log.drop_owner(client.id)
        if self.shared is not None:
            self.shared.drop_owner(client.id)
        await self.browser.on_disconnect(client)
        self._forget_if_idle(session)

    def _local_tools(self, connection_id: str) -> Mapping[str, ToolSpec] | None:
        client = self.connections.get(connection_id)
        return client.tools if client is not None and client.is_open else None

    async def find_peer(self, session_name: str, tool_name: str) -> Peer | None:
        """S2: the newest live connection of the session that registered the tool.

        With several processes on the ledger, across all of them: a connection
        here, or a remote peer on another process.
        """
        if self.peers is not None:
            for registration, tools in reversed(await self.peers.live(session_name)):
                if tool_name not in tools:
                    continue
                if registration.process_id == self.ledger.owner:
                    local = self.connections.get(registration.connection_id)
                    if local is None:
                        continue  # closed while the registrations were read
                    return local
                return self.peers.remote(registration)
            return None
        session = self.sessions.get(session_name)
        if session is None:
            return None
        offering = [c for c in session.clients if c.is_open and tool_name in c.tools]
        return max(offering, key=lambda c: c.registration, default=None)

    async def register_tools(self, client: Client, frame: ClientToolsFrame) -> None:
        accepted: dict[str, ToolSpec] = {}
        rejected: list[RejectedTool] = []
        for spec in frame.tools:
            reason = self._refusal(spec, accepted)
            if reason is None:
                accepted[spec.name] = spec
            else:
                rejected.append(RejectedTool(name=spec.name, reason=reason))
        if self.peers is not None:
            order = await self.ledger.register(
                client.id, client.session, frame.client_id, tools_json(accepted)
            )
            self.peers.forget(client.session)
        else:
            order = next(self._registrations)
        client.set_tools(frame.client_id, accepted, order)
        self.remembered.remember(client.session, accepted)
        client.send(ToolsAckFrame(accepted=list(accepted), rejected=rejected))
        await self.browser.on_registered(client)
        if self.bus is not None:
            await self.ledger.notify(None, REGISTERED, client.session)

    async def tool_spec(self, session: str, name: str) -> ToolSpec | None:
        """S2: the spec of the session's newest live page that offers the tool, else the
        remembered one."""
        peer = await self.find_peer(session, name)
        spec = peer.tool_spec(name) if peer is not None else None
        return spec if spec is not None else self.remembered.get(session, name)

    def remembered_tool(self, session: str, name: str) -> ToolSpec | None:
        """The spec of a tool some page of the session registered, live or not."""
        return self.remembered.get(session, name)

    async def session_specs(self, session_name: str) -> dict[str, ToolSpec]:
        """S2: every tool the session's pages registered, live or not; a live page's spec wins.

        A call to one whose page is gone waits for the next page that registers it.
        """
        specs = self.remembered.of(session_name)
        if self.peers is not None:
            for _, tools in await self.peers.live(session_name):
                specs.update(tools)
            return specs
        session = self.sessions.get(session_name)
        if session is not None:
            for client in sorted(session.clients, key=lambda c: c.registration):
                if client.is_open:
                    specs.update(client.tools)
        return specs

    def _refusal(self, spec: ToolSpec, accepted: Mapping[str, ToolSpec]) -> str | None:
        if spec.name in accepted:
            return "a tool of this name is already in this registration"
        if spec.name in self.reserved_names:
            return "the name is taken by a server tool"
        if len(accepted) >= MAX_TOOLS_PER_CONNECTION:
            return f"at most {MAX_TOOLS_PER_CONNECTION} tools per connection"
        size = json_size(spec.model_dump(mode="json", by_alias=True, exclude_none=True))
        if size > MAX_TOOL_SPEC_BYTES:
            return f"the tool spec is {size:,} bytes; at most {MAX_TOOL_SPEC_BYTES:,} are allowed"
        if spec.output_schema is not None:
            problem = self.browser.schemas.problem(spec.output_schema)
            if problem is not None:
                return f"the outputSchema is not a valid JSON Schema (Draft 2020-12): {problem}"
        return None

    # -- routing between processes (the bus) ------------------------------------------

    def _listen(self, bus: Bus) -> None:
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
        connection_id, request_id, tool_call_id, timeout_ms, attempt = args
        client = self.connections.get(connection_id)
        if client is None or not client.is_open:
            # A row left behind (its unregister failed): gone for good, so that the
            # run's process does not pick it again.
            await self.ledger.unregister(connection_id)
            await self.ledger.notify(sender, GONE, request_id, connection_id)
            return
        step = await self.ledger.step_by_request_id(request_id)
        if self.connections.get(connection_id) is not client or not client.is_open:
            # It closed while the step was read, and its close told nobody of this call.
            await self.ledger.notify(sender, GONE, request_id, connection_id)
            return
        if step is None:
            return
        if step.state != "pending":
            # Settled meanwhile (the page's result reached us for the run's previous
            # owner, say): nothing to run, but the run must wake.
            await self.ledger.notify(
                sender, SETTLED, request_id, step.execution_id, str(step.seq), "page"
            )
            return
        frame = InvokeFrame(
            request_id=request_id,
            tool_call_id=tool_call_id,
            tool_name=step.name,
            input=json.loads(step.input_json),
            timeout_ms=int(timeout_ms) or None,
            attempt=int(attempt),
        )
        self.browser.relay_invoke(sender, client, step, frame)

    async def _on_cancel(self, sender: str, args: tuple[str, ...]) -> None:
        connection_id, request_id, reason = args
        self.browser.relay_cancel(
            request_id, cast("CancelReason", reason), self.connections.get(connection_id)
        )

    async def _on_settled(self, sender: str, args: tuple[str, ...]) -> None:
        request_id, execution_id, seq, how = args
        if how == "outside" and request_id:
            self.browser.remember_superseded(request_id)
        if sender == self.ledger.owner:
            return  # settled here: woken already
        if not await self.browser.settled_elsewhere(request_id, execution_id, int(seq), how):
            self.approvals.wake(execution_id, int(seq))  # an approval answered elsewhere

    async def _on_progress(self, sender: str, args: tuple[str, ...]) -> None:
        request_id, progress = args
        self.browser.progressed_elsewhere(sender, request_id, float(progress))

    async def _on_gone(self, sender: str, args: tuple[str, ...]) -> None:
        request_id, connection_id = args
        entry = self.browser.pending.get(request_id)
        if entry is not None:
            self._forget(entry.session)  # the connection may be one we still had
        await self.browser.gone_elsewhere(sender, request_id, connection_id)

    async def _on_registered(self, sender: str, args: tuple[str, ...]) -> None:
        if sender != self.ledger.owner:
            (session,) = args
            self._forget(session)
            await self.browser.registered_elsewhere(session)

    async def _on_unregistered(self, sender: str, args: tuple[str, ...]) -> None:
        if sender != self.ledger.owner:
            (session,) = args
            self._forget(session)

    def _forget(self, session: str) -> None:
        if self.peers is not None:
            self.peers.forget(session)

    async def _on_reconnect(self) -> None:
        """Notifications were lost while the bus was away: resync both sides from the rows.

        As the run's process: re-read the steps of our calls, deliver what waits.
        As the pages' process: a call whose last invoke went to one of our
        connections but that we never relayed had its invoke lost; its run's
        process delivers it again once told the invoke's connection does not have it.
        """
        if self.peers is not None:
            self.peers.refresh()
        await self.browser.resync()
        delivered = await self.ledger.delivered_to(list(self.connections))
        for request_id, connection_id, owner in delivered:
            if request_id not in self.browser.relayed and owner not in (None, self.ledger.owner):
                await self.ledger.notify(owner, GONE, request_id, connection_id)

    async def _on_expired(self, sender: str, args: tuple[str, ...]) -> None:
        if sender != self.ledger.owner:
            await self.browser.wake_expired(args)
            self.approvals.wake_expired(args)

    # -- chat -------------------------------------------------------------------------

    async def start_run(self, client: Client, frame: SendFrame) -> None:
        session = self._session(client.session)
        if frame.id in session.logs:
            client.send(_busy(frame))
            return
        # H1, H5 and the size limit: the stored history decides what the run answers.
        prepared = await self.conversations.prepare(
            client.session, frame.id, frame.trigger, frame.message_id, frame.messages
        )
        if isinstance(prepared, Refusal):
            client.send(_refused(frame, prepared))
            return
        request = RunRequest(frame.id, list[JsonValue](prepared.history))
        try:
            execution = await self.ledger.start_execution(
                client.session, request.to_json(), self.clock.now(), chat_id=frame.id
            )
        except ChatBusy:  # it streams on another process
            client.send(_busy(frame))
            return
        except ValueError:
            client.send(
                ErrorFrame(request_id=frame.request_id, error_text="the request was not usable")
            )
            return
        log = ChunkLog(frame.id)
        log.subscribe(frame.request_id, client.id, client.send, after=None)
        await self._launch(
            execution.id, client.session, request, log, fresh=True, prepared=prepared
        )

    async def _launch(
        self,
        execution_id: str,
        session_name: str,
        request: RunRequest,
        log: ChunkLog | None = None,
        *,
        fresh: bool = False,
        prepared: Prepared | None = None,
    ) -> None:
        if log is None:
            log = await self._resumed_log(execution_id, request.chat_id)
        elif self.shared is not None:
            await self.shared.publish(execution_id, log)
        session = self._session(session_name)
        session.logs[request.chat_id] = log
        # H2: the response's message is stored however the run goes (a replay too).
        recorder = self.conversations.recorder(session_name, execution_id, request, prepared)
        run = Run(
            execution_id, request, self.ledger, self.agent, self.model,
            SessionTools(session_name, self.session_specs, self.browser, self.approvals),
            self.server_toolset, recorder.through(log.append),
            clock=self.clock.now, max_steps=self.config.max_steps, fresh=fresh,
            client_tools=self.config.client_tools,
        )  # fmt: skip
        task = asyncio.create_task(self._drive(run, log, session_name, recorder))
        self.runs[execution_id] = ActiveRun(run, task, log, session_name)

    async def _resumed_log(self, execution_id: str, chat_id: str) -> ChunkLog:
        """The log of a run resumed here: on a shared ledger it goes on from the chunks
        published by the process that had it, so pages keep their sequence numbers."""
        if self.shared is None:
            return ChunkLog(chat_id)
        published: list[Chunk] = []
        ended = False
        try:
            published, ended = await self.shared.published(execution_id)
        except LedgerUnavailable as exc:
            logger.warning("run %s: its response so far could not be read: %s", execution_id, exc)
            ended = True  # publish nothing: it would number the response again from 0
        log = ChunkLog(chat_id, published)
        await self.shared.publish(execution_id, log, ended=ended, taken=True)
        return log

    async def _drive(
        self, run: Run, log: ChunkLog, session_name: str, recorder: ResponseRecorder
    ) -> None:
        try:
            await run.execute()
        finally:
            try:
                ended = (not self._closing or run.aborted) and not run.lost
                # Stored before the end goes out: a page that sees the end finds the
                # final message stored (H2). Not at shutdown or once lost: the run
                # goes on (after a restart, or on another process) and stores it there.
                await recorder.close(final=ended)
                self.runs.pop(run.execution_id, None)
                session = self.sessions.get(session_name)
                if session is not None:
                    if session.logs.get(log.chat_id) is log:
                        del session.logs[log.chat_id]
                    self._forget_if_idle(session)
                # At shutdown the response is not over: the page resumes it from
                # the restarted server instead of seeing it end. Nor is it when
                # another process took the run over: it goes on there.
                if ended:
                    log.finish()
                    self.finished.keep(session_name, log)
                    if self.shared is not None:
                        # While the lease is held: its end is written fenced.
                        await self.shared.drained(run.execution_id)
                elif run.lost and self.shared is not None:
                    await self.shared.lost(run.execution_id, session_name, log)
            finally:
                self.ledger.release(run.execution_id)

    async def resume(self, client: Client, frame: ResumeFrame) -> None:
        """S7; and a resume that names ``lastSequence`` also reaches a response that just ended.

        Such a page was following the response and lost its socket (a server
        restart, a network drop) just before the end. The result that finished
        the run may arrive first (the page's own outbox re-sends it before its
        chat resumes, C11), so without this the page would get ``no-active`` and
        keep a truncated message. A resume without ``lastSequence`` asks what is
        streaming now, and a finished response is not.
        """
        if await self.conversations.owned_elsewhere(client.session, frame.id):
            client.send(ProtocolErrorFrame(message=OTHER_SESSION, request_id=frame.request_id))
            return
        session = self.sessions.get(client.session)
        log = session.logs.get(frame.id) if session is not None else None
        if log is None and self.shared is not None:
            # Not streaming here: the shared record knows where it streams (or
            # streamed: it keeps the ended ones for the grace too).
            await self.shared.resume(client, frame)
            return
        if log is None and frame.last_sequence is not None:
            log = self.finished.get(client.session, frame.id)
        if log is None:
            client.send(NoActiveFrame(request_id=frame.request_id))
            return
        log.subscribe(frame.request_id, client.id, client.send, after=frame.last_sequence)

    async def abort(self, client: Client, frame: AbortFrame) -> None:
        for active in self.runs.values():
            if active.session == client.session and frame.request_id in active.log.request_ids:
                active.run.aborted = True
                active.task.cancel()
                return
        if self.shared is not None:
            await self.shared.abort(client, frame)  # a response followed here, run elsewhere

    async def abort_chat(self, session_name: str, chat_id: str) -> bool:
        """Abort the run streaming for a chat, here or on another process; False if none.

        What a page without a chat socket asks (the HTTP transport): by chat,
        not by the request that started it, which may be gone.
        """
        for active in self.runs.values():
            if active.session == session_name and active.log.chat_id == chat_id:
                if active.run.lost:
                    break  # another process runs it now
                active.run.aborted = True
                active.task.cancel()
                return True
        if self.shared is not None:
            return await self.shared.abort_chat(session_name, chat_id)
        return False

    def abort_run(self, execution_id: str) -> bool:
        """Abort a run of this process (a page aborted it on another one); False if none."""
        active = self.runs.get(execution_id)
        if active is None or active.run.lost:
            return False
        active.run.aborted = True
        active.task.cancel()
        return True

    async def on_result(self, client: Client, frame: ToolResultFrame) -> ResultAckFrame:
        return await self.browser.on_result(client, frame)

    async def on_progress(self, client: Client, frame: ToolProgressFrame) -> None:
        await self.browser.on_progress(client, frame)

    async def approve(self, client: Client, frame: ToolApprovalFrame) -> None:
        problem = await self.approvals.on_approval(client, frame)
        if problem is not None:
            client.send(ProtocolErrorFrame(message=problem))

    # -- the stored chats (H3, H4)

    async def subscribe_chat(self, client: Client, frame: ChatSubscribeFrame) -> None:
        await self.conversations.subscribe(client, frame)

    async def clear_chat(self, client: Client, frame: ChatClearFrame) -> None:
        session = self.sessions.get(client.session)
        streaming = session is not None and frame.id in session.logs
        await self.conversations.clear(client, frame, streaming)

    async def chat_streams(self, chat_id: str) -> bool:
        """Does a response stream for the chat, here or on another process?"""
        if any(chat_id in session.logs for session in self.sessions.values()):
            return True
        return await self.conversations.streams(chat_id)


class SessionTools:
    """What a run of one session reaches: its pages' tools, the browser-call proxy, approvals."""

    def __init__(
        self,
        session: str,
        specs: Callable[[str], Awaitable[dict[str, ToolSpec]]],
        browser: CallProxy,
        approvals: Approvals,
    ) -> None:
        self.session = session
        self._specs = specs
        self._browser = browser
        self._approvals = approvals

    async def specs(self) -> dict[str, ToolSpec]:
        return await self._specs(self.session)

    async def run_client_tool(self, step: Step, call: RequestedCall) -> Step | None:
        return await self._browser.call(self.session, step, call)

    async def start_client_tool(self, step: Step, call: RequestedCall) -> StartedCall:
        return await self._browser.start(self.session, step, call)

    async def await_approval(self, step: Step, call: RequestedCall) -> None:
        await self._approvals.wait(self.session, step, call)


def _refused(frame: SendFrame, refusal: Refusal) -> WireModel:
    if refusal.protocol:
        return ProtocolErrorFrame(message=refusal.message, request_id=frame.request_id)
    return ErrorFrame(request_id=frame.request_id, error_text=refusal.message)


def _busy(frame: SendFrame) -> ErrorFrame:
    return ErrorFrame(request_id=frame.request_id, error_text=BUSY)


def agent_tool_names(agent: Agent[None, Any]) -> frozenset[str]:
    """The names of the agent's own function tools (those it holds without a run)."""
    names: set[str] = set()
    for toolset in agent.toolsets:
        if isinstance(toolset, FunctionToolset):
            names.update(toolset.tools)
    return frozenset(names)
