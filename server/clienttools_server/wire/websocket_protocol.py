"""The WebSocket protocol uvicorn runs for the server: a failed connection still ends in a close.

A frame the WebSocket layer refuses, before the app sees it (over the frame
limit: 1009; invalid UTF-8: 1007), fails the connection. uvicorn's
websockets-sansio protocol then writes the close frame and closes the TCP socket
at once. Whatever the peer sent after the refused frame is still unread, and a
socket closed with unread input is reset (RST), not finished (FIN): the kernel
drops what it had not yet sent, the close frame among it, and a peer whose own
write fails on the reset may never read what did arrive. The peer sees the
socket vanish (1006) instead of the close code. websockets' sans-I/O contract
is different: send the close frame, half-close, and keep reading (and
discarding) until the peer closes. :class:`WebSocketProtocol` does that, within
the close timeout uvicorn uses for a close the app asks for.

It also offers the app one ASGI extension, ``clienttools.socket``, for what
each frame costs: an idle page's ping and pong, and a run's burst of chunks.

- ``stop()`` ends uvicorn's WebSocket-level pings on that connection. A page
  that registered tools answers the app's own ``cf_agent_ping``, which then
  shows the connection alive (PageConnection closes a silent one); a second
  ping at the transport level would only double the cost of an idle page. A
  peer that speaks only chat gets no app ping and keeps the transport's.
- ``send_now(*texts)`` writes text frames at once, all in one socket write,
  without the ASGI send's wrappers; it answers False when the socket cannot
  take them now (closing, or its peer not reading), and the app then sends them
  the ASGI way.
- ``intercept(handler)`` offers every text message to ``handler`` first, as it
  arrives; one the handler answers True for (a pong) never reaches the app's
  receive, and costs no queue, no task switch and no ASGI wrapper.

    uvicorn.Config(app, ws=WebSocketProtocol, ws_max_size=limit, ...)
    socket = websocket.scope["extensions"][SOCKET]      # in the app
    socket["stop"]()
    socket["send_now"](first_text, second_text)
    socket["intercept"](lambda text: is_pong(text))

And it stops reading from a socket only once the app is :data:`BACKLOG` messages
behind. uvicorn pauses the socket after every message and resumes it when the app
takes it: two ``epoll_ctl`` calls and the selector's bookkeeping per message, a
sixth of the CPU of a server whose 10,000 idle pages only answer pings. A bound
of a few messages holds a peer back just as well.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.http11 import Request

#: The ASGI extension (in ``scope["extensions"]``) with the socket's fast paths.
SOCKET = "clienttools.socket"
#: Messages the app may be behind before the socket stops being read (uvicorn's is 1).
BACKLOG = 8


class WebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's websockets-sansio protocol, failing a connection without a reset."""

    _failed = False
    _intercept: Callable[[str], bool] | None = None

    def handle_connect(self, event: Request) -> None:
        super().handle_connect(event)
        # The app's task is created but has not run: it sees the extension in its scope.
        extensions: dict[str, Any] = self.scope.setdefault("extensions", {})
        extensions[SOCKET] = {
            "stop": self.stop_keepalive,
            "send_now": self.send_now,
            "intercept": self.intercept,
        }

    def intercept(self, handler: Callable[[str], bool] | None) -> None:
        """Offer each text message to ``handler`` first (None: stop)."""
        self._intercept = handler

    def send_now(self, *texts: str) -> bool:
        """Write these text frames now, in one write, if the socket takes them; else False."""
        if (
            not self.handshake_complete
            or self.close_sent
            or self.disconnected
            or not self.writable.is_set()  # the peer reads slower than we write
            or self.transport.is_closing()
        ):
            return False
        for text in texts:
            self.conn.send_text(text.encode())
        self.transport.write(b"".join(self.conn.data_to_send()))
        return True

    def send_receive_event_to_app(self) -> None:
        if (
            self._intercept is not None
            and self.curr_msg_data_type == "text"
            and len(self.frames) == 1
            and not self.close_sent
        ):
            try:
                text = self.frames[0].decode()
            except UnicodeDecodeError:
                pass  # uvicorn's own path refuses it (1007)
            else:
                if self._intercept(text):
                    self.frames = []
                    return
        if self.read_paused or self.queue.qsize() >= BACKLOG - 1:
            super().send_receive_event_to_app()  # queues the message, and pauses
            return
        # uvicorn pauses unless it sees the socket paused already: let it see that.
        self.read_paused = True
        try:
            super().send_receive_event_to_app()
        finally:
            # Still reading, unless a refused message made the parser fail the socket.
            self.read_paused = False

    def handle_parser_exception(self) -> None:
        # Called again for every later read while the parser discards: once is enough.
        if self._failed:
            return
        self._failed = True
        close = self.conn.close_sent
        assert close is not None
        self.queue.put_nowait(
            {"type": "websocket.disconnect", "code": close.code, "reason": close.reason}
        )
        self.close_sent = True
        # The close frame, then, when websockets asks for it (an empty chunk), the end of
        # our side of the stream: the peer reads everything and then the FIN.
        for data in self.conn.data_to_send():
            if data:
                self.transport.write(data)
            elif self.transport.can_write_eof():
                self.transport.write_eof()
        # Keep reading, so nothing the peer sends is left unread when the socket closes:
        # the peer's close (or EOF) ends it; a peer that never closes, the timer.
        if self.read_paused:
            self.read_paused = False
            self.transport.resume_reading()
        if self.close_timer is None:
            self.close_timer = self.loop.call_later(self.close_timeout, self.transport.close)
