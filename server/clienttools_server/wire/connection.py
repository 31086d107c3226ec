"""One WebSocket of one page: admission, frame parsing, limits, and routing to the hub (S9, S10).

Every frame is parsed with the shared :mod:`clienttools.protocol`; a malformed
one is answered with ``cf_agent_protocol_error`` and the socket stays open,
unless malformed frames come in a flood (close 1008). A frame over the size
limit closes the socket with 1009. Frames out go through one queue and one
writer task, so runs, timers and acks never interleave partial sends; the
writer sends what the queue holds in one socket write. Pings and pongs, which
keep no order with other frames, skip the queues: the process's one pinger
(:mod:`~clienttools_server.wire.keepalive`) writes a ping straight to an idle
socket, and a pong is read where it arrives.

    principal = await authorize(websocket) if admitted(websocket, config) else None
    if principal is None:
        await websocket.close(code=1008)        # before accept: the handshake gets 403
    elif not await access(websocket).allows(principal, session, route="WS", claim=True):
        await websocket.accept()
        await websocket.close(code=4403)        # another principal's session (O1)
    else:
        await websocket.accept()
        await PageConnection(websocket, session, hub, config, pinger, clock).serve()

A connection knows the server only as a :class:`Router` (the hub implements it):
it hands over each parsed frame and sends what comes back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections import deque
from collections.abc import Callable, Mapping
from typing import Protocol

from starlette.websockets import WebSocket, WebSocketDisconnect

from clienttools.protocol import (
    AbortFrame,
    ChatClearFrame,
    ChatSubscribeFrame,
    ChunkFrame,
    ClientFrame,
    ClientToolsFrame,
    FrameError,
    PongFrame,
    ProtocolErrorFrame,
    ResultAckFrame,
    ResumeFrame,
    SendFrame,
    ToolApprovalFrame,
    ToolProgressFrame,
    ToolResultFrame,
    ToolSpec,
    WireModel,
    dump_frame,
    dump_json,
    parse_client_frame,
)

from ..calls.pages import Client
from ..clock import SYSTEM_CLOCK, Clock, Timer
from ..config import ServerConfig
from ..ledger import LeaseLost, LedgerUnavailable
from .keepalive import Pinger
from .websocket_protocol import SOCKET

logger = logging.getLogger(__name__)

CLOSE_POLICY_VIOLATION = 1008
CLOSE_TOO_BIG = 1009
CLOSE_TRY_AGAIN_LATER = 1013
CLOSE_SILENT = 1011  # as websockets and uvicorn close a peer that stopped answering pings
#: A page that answers pings and sends nothing for this many intervals is gone (C12's rule).
SILENT_INTERVALS = 2.5
MAX_SESSION_NAME = 256
#: A text with this within its first characters may be a pong (parsed as it arrives).
PONG_MARK = '"cf_agent_pong"'
PONG_MARK_WITHIN = 64


# Frames that show a peer is a page or a chat, not an idle socket (see idle_timeout).
ENGAGING_FRAMES = (ClientToolsFrame, SendFrame, ResumeFrame, ChatSubscribeFrame)


class Router(Protocol):
    """The server as a connection sees it: where each parsed frame goes.

    The handlers are coroutines (they read and write the ledger); a connection
    awaits each before it reads its next frame, so a peer's frames are handled
    in the order it sent them.
    """

    def attach(self, client: Client) -> None: ...

    async def detach(self, client: Client) -> None: ...

    async def register_tools(self, client: Client, frame: ClientToolsFrame) -> None: ...

    async def on_result(self, client: Client, frame: ToolResultFrame) -> ResultAckFrame: ...

    async def on_progress(self, client: Client, frame: ToolProgressFrame) -> None: ...

    async def approve(self, client: Client, frame: ToolApprovalFrame) -> None: ...

    async def start_run(self, client: Client, frame: SendFrame) -> None: ...

    async def resume(self, client: Client, frame: ResumeFrame) -> None: ...

    async def abort(self, client: Client, frame: AbortFrame) -> None: ...

    async def subscribe_chat(self, client: Client, frame: ChatSubscribeFrame) -> None: ...

    async def clear_chat(self, client: Client, frame: ChatClearFrame) -> None: ...

    def lease_lost(self, execution_id: str) -> None: ...


def origin_allowed(origin: str | None, host: str | None, config: ServerConfig) -> bool:
    """S10: is a handshake with this ``Origin`` header allowed?

    A browser always sends ``Origin`` and a page cannot forge it; a client
    without one is not a browser page (CPython, Node), which the Origin check
    cannot constrain anyway, so it is admitted and left to the token.
    """
    if origin is None:
        return True
    if "*" in config.allow_origins:
        return True
    if config.allow_origins:
        return origin in config.allow_origins
    return host is not None and origin in (f"http://{host}", f"https://{host}")


def admitted(websocket: WebSocket, config: ServerConfig) -> bool:
    """S10: Origin allow-list and a sane session name (the token is the authorizer's:
    :mod:`clienttools_server.wire.auth`)."""
    session = websocket.path_params.get("session", "")
    if not isinstance(session, str) or not 0 < len(session) <= MAX_SESSION_NAME:
        return False
    if not origin_allowed(websocket.headers.get("origin"), websocket.headers.get("host"), config):
        logger.info("refused origin %r", websocket.headers.get("origin"))
        return False
    return True


def frame_text(frame: WireModel) -> str:
    """``dump_frame(frame)``, a chunk's without pydantic: a run sends dozens of them.

    A chunk's frame is its three fields around the chunk's own JSON; pydantic's
    dump would walk the chunk into a copy first, a tenth of a call's CPU.
    """
    if type(frame) is ChunkFrame:
        return (
            f'{{"type":"chunk","requestId":{dump_json(frame.request_id)},'
            f'"sequence":{frame.sequence},"chunk":{dump_json(frame.chunk)}}}'
        )
    return dump_frame(frame)


class PageConnection:
    """A live socket as the hub and the proxy see it (a ``Client``)."""

    def __init__(
        self,
        websocket: WebSocket,
        session: str,
        hub: Router,
        config: ServerConfig,
        pinger: Pinger,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._websocket = websocket
        self._pinger = pinger
        self._session = session
        self._hub = hub
        self._config = config
        self._clock = clock
        self._idle_timer: Timer | None = None
        # Why the server ends the read (the idle timeout, a silent page), with its close code.
        self._ended: tuple[int, str] | None = None
        self._reader: asyncio.Task[int | None] | None = None
        self._heard = clock.now()
        self._answers_pings = False
        self._id = secrets.token_hex(8)
        self._client_id: str | None = None
        self._tools: dict[str, ToolSpec] = {}
        self._registration = 0
        self._open = True
        self._outbox: asyncio.Queue[str | None] = asyncio.Queue()
        self._error_times: deque[float] = deque()
        fast = websocket.scope.get("extensions", {}).get(SOCKET) or {}
        self._stop_transport_pings: Callable[[], None] | None = fast.get("stop")
        self._send_now: Callable[..., bool] | None = fast.get("send_now")
        if "intercept" in fast:
            fast["intercept"](self._pong_now)

    # -- Client -----------------------------------------------------------------------

    @property
    def id(self) -> str:
        return self._id

    @property
    def session(self) -> str:
        return self._session

    @property
    def client_id(self) -> str | None:
        return self._client_id

    @property
    def is_open(self) -> bool:
        return self._open

    @property
    def tools(self) -> Mapping[str, ToolSpec]:
        return self._tools

    @property
    def registration(self) -> int:
        return self._registration

    def set_tools(self, client_id: str, tools: dict[str, ToolSpec], registration: int) -> None:
        self._client_id, self._tools, self._registration = client_id, tools, registration

    def tool_spec(self, name: str) -> ToolSpec | None:
        return self._tools.get(name)

    def send(self, frame: WireModel) -> None:
        if self._open:
            self._outbox.put_nowait(frame_text(frame))

    # -- the socket -------------------------------------------------------------------

    async def serve(self) -> None:
        """Read until the peer leaves or breaks a limit; then drain, detach and close."""
        writer = asyncio.create_task(self._write())
        self._pinger.add(self)
        self._hub.attach(self)
        close_code: int | None = None
        reader = self._reader = asyncio.create_task(self._read())
        # Until the peer registers tools or speaks chat, it gets idle_timeout seconds in all.
        self._idle_timer = self._clock.call_later(
            self._config.idle_timeout,
            self._end,
            CLOSE_POLICY_VIOLATION,
            "nothing registered within the idle timeout",
        )
        try:
            close_code = await reader
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if self._ended is None or (current is not None and current.cancelling()):
                raise
            close_code, why = self._ended
            logger.info("closing %s: %s", self._id, why)
        finally:
            self._open = False
            self._engaged()
            reader.cancel()
            self._pinger.discard(self)
            try:
                await self._hub.detach(self)
            finally:
                self._outbox.put_nowait(None)
            await asyncio.gather(writer, reader, return_exceptions=True)
        if close_code is not None:
            # The peer may be gone already; then there is nothing to close.
            with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
                await self._websocket.close(code=close_code)

    def _end(self, code: int, why: str) -> None:
        self._idle_timer = None
        if self._ended is None and self._reader is not None:
            self._ended = (code, why)
            self._reader.cancel()

    def _engaged(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    async def _read(self) -> int | None:
        limit = self._config.max_frame_bytes
        while True:
            try:
                message = await self._websocket.receive()
            except (WebSocketDisconnect, RuntimeError, OSError):
                return None
            self._heard = self._clock.now()
            if message["type"] == "websocket.disconnect":
                return None
            text: str | None = message.get("text")
            raw: str | bytes = text if text is not None else (message.get("bytes") or b"")
            size = len(raw.encode("utf-8", "surrogatepass")) if isinstance(raw, str) else len(raw)
            if size > limit:
                logger.info("closing %s: a frame of %d bytes is over the limit", self._id, size)
                return CLOSE_TOO_BIG
            try:
                frame = parse_client_frame(raw, limit)
            except FrameError as exc:
                # The message describes the peer's own frame, not server internals.
                self.send(ProtocolErrorFrame(message=exc.message, request_id=exc.request_id))
                if self._flooded():
                    logger.info("closing %s: a flood of malformed frames", self._id)
                    return CLOSE_POLICY_VIOLATION
                continue
            if isinstance(frame, ENGAGING_FRAMES):
                self._engaged()
            try:
                await self._dispatch(frame)
            except LedgerUnavailable as exc:
                # Nothing of the frame was recorded, so nothing is acknowledged: the
                # peer reconnects (C11) and sends it again, the database back or not.
                logger.warning("closing %s with 1013: %s", self._id, exc)
                return CLOSE_TRY_AGAIN_LATER
            except LeaseLost as exc:
                # The frame is for a run another process took over: not acknowledged
                # here, so the peer sends it again once it reaches that process.
                self._hub.lease_lost(exc.execution_id)
                logger.warning("closing %s with 1013: %s", self._id, exc)
                return CLOSE_TRY_AGAIN_LATER
            except Exception:
                logger.exception("handling a %s frame failed", frame.type)
                self.send(
                    ProtocolErrorFrame(
                        message="the server could not handle this frame",
                        request_id=getattr(frame, "request_id", None),
                    )
                )

    def _flooded(self) -> bool:
        now = self._clock.now()
        self._error_times.append(now)
        while self._error_times and self._error_times[0] < now - self._config.flood_window:
            self._error_times.popleft()
        return len(self._error_times) > self._config.flood_limit

    async def _dispatch(self, frame: ClientFrame) -> None:
        hub = self._hub
        if isinstance(frame, ClientToolsFrame):
            await hub.register_tools(self, frame)
        elif isinstance(frame, ToolResultFrame):
            self.send(await hub.on_result(self, frame))
        elif isinstance(frame, ToolProgressFrame):
            await hub.on_progress(self, frame)
        elif isinstance(frame, ToolApprovalFrame):
            await hub.approve(self, frame)
        elif isinstance(frame, SendFrame):
            await hub.start_run(self, frame)
        elif isinstance(frame, ResumeFrame):
            await hub.resume(self, frame)
        elif isinstance(frame, AbortFrame):
            await hub.abort(self, frame)
        elif isinstance(frame, ChatSubscribeFrame):
            await hub.subscribe_chat(self, frame)
        elif isinstance(frame, ChatClearFrame):
            await hub.clear_chat(self, frame)
        elif isinstance(frame, PongFrame):
            self._on_pong()

    async def _write(self) -> None:
        outbox = self._outbox
        while True:
            item = await outbox.get()
            texts: list[str] = []
            while item is not None:  # a run's chunks come in bursts: one write for them all
                texts.append(item)
                if outbox.empty():
                    break
                item = outbox.get_nowait()
            if texts and not (self._send_now is not None and self._send_now(*texts)):
                try:
                    for text in texts:
                        await self._websocket.send_text(text)
                except (WebSocketDisconnect, RuntimeError, OSError):
                    self._open = False
                    return
            if item is None:
                return

    def _pong_now(self, text: str) -> bool:
        """A pong, taken as it arrives (the socket offers each text first): no reader turn."""
        if PONG_MARK not in text[:PONG_MARK_WITHIN]:
            return False
        try:
            frame = parse_client_frame(text, self._config.max_frame_bytes)
        except FrameError:
            return False  # the reader answers it with a protocol error
        if not isinstance(frame, PongFrame):
            return False
        self._heard = self._clock.now()
        self._on_pong()
        return True

    def _on_pong(self) -> None:
        if not self._answers_pings:
            # The page answers our pings: they show it alive from now on (any frame does,
            # _read notes when), so the transport's own pings would only double the cost.
            self._answers_pings = True
            if self._stop_transport_pings is not None:
                self._stop_transport_pings()

    def on_ping(self, now: float, text: str) -> None:
        """The pinger's turn for this page (``text`` is the ``cf_agent_ping``)."""
        # Only a peer that spoke the tools protocol (C12) knows the ping. A chat-only
        # client, such as the AI SDK's stock WebSocketChatTransport, treats a frame
        # without a requestId as invalid and drops its connection.
        if self._client_id is None or not self._open:
            return
        silent = now - self._heard
        if self._answers_pings and silent > SILENT_INTERVALS * self._config.ping_interval:
            self._end(CLOSE_SILENT, f"nothing heard for {silent:.0f} s, pings unanswered")
            return
        # Straight to the socket when nothing waits before it in the outbox: a ping has no
        # order to keep, and this spares the writer's task switch and the ASGI wrappers.
        if not (self._outbox.empty() and self._send_now is not None and self._send_now(text)):
            self._outbox.put_nowait(text)
