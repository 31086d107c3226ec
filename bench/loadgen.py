"""The load generator: the WebSocket every benchmark page connects to, in its own process.

It plays the server side of the tool protocol, and nothing else: it answers
`cf_agent_client_tools` with an ack, sends `cf_agent_client_tool_invoke`
frames, times their results and acknowledges each one (auto-ack), so the
clienttools page never fills its outbox. Keeping it out of the Playwright
driver's process means the driver's own work (CDP, polling) never sits on the
timed path.

It is driven over stdin/stdout, one JSON object per line:

    $ python -m bench.loadgen
    {"event": "ready", "port": 41233}                  <- first line out
    {"op": "wait", "session": "ct-1", "timeout": 60}    -> {"ok": true}
    {"op": "roundtrip", "session": "ct-1", "n": 2000}   -> {"ok": true, "p50_us": ..., ...}
    {"op": "pipelined", "session": "ct-1", "n": 5000}   -> {"ok": true, "per_s": ..., ...}
    {"op": "quit"}

Pages connect to ws://127.0.0.1:PORT/agents/chat/SESSION. Every invoke calls
`add` with {"a": i, "b": 1}; a result other than i + 1 counts as an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed


@dataclass(eq=False)
class Peer:
    """One page's connection."""

    connection: ServerConnection
    session: str
    registered: asyncio.Event = field(default_factory=asyncio.Event)
    waiting: dict[str, asyncio.Future[dict[str, Any]]] = field(default_factory=dict)


