"""A scriptable protocol peer for client tests: a real `websockets` server in a background thread.

It plays the server side of docs/protocol.md by hand, so a test can send any frame
(valid or not) at a live client and read every frame the client sent back.
Synchronous methods, so Playwright's sync API and the driver mix in one test.

    driver = ToolDriver().start()                 # ws://127.0.0.1:<port>/agents/chat/<session>
    page.goto(f"{static}/client.html?ws={driver.url('s1')}")
    driver.wait_registered("s1")
    result = driver.invoke("s1", "add", {"a": 1, "b": 2})   # the result frame, as a dict
    driver.stop()
"""

from __future__ import annotations

import asyncio
import json
import secrets
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed

T = TypeVar("T")


@dataclass
class Peer:
    """One client connection as the driver sees it."""

    connection: ServerConnection
    session: str
    received: list[dict[str, Any]] = field(default_factory=list)
    raw: list[str | bytes] = field(default_factory=list)
    closed: bool = False


class ToolDriver:
    def __init__(self, *, auto_ack: bool = True, ping_interval: float | None = None) -> None:
        self.auto_ack = auto_ack
        self.held_acks: set[str] = set()  # sessions whose results the driver does not acknowledge
        self.ping_interval = ping_interval
        self.peers: list[Peer] = []
        self._loop = asyncio.new_event_loop()
        self._server: Server | None = None
        self._changed: asyncio.Condition | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="driver")

    # --- lifecycle -------------------------------------------------------------

    def start(self) -> ToolDriver:
        self._thread.start()
        self._run(self._start())
        return self

    async def _start(self) -> None:
        self._changed = asyncio.Condition()
        self._server = await serve(self._handle, "127.0.0.1", 0, max_size=None, ping_interval=None)

    def stop(self) -> None:
        async def _stop() -> None:
            assert self._server is not None
            self._server.close()
            await self._server.wait_closed()

        self._run(_stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._loop.close()

    @property
    def port(self) -> int:
        assert self._server is not None
        port: int = next(iter(self._server.sockets)).getsockname()[1]
        return port

    def url(self, session: str) -> str:
        return f"ws://127.0.0.1:{self.port}/agents/chat/{session}"

    def _run(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    # --- the server side ---------------------------------------------------------

    async def _handle(self, connection: ServerConnection) -> None:
        session = (connection.request.path if connection.request else "/").rsplit("/", 1)[-1]
        session = session.split("?", 1)[0]
        peer = Peer(connection, session)
        self.peers.append(peer)
        await self._notify()
        try:
            async for message in connection:
                peer.raw.append(message)
                try:
                    frame = json.loads(message)
                except ValueError:
                    continue
                peer.received.append(frame)
                await self._answer(peer, frame)
                await self._notify()
        except ConnectionClosed:
            pass
        finally:
            peer.closed = True
            await self._notify()

    async def _answer(self, peer: Peer, frame: dict[str, Any]) -> None:
        kind = frame.get("type")
        if kind == "cf_agent_client_tools":
            names = [t.get("name") for t in frame.get("tools", [])]
            await peer.connection.send(
                json.dumps({"type": "cf_agent_client_tools_ack", "accepted": names, "rejected": []})
            )
        elif (
            kind == "cf_agent_client_tool_result"
            and self.auto_ack
            and peer.session not in self.held_acks
        ):
            await peer.connection.send(
                json.dumps(
                    {
                        "type": "cf_agent_client_tool_result_ack",
                        "requestId": frame.get("requestId"),
                        "outcome": "applied",
                    }
                )
            )

    async def _notify(self) -> None:
        assert self._changed is not None
        async with self._changed:
            self._changed.notify_all()

    async def _wait_for(self, predicate: Callable[[], T | None], timeout: float) -> T:
        assert self._changed is not None
        async with self._changed:
            deadline = time.monotonic() + timeout
            while (value := predicate()) is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError("the driver waited in vain")
                try:
                    await asyncio.wait_for(self._changed.wait(), remaining)
                except TimeoutError:
                    continue
            return value

    # --- what tests call -------------------------------------------------------

    def peer(self, session: str) -> Peer | None:
        """The most recent live connection of a session."""
        live = [p for p in self.peers if p.session == session and not p.closed]
        return live[-1] if live else None

    def wait_registered(self, session: str, timeout: float = 30.0, after: int = 0) -> Peer:
        """Wait for a live connection of `session` (the `after`-th or later) that sent its tools."""

        def ready() -> Peer | None:
            for index, p in enumerate(self.peers):
                if index < after or p.session != session or p.closed:
                    continue
                if any(f.get("type") == "cf_agent_client_tools" for f in p.received):
                    return p
            return None

        return self._run(self._wait_for(ready, timeout), timeout + 5)

    def send(self, session: str, frame: dict[str, Any] | str | bytes) -> None:
        peer = self.peer(session)
        assert peer is not None, f"no live connection for session {session!r}"
        message = frame if isinstance(frame, str | bytes) else json.dumps(frame)
        self._run(peer.connection.send(message))

    def wait_frame(
        self, session: str, predicate: Callable[[dict[str, Any]], bool], timeout: float = 10.0
    ) -> dict[str, Any]:
        def found() -> dict[str, Any] | None:
            for p in self.peers:
                if p.session == session:
                    for frame in p.received:
                        if predicate(frame):
                            return frame
            return None

        return self._run(self._wait_for(found, timeout), timeout + 5)

    def frames(self, session: str, kind: str | None = None) -> list[dict[str, Any]]:
        return [
            f
            for p in self.peers
            if p.session == session
            for f in p.received
            if kind is None or f.get("type") == kind
        ]

    def start_invoke(
        self,
        session: str,
        tool: str,
        arguments: dict[str, Any],
        *,
        request_id: str | None = None,
        timeout_ms: int | None = None,
        attempt: int = 1,
    ) -> str:
        request_id = request_id or secrets.token_hex(16)
        frame: dict[str, Any] = {
            "type": "cf_agent_client_tool_invoke",
            "requestId": request_id,
            "toolCallId": f"call_{request_id[:8]}",
            "toolName": tool,
            "input": arguments,
            "attempt": attempt,
        }
        if timeout_ms is not None:
            frame["timeoutMs"] = timeout_ms
        self.send(session, frame)
        return request_id

    def result(
        self, session: str, request_id: str, timeout: float = 10.0, nth: int = 1
    ) -> dict[str, Any]:
        """The `nth` result frame the client sent for `request_id`."""

        def found() -> dict[str, Any] | None:
            matches = [
                f
                for f in self.frames(session, "cf_agent_client_tool_result")
                if f.get("requestId") == request_id
            ]
            return matches[nth - 1] if len(matches) >= nth else None

        return self._run(self._wait_for(found, timeout), timeout + 5)

    def invoke(
        self,
        session: str,
        tool: str,
        arguments: dict[str, Any],
        timeout: float = 10.0,
        **options: Any,
    ) -> dict[str, Any]:
        request_id = self.start_invoke(session, tool, arguments, **options)
        return self.result(session, request_id, timeout)

    def drop(self, session: str) -> None:
        """Cut the session's live connection abruptly, without a close handshake."""
        peer = self.peer(session)
        assert peer is not None
        self._run(peer.connection.close(code=1012, reason="driver dropped the connection"))
