"""The server's state and what connects the sockets to the agent runs: the parts, composed.

The hub owns every piece of per-server state (no module globals) through its
parts: the pages of each session and their tools (:class:`Pages`), the runs
and their responses (:class:`RunLauncher`), the browser-call proxy and the
approvals, settling from outside (:class:`OutsideSettlement`), the two
maintenance loops and, with several processes on one ledger, the bus handlers
and the shared streams. Connections call it with parsed frames.

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
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

from pydantic import JsonValue
from pydantic_ai import Agent
from pydantic_ai.models import Model
from pydantic_ai.toolsets import FunctionToolset

from clienttools.protocol import (
    AbortFrame,
    ChatClearFrame,
    ChatSubscribeFrame,
    ClientToolsFrame,
    ProtocolErrorFrame,
    ResultAckFrame,
    ResumeFrame,
    SendFrame,
    ToolApprovalFrame,
    ToolProgressFrame,
    ToolResultFrame,
    ToolSpec,
)

from .agent.chunk_log import FinishedResponses
from .agent.conversations import Conversations
from .agent.launcher import RunLauncher
from .agent.server_tools import ServerTool, ServerToolset
from .calls.approvals import Approvals
from .calls.delivery import Peer
from .calls.output_schemas import OutputSchemas
from .calls.pages import Client, Pages
from .calls.proxy import CallProxy
from .calls.settlement import Applied, OutsideSettlement, Settlement
from .clock import SYSTEM_CLOCK, Clock
from .cluster.handlers import BusHandlers
from .cluster.routing import REGISTERED, UNREGISTERED, Peers
from .config import ServerConfig
from .ledger import Ledger, LedgerUnavailable, Outcome
from .maintenance import Maintenance

if TYPE_CHECKING:
    from .cluster.bus import Bus
    from .cluster.shared_streams import SharedStreams

logger = logging.getLogger(__name__)


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
        self.clock = clock
        self.bus = bus
        server_toolset = ServerToolset(dict(server_tools))
        reserved = frozenset(server_tools) | agent_tool_names(agent)
        schemas = OutputSchemas()
        self.pages = Pages(ledger, reserved, schemas, clock.now)
        self.browser = CallProxy(
            ledger, config, self.pages.find_peer, durable=durable, clock=clock,
            find_spec=self.pages.tool_spec, schemas=schemas,
        )  # fmt: skip
        self.approvals = Approvals(ledger, clock, shared=bus is not None)
        # Several processes on one ledger (PostgreSQL): registrations live in the
        # ledger and calls are routed between processes over the bus. None: this
        # process is the whole server (SQLite), everything stays in memory.
        if bus is not None:
            self.pages.peers = Peers(ledger, self.pages.local_tools, clock.now)
            BusHandlers(ledger, self.pages, self.browser, self.approvals).listen(bus)
        self.finished = FinishedResponses(config.resume_grace, clock.now)
        # The chats' stored messages (H1-H5); on the bus too with several processes.
        self.conversations = Conversations(ledger, clock, bus=bus)
        self.runs = RunLauncher(
            config, ledger, agent, model, server_toolset, self.pages, self.browser,
            self.approvals, self.conversations, self.finished, clock=clock,
        )  # fmt: skip
        self.outside = OutsideSettlement(
            ledger, self.browser, self.approvals, self.runs.answering, shared=bus is not None
        )
        # The chat streams across processes, on the bus too (after the handlers above:
        # on a reconnect the calls resync first, then the chats, then the streams).
        self.shared: SharedStreams | None = None
        if bus is not None:
            from .cluster.shared_streams import SharedStreams  # psycopg: only with a shared ledger

            self.shared = self.runs.shared = SharedStreams(
                cast(Any, ledger), bus, clock, grace=config.resume_grace, poll=config.lease,
                abort_run=self.runs.abort_run, lease_lost=self.runs.lease_lost,
            )  # fmt: skip
        self.maintenance = Maintenance(
            config, ledger, clock, self.runs, self.browser, self.approvals,
            self.conversations, self.finished, peers=self.pages.peers, shared=self.shared,
        )  # fmt: skip

    @property
    def connections(self) -> dict[str, Client]:
        return self.pages.connections

    # -- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        """Expire what outlived its TTL, resume the runs whose lease lapsed (S8), start
        the loops (:class:`Maintenance`) and the shared streams."""
        await self.maintenance.start()
        if self.shared is not None:
            self.shared.start()

    async def close(self) -> None:
        """Stop every task; unfinished runs stay resumable in the ledger.

        Their leases are not given up: another process takes them over once they
        lapse, or this one when it starts again on the same SQLite file.
        """
        self.runs.closing = True
        self.browser.shutting_down = True
        await asyncio.gather(self.runs.close(), self.maintenance.close())
        await self.browser.close()
        if self.shared is not None:
            await self.shared.close()
        if self.pages.peers is not None:
            await self.pages.peers.close()

    async def prune_now(self) -> int:
        return await self.maintenance.prune_now()

    def lease_lost(self, execution_id: str) -> None:
        self.runs.lease_lost(execution_id)

    def stats(self) -> dict[str, int]:
        """Counts of live state; all but sessions are 0 when nothing runs (tests assert it)."""
        shared = self.shared
        return {
            "runs": len(self.runs.runs),
            "pending_calls": len(self.browser.pending),
            "timers": self.browser.timer_count,
            "approvals": len(self.approvals.waiting),
            "relayed": len(self.browser.relay.relayed),
            "active_responses": sum(len(s.logs) for s in self.pages.sessions.values()),
            "published_responses": len(shared.publishers) if shared is not None else 0,
            "followed_responses": len(shared.followers) if shared is not None else 0,
            "sessions": len(self.pages.sessions),
        }

    # -- settling from outside (S8): OutsideSettlement --------------------------------

    async def resolve(self, execution_id: str, seq: int, output: JsonValue) -> Outcome:
        return await self.outside.resolve(execution_id, seq, output)

    async def reject(self, execution_id: str, seq: int, code: str, message: str) -> Outcome:
        return await self.outside.reject(execution_id, seq, code, message)

    async def settle(self, execution_id: str, seq: int, settlement: Settlement) -> Applied:
        return await self.outside.settle(execution_id, seq, settlement)

    # -- connections ------------------------------------------------------------------

    def attach(self, client: Client) -> None:
        self.pages.attach(client)

    async def detach(self, client: Client) -> None:
        self.pages.disconnect(client)
        peers = self.pages.peers
        if peers is not None and client.registration:
            peers.forget(client.session)
            try:
                # First: whoever re-delivers this connection's calls must not find it.
                await self.ledger.unregister(client.id)
                await self.ledger.notify(None, UNREGISTERED, client.session)
            except LedgerUnavailable as exc:
                # Its row stays until a relayed invoke finds the connection gone.
                logger.warning("could not unregister %s: %s", client.id, exc)
        await self.conversations.drop(client)
        session = self.pages.leave(client)
        if session is None:
            return
        for log in session.logs.values():
            log.drop_owner(client.id)
        if self.shared is not None:
            self.shared.drop_owner(client.id)
        await self.browser.on_disconnect(client)
        self.pages.forget_if_idle(session)

    async def find_peer(self, session_name: str, tool_name: str) -> Peer | None:
        return await self.pages.find_peer(session_name, tool_name)

    def remembered_tool(self, session: str, name: str) -> ToolSpec | None:
        """The spec of a tool some page of the session registered, live or not."""
        return self.pages.remembered.get(session, name)

    async def register_tools(self, client: Client, frame: ClientToolsFrame) -> None:
        await self.pages.register(client, frame)
        await self.browser.on_registered(client)
        if self.bus is not None:
            await self.ledger.notify(None, REGISTERED, client.session)

    async def on_result(self, client: Client, frame: ToolResultFrame) -> ResultAckFrame:
        return await self.browser.results.on_result(client, frame)

    async def on_progress(self, client: Client, frame: ToolProgressFrame) -> None:
        await self.browser.on_progress(client, frame)

    async def approve(self, client: Client, frame: ToolApprovalFrame) -> None:
        problem = await self.approvals.on_approval(client, frame)
        if problem is not None:
            client.send(ProtocolErrorFrame(message=problem))

    # -- chat: RunLauncher --------------------------------------------------------------

    async def start_run(self, client: Client, frame: SendFrame) -> None:
        await self.runs.start_run(client, frame)

    async def resume(self, client: Client, frame: ResumeFrame) -> None:
        await self.runs.resume(client, frame)

    async def abort(self, client: Client, frame: AbortFrame) -> None:
        await self.runs.abort(client, frame)

    async def abort_chat(self, session_name: str, chat_id: str) -> bool:
        return await self.runs.abort_chat(session_name, chat_id)

    def abort_run(self, execution_id: str) -> bool:
        return self.runs.abort_run(execution_id)

    # -- the stored chats (H3, H4)

    async def subscribe_chat(self, client: Client, frame: ChatSubscribeFrame) -> None:
        await self.conversations.subscribe(client, frame)

    async def clear_chat(self, client: Client, frame: ChatClearFrame) -> None:
        session = self.pages.sessions.get(client.session)
        streaming = session is not None and frame.id in session.logs
        await self.conversations.clear(client, frame, streaming)

    async def chat_streams(self, chat_id: str) -> bool:
        """Does a response stream for the chat, here or on another process?"""
        if any(chat_id in session.logs for session in self.pages.sessions.values()):
            return True
        return await self.conversations.streams(chat_id)


def agent_tool_names(agent: Agent[None, Any]) -> frozenset[str]:
    """The names of the agent's own function tools (those it holds without a run)."""
    names: set[str] = set()
    for toolset in agent.toolsets:
        if isinstance(toolset, FunctionToolset):
            names.update(toolset.tools)
    return frozenset(names)
