"""The live pages of each session and the tools they registered (S2).

A call of a session's tool goes to the newest live connection of the session
that registered it (:meth:`Pages.find_peer`); with several processes on one
ledger, the registrations are rows of the ledger and the connection may be on
another process (a :class:`~clienttools_server.cluster.routing.RemotePeer`).
A registration is checked here (names, counts, sizes, the outputSchema) and
acked with what was accepted and what was rejected, and why.

    pages = Pages(ledger, reserved_names=frozenset({"now"}), schemas=OutputSchemas(),
                  now=clock.now)
    pages.attach(connection)
    await pages.register(connection, frame)      # sets its tools, sends the tools ack
    peer = await pages.find_peer("desk", "locate")
    await pages.recall("desk")                   # a resumed run: the tools the ledger kept
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from clienttools.protocol import (
    MAX_TOOL_SPEC_BYTES,
    MAX_TOOLS_PER_CONNECTION,
    ClientToolsFrame,
    RejectedTool,
    ToolsAckFrame,
    ToolSpec,
    json_size,
)

from ..cluster.routing import Peers, tools_json
from ..ledger import Ledger
from .delivery import Peer
from .output_schemas import OutputSchemas
from .remembered import MAX_REMEMBERED_TOOLS, RememberedTools

if TYPE_CHECKING:
    from ..agent.chunk_log import ChunkLog

logger = logging.getLogger(__name__)


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


class Pages:
    """The sessions of this process, their connections, and where a call of a tool goes."""

    def __init__(
        self,
        ledger: Ledger,
        reserved_names: frozenset[str],
        schemas: OutputSchemas,
        now: Callable[[], float],
        peers: Peers | None = None,
    ) -> None:
        self.ledger = ledger
        self.now = now
        # Names a page tool cannot take: the server's tools and the agent's own.
        self.reserved_names = reserved_names
        self.schemas = schemas
        self.sessions: dict[str, SessionState] = {}
        # Every live connection of this process, by id (a relayed invoke names one).
        self.connections: dict[str, Client] = {}
        self.remembered = RememberedTools()
        # Several processes on one ledger: the registrations of all of them, read
        # from the ledger. None: this process is the whole server.
        self.peers = peers
        self._registrations = itertools.count(1)

    def session(self, name: str) -> SessionState:
        session = self.sessions.get(name)
        if session is None:
            session = self.sessions[name] = SessionState(name)
        return session

    def forget_if_idle(self, session: SessionState) -> None:
        if not session.clients and not session.logs:
            self.sessions.pop(session.name, None)

    def forget(self, session: str) -> None:
        """The session's registrations changed (on any process): read them again."""
        if self.peers is not None:
            self.peers.forget(session)

    def attach(self, client: Client) -> None:
        self.session(client.session).clients.append(client)
        self.connections[client.id] = client

    def disconnect(self, client: Client) -> None:
        """A relayed invoke no longer finds the connection (it closed)."""
        if self.connections.get(client.id) is client:
            del self.connections[client.id]

    def leave(self, client: Client) -> SessionState | None:
        """No call goes to the connection any more; its session's state, if any."""
        session = self.sessions.get(client.session)
        if session is not None and client in session.clients:
            session.clients.remove(client)
        return session

    def local_tools(self, connection_id: str) -> Mapping[str, ToolSpec] | None:
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

    async def register(self, client: Client, frame: ClientToolsFrame) -> None:
        """Check the frame's tools, set the accepted ones on ``client``, send the tools ack."""
        accepted: dict[str, ToolSpec] = {}
        rejected: list[RejectedTool] = []
        for spec in frame.tools:
            reason = self._refusal(spec, accepted)
            if reason is None:
                accepted[spec.name] = spec
            else:
                rejected.append(RejectedTool(name=spec.name, reason=reason))
        # Kept in the ledger before the ack, each registration (so the time of the
        # last one is kept too): a page acked is a page whose tools a replay after a
        # restart can offer. The ledger away: no ack, and the page registers again.
        if accepted:
            await self.ledger.remember_tools(
                client.session,
                {
                    name: spec.model_dump_json(by_alias=True, exclude_none=True)
                    for name, spec in accepted.items()
                },
                self.now(),
                keep=MAX_REMEMBERED_TOOLS,
            )
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

    async def recall(self, session: str) -> None:
        """Remember the session's tools the ledger kept: for a run resumed, or started,
        before any page of the session registered on this process.

        The ledger's spec of a tool is the newest (every registration, on any process,
        writes it before it is remembered), so it replaces the one remembered here. A
        ledger that cannot be read leaves things as they were (logged): the offered
        tools are then those known here, and a later run of the session tries again.
        """
        try:
            kept = await self.ledger.remembered_tools(session)
        except Exception as exc:
            logger.warning("session %s: its kept tools could not be read: %s", session, exc)
            return
        specs: dict[str, ToolSpec] = {}
        for name, text in kept.items():
            try:
                specs[name] = ToolSpec.model_validate_json(text)
            except ValueError:
                logger.warning("session %s: the kept spec of tool %r is unreadable", session, name)
        self.remembered.remember(session, specs)

    async def tool_spec(self, session: str, name: str) -> ToolSpec | None:
        """S2: the spec of the session's newest live page that offers the tool, else the
        remembered one."""
        peer = await self.find_peer(session, name)
        spec = peer.tool_spec(name) if peer is not None else None
        return spec if spec is not None else self.remembered.get(session, name)

    async def session_specs(self, session_name: str) -> dict[str, ToolSpec]:
        """S2: every tool the session's pages registered, live or not; a live page's spec wins.

        A call to one whose page is gone waits for the next page that registers it. A
        session this process has not met yet (since it started) first recalls the
        tools the ledger kept for it.
        """
        if not self.remembered.knows(session_name):
            await self.recall(session_name)
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
            problem = self.schemas.problem(spec.output_schema)
            if problem is not None:
                return f"the outputSchema is not a valid JSON Schema (Draft 2020-12): {problem}"
        return None
