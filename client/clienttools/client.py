"""`ToolClient`: Python tools in this page (or process), callable by a server-side agent.

The client wires a `ToolRegistry` (tools.py), the sans-I/O `Session`
(session.py) and a `Connector` (transport.py). It is plain asyncio, so the same
code runs under CPython and in Pyodide (whose WebLoop drives asyncio); only the
connector differs, and it is picked by itself: `browser.BrowserConnector` on
Pyodide, `native.NativeConnector` elsewhere.

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
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, TypeAlias, TypeVar, overload
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from clienttools import protocol
from clienttools.session import (
    DEFAULT_PING_INTERVAL,
    CancelTool,
    ChatFrameReceived,
    Event,
    ReplaceConnection,
    RunTool,
    Session,
    ToolsAcknowledged,
    backoff,
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
    ToolsRejected,
    redact_token,
)

if TYPE_CHECKING:
    from clienttools.chatclient import Chat

logger = logging.getLogger("clienttools")

F = TypeVar("F", bound=Callable[..., Any])
ConnectionStatus: TypeAlias = Literal["idle", "connecting", "open", "reconnecting", "closed"]
StatusCallback: TypeAlias = Callable[[ConnectionStatus], None]

#: How long close() waits for cancelled tools and closing sockets before giving up on them.
CLOSE_GRACE_SECONDS = 2.0
#: Close code for a connection dropped because nothing arrived on it (C12).
CLOSE_CODE_SILENT = 4000
#: Seconds an outbox change may wait before it is written to the store. Writing the
#: whole outbox on every change was over half of an invoke's time in the browser, and
#: quadratic while results wait for acks (bench/README.md). The outbox turning empty or
#: non-empty is written at once (a small write); changes to a non-empty outbox are
#: batched. Closing the client, and in the browser hiding or leaving the page, write
#: at once too.
OUTBOX_SAVE_DELAY = 0.02


@dataclass(eq=False)
class _Connection:
    """One socket and the two tasks that serve it."""

    socket: Socket
    # The first cf_agent_client_tools_ack, or why the socket ended before it came.
    registered: asyncio.Future[ToolsAcknowledged | str]
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    wake_writer: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    close_code: int = 1000
    close_reason: str = ""


class ToolClient:
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
    """

    def __init__(
        self,
        url: str,
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
    ) -> None:
        if connect_timeout <= 0:
            raise ValueError("connect_timeout must be positive")
        self.url = url
        self._open_url = _with_token(url, token)
        self._connector = connector
        self._outbox_store = outbox_store
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
        self._chat_id = chat_id or _session_of(url)
        self._chat: Chat | None = None
        self._status: ConnectionStatus = "idle"
        self._status_callbacks: list[StatusCallback] = []
        self._closed_event: asyncio.Event | None = None
        self._closing = False
        self._outbox_restored = False
        self._saved_outbox_revision = self._session.outbox_revision
        self._saved_outbox_text: str | None = None
        self._saved_outbox_empty = True
        self._outbox_timer: asyncio.TimerHandle | None = None
        self._connection: _Connection | None = None
        self._supervisor: asyncio.Task[None] | None = None
        self._runs: dict[str, asyncio.Task[None]] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._pumping = False
        self._unsubscribe_registry: Callable[[], None] | None = None

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
    ) -> F | Callable[[F], F]:
        """Register a tool: `@client.tool` or `@client.tool(name=..., timeout=...)`.

        Tools added or removed while connected are announced to the server at once.
        """
        decorate = self._registry.tool(
            name=name, description=description, timeout=timeout, needs_approval=needs_approval
        )
        return decorate if fn is None else decorate(fn)

    @property
    def chat(self) -> Chat:
        """The chat on this connection (AI SDK WebSocket chat frames), made on first use.

        Made lazily because clienttools.chat is most of the SDK's import time, and a
        page that only hosts tools never needs it (cold start, bench/README.md).
        """
        if self._chat is None:
            from clienttools.chatclient import Chat

            self._chat = Chat(self._send_chat_frame, chat_id=self._chat_id)
        return self._chat

    # --- state -------------------------------------------------------------------------

    @property
    def status(self) -> ConnectionStatus:
        """idle -> connecting -> open (-> reconnecting -> open ...) -> closed."""
        return self._status

    @property
    def connected(self) -> bool:
        """True while a connection is open and its tools were acknowledged."""
        return self._status == "open"

    def on_status(self, callback: StatusCallback) -> Callable[[], None]:
        """Call `callback(status)` on every status change; returns an unsubscribe function."""
        self._status_callbacks.append(callback)

        def unsubscribe() -> None:
            if callback in self._status_callbacks:
                self._status_callbacks.remove(callback)

        return unsubscribe

    def _set_status(self, status: ConnectionStatus) -> None:
        if status == self._status:
            return
        self._status = status
        logger.info("%s: %s", redact_token(self.url), status)
        if status == "closed" and self._closed_event is not None:
            self._closed_event.set()
        for callback in list(self._status_callbacks):
            try:
                callback(status)
            except Exception:  # an app callback must not break the connection
                logger.exception("status callback failed")

    # --- connect and close -------------------------------------------------------------

    async def connect(self) -> None:
        """Open the connection; return once the server acknowledged the tools (C1).

        Raises a `ConnectError` that names the URL and the reason: `ConnectionFailed`
        (refused, unreachable, no answer within `connect_timeout`, HTTP error),
        `RegistrationTimeout` (no tools ack within `connect_timeout`) or
        `ToolsRejected`. The first attempt is not retried; after it succeeds,
        the client reconnects by itself.
        """
        if self._status in ("connecting", "open", "reconnecting"):
            raise RuntimeError(f"ToolClient.connect() called while {self._status}")
        self._closing = False
        self._closed_event = asyncio.Event()
        self._restore_outbox()
        self._unsubscribe_registry = self._registry.on_change(self._registry_changed)
        self._set_status("connecting")
        try:
            await self._open(first=True)
        except BaseException:
            await self._stop()
            raise
        self._supervisor = asyncio.get_running_loop().create_task(
            self._supervise(), name="clienttools supervisor"
        )

    async def close(self) -> None:
        """Close the connection for good: no reconnect. Running async tools are cancelled.

        Unacknowledged results stay in the outbox store, and a later connect()
        (or the next page load) sends them.
        """
        if self._status in ("idle", "closed"):
            return
        await self._stop()

    async def wait_closed(self) -> None:
        """Wait until the client is closed (by close(), or after a close with reconnect off)."""
        if self._status in ("idle", "closed") or self._closed_event is None:
            return
        await self._closed_event.wait()

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
            self._connector = self._default_connector()
        return self._connector

    def _default_connector(self) -> Connector:
        if sys.platform == "emscripten":
            from clienttools.browser import BrowserConnector

            return BrowserConnector()
        from clienttools.native import NativeConnector

        return NativeConnector()

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
        if isinstance(outcome, str):
            await self._detach(connection)
            raise ConnectionFailed(self._open_url, outcome)
        if outcome.rejected:
            if first:
                await self._detach(connection)
                raise ToolsRejected(self._open_url, outcome.rejected)
            for rejected in outcome.rejected:
                logger.warning("server rejected tool %r: %s", rejected.name, rejected.reason)
        self._set_status("open")
        if not first and self._chat is not None:
            self._spawn(self._chat.connection_restored(), "chat resume")

    def _attach(self, socket: Socket) -> _Connection:
        loop = asyncio.get_running_loop()
        connection = _Connection(socket, loop.create_future())
        self._connection = connection
        self._session.connection_opened(loop.time())
        connection.tasks = [
            loop.create_task(self._read(connection), name="clienttools reader"),
            loop.create_task(self._write(connection), name="clienttools writer"),
        ]
        self._pump()
        return connection

    async def _detach(self, connection: _Connection) -> None:
        """Forget a connection: stop its tasks, close its socket, tell the session and chat."""
        self._end(connection, "the client dropped the connection")
        if self._connection is connection:
            self._connection = None
            self._session.connection_lost(asyncio.get_running_loop().time())
            if self._chat is not None:
                self._chat.connection_lost()
        current = asyncio.current_task()
        tasks = [t for t in connection.tasks if t is not current]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        # Closing waits for the peer's close frame; never let that hold up a reconnect.
        self._spawn(
            connection.socket.close(connection.close_code, connection.close_reason), "socket close"
        )
        self._pump()

    def _end(self, connection: _Connection, why: str) -> None:
        """Mark a connection as over (idempotent); the supervisor takes it from there."""
        if not connection.registered.done():
            connection.registered.set_result(why)
        connection.ended.set()

    async def _read(self, connection: _Connection) -> None:
        loop = asyncio.get_running_loop()
        try:
            deliver_to = getattr(connection.socket, "deliver_to", None)
            if deliver_to is not None:
                # The browser socket hands frames over from its onmessage event, without
                # a turn of this task per frame (bench/README.md); this task then only
                # waits for the close.
                deliver_to(functools.partial(self._receive_frame, connection, loop))
            while (data := await connection.socket.receive()) is not None:
                self._session.receive_frame(data, loop.time())
                self._pump()
        except Exception:
            logger.exception("reading from the socket failed")
        finally:
            self._end(connection, _closed_before_ack(connection.socket))

    def _receive_frame(
        self, connection: _Connection, loop: asyncio.AbstractEventLoop, data: str | bytes
    ) -> None:
        """One frame handed over by the socket itself (see _read): what the reader does."""
        if self._connection is not connection:
            return  # detached: the reader task would have been cancelled by now
        try:
            self._session.receive_frame(data, loop.time())
            self._pump()
        except Exception:
            logger.exception("reading from the socket failed")
            self._end(connection, "handling a frame failed")

    async def _write(self, connection: _Connection) -> None:
        # The only task that sends on this socket, so frames leave in session order.
        while True:
            await connection.wake_writer.wait()
            connection.wake_writer.clear()
            if self._connection is not connection:
                return
            for text in self._session.frames_to_send():
                try:
                    await connection.socket.send(text)
                except Exception as exc:
                    # The reader sees the close too; unsent results wait in the outbox.
                    logger.info("send failed (%s); the connection is going away", exc)
                    self._end(connection, f"sending failed: {exc}")
                    return

    async def _supervise(self) -> None:
        """Watch the open connection; after an unexpected end, reconnect with backoff (C11)."""
        while True:
            connection = self._connection
            if connection is None:
                return
            await connection.ended.wait()
            await self._detach(connection)
            if self._closing:
                return
            if not self.reconnect:
                logger.warning("connection lost; reconnect is off, so the client closes")
                self._spawn(self._stop(), "close")
                return
            self._set_status("reconnecting")
            for delay in backoff():
                await asyncio.sleep(delay)
                try:
                    await self._open(first=False)
                    break
                except ConnectError as exc:
                    logger.info("reconnect failed: %s", exc)

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
            self._end(connection, "the client is closing")
            await self._detach(connection)
        self._session.shutdown()
        self._pump()  # carries out the CancelTool events
        runs = list(self._runs.values())
        if runs:
            _, stubborn = await asyncio.wait(runs, timeout=CLOSE_GRACE_SECONDS)
            for task in stubborn:
                logger.warning("tool task %s ignored its cancellation", task.get_name())
        if self._timer is not None:
            self._timer.cancel()
            self._timer, self._timer_at = None, None
        if self._outbox_timer is not None:
            self._outbox_timer.cancel()
            self._outbox_timer = None
        background = [t for t in self._background if t is not current]
        if background:
            _, pending = await asyncio.wait(background, timeout=CLOSE_GRACE_SECONDS)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        if self._unsubscribe_registry is not None:
            self._unsubscribe_registry()
            self._unsubscribe_registry = None
        self._save_outbox()
        self._set_status("closed")

    def _spawn(self, coroutine: Coroutine[Any, Any, Any], name: str) -> None:
        task = asyncio.get_running_loop().create_task(coroutine, name=f"clienttools {name}")
        self._background.add(task)
        task.add_done_callback(self._background_done)

    def _background_done(self, task: asyncio.Task[Any]) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.info("background %s failed: %s", task.get_name(), task.exception())

    # --- carrying out what the session asks --------------------------------------------

    def _pump(self) -> None:
        """Carry out the session's events, wake the writer, re-arm the timer, save the outbox.

        Called after every input to the session. Not re-entrant: a sync tool that
        changes the registry while it runs only queues work for the outer loop.
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
        connection = self._connection
        if connection is not None and self._session.has_frames_to_send:
            self._flush(connection)
        self._rearm_timer()
        self._save_outbox_soon()

    def _flush(self, connection: _Connection) -> None:
        """Send the session's frames: at once where the socket can, else through the writer.

        A browser WebSocket's send() only queues, so it never blocks; sending right
        here saves the writer task's turn of the event loop, which under Pyodide is a
        round through the browser's task queue on every invoke.
        """
        send_now = getattr(connection.socket, "send_nowait", None)
        if send_now is None or connection.wake_writer.is_set():
            connection.wake_writer.set()  # the writer sends them, after what it has
            return
        for text in self._session.frames_to_send():
            try:
                send_now(text)
            except Exception as exc:
                logger.info("send failed (%s); the connection is going away", exc)
                self._end(connection, f"sending failed: {exc}")
                return

    def _carry_out(self, event: Event) -> None:
        if isinstance(event, RunTool):
            self._start_run(event)
        elif isinstance(event, CancelTool):
            task = self._runs.get(event.request_id)
            if task is not None:
                task.cancel(f"cancelled: {event.reason}")
        elif isinstance(event, ToolsAcknowledged):
            connection = self._connection
            if connection is not None and not connection.registered.done():
                connection.registered.set_result(event)
            else:
                for rejected in event.rejected:
                    logger.warning("server rejected tool %r: %s", rejected.name, rejected.reason)
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
                connection.close_code = CLOSE_CODE_SILENT
                connection.close_reason = "no frames received"
                self._end(connection, event.reason)

    def _start_run(self, run: RunTool) -> None:
        request_id = run.request_id

        def report_progress(progress: float, total: float | None, message: str | None) -> None:
            self._session.report_progress(request_id, progress, total, message)
            self._pump()

        # Only a tool that declares a ToolContext parameter gets one: most do not.
        context = run.context(report_progress) if run.tool.context_parameter else None
        try:
            result = run.tool.call(run.arguments, context)
        except Exception as exc:  # a sync tool raised
            self._session.tool_raised(request_id, exc)
            return
        if not run.tool.is_async:
            self._session.tool_returned(request_id, result)
            return
        # The tool's own coroutine is the task, so a cancel lands inside the tool, even
        # one cancelled before its first step; the done callback reports the outcome.
        task = asyncio.get_running_loop().create_task(
            result, name=f"clienttools tool {run.tool.name} {request_id}"
        )
        task.add_done_callback(functools.partial(self._run_done, request_id))
        self._runs[request_id] = task

    def _run_done(self, request_id: str, task: asyncio.Task[Any]) -> None:
        self._runs.pop(request_id, None)
        if task.cancelled():
            self._session.tool_cancelled(request_id)
        elif (exc := task.exception()) is not None:
            self._session.tool_raised(request_id, exc)
        else:
            self._session.tool_returned(request_id, task.result())
        self._pump()

    def _rearm_timer(self) -> None:
        """Keep one timer, set to the session's next deadline."""
        deadline = self._session.next_deadline()
        # Every frame pushes the liveness deadline later; rather than re-arm per frame,
        # let an earlier timer fire: tick() then does nothing and the timer moves on.
        if deadline is not None and self._timer_at is not None and self._timer_at <= deadline:
            return
        if deadline == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_at = None, deadline
        if deadline is not None:
            self._timer = asyncio.get_running_loop().call_at(deadline, self._on_timer, deadline)

    def _on_timer(self, deadline: float) -> None:
        self._timer, self._timer_at = None, None
        # Timers may fire a hair early; the time it was set for has come.
        self._session.tick(max(asyncio.get_running_loop().time(), deadline))
        self._pump()

    def _registry_changed(self) -> None:
        self._session.registry_changed()
        self._pump()

    async def _send_chat_frame(self, text: str) -> None:
        if not self.send_frame(text):
            raise ConnectionError("not connected; the frame was not sent")

    # --- the outbox store --------------------------------------------------------------

    def _store(self) -> OutboxStore:
        if self._outbox_store is None:
            if sys.platform == "emscripten":
                from clienttools.browser import SessionStorageOutbox

                self._outbox_store = SessionStorageOutbox(self.url)
            else:
                self._outbox_store = MemoryOutboxStore()
        return self._outbox_store

    def _restore_outbox(self) -> None:
        if self._outbox_restored:
            return
        self._outbox_restored = True
        try:
            text = self._store().load()
        except Exception:
            logger.exception("loading the stored outbox failed")
            return
        if text:
            restored = self._session.restore_outbox(text)
            if restored:
                logger.info("restored %d unacknowledged results", restored)
        self._saved_outbox_revision = self._session.outbox_revision
        self._saved_outbox_text = text
        self._saved_outbox_empty = self._session.outbox_size == 0
        # Saves are batched (OUTBOX_SAVE_DELAY); a store that can tell when the page
        # goes away (the browser's) gets a chance to write what is still waiting.
        on_page_hide = getattr(self._store(), "flush_on_page_hide", None)
        if callable(on_page_hide):
            on_page_hide(self._save_outbox)

    def _save_outbox_soon(self) -> None:
        if self._session.outbox_revision == self._saved_outbox_revision:
            return
        if (self._session.outbox_size == 0) != self._saved_outbox_empty:
            self._save_outbox()  # the first result waiting, or the last one acked
        elif self._outbox_timer is None:
            self._outbox_timer = asyncio.get_running_loop().call_later(
                OUTBOX_SAVE_DELAY, self._save_outbox
            )

    def _save_outbox(self) -> None:
        if self._outbox_timer is not None:
            self._outbox_timer.cancel()
            self._outbox_timer = None
        revision = self._session.outbox_revision
        if revision == self._saved_outbox_revision:
            return
        self._saved_outbox_revision = revision
        text = self._session.export_outbox()
        self._saved_outbox_empty = self._session.outbox_size == 0
        if text == self._saved_outbox_text:
            return  # e.g. a result and its ack within one delay: nothing to write
        self._saved_outbox_text = text
        try:
            self._store().save(text)
        except Exception:  # e.g. storage quota: results still go out while connected
            logger.exception("saving the outbox failed")


def _closed_before_ack(socket: Socket) -> str:
    # close_code/close_reason are optional Socket attributes; both adapters have them.
    code = getattr(socket, "close_code", None)
    reason = getattr(socket, "close_reason", "") or ""
    detail = f" with code {code}{f' ({reason})' if reason else ''}" if code else ""
    return f"the server closed the connection{detail} before acknowledging the tools"


def _session_of(url: str) -> str:
    """The last path segment of the URL: the session in `/agents/chat/{session}`."""
    path = urlsplit(url).path.rstrip("/")
    return unquote(path.rsplit("/", 1)[-1]) or "chat"


def _with_token(url: str, token: str | None) -> str:
    if token is None:
        return url
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "token"]
    query.append(("token", token))
    return urlunsplit(parts._replace(query=urlencode(query)))
