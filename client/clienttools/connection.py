"""`Connection`: one open socket and the two tasks that serve it, between socket and `Session`.

The reader feeds every frame to the session and then calls `on_input` (the
client's pump; `on_input(True)` when more frames of a batch follow at once);
the writer is the only task that sends, so frames leave in session order. A
socket that `SendsAtOnce` gets the session's frames straight from `flush()`,
and one that `PushesFrames` hands frames over from its own message event: both
save a turn of the event loop per invoke, which under Pyodide is a round
through the browser's task queue.

    connection = Connection(socket, session, on_input=pump)
    connection.start()
    outcome = await connection.registered   # the tools ack, or why it ended first
    ...
    connection.end("the client is closing")  # the supervisor sees connection.ended
    await connection.stop()
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable

from clienttools.session import Session, ToolsAcknowledged
from clienttools.transport import PushesFrames, ReportsClose, SendsAtOnce, Socket

__all__ = ["Connection"]

logger = logging.getLogger("clienttools")


class Connection:
    """One socket: its reader and writer tasks, how it ended, and the close to send."""

    def __init__(self, socket: Socket, session: Session, on_input: Callable[[bool], None]) -> None:
        loop = asyncio.get_running_loop()
        self.socket = socket
        self.session = session
        self._on_input = on_input
        #: The first cf_agent_client_tools_ack, or why the socket ended before it came.
        self.registered: asyncio.Future[ToolsAcknowledged | str] = loop.create_future()
        self.ended = asyncio.Event()
        self.close_code = 1000
        self.close_reason = ""
        #: Set once the client let go of this connection: its tasks stop touching the session.
        self.detached = False
        self._wake_writer = asyncio.Event()
        self._send_now = socket.send_nowait if isinstance(socket, SendsAtOnce) else None
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._read(), name="clienttools reader"),
            loop.create_task(self._write(), name="clienttools writer"),
        ]

    def end(self, why: str) -> None:
        """Mark the connection as over (idempotent); the supervisor takes it from there."""
        if not self.registered.done():
            self.registered.set_result(why)
        self.ended.set()

    def acknowledged(self, ack: ToolsAcknowledged) -> bool:
        """Resolve `registered` with the first tools ack; False if it was resolved already."""
        if self.registered.done():
            return False
        self.registered.set_result(ack)
        return True

    def replace(self, reason: str, code: int) -> None:
        """End a silent connection, closing it with `code` (C12)."""
        self.close_code = code
        self.close_reason = "no frames received"
        self.end(reason)

    async def stop(self) -> None:
        """Cancel the reader and the writer (except the task calling this) and wait for them."""
        current = asyncio.current_task()
        tasks = [t for t in self._tasks if t is not current]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def close_socket(self) -> None:
        await self.socket.close(self.close_code, self.close_reason)

    def flush(self) -> None:
        """Send the session's frames: at once where the socket can, else through the writer."""
        send_now = self._send_now
        if send_now is None or self._wake_writer.is_set():
            self._wake_writer.set()  # the writer sends them, after what it has
            return
        for text in self.session.frames_to_send():
            try:
                send_now(text)
            except Exception as exc:
                logger.info("send failed (%s); the connection is going away", exc)
                self.end(f"sending failed: {exc}")
                return

    def closed_before_ack(self) -> str:
        socket = self.socket
        code, reason = (
            (socket.close_code, socket.close_reason or "")
            if isinstance(socket, ReportsClose)
            else (None, "")
        )
        detail = f" with code {code}{f' ({reason})' if reason else ''}" if code else ""
        return f"the server closed the connection{detail} before acknowledging the tools"

    async def _read(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            if isinstance(self.socket, PushesFrames):
                # The socket hands frames over from its message event; this task then
                # only waits for the close.
                self.socket.deliver_to(functools.partial(self._receive_frame, loop))
            while (data := await self.socket.receive()) is not None:
                self.session.receive_frame(data, loop.time())
                self._on_input(False)
        except Exception:
            logger.exception("reading from the socket failed")
        finally:
            self.end(self.closed_before_ack())

    def _receive_frame(
        self, loop: asyncio.AbstractEventLoop, data: str | bytes, more: bool
    ) -> None:
        """One frame handed over by the socket itself (see _read): what the reader does.

        `more`: the socket hands over further frames of the same batch right after
        this one, so `on_input` may hold the writes and sends until the last.
        """
        if self.detached:
            return  # the reader task would have been cancelled by now
        try:
            self.session.receive_frame(data, loop.time())
            self._on_input(more)
        except Exception:
            logger.exception("reading from the socket failed")
            self.end("handling a frame failed")

    async def _write(self) -> None:
        while True:
            await self._wake_writer.wait()
            self._wake_writer.clear()
            if self.detached:
                return
            for text in self.session.frames_to_send():
                try:
                    await self.socket.send(text)
                except Exception as exc:
                    # The reader sees the close too; unsent results wait in the outbox.
                    logger.info("send failed (%s); the connection is going away", exc)
                    self.end(f"sending failed: {exc}")
                    return
