"""`ToolClient`: Python tools in this page (or process), callable by a server-side agent.

The client wires a `ToolRegistry` (tools.py), the sans-I/O `Session`
(session.py) and a `Connector` (transport.py). It is plain asyncio, so the same
code runs under CPython and in Pyodide (whose WebLoop drives asyncio); only the
adapters differ, and `current_platform()` picks them, the one place that looks:
`browser.BrowserConnector` on Pyodide, `native.NativeConnector` elsewhere.

Each job has its own small class; `ToolClient` is the public face and the
supervisor (connect, reconnect with backoff, close) that drives them:

- `connection.Connection`: one socket, its reader and writer tasks;
- `outbox.OutboxWriter`: the unacknowledged results in their store, batched;
- `ToolRuns`: the tasks of running async tools; `DeadlineTimer`: the one timer;
- the status moves by the table `CLIENT_TRANSITIONS`.

    client = ToolClient("ws://127.0.0.1:8000/agents/chat/demo")

    @client.tool
    def add(a: int, b: int) -> int:
        '''Add two integers.'''
        return a + b

    @client.tool(name="slow_echo", timeout=5.0)
    async def slow_echo(text: str, seconds: float, ctx: ToolContext) -> str:
        await ctx.progress(0.5)
        await asyncio.sleep(seconds)
        return text

    await client.connect()   # returns once the server acknowledged the tools
    ...
    await client.close()     # no reconnect after this

Async tools run as asyncio tasks: many at once, and a cancel from the server
(or a time limit) cancels the task, so the tool sees `CancelledError` at its
next `await`. Sync tools run inline when their invoke arrives: they block the
event loop (and with it the page) until they return, and cannot be cancelled or
stopped by a time limit. Long work belongs in an `async def` that awaits now and
then.

After an unexpected close the client reconnects with backoff, registers its
tools again and re-sends every result the server has not acknowledged (C11).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import sys
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Literal, TypeAlias, TypeVar, cast, overload

from clienttools import protocol
from clienttools.connection import Connection
from clienttools.outbox import OUTBOX_SAVE_DELAY, OutboxWriter
from clienttools.rules import CLOSE_CODE_SILENT
from clienttools.session import (
    DEFAULT_PING_INTERVAL,
    CancelTool,
    ChatFrameReceived,
    Event,
    ReplaceConnection,
    RunTool,
    Session,
    ToolsAcknowledged,
)
from clienttools.supervisor import (
    CLIENT_TRANSITIONS,
    ClientEvent,
    ClientStatus,
    check_connect,
    check_options,
    registration_error,
    supervise,
    warn_rejected,
)
from clienttools.tools import ToolRegistry
from clienttools.transport import (
    ConnectError,
    ConnectionFailed,
    Connector,
    MemoryOutboxStore,
    OutboxStore,
    RegistrationTimeout,
    Socket,
)

if TYPE_CHECKING:
    from clienttools.chatclient import Chat
    from clienttools.webmcp import ModelContextMirror

logger = logging.getLogger("clienttools")

F = TypeVar("F", bound=Callable[..., Any])
ConnectionStatus: TypeAlias = Literal["idle", "connecting", "open", "reconnecting", "closed"]
StatusCallback: TypeAlias = Callable[[ConnectionStatus], None]

#: How long close() waits for cancelled tools and closing sockets before giving up on them.
CLOSE_GRACE_SECONDS = 2.0
__all__ = [
    "CLIENT_TRANSITIONS",
    "OUTBOX_SAVE_DELAY",
    "ClientEvent",
    "ConnectionStatus",
    "Platform",
    "ToolClient",
    "current_platform",
]


@dataclass(frozen=True)
class Platform:
    """How one platform opens sockets and where it keeps the outbox; each made on first use."""

    connector: Callable[[], Connector]
    outbox_store: Callable[[str], OutboxStore]


def _browser() -> Any:
    from clienttools import browser

    browser.log_to_console()  # in a page, records belong in the console, not on stderr
    return browser


def _native_connector() -> Connector:
    # Imported only when used: a client given its own connector needs no `websockets`.
    from clienttools.native import NativeConnector

    return NativeConnector()


BROWSER: Final = Platform(
    connector=lambda: _browser().BrowserConnector(),
    outbox_store=lambda url: _browser().SessionStorageOutbox(url),
)
NATIVE: Final = Platform(connector=_native_connector, outbox_store=lambda url: MemoryOutboxStore())


def _worker_outbox(url: str) -> OutboxStore:
    import js

    from clienttools.outbox import StorageOutbox
    from clienttools.worker import outbox_storage

    return StorageOutbox(url, outbox_storage(js))


#: Pyodide in a PyScript worker: the same sockets; the outbox in the page's sessionStorage.
WORKER: Final = Platform(
    connector=lambda: _browser().BrowserConnector(), outbox_store=_worker_outbox
)


def current_platform() -> Platform:
    """The adapters of the platform this runs on; the one place that checks it.

    In Pyodide: the browser's WebSocket and a sessionStorage outbox (in a PyScript
    worker the page's, through PyScript's proxy: clienttools.worker), and the
    SDK's log records go to the browser console (`browser.log_to_console`).
    Elsewhere: the `websockets` library and an outbox in memory.
    """
    if sys.platform != "emscripten":
        return NATIVE
    import js

    from clienttools.worker import in_worker

    return WORKER if in_worker(js) else BROWSER


class DeadlineTimer:
    """One asyncio timer, kept at the session's next deadline; `fire(deadline)` when it passes."""

    __slots__ = ("_at", "_fire", "_handle")

    def __init__(self, fire: Callable[[float], None]) -> None:
        self._fire = fire
        self._handle: asyncio.TimerHandle | None = None
        self._at: float | None = None

    @property
    def armed(self) -> bool:
        return self._handle is not None

    def rearm(self, deadline: float | None) -> None:
        # Every frame pushes the liveness deadline later; rather than re-arm per frame,
        # let an earlier timer fire: tick() then does nothing and the timer moves on.
        if deadline is not None and self._at is not None and self._at <= deadline:
            return
        if deadline == self._at:
            return
        if self._handle is not None:
            self._handle.cancel()
        self._handle, self._at = None, deadline
        if deadline is not None:
            self._handle = asyncio.get_running_loop().call_at(deadline, self._on_time, deadline)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._handle, self._at = None, None

    def _on_time(self, deadline: float) -> None:
        self._handle, self._at = None, None
        self._fire(deadline)


