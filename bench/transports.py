"""The AI SDK's HTTP chat transport against its WebSocket chat transport, on one server.

One server process (``python -m clienttools_server``, the scripted model, no
``--db``) and, in this process, one page socket that registers ``add`` and
answers every invoke, and ``--lanes`` chat lanes. Each turn is a fresh chat with
one user message, ``call add {"a": i, "b": 1}``: one model step that calls the
page tool, its output, the answer; the turn ends at the WebSocket ``end`` frame
or the event stream's ``data: [DONE]``. A WebSocket lane keeps one chat socket;
an HTTP lane keeps one keep-alive connection, as a browser does.

Blocks of ``--turns`` turns per lane alternate between the two transports,
``--blocks`` times each, so both meet the same machine; each block reads the
server's CPU time (/proc/PID/stat) before and after. Reported: server CPU per
turn (median of the blocks, and their range) and the turn time p50 (all turns
of a transport), and the HTTP/WebSocket ratio of each.

    python -m bench.transports --lanes 4 --turns 50 --blocks 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import statistics
import subprocess
import sys
import time
from typing import Any

from websockets.asyncio.client import ClientConnection, connect

from bench.serverload import ROOT, _cpu_seconds, _free_port, _wait_listening

SESSION = "bench"
ADD = {
    "name": "add",
    "description": "Add two integers.",
    "inputSchema": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    },
}


def _turn_body(i: int) -> tuple[str, list[dict[str, Any]]]:
    chat_id = f"chat-{i}-{secrets.token_hex(4)}"
    text = "call add " + json.dumps({"a": i, "b": 1})
    return chat_id, [
        {"id": f"u-{chat_id}", "role": "user", "parts": [{"type": "text", "text": text}]}
    ]


async def page(url: str, ready: asyncio.Event) -> None:
    """The page: registers ``add``, answers every invoke, until cancelled."""
    async with connect(url, compression=None) as ws:
        await ws.send(
            json.dumps(
                {"type": "cf_agent_client_tools", "protocol": 1, "clientId": "bench-page",
                 "tools": [ADD]}
            )
        )  # fmt: skip
        async for text in ws:
            frame = json.loads(text)
            if frame["type"] == "cf_agent_client_tools_ack":
                ready.set()
            elif frame["type"] == "cf_agent_client_tool_invoke":
                tool_input = frame["input"]
                result = {
                    "type": "cf_agent_client_tool_result",
                    "requestId": frame["requestId"],
                    "output": tool_input["a"] + tool_input["b"],
                }
                await ws.send(json.dumps(result))


class WebSocketLane:
    """The stock WebSocketChatTransport's frames on one chat socket."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws

    @classmethod
    async def open(cls, url: str) -> WebSocketLane:
        return cls(await connect(url, compression=None, max_size=None))

    async def turn(self, i: int) -> None:
        chat_id, messages = _turn_body(i)
        request_id = secrets.token_hex(8)
        frame = {
            "type": "send", "requestId": request_id, "id": chat_id, "trigger": "submit-message",
            "messages": messages, "headers": {}, "body": {},
        }  # fmt: skip
        await self.ws.send(json.dumps(frame))
        while True:
            reply = json.loads(await self.ws.recv())
            if reply.get("requestId") != request_id:
                continue
            if reply["type"] == "end":
                return
            if reply["type"] == "error":
                raise RuntimeError(f"turn {i}: {reply}")

    async def close(self) -> None:
        await self.ws.close()


