"""``Chat``: the asyncio chat a ``ToolClient`` exposes as ``client.chat``.

The facade around the sans-I/O ``chat.ChatState``: it sends the frames the
state returns (as ``protocol.dump_frame`` text on the shared socket), feeds
it the chat frames ``Session`` parsed, and turns the request lifecycle into
awaitables and change callbacks. Uses asyncio, nothing browser-specific.

    chat = Chat(send=socket_send)          # socket_send(text) -> Awaitable[None]
    reply = await chat.send("What is 2 + 2?")
    async for snapshot in chat.stream("And times 3?"):
        render(snapshot)
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import TypeAlias

from clienttools import protocol
from clienttools.chat import DEFAULT_ERROR, ChatResponseError, ChatState, ChatStatus, new_id
from clienttools.observers import Observers
from clienttools.rules import LocalProtocolError
from clienttools.uimessage import ToolPart, UIMessage

__all__ = ["ChangeCallback", "Chat"]

logger = logging.getLogger("clienttools.chat")


ChangeCallback: TypeAlias = Callable[["Chat"], None]


class Chat:
    """The chat a ``ToolClient`` exposes as ``client.chat``.

    ``send`` writes one text frame on the shared socket. The client calls
    ``feed`` with every chat frame it receives, and ``connection_lost`` /
    ``connection_restored`` around reconnects (a response that was streaming
    is resumed from ``last_sequence``). Uses asyncio, nothing browser-specific.
    """

    def __init__(
        self,
        send: Callable[[str], Awaitable[None]],
        *,
        chat_id: str | None = None,
        id_factory: Callable[[], str] = new_id,
        messages: Iterable[UIMessage] = (),
    ) -> None:
        self._send = send
        self._id_factory = id_factory
        self._state = ChatState(chat_id=chat_id, id_factory=id_factory, messages=messages)
        self._observers: Observers[[Chat]] = Observers("chat: on_change")
        self._done: asyncio.Future[None] | None = None
        self._connected = True
        self._unsent: list[protocol.ChatClearFrame] = []  # written, not yet handed to the socket
        self._tasks: set[asyncio.Task[None]] = set()

    # -- state

    @property
    def state(self) -> ChatState:
        """The sans-I/O core (read it; drive it only through this class)."""
        return self._state

    @property
    def messages(self) -> list[UIMessage]:
        return self._state.messages

    @property
    def status(self) -> ChatStatus:
        return self._state.status

    @property
    def error(self) -> str | None:
        return self._state.error

    @property
    def pending_approvals(self) -> list[ToolPart]:
        return self._state.pending_approvals

    def on_change(self, callback: ChangeCallback) -> Callable[[], None]:
        """Call ``callback(chat)`` after every change; returns the unsubscribe function.

        A callback that raises is logged; the chat and the other callbacks go on.
        """
        return self._observers.subscribe(callback)

    # -- the public operations

    async def send(self, text: str | UIMessage) -> UIMessage:
        """Send a user message; return the assistant's message once the response ends.

        Raises ``ChatResponseError`` if the response ends in an error. After
        ``stop()`` it returns the message as far as it got.
        """
        done = await self._begin(text)
        await done
        return self._outcome()

    async def stream(self, text: str | UIMessage) -> AsyncIterator[UIMessage]:
        """Send a user message; yield a snapshot of the assistant message on every change."""
        queue: asyncio.Queue[UIMessage | None] = asyncio.Queue()
        last: list[UIMessage | None] = [None]

        def push(chat: Chat) -> None:
            message = chat._state.response_message
            shown = message is not None and any(m is message for m in chat.messages)
            if shown and message != last[0]:
                assert message is not None
                last[0] = message.model_copy(deep=True)
                queue.put_nowait(last[0])
            if not chat._state.active:
                queue.put_nowait(None)

        unsubscribe = self.on_change(push)
        try:
            await self._begin(text)
            while (snapshot := await queue.get()) is not None:
                yield snapshot
        finally:
            unsubscribe()
        self._outcome()  # raises if the response ended in an error

    async def resume(self) -> UIMessage | None:
        """Rejoin the response the server is streaming for this chat; return it once finished.

        For a page that reloaded in the middle of a response: after
        ``connect()``, the response is replayed from its first chunk, then
        followed live. Returns None when nothing was streaming. The chat id
        must be the one used before the reload (``ToolClient`` takes it from
        the session in its URL unless told otherwise).
        """
        if self._state.active:
            raise LocalProtocolError("a response is already in progress; wait for it or stop() it")
        frame = self._state.begin_resume(self._id_factory())
        done = self._done = asyncio.get_running_loop().create_future()
        self._changed()
        await self._write(frame)
        await done
        message = self._outcome()
        return message if message.parts else None

    async def stop(self) -> None:
        """Abort the response in flight (status ``ready`` at once)."""
        frame = self._state.abort()
        if frame is None:
            return
        self._changed()
        try:
            await self._write(frame)
        except Exception:  # the socket is down: the server drops it on close anyway
            logger.warning("chat: could not send abort", exc_info=True)

    def clear(self) -> None:
        """Start a fresh conversation: forget every message, here and on the server.

        Every tab of the chat sees the empty conversation (the server refuses
        while a response streams for it, and keeps the messages). Raises
        ``LocalProtocolError`` while a response is in flight; ``stop()`` it first.
        """
        frame = self._state.clear()
        self._changed()
        self._send_soon(frame)

    async def respond(self, tool_call_id: str, approved: bool, reason: str | None = None) -> None:
        """Answer a tool approval request."""
        frame = self._state.respond_approval(tool_call_id, approved, reason)
        self._changed()
        await self._write(frame)

    # -- called by the client's I/O layer

    def feed(self, frame: protocol.ChatServerFrame) -> None:
        """One chat frame (``start``/``chunk``/``end``/``error``/``no-active``), as parsed."""
        if self._state.receive(frame):
            self._changed()

    async def subscribe(self) -> None:
        """Ask for the stored messages, now and after every change (the client does it)."""
        await self._write(self._state.subscribe())

    def connection_lost(self) -> None:
        # Nothing changes for the UI: a response in flight stays "streaming".
        self._connected = False

    async def connection_restored(self) -> None:
        """Every open: subscribe to the stored messages (a reload or a reconnect gets
        them), and resume the response that was streaming during the drop."""
        self._connected = True
        await self.subscribe()
        if self._state.active:
            frame = self._state.begin_resume(self._id_factory())
            await self._write(frame)

    # -- internals

    def _send_soon(self, frame: protocol.ChatClearFrame) -> None:
        """Send without awaiting, from synchronous code, yet before any frame written
        after it; a socket that is down drops it (the next open subscribes again and
        gets what the server holds)."""
        self._unsent.append(frame)
        task = asyncio.get_running_loop().create_task(self._flush())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _flush(self) -> None:
        """Hand the frames written without awaiting to the socket, oldest first."""
        while self._unsent:
            frame = self._unsent.pop(0)
            try:
                await self._send(protocol.dump_frame(frame))
            except Exception:
                logger.warning("chat: could not send %s", frame.type, exc_info=True)

    async def _write(self, frame: protocol.WireModel) -> None:
        """Send one frame, after those written before it: ``clear(); await send(...)``
        reaches the server in that order, so the clear is not refused as streaming."""
        await self._flush()
        await self._send(protocol.dump_frame(frame))

    async def _begin(self, text: str | UIMessage) -> asyncio.Future[None]:
        frame = self._state.begin_request(self._id_factory(), text)
        done = self._done = asyncio.get_running_loop().create_future()
        self._changed()
        try:
            await self._write(frame)
        except Exception as exc:
            self._state.fail(f"could not send the chat request: {exc}")
            self._changed()
            raise
        return done

    def _outcome(self) -> UIMessage:
        message = self._state.response_message
        if self._state.status == "error":
            raise ChatResponseError(self._state.error or DEFAULT_ERROR, message)
        assert message is not None  # begin_request always makes a builder
        return message

    def _changed(self) -> None:
        self._observers.notify(self)
        if self._done is not None and not self._state.active and not self._done.done():
            self._done.set_result(None)