class ToolRuns:
    """The asyncio tasks of the async tools that are running, by requestId.

    A sync tool runs inline in `start` and reports at once. For an async tool the
    tool's own coroutine is the task, so a cancel lands inside the tool, even one
    cancelled before its first step; the done callback reports the outcome.
    """

    def __init__(self, session: Session, on_input: Callable[[], None]) -> None:
        self._session = session
        self._on_input = on_input
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def start(self, run: RunTool) -> None:
        request_id = run.request_id
        session = self._session

        def report_progress(progress: float, total: float | None, message: str | None) -> None:
            session.report_progress(request_id, progress, total, message)
            self._on_input()

        # Only a tool that declares a ToolContext parameter gets one: most do not.
        context = run.context(report_progress) if run.tool.context_parameter else None
        try:
            result = run.tool.call(run.arguments, context)
        except Exception as exc:  # a sync tool raised
            session.tool_raised(request_id, exc)
            return
        if not run.tool.is_async:
            session.tool_returned(request_id, result)
            return
        task = asyncio.get_running_loop().create_task(
            result, name=f"clienttools tool {run.tool.name} {request_id}"
        )
        task.add_done_callback(functools.partial(self._done, request_id))
        self._tasks[request_id] = task

    def cancel(self, request_id: str, reason: str) -> None:
        task = self._tasks.get(request_id)
        if task is not None:
            task.cancel(f"cancelled: {reason}")

    async def wait(self, timeout: float) -> None:
        """Wait up to `timeout` for every run to end; log the ones that would not."""
        runs = list(self._tasks.values())
        if runs:
            _, stubborn = await asyncio.wait(runs, timeout=timeout)
            for task in stubborn:
                logger.warning("tool task %s ignored its cancellation", task.get_name())

    def _done(self, request_id: str, task: asyncio.Task[Any]) -> None:
        self._tasks.pop(request_id, None)
        if task.cancelled():
            self._session.tool_cancelled(request_id)
        elif (exc := task.exception()) is not None:
            self._session.tool_raised(request_id, exc)
        else:
            self._session.tool_returned(request_id, task.result())
        self._on_input()