class HttpLane:
    """DefaultChatTransport's POST on one keep-alive HTTP/1.1 connection."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    @classmethod
    async def open(cls, host: str, port: int) -> HttpLane:
        lane = cls(host, port)
        lane.reader, lane.writer = await asyncio.open_connection(host, port)
        return lane

    async def turn(self, i: int) -> None:
        assert self.reader is not None and self.writer is not None
        chat_id, messages = _turn_body(i)
        body = json.dumps({"id": chat_id, "messages": messages, "trigger": "submit-message"})
        data = body.encode()
        head = (
            f"POST /agents/chat/{SESSION} HTTP/1.1\r\nhost: {self.host}:{self.port}\r\n"
            f"content-type: application/json\r\ncontent-length: {len(data)}\r\n\r\n"
        )
        self.writer.write(head.encode() + data)
        status = await self.reader.readline()
        if status == b"":
            # uvicorn closed the connection after its keep-alive timeout (5 s idle, while
            # the other transport's block ran); a browser opens another one, and so do we.
            self.writer.close()
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
            self.writer.write(head.encode() + data)
            status = await self.reader.readline()
        if b" 200 " not in status:
            raise RuntimeError(f"turn {i}: {status!r}")
        chunked = False
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            if line.lower().startswith(b"transfer-encoding:") and b"chunked" in line.lower():
                chunked = True
        if not chunked:
            raise RuntimeError(f"turn {i}: the event stream is not chunked")
        stream = b""
        while True:
            size = int((await self.reader.readline()).strip(), 16)
            if size == 0:
                await self.reader.readline()
                break
            stream += await self.reader.readexactly(size)
            await self.reader.readexactly(2)
        if not stream.endswith(b"data: [DONE]\n\n"):
            raise RuntimeError(f"turn {i}: the stream did not end with [DONE]")

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


async def block(lanes: list[Any], turns: int, start: int, pid: int) -> tuple[float, list[float]]:
    """``turns`` turns on every lane at once: the server's CPU seconds and each turn's time."""
    times: list[float] = []

    async def run(lane: Any, offset: int) -> None:
        for k in range(turns):
            began = time.perf_counter()
            await lane.turn(start + offset * turns + k)
            times.append(time.perf_counter() - began)

    before = _cpu_seconds(pid) or 0.0
    await asyncio.gather(*(run(lane, n) for n, lane in enumerate(lanes)))
    after = _cpu_seconds(pid) or 0.0
    return after - before, times


def _summary(cpu: list[float], times: list[float], turns_per_block: int) -> dict[str, Any]:
    per_turn = sorted(c / turns_per_block * 1000 for c in cpu)
    ordered = sorted(times)
    return {
        "server_cpu_per_turn_ms": statistics.median(per_turn),
        "server_cpu_per_turn_ms_range": [per_turn[0], per_turn[-1]],
        "turn_p50_ms": statistics.median(ordered) * 1000,
        "turn_p90_ms": ordered[int(len(ordered) * 0.9)] * 1000,
        "turns": len(times),
    }


async def compare(lanes: int, turns: int, blocks: int, warmup: int) -> dict[str, Any]:
    port = _free_port()
    command = [sys.executable, "-m", "clienttools_server", "--port", str(port),
               "--log-level", "warning"]  # fmt: skip
    server = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL)
    try:
        _wait_listening(port, server)
        url = f"ws://127.0.0.1:{port}/agents/chat/{SESSION}"
        ready = asyncio.Event()
        page_task = asyncio.create_task(page(url, ready))
        await asyncio.wait_for(ready.wait(), 10)
        ws_lanes = [await WebSocketLane.open(url) for _ in range(lanes)]
        http_lanes = [await HttpLane.open("127.0.0.1", port) for _ in range(lanes)]
        kinds: dict[str, list[Any]] = {"websocket": ws_lanes, "http": http_lanes}
        for lanes_of in kinds.values():  # warm both paths before anything counts
            await block(lanes_of, warmup, 10_000_000, server.pid)
        cpu: dict[str, list[float]] = {k: [] for k in kinds}
        times: dict[str, list[float]] = {k: [] for k in kinds}
        counter = 0
        for round_ in range(blocks):
            # Alternate which goes first, so neither always meets the other's leftovers.
            order = list(kinds) if round_ % 2 == 0 else list(reversed(kinds))
            for kind in order:
                used, took = await block(kinds[kind], turns, counter, server.pid)
                counter += lanes * turns
                cpu[kind].append(used)
                times[kind].extend(took)
        for lane in ws_lanes + http_lanes:
            await lane.close()
        page_task.cancel()
        await asyncio.gather(page_task, return_exceptions=True)
    finally:
        server.terminate()
        server.wait(timeout=10)
    result = {k: _summary(cpu[k], times[k], lanes * turns) for k in kinds}
    ws, http = result["websocket"], result["http"]
    result["ratio_http_to_websocket"] = {
        "server_cpu_per_turn": http["server_cpu_per_turn_ms"] / ws["server_cpu_per_turn_ms"],
        "turn_p50": http["turn_p50_ms"] / ws["turn_p50_ms"],
    }
    result["settings"] = {"lanes": lanes, "turns": turns, "blocks": blocks, "warmup": warmup}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lanes", type=int, default=4, help="chats in flight at once")
    parser.add_argument("--turns", type=int, default=50, help="turns per lane per block")
    parser.add_argument("--blocks", type=int, default=5, help="blocks per transport")
    parser.add_argument("--warmup", type=int, default=10, help="turns per lane before counting")
    args = parser.parse_args()
    result = asyncio.run(compare(args.lanes, args.turns, args.blocks, args.warmup))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
