"""The Starlette application: lifespan (ledger, hub), the chat WebSocket, the AI SDK's HTTP
chat transport (:mod:`clienttools_server.wire.http_chat`), the pending-call routes
(``/executions``, see :mod:`clienttools_server.wire.pending_routes`), static files.

config = ServerConfig(port=0)
app = create_app(config)                       # serve it with uvicorn, or:
async with running_server(config) as server:   # in-process, on a free port
    url = server.ws_url("chat-1")              # ws://127.0.0.1:PORT/agents/chat/chat-1
    server.pending.executions(status="paused") # the Python API the HTTP routes call
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

import uvicorn
from pydantic_ai import Agent
from pydantic_ai.models import Model, infer_model
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute, Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.types import Message, Receive, Scope, Send
from starlette.websockets import WebSocket

from .agent.agents import default_agent, load_agent
from .agent.model_choice import choose_model
from .agent.scripted import SCRIPTED
from .agent.server_tools import ServerTool, default_server_tools
from .calls.pending import PendingCalls
from .clock import SYSTEM_CLOCK, Clock
from .cluster.bus import Bus
from .config import ServerConfig
from .hub import Hub
from .ledger import DEFAULT_LEASE, Ledger, LedgerUnavailable, SqliteLedger
from .wire.auth import (
    CLOSE_NOT_YOURS,
    Access,
    Authorizer,
    access,
    authorize,
    default_authorizer,
    redact_tokens,
    route_of,
)
from .wire.chat_routes import chat_routes
from .wire.connection import CLOSE_POLICY_VIOLATION, CLOSE_TRY_AGAIN_LATER, PageConnection, admitted
from .wire.http_chat import chat_http_routes
from .wire.keepalive import Pinger
from .wire.pending_routes import pending_routes
from .wire.websocket_protocol import WebSocketProtocol

logger = logging.getLogger(__name__)

POSTGRES_SCHEMES = ("postgresql://", "postgres://")


#: What makes a page cross-origin isolated (`crossOriginIsolated` true): only such a
#: page has SharedArrayBuffer, which PyScript needs to give a worker the page's
#: `window` and `document` (synchronous calls across threads). COEP `require-corp`
#: refuses any subresource that does not allow this origin to embed it, so every
#: file served here says it may be embedded by its own origin (CORP); the SDK,
#: Pyodide, PyScript, MicroPython and the wheels are all served from here.
ISOLATION_HEADERS: Final[tuple[tuple[bytes, bytes], ...]] = (
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-embedder-policy", b"require-corp"),
    (b"cross-origin-resource-policy", b"same-origin"),
)


class StaticDirs:
    """Several directories served at one mount point; the first that has the file wins.

    One ``StaticFiles`` per directory, asked in order through its public
    ``get_path`` / ``get_response``: a 404 from one (an exception, or its own
    ``404.html``) passes the request to the next; the first 404 page found is
    the answer when none has the file. With ``isolation`` every response carries
    ``ISOLATION_HEADERS``.
    """

    def __init__(self, directories: tuple[str, ...], *, isolation: bool = False) -> None:
        if not directories:
            raise ValueError("StaticDirs needs at least one directory")
        # StaticFiles raises at once for a missing directory.
        self._files = [StaticFiles(directory=d, html=True) for d in directories]
        self._isolation = isolation

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._files[0](scope, receive, send)  # refuses a WebSocket as StaticFiles does
            return
        if self._isolation:
            send = _with_headers(send, ISOLATION_HEADERS)
        not_found: Response | None = None
        for files in self._files:
            try:
                response = await files.get_response(files.get_path(scope), scope)
            except HTTPException as exc:
                if exc.status_code != 404:
                    raise
                continue
            if response.status_code != 404:
                await response(scope, receive, send)
                return
            not_found = not_found or response
        # Answered here, not raised: the exception handler's response would miss the headers.
        await (not_found or PlainTextResponse("Not Found", status_code=404))(scope, receive, send)


def _with_headers(send: Send, headers: tuple[tuple[bytes, bytes], ...]) -> Send:
    """`send` that adds `headers` to the response start (404s and 304s included)."""

    async def send_with_headers(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()), *headers]}
        await send(message)

    return send_with_headers


async def chat_endpoint(websocket: WebSocket) -> None:
    config: ServerConfig = websocket.app.state.config
    hub: Hub = websocket.app.state.hub
    principal = await authorize(websocket) if admitted(websocket, config) else None
    if principal is None:
        # Before accept, a close becomes an HTTP 403 refusal of the handshake.
        await websocket.close(code=CLOSE_POLICY_VIOLATION)
        return
    session = websocket.path_params["session"]
    try:
        allowed = await access(websocket).allows(
            principal, session, route=route_of(websocket), claim=True
        )
    except LedgerUnavailable as exc:
        logger.warning("closing a handshake of session %r with 1013: %s", session, exc)
        await websocket.accept()
        await websocket.close(code=CLOSE_TRY_AGAIN_LATER)
        return
    await websocket.accept()
    if not allowed:
        # Accepted only to say why, before any frame, with no reason text (O1, O4).
        await websocket.close(code=CLOSE_NOT_YOURS)
        return
    pinger: Pinger = websocket.app.state.pinger
    await PageConnection(websocket, session, hub, config, pinger, hub.clock).serve()


async def open_ledger(db: str | None, *, lease: float = DEFAULT_LEASE) -> Ledger:
    """The ledger ``--db`` names: a PostgreSQL URL, a SQLite file, or (None) memory.

    ``lease``: seconds each run this ledger owns stays its own past a renewal.
    """
    if db is None:
        # Without a db the same SQLite ledger runs in memory: one implementation to trust.
        return SqliteLedger(":memory:", lease=lease)
    if db.startswith(POSTGRES_SCHEMES):
        # Imported here: psycopg is needed only by servers that use PostgreSQL.
        from .ledger.postgres import PostgresLedger

        return await PostgresLedger.connect(db, lease=lease)
    return SqliteLedger(db, lease=lease)


def open_bus(db: str | None, ledger: Ledger) -> Bus | None:
    """The bus to the other processes of a shared (PostgreSQL) ledger; None for SQLite."""
    if db is None or not db.startswith(POSTGRES_SCHEMES):
        return None
    from .cluster.bus import Bus
    from .ledger.postgres import PostgresLedger

    assert isinstance(ledger, PostgresLedger)
    return Bus(ledger)


def serving(
    config: ServerConfig, agent: Agent[None, Any] | None = None, model: Model | None = None
) -> tuple[Agent[None, Any], Model]:
    """The agent and the model a server with ``config`` runs.

    The agent is ``agent``, else ``config.agent`` loaded, else a plain one; the
    model is ``model``, else the ``--model`` name when it is not the default,
    else the agent's own model, else the scripted one. Raises ModelChoiceError
    or AgentLoadError with a message that says what to do.
    """
    if agent is None:
        agent = load_agent(config.agent) if config.agent is not None else default_agent()
    if model is None:
        if config.model == SCRIPTED and agent.model is not None:
            model = infer_model(agent.model)
        else:
            model = choose_model(
                config.model,
                first_chunk_delay=config.first_chunk_delay,
                chunk_delay=config.chunk_delay,
            )
    return agent, model


def model_label(config: ServerConfig, model: Model) -> str:
    """The model's name as a person reads it: the ``--model`` name, or the model's own."""
    if config.model != SCRIPTED or model.model_name == SCRIPTED:
        return config.model
    return f"{model.system}:{model.model_name}"


def create_app(
    config: ServerConfig,
    *,
    agent: Agent[None, Any] | None = None,
    model: Model | None = None,
    server_tools: Mapping[str, ServerTool] | None = None,
    clock: Clock = SYSTEM_CLOCK,
    authorize: Authorizer | None = None,
    ledger: Ledger | None = None,
) -> Starlette:
    """The ASGI app for ``config``, serving ``agent`` (a user's pydantic-ai Agent) if given.

    Each session's page tools are added to the agent per run. ``model``
    replaces the agent's model; ``server_tools`` the default server tools.
    ``authorize`` is where identity enters: called with every WebSocket
    handshake and every HTTP request of the chat and pending-call routes, it
    returns the :class:`~clienttools_server.wire.auth.Principal` or None to refuse
    (sync or async); without it, the token rules of ``config``
    (:func:`~clienttools_server.wire.auth.default_authorizer`). ``ledger``: one
    already open for ``config.db`` (the command's, opened by its start-up checks),
    which the app then owns and closes at shutdown; else the lifespan opens it.
    """
    chosen_agent, chosen_model = serving(config, agent, model)
    authorizer = authorize if authorize is not None else default_authorizer(config, clock)
    tools = dict(server_tools) if server_tools is not None else default_server_tools(clock)

    opened = ledger

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        ledger = opened if opened is not None else await open_ledger(config.db, lease=config.lease)
        bus = open_bus(config.db, ledger)
        hub = Hub(
            config, ledger, chosen_agent, chosen_model, tools,
            durable=config.db is not None, clock=clock, bus=bus,
        )  # fmt: skip
        app.state.config = config
        app.state.ledger = ledger
        app.state.hub = hub
        app.state.pinger = Pinger(clock, config.ping_interval)
        app.state.pending = PendingCalls(hub.outside, ledger)
        app.state.access = Access(authorizer, ledger, clock)
        try:
            if bus is not None:
                await bus.start()  # the hub's handlers are on it: nothing is missed
            await hub.start()
            yield
        finally:
            await hub.close()
            if bus is not None:
                await bus.close()
            await ledger.close()

    label = model_label(config, chosen_model)

    async def info(request: Request) -> JSONResponse:
        """What answers: the model's name (the demo page shows it) and the agent's."""
        return JSONResponse({"model": label, "agent": chosen_agent.name})

    routes: list[BaseRoute] = [
        WebSocketRoute("/agents/chat/{session}", chat_endpoint),
        Route("/agents/info", info, methods=["GET"]),
    ]
    routes += chat_http_routes()
    routes += pending_routes()
    routes += chat_routes()
    if config.static_dirs:
        routes.append(
            Mount(
                "/",
                app=StaticDirs(config.static_dirs, isolation=config.cross_origin_isolation),
                name="static",
            )
        )
    return Starlette(routes=routes, lifespan=lifespan)


def uvicorn_config(app: Starlette, config: ServerConfig) -> uvicorn.Config:
    """How uvicorn serves the app: S9's frame limit is enforced by the WebSocket layer too.

    A frame that layer refuses still ends in a close frame, not a reset (WebSocketProtocol).
    uvicorn's logs of a handshake or request never show a ``?token=`` (RedactTokens).
    """
    served = uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        log_level=config.log_level,
        ws=WebSocketProtocol,
        ws_max_size=config.max_frame_bytes,
        lifespan="on",
        timeout_graceful_shutdown=5,
    )
    # After the Config: it sets up uvicorn's loggers (filters already there stay).
    redact_tokens("uvicorn.error", "uvicorn.access", "uvicorn.asgi")
    return served


class _EmbeddedServer(uvicorn.Server):
    """uvicorn inside a process that owns its signals (pytest, an app): it must not take them."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@dataclass(frozen=True, slots=True)
class RunningServer:
    app: Starlette
    host: str
    port: int

    @property
    def http_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def ws_url(self, session: str, token: str | None = None) -> str:
        url = f"ws://{self.host}:{self.port}/agents/chat/{session}"
        return url if token is None else f"{url}?token={token}"

    @property
    def hub(self) -> Hub:
        hub: Hub = self.app.state.hub
        return hub

    @property
    def pending(self) -> PendingCalls:
        """List and settle pending calls: what the ``/executions`` routes call."""
        pending: PendingCalls = self.app.state.pending
        return pending


@contextlib.asynccontextmanager
async def running_server(
    config: ServerConfig,
    *,
    agent: Agent[None, Any] | None = None,
    model: Model | None = None,
    server_tools: Mapping[str, ServerTool] | None = None,
    clock: Clock = SYSTEM_CLOCK,
    authorize: Authorizer | None = None,
) -> AsyncIterator[RunningServer]:
    """Serve in this event loop (``port=0`` picks a free port) until the block exits."""
    app = create_app(
        config, agent=agent, model=model, server_tools=server_tools, clock=clock,
        authorize=authorize,
    )  # fmt: skip
    server = _EmbeddedServer(uvicorn_config(app, config))
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
            raise RuntimeError("uvicorn stopped before it started")
        await asyncio.sleep(0.005)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield RunningServer(app, config.host, port)
    finally:
        server.should_exit = True
        await task