class ToolClient(ClientStatus):
    """Hosts Python tools for a server-side agent over one WebSocket (protocol v1).

    Arguments:
        url: the server's WebSocket URL, e.g. `ws://HOST/agents/chat/{session}`.
        token: sent as the `?token=` query parameter (browsers cannot set headers).
        connector: opens sockets; by default the browser or the native one.
        outbox_store: keeps unacknowledged results across a page reload; by
            default `sessionStorage` in the browser, memory elsewhere.
        registry: share a `ToolRegistry`; by default the client has its own.
        connect_timeout: seconds for one connection attempt, up to the tools ack.
        ping_interval: the server's ping interval; 2.5 of them without a frame
            and the connection is replaced (C12).
        reconnect: reconnect after an unexpected close (C11).
        client_id: sent in the tools frame; stable per page load by default.
        max_result_bytes: results larger than this are `output_too_large`.
        chat_id: the `id` of the chat frames; by default the session named by
            the URL's last path segment, so a reloaded page can `chat.resume()`.
        webmcp: also offer every tool to the browser's own agent on
            `document.modelContext` (WebMCP, webmcp.py); with no `url` the client
            serves that agent only, and `connect()` is not for it.
        webmcp_approval: offer tools with `needs_approval=True` there too (they are
            left out by default: the browser's agent does its own approvals, or none).
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        token: str | None = None,
        connector: Connector | None = None,
        outbox_store: OutboxStore | None = None,
        registry: ToolRegistry | None = None,
        connect_timeout: float = 10.0,
        ping_interval: float = DEFAULT_PING_INTERVAL,
        reconnect: bool = True,
        client_id: str | None = None,
        max_result_bytes: int = protocol.MAX_RESULT_BYTES,
        chat_id: str | None = None,
        webmcp: bool = False,
        webmcp_approval: bool = False,
    ) -> None:
        self.url = check_options(url, connect_timeout, webmcp)
        self._open_url = _with_token(self.url, token)
        self._connector = connector
        self._outbox_store = outbox_store
        self._platform = current_platform()
        self._registry = registry if registry is not None else ToolRegistry()
        self.connect_timeout = connect_timeout
        self.reconnect = reconnect
        self.client_id = client_id or uuid.uuid4().hex
        self._session = Session(
            self._registry,
            client_id=self.client_id,
            ping_interval=ping_interval,
            max_result_bytes=max_result_bytes,
        )
        self._chat_id = chat_id  # by default the URL's session, found when the chat is made
        self._chat: Chat | None = None
        super().__init__()
        self._closing = False
        self._outbox: OutboxWriter | None = None
        self._connection: Connection | None = None
        self._supervisor: asyncio.Task[None] | None = None
        self._runs = ToolRuns(self._session, self._pump)
        self._background: set[asyncio.Task[Any]] = set()
        self._timer = DeadlineTimer(self._on_timer)
        self._pumping = False
        self._unsubscribe_registry: Callable[[], None] | None = None
        self._webmcp: ModelContextMirror | None = None
        if webmcp:
            self._webmcp = _mirror(self._registry, max_result_bytes, webmcp_approval)

    # --- tools -------------------------------------------------------------------------

    @property
    def registry(self) -> ToolRegistry:
        return self._registry

    @property
    def session(self) -> Session:
        """The protocol core (read-only use: state, outbox)."""
        return self._session

    @overload
    def tool(self, fn: F, /) -> F: ...

    @overload
    def tool(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        description: str | None = None,
        timeout: float | None = None,
        needs_approval: bool = False,
        read_only: bool = False,
    ) -> Callable[[F], F]: ...

    def tool(
        self,
        fn: F | None = None,
        /,
        *,
        name: str | None = None,
        description: str | None = None,
        timeout: float | None = None,
        needs_approval: bool = False,
        read_only: bool = False,
    ) -> F | Callable[[F], F]:
        """Register a tool: `@client.tool` or `@client.tool(name=..., timeout=...)`.

        Tools added or removed while connected are announced to the server at once
        (and with `webmcp=True` registered on, or aborted from, `document.modelContext`).
        `read_only=True` is WebMCP's `readOnlyHint`: the tool changes nothing.
        """
        decorate = self._registry.tool(
            name=name,
            description=description,
            timeout=timeout,
            needs_approval=needs_approval,
            read_only=read_only,
        )
        return decorate if fn is None else decorate(fn)

    @property
    def webmcp(self) -> ModelContextMirror | None:
        """The tools' registrations on `document.modelContext`, with `webmcp=True`."""
        return self._webmcp

    @property
    def chat(self) -> Chat:
        """The chat on this connection (AI SDK WebSocket chat frames), made on first use.

        Made lazily because clienttools.chat is most of the SDK's import time, and a
        page that only hosts tools never needs it.
        """
        if self._chat is None:
            from clienttools.chatclient import Chat

            chat_id = self._chat_id or _session_of(self.url)
            self._chat = Chat(self._send_chat_frame, chat_id=chat_id)
            if self._status == "open":
                # The chat subscribes by itself (H3): now, and on every later open.
                self._spawn(self._chat.subscribe(), "chat subscribe")
        return self._chat

    # --- state -------------------------------------------------------------------------

    @property
    def status(self) -> ConnectionStatus:
        """idle -> connecting -> open (-> reconnecting -> open ...) -> closed."""
        return cast("ConnectionStatus", self._status)

    # --- connect and close -------------------------------------------------------------

    async def connect(self) -> None:
        """Open the connection; return once the server acknowledged the tools (C1).

        Raises a `ConnectError` that names the URL and the reason: `ConnectionFailed`
        (refused, unreachable, no answer within `connect_timeout`, HTTP error),
        `RegistrationTimeout` (no tools ack within `connect_timeout`) or
        `ToolsRejected`. The first attempt is not retried; after it succeeds,
        the client reconnects by itself.
        """
        check_connect(self._status, self.url)
        self._closing = False
        self._closed_event = asyncio.Event()
        self._outbox_writer().restore()
        self._unsubscribe_registry = self._registry.on_change(self._registry_changed)
        await self._connect_first()
        self._supervisor = asyncio.get_running_loop().create_task(
            supervise(self), name="clienttools supervisor"
        )

    async def close(self) -> None:
        """Close the connection for good: no reconnect. Running async tools are cancelled.

        Unacknowledged results stay in the outbox store, and a later connect()
        (or the next page load) sends them. With `webmcp=True`, every registration on
        `document.modelContext` is aborted, for good.
        """
        if self._webmcp is not None:
            self._webmcp.close()
        if self._status in ("idle", "closed"):
            return
        await self._stop()

    async def __aenter__(self) -> ToolClient:
        await self.connect()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    def send_frame(self, frame: protocol.WireModel | str) -> bool:
        """Send a frame on the shared socket (the chat layer's). False while disconnected."""
        queued = self._session.send_frame(frame)
        self._pump()
        return queued

    # --- the connection ----------------------------------------------------------------

    @property
    def connector(self) -> Connector:
        """The adapter that opens sockets: the browser one in Pyodide, else the native one."""
        if self._connector is None:
            self._connector = self._platform.connector()
        return self._connector

    def _outbox_writer(self) -> OutboxWriter:
        if self._outbox is None:
            store = self._outbox_store
            if store is None:
                store = self._platform.outbox_store(self.url)
            self._outbox = OutboxWriter(self._session, store)
        return self._outbox

    async def _open(self, *, first: bool) -> None:
        """Open a socket and register the tools; raise ConnectError on any failure."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            socket = await self.connector.open(self._open_url, self.connect_timeout)
        except ConnectError:
            raise
        except Exception as exc:  # a connector that breaks the interface still fails clearly
            raise ConnectionFailed(self._open_url, f"{type(exc).__name__}: {exc}") from exc
        connection = self._attach(socket)
        remaining = max(0.0, self.connect_timeout - (loop.time() - started))
        try:
            outcome = await asyncio.wait_for(asyncio.shield(connection.registered), remaining)
        except TimeoutError:
            await self._detach(connection)
            raise RegistrationTimeout(
                self._open_url,
                f"connected, but the server did not acknowledge the tools within "
                f"{self.connect_timeout:g} s (is this a clienttools endpoint?)",
            ) from None
        except BaseException:
            await self._detach(connection)
            raise
        error = registration_error(self._open_url, outcome, first)
        if error is not None:
            await self._detach(connection)
            raise error
        self._step(ClientEvent.OPENED)
        if self._chat is not None:
            self._spawn(self._chat.connection_restored(), "chat subscribe and resume")

    def _attach(self, socket: Socket) -> Connection:
        connection = Connection(socket, self._session, self._pump)
        self._connection = connection
        self._session.connection_opened(asyncio.get_running_loop().time())
        connection.start()
        self._pump()
        return connection

    async def _detach(self, connection: Connection) -> None:
        """Forget a connection: stop its tasks, close its socket, tell the session and chat."""
        connection.end("the client dropped the connection")
        if self._connection is connection:
            self._connection = None
            connection.detached = True
            self._session.connection_lost(asyncio.get_running_loop().time())
            if self._chat is not None:
                self._chat.connection_lost()
        await connection.stop()
        # Closing waits for the peer's close frame; never let that hold up a reconnect.
        self._spawn(connection.close_socket(), "socket close")
        self._pump()

    # What supervisor.supervise (C11's reconnect loop, shared with mpy.py) asks of us:

    async def _connection_over(self, connection: Connection) -> None:
        await connection.ended.wait()
        await self._detach(connection)

    async def _close_after_loss(self) -> None:
        # Not awaited here: _stop() waits for the supervisor, which is the caller.
        self._spawn(self._stop(), "close")

    async def _stop(self) -> None:
        """Close for good: supervisor, connection, tool runs, timer, background tasks."""
        self._closing = True
        current = asyncio.current_task()
        supervisor, self._supervisor = self._supervisor, None
        if supervisor is not None and supervisor is not current:
            supervisor.cancel()
            await asyncio.gather(supervisor, return_exceptions=True)
        connection = self._connection
        if connection is not None:
            connection.end("the client is closing")
            await self._detach(connection)
        self._session.shutdown()
        self._pump()  # carries out the CancelTool events
        await self._runs.wait(CLOSE_GRACE_SECONDS)
        self._timer.cancel()
        outbox = self._outbox_writer()
        outbox.cancel()
        background = [t for t in self._background if t is not current]
        if background:
            _, pending = await asyncio.wait(background, timeout=CLOSE_GRACE_SECONDS)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        if self._unsubscribe_registry is not None:
            self._unsubscribe_registry()
            self._unsubscribe_registry = None
        outbox.save()
        self._step(ClientEvent.CLOSED)

    def _spawn(self, coroutine: Coroutine[Any, Any, Any], name: str) -> None:
        task = asyncio.get_running_loop().create_task(coroutine, name=f"clienttools {name}")
        self._background.add(task)
        task.add_done_callback(self._background_done)

    def _background_done(self, task: asyncio.Task[Any]) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.info("background %s failed: %s", task.get_name(), task.exception())

    # --- carrying out what the session asks --------------------------------------------

    def _pump(self, more: bool = False) -> None:
        """Carry out the session's events, save the outbox, send, re-arm the timer.

        Called after every input to the session. `more` says that further frames
        of one batch follow at once: only the events are carried out, and the last
        frame's call writes and sends for the whole batch. The outbox writer is
        told before anything is sent (outbox.py: where nothing saves it at the
        page's end, a result is in the store before it leaves).
        Not re-entrant: a sync tool that changes the registry while it runs only
        queues work for the outer loop.
        """
        if self._pumping:
            return
        self._pumping = True
        try:
            while events := self._session.events():
                for event in events:
                    self._carry_out(event)
        finally:
            self._pumping = False
        if more:
            return
        if self._outbox is not None:
            self._outbox.save_soon()
        connection = self._connection
        if connection is not None and self._session.has_frames_to_send:
            connection.flush()
        self._timer.rearm(self._session.next_deadline())

    def _carry_out(self, event: Event) -> None:
        if isinstance(event, RunTool):
            self._runs.start(event)
        elif isinstance(event, CancelTool):
            self._runs.cancel(event.request_id, event.reason)
        elif isinstance(event, ToolsAcknowledged):
            connection = self._connection
            if connection is None or not connection.acknowledged(event):
                warn_rejected(event.rejected)
        elif isinstance(event, ChatFrameReceived):
            if self._chat is None:
                return  # no chat was ever started here: nothing waits for these frames
            try:
                self._chat.feed(event.frame)
            except Exception:  # the chat layer must not take the tool connection down
                logger.exception("the chat layer failed on a %r frame", event.frame.type)
        elif isinstance(event, ReplaceConnection):
            connection = self._connection
            if connection is not None:
                logger.warning("replacing a silent connection: %s", event.reason)
                connection.replace(event.reason, CLOSE_CODE_SILENT)

    def _on_timer(self, deadline: float) -> None:
        # Timers may fire a hair early; the time it was set for has come.
        self._session.tick(max(asyncio.get_running_loop().time(), deadline))
        self._pump()

    def _registry_changed(self) -> None:
        self._session.registry_changed()
        self._pump()

    async def _send_chat_frame(self, text: str) -> None:
        if not self.send_frame(text):
            raise ConnectionError("not connected; the frame was not sent")


def _mirror(registry: ToolRegistry, max_result_bytes: int, approval: bool) -> ModelContextMirror:
    """The registry's tools on document.modelContext, kept in step with the registry."""
    from clienttools.webmcp import ModelContextMirror, tool_runner

    def specs() -> list[tuple[dict[str, Any], bool]]:
        return [(tool.wire_spec, tool.read_only) for tool in registry]

    mirror = ModelContextMirror(specs, tool_runner(registry, max_result_bytes), approval=approval)
    registry.on_change(mirror.sync)
    return mirror


# urllib.parse is imported by these two only when they run: in a page, importing it is a
# tenth of the SDK's start-up (Pyodide's stdlib is compiled from source on every load),
# and a client without a token or a chat never needs it.


def _session_of(url: str) -> str:
    """The last path segment of the URL: the session in `/agents/chat/{session}`."""
    from urllib.parse import unquote, urlsplit

    path = urlsplit(url).path.rstrip("/")
    return unquote(path.rsplit("/", 1)[-1]) or "chat"


def _with_token(url: str, token: str | None) -> str:
    if token is None:
        return url
    from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "token"]
    query.append(("token", token))
    return urlunsplit(parts._replace(query=urlencode(query)))
