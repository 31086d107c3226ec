"""Every close the server makes reaches the peer as a close frame, even a peer slow to read.

A frame the WebSocket layer refuses (over the size limit: 1009; invalid UTF-8:
1007) fails the connection. The peer here is a raw socket driven by websockets'
sans-I/O client, so the test decides when it reads: it lets the server's replies
pile up unread, sends the refused frame, sends a few more bytes (a peer does not
know yet that it was refused), and only then reads everything. What it must read
is the replies, then the close frame with the code, then the end of the stream;
never a reset in place of the close frame (the 1006 a browser would report).

    peer = SlowPeer.open(server.ws_url("s1"))    # a blocking socket: run it in a thread
    peer.send_text(b"{", 1500)                   # 1,500 protocol errors, none read yet
    peer.send_raw(peer.frame_bytes(payload))     # the refused frame
    frames, reset = peer.read_to_end()           # replies, close frame, end; reset=False

Without the half-close in clienttools_server.wire.websocket_protocol both cases read a
few dozen replies and then a reset: the close frame is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from typing import Any

import pytest
from websockets.client import ClientProtocol
from websockets.frames import Close, Frame, Opcode
from websockets.http11 import Response
from websockets.uri import parse_uri

from clienttools_server import app as app_module
from clienttools_server.app import RunningServer, uvicorn_config
from tests.support.wait import wait_until_blocking

# Small enough that the replies below fill it many times over, so the close frame
# still waits in the server's send queue when the server is done writing.
RECEIVE_BUFFER = 4096
BACKLOG_FRAMES = 1500


class SlowPeer:
    """A WebSocket client on a blocking socket that reads only when told to."""

    def __init__(self, sock: socket.socket, protocol: ClientProtocol) -> None:
        self.sock = sock
        self.protocol = protocol

    @classmethod
    def open(cls, url: str) -> SlowPeer:
        uri = parse_uri(url)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
        sock.settimeout(30)
        sock.connect((uri.host, uri.port))
        protocol = ClientProtocol(uri, max_size=None)
        protocol.send_request(protocol.connect())
        peer = cls(sock, protocol)
        peer._flush()
        while True:
            peer._receive(sock.recv(4096))
            events = protocol.events_received()
            if events:
                assert isinstance(events[0], Response) and events[0].status_code == 101
                return peer

    def _flush(self) -> None:
        for data in self.protocol.data_to_send():
            if data:
                self.sock.sendall(data)

    def _receive(self, data: bytes) -> None:
        if data:
            self.protocol.receive_data(data)
        else:
            self.protocol.receive_eof()

    def send_text(self, payload: bytes, count: int = 1) -> None:
        for _ in range(count):
            self.protocol.send_text(payload)
        self._flush()

    def frame_bytes(self, payload: bytes) -> bytes:
        """The wire bytes of one text frame, not sent: the caller sends them in pieces."""
        self.protocol.send_text(payload)
        return b"".join(self.protocol.data_to_send())

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read_to_end(self) -> tuple[list[Frame], bool]:
        """Every frame until the server ends the stream; True if it ended with a reset."""
        frames: list[Frame] = []
        reset = False
        while True:
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:
                reset = True
                break
            self._receive(data)
            frames += [e for e in self.protocol.events_received() if isinstance(e, Frame)]
            self._flush_quietly()  # the close reply, as a real peer sends it
            if not data:
                break
        self.sock.close()
        return frames, reset

    def _flush_quietly(self) -> None:
        # The server may be gone already; what it sent is what counts.
        with contextlib.suppress(OSError):
            self._flush()


def close_code(frames: list[Frame]) -> int | None:
    closes = [f for f in frames if f.opcode is Opcode.CLOSE]
    return Close.parse(closes[0].data).code if closes else None


def refused_after_a_backlog(
    server: RunningServer, payload: bytes, whole: bool
) -> tuple[list[Frame], bool]:
    """Replies left unread, then the refused frame (`whole`, or its first bytes), then more.

    Runs in a thread: it reads the server's state (a deque's length, a dict's keys) to
    know when the server has done each step, not a fixed time.
    """
    peer = SlowPeer.open(server.ws_url("s1"))
    wait_until_blocking(lambda: len(server.hub.connections) == 1, 30, "the connection")
    [connection] = server.hub.connections.values()
    # Malformed frames: each earns a protocol error, none of which the peer reads yet.
    peer.send_text(b"{", BACKLOG_FRAMES)
    # The server answers them all before it sees the refused frame.
    wait_until_blocking(
        lambda: len(connection._error_times) == BACKLOG_FRAMES, 30, "the backlog answered"
    )
    refused = peer.frame_bytes(payload)
    if whole:
        first, rest = refused, peer.frame_bytes(b"{}")
    else:
        first, rest = refused[:64], refused[64 : 64 + 16384]
    peer.send_raw(first)
    # The server refuses the frame (the connection ends) before the rest arrives.
    wait_until_blocking(
        lambda: connection.id not in server.hub.connections, 30, "the frame refused"
    )
    # A server that already reset the connection fails this send; the reading shows it.
    with contextlib.suppress(OSError):
        peer.send_raw(rest)
    return peer.read_to_end()


@pytest.mark.parametrize(
    ("payload", "whole", "code"),
    [
        # Over the 1 MiB limit: refused at the frame header, most of it still to come.
        (b"x" * 2_000_000, False, 1009),
        # A lone surrogate: invalid UTF-8, refused once the whole frame is in.
        ('{"type": "x\ud800"}'.encode("utf-8", "surrogatepass"), True, 1007),
    ],
    ids=["over-the-limit", "invalid-utf8"],
)
async def test_a_refused_frame_closes_with_a_close_frame(
    start_server: Any, payload: bytes, whole: bool, code: int
) -> None:
    # No malformed frame of the backlog leaves the flood window while the test counts them.
    server = await start_server(flood_limit=10 * BACKLOG_FRAMES, flood_window=3600.0)
    frames, reset = await asyncio.to_thread(refused_after_a_backlog, server, payload, whole)
    replies = [f for f in frames if f.opcode is Opcode.TEXT]
    assert replies, "the backlog of protocol errors never arrived"
    assert close_code(frames) == code, f"no close frame ({len(replies)} replies, reset={reset})"
    assert not reset


class TransportPings:
    """A page on a raw socket that sees the WebSocket-level pings (a library would hide them)."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, protocol: ClientProtocol
    ) -> None:
        self.reader, self.writer, self.protocol = reader, writer, protocol
        self.transport_pings: list[float] = []
        self.app_pings: list[dict[str, Any]] = []

    @classmethod
    async def open(cls, url: str) -> TransportPings:
        uri = parse_uri(url)
        reader, writer = await asyncio.open_connection(uri.host, uri.port)
        protocol = ClientProtocol(uri)
        protocol.send_request(protocol.connect())
        peer = cls(reader, writer, protocol)
        await peer._flush()
        while not any(isinstance(e, Response) for e in await peer._read_events()):
            pass
        return peer

    async def _flush(self) -> None:
        for data in self.protocol.data_to_send():
            self.writer.write(data)
        await self.writer.drain()

    async def _read_events(self) -> list[Any]:
        data = await self.reader.read(65536)
        if data:
            self.protocol.receive_data(data)
        else:
            self.protocol.receive_eof()
        await self._flush()  # the pong a real page's browser sends at once
        return self.protocol.events_received()

    async def send(self, frame: dict[str, Any]) -> None:
        self.protocol.send_text(json.dumps(frame).encode())
        await self._flush()

    async def listen(self, seconds: float) -> None:
        """Read for ``seconds``: note each ping of either kind as it arrives."""
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds
        while (left := end - loop.time()) > 0:
            try:
                events = await asyncio.wait_for(self._read_events(), left)
            except TimeoutError:
                return
            for event in events:
                if isinstance(event, Frame) and event.opcode is Opcode.PING:
                    self.transport_pings.append(loop.time())
                elif isinstance(event, Frame) and event.opcode is Opcode.TEXT:
                    frame = json.loads(event.data)
                    if frame["type"] == "cf_agent_ping":
                        self.app_pings.append(frame)

    def close(self) -> None:
        self.writer.close()