class LoadGenerator:
    def __init__(self) -> None:
        self.peers: dict[str, Peer] = {}  # session -> its newest connection
        self.sessions_changed = asyncio.Event()

    async def handle(self, connection: ServerConnection) -> None:
        path = connection.request.path if connection.request else "/"
        session = path.split("?", 1)[0].rsplit("/", 1)[-1]
        peer = Peer(connection, session)
        self.peers[session] = peer
        self.sessions_changed.set()
        try:
            async for message in connection:
                frame = json.loads(message)
                kind = frame.get("type")
                if kind == "cf_agent_client_tool_result":
                    request_id = frame.get("requestId")
                    waiter = peer.waiting.pop(request_id, None)
                    if waiter is not None and not waiter.done():
                        waiter.set_result(frame)
                    # The ack a real server sends; the SDK keeps a result until it comes.
                    await connection.send(
                        '{"type":"cf_agent_client_tool_result_ack","requestId":'
                        f'{json.dumps(request_id)},"outcome":"applied"}}'
                    )
                elif kind == "cf_agent_client_tools":
                    names = [tool.get("name") for tool in frame.get("tools", [])]
                    ack = {"type": "cf_agent_client_tools_ack", "accepted": names, "rejected": []}
                    await connection.send(json.dumps(ack))
                    peer.registered.set()
        except ConnectionClosed:
            pass
        finally:
            for waiter in peer.waiting.values():
                if not waiter.done():
                    waiter.set_exception(ConnectionError(f"session {session} closed"))
            if self.peers.get(session) is peer:
                del self.peers[session]

    async def peer(self, session: str, timeout: float) -> Peer:
        """The session's connection once it registered its tools."""
        async with asyncio.timeout(timeout):
            while (peer := self.peers.get(session)) is None:
                self.sessions_changed.clear()
                await self.sessions_changed.wait()
            await peer.registered.wait()
        return peer

    # --- the measurements ----------------------------------------------------------

    async def roundtrip(self, peer: Peer, n: int) -> dict[str, Any]:
        """`n` sequential invokes: each waits for the previous result."""
        loop = asyncio.get_running_loop()
        frames = [_invoke(i) for i in range(n)]
        latencies: list[float] = []
        errors = 0
        for i, (request_id, text) in enumerate(frames):
            waiter = loop.create_future()
            peer.waiting[request_id] = waiter
            started = time.perf_counter()
            await peer.connection.send(text)
            result = await waiter
            latencies.append(time.perf_counter() - started)
            errors += result.get("output") != i + 1
        latencies.sort()
        return {
            "n": n,
            "errors": errors,
            "p50_us": _percentile(latencies, 50) * 1e6,
            "p99_us": _percentile(latencies, 99) * 1e6,
            "mean_us": statistics.fmean(latencies) * 1e6,
        }

    async def pipelined(self, peer: Peer, n: int, window: int | None = None) -> dict[str, Any]:
        """`n` invokes with up to `window` outstanding (default: all of them at once)."""
        loop = asyncio.get_running_loop()
        window = window or n
        frames = [_invoke(i) for i in range(n)]
        waiters: list[asyncio.Future[dict[str, Any]]] = []
        started = time.perf_counter()
        for i, (request_id, text) in enumerate(frames):
            if i >= window:
                await waiters[i - window]
            waiter = loop.create_future()
            peer.waiting[request_id] = waiter
            waiters.append(waiter)
            await peer.connection.send(text)
        results = await asyncio.gather(*waiters)
        elapsed = time.perf_counter() - started
        errors = sum(r.get("output") != i + 1 for i, r in enumerate(results))
        return {"n": n, "errors": errors, "elapsed_s": elapsed, "per_s": n / elapsed}

    async def call(self, peer: Peer, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """One invoke of `tool`: its result and how long it took to come back."""
        request_id = secrets.token_hex(16)
        frame = {
            "type": "cf_agent_client_tool_invoke",
            "requestId": request_id,
            "toolCallId": f"call_{request_id[:12]}",
            "toolName": tool,
            "input": arguments,
            "attempt": 1,
        }
        waiter = asyncio.get_running_loop().create_future()
        peer.waiting[request_id] = waiter
        started = time.perf_counter()
        await peer.connection.send(json.dumps(frame, separators=(",", ":")))
        result = await waiter
        return {"result": result, "elapsed_s": time.perf_counter() - started}


def _invoke(i: int) -> tuple[str, str]:
    request_id = secrets.token_hex(16)
    frame = {
        "type": "cf_agent_client_tool_invoke",
        "requestId": request_id,
        "toolCallId": f"call_{request_id[:12]}",
        "toolName": "add",
        "input": {"a": i, "b": 1},
        "attempt": 1,
    }
    return request_id, json.dumps(frame, separators=(",", ":"))


def _percentile(ordered: list[float], percent: float) -> float:
    """Nearest-rank percentile of an already sorted list."""
    rank = max(1, -(-len(ordered) * percent // 100))
    return ordered[int(rank) - 1]


async def _commands(generator: LoadGenerator) -> None:
    """Read commands from stdin, one per line; write one JSON reply per command."""
    operations: dict[str, Callable[[Peer, dict[str, Any]], Awaitable[dict[str, Any]]]] = {
        "wait": lambda peer, cmd: _done({}),
        "roundtrip": lambda peer, cmd: generator.roundtrip(peer, int(cmd["n"])),
        "pipelined": lambda peer, cmd: generator.pipelined(peer, int(cmd["n"]), cmd.get("window")),
        "call": lambda peer, cmd: generator.call(peer, str(cmd["tool"]), dict(cmd["input"])),
    }
    while True:
        line = await asyncio.to_thread(sys.stdin.readline)
        if not line or not line.strip():
            if not line:
                return
            continue
        command = json.loads(line)
        op = command.get("op")
        if op == "quit":
            return
        try:
            operation = operations[op]
            async with asyncio.timeout(float(command.get("timeout", 120))):
                peer = await generator.peer(command["session"], float(command.get("timeout", 120)))
                reply = await operation(peer, command)
            reply["ok"] = True
        except Exception as exc:  # report, keep serving: the driver decides what failed means
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        _reply(reply)


async def _done(value: dict[str, Any]) -> dict[str, Any]:
    return value


def _reply(value: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(value) + "\n")
    sys.stdout.flush()


async def main() -> None:
    generator = LoadGenerator()
    # No keepalive pings: they would land in the middle of a timed run.
    async with serve(
        generator.handle, "127.0.0.1", 0, max_size=None, ping_interval=None, compression=None
    ) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        _reply({"event": "ready", "port": port})
        await _commands(generator)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())
