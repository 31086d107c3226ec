"""The Starlette application: lifespan (ledger, hub), the chat WebSocket, static files.

config = ServerConfig(port=0)
app = create_app(config)                       # serve it with uvicorn, or:
async with running_server(config) as server:   # in-process, on a free port
    url = server.ws_url("chat-1")              # ws://127.0.0.1:PORT/agents/chat/chat-1
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass

import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.routing import Mount, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.types import Receive, Scope, Send
from starlette.websockets import WebSocket

from .config import ServerConfig
from .connection import CLOSE_POLICY_VIOLATION, Connection, admitted
from .hub import Hub
from .ledger import Ledger, SqliteLedger
from .models import Model, create_model
from .server_tools import ServerTool, default_server_tools

logger = logging.getLogger(__name__)


class StaticDirs:
    """Several directories served at one mount point; the first that has the file wins.

    One ``StaticFiles`` per directory, asked in order through its public
    ``get_path`` / ``get_response``: a 404 from one (an exception, or its own
    ``404.html``) passes the request to the next; the first 404 page found is
    the answer when none has the file.
    """

    def __init__(self, directories: tuple[str, ...]) -> None:
        if not directories:
            raise ValueError("StaticDirs needs at least one directory")
        # StaticFiles raises at once for a missing directory.
        self._files = [StaticFiles(directory=d, html=True) for d in directories]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._files[0](scope, receive, send)  # refuses a WebSocket as StaticFiles does
            return
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
        if not_found is None:
            raise HTTPException(status_code=404)
        await not_found(scope, receive, send)


async def chat_endpoint(websocket: WebSocket) -> None:
    config: ServerConfig = websocket.app.state.config
    hub: Hub = websocket.app.state.hub
    if not admitted(websocket, config):
        # Before accept, a close becomes an HTTP 403 refusal of the handshake.
        await websocket.close(code=CLOSE_POLICY_VIOLATION)
        return
    await websocket.accept()
    await Connection(websocket, websocket.path_params["session"], hub, config).serve()


def create_app(
    config: ServerConfig,
    *,
    model: Model | None = None,
    server_tools: Mapping[str, ServerTool] | None = None,
    clock: Callable[[], float] = time.time,
) -> Starlette:
    """The app for ``config``; ``model`` and ``server_tools`` replace the defaults (tests)."""
    chosen_model = model
    if chosen_model is None:
        chosen_model = create_model(
            config.model, first_chunk_delay=config.first_chunk_delay, chunk_delay=config.chunk_delay
        )
    tools = dict(server_tools) if server_tools is not None else default_server_tools(clock)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # Without a db the same SQLite ledger runs in memory: one implementation to trust.
        ledger: Ledger = SqliteLedger(config.db if config.db is not None else ":memory:")
        hub = Hub(config, ledger, chosen_model, tools, durable=config.db is not None, clock=clock)
        app.state.config = config
        app.state.ledger = ledger
        app.state.hub = hub
        hub.start()
        try:
            yield
        finally:
            await hub.close()
            ledger.close()

    routes: list[WebSocketRoute | Mount] = [WebSocketRoute("/agents/chat/{session}", chat_endpoint)]
    if config.static_dirs:
        routes.append(Mount("/", app=StaticDirs(config.static_dirs), name="static"))
    return Starlette(routes=routes, lifespan=lifespan)


def uvicorn_config(app: Starlette, config: ServerConfig) -> uvicorn.Config:
    """How uvicorn serves the app: S9's frame limit is enforced by the WebSocket layer too."""
    return uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        log_level=config.log_level,
        ws="websockets-sansio",
        ws_max_size=config.max_frame_bytes,
        lifespan="on",
        timeout_graceful_shutdown=5,
    )


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


@contextlib.asynccontextmanager
async def running_server(
    config: ServerConfig,
    *,
    model: Model | None = None,
    server_tools: Mapping[str, ServerTool] | None = None,
    clock: Callable[[], float] = time.time,
) -> AsyncIterator[RunningServer]:
    """Serve in this event loop (``port=0`` picks a free port) until the block exits."""
    app = create_app(config, model=model, server_tools=server_tools, clock=clock)
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