async def test_the_transport_pings_stop_once_the_page_answers_the_apps(
    start_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One ping per interval for an idle page, not two: after its first pong only ours."""

    def fast_transport_pings(app: Any, config: Any) -> Any:
        served = uvicorn_config(app, config)
        served.ws_ping_interval = 0.1
        return served

    monkeypatch.setattr(app_module, "uvicorn_config", fast_transport_pings)
    server = await start_server(ping_interval=0.3)
    page = await TransportPings.open(server.ws_url("s1"))
    await page.send({"type": "cf_agent_client_tools", "protocol": 1, "clientId": "c", "tools": []})
    await page.listen(0.5)
    assert len(page.transport_pings) >= 2, "no WebSocket pings before the page answered ours"
    assert page.app_pings, "no cf_agent_ping in 0.5 s at a 0.3 s interval"
    await page.send({"type": "cf_agent_pong", "t": page.app_pings[-1]["t"]})
    answered = asyncio.get_running_loop().time()
    before = len(page.app_pings)
    await page.listen(1.0)
    # A ping already on its way when the pong arrived may still come in.
    late = [t for t in page.transport_pings if t > answered + 0.15]
    assert late == [], f"{len(late)} WebSocket pings after the page answered ours"
    assert len(page.app_pings) - before >= 2, "our own pings stopped too"
    page.close()
