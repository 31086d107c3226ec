"""Figure 5's load: many fake pages, each sending chats that call a browser tool.

Runs in its own process against a reference server, so the server (another
process) has a core of its own to be measured on:

    $ python -m bench.fleet ws://127.0.0.1:8000/agents/chat --clients 100 --invokes 100
    {"invokes": 10000, "elapsed_s": ..., "per_invoke_ms": ..., "chat_p50_ms": ..., ...}

Each client registers the tool `add` and then sends, one after another,
`invokes` chat `send` frames whose user text is `call add {"a": I, "b": 1}`.
The scripted model turns that line into a tool call, so every invoke takes
the full chat path: run, ledger, model step, invoke frame, result, ack, model
step, text, `end`. A chat counts as done at its `end`; it is an error unless
the tool's output came back in it.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import statistics
import sys
import time
from typing import Any

from websockets.asyncio.client import ClientConnection, connect

from bench import bounded

TOOL = {
    "name": "add",
    "description": "Add two integers.",
    "inputSchema": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    },
}


class _Gate:
    """Counts registered clients; the timed chats start once every client registered."""

    def __init__(self, clients: int, invokes: int) -> None:
        self.waiting = clients
        self.total = clients * invokes
        self.done = 0
        self.every = max(1, self.total // 10)  # a progress line per tenth of the chats
        self.registered = asyncio.Event()
        self.start = asyncio.Event()

    def arrived(self) -> None:
        self.waiting -= 1
        if self.waiting == 0:
            self.registered.set()


async def _client(url: str, index: int, invokes: int, gate: _Gate) -> list[float]:
    """One page: register, then `invokes` chats in a row; returns each chat's latency."""
    latencies: list[float] = []
    async with connect(f"{url}/fleet-{index}", max_size=None, compression=None) as ws:
        await ws.send(
            json.dumps(
                {
                    "type": "cf_agent_client_tools",
                    "protocol": 1,
                    "clientId": f"fleet-{index}",
                    "tools": [TOOL],
                }
            )
        )
        while json.loads(await ws.recv()).get("type") != "cf_agent_client_tools_ack":
            pass
        gate.arrived()
        await gate.start.wait()
        for i in range(invokes):
            started = time.perf_counter()
            if not await chat(ws, index, i):
                raise RuntimeError(f"client {index}: chat {i} ended without the tool's output")
            latencies.append(time.perf_counter() - started)
            gate.done += 1
            if gate.done % gate.every == 0:
                bounded.current().step("chats", gate.done, gate.total)
    return latencies


async def chat(ws: ClientConnection, index: int, i: int) -> bool:
    """One chat whose model calls `add` once; True when the output came back before `end`."""
    request_id = secrets.token_hex(8)
    text = f'call add {{"a": {i}, "b": 1}}'
    await ws.send(
        json.dumps(
            {
                "type": "send",
                "requestId": request_id,
                "id": f"chat-{index}-{i}",
                "trigger": "submit-message",
                "messages": [
                    {
                        "id": f"u-{request_id}",
                        "role": "user",
                        "parts": [{"type": "text", "text": text}],
                    }
                ],
                "headers": {},
                "body": {},
            }
        )
    )
    got_output = False
    while True:
        frame = json.loads(await ws.recv())
        kind = frame.get("type")
        if kind == "cf_agent_client_tool_invoke":
            tool_input = frame["input"]
            await ws.send(
                json.dumps(
                    {
                        "type": "cf_agent_client_tool_result",
                        "requestId": frame["requestId"],
                        "output": tool_input["a"] + tool_input["b"],
                    }
                )
            )
        elif kind == "chunk" and frame["requestId"] == request_id:
            chunk = frame["chunk"]
            if chunk.get("type") == "tool-output-available" and chunk.get("output") == i + 1:
                got_output = True
        elif kind in ("end", "error") and frame.get("requestId") == request_id:
            return got_output and kind == "end"


async def run(url: str, clients: int, invokes: int) -> dict[str, Any]:
    gate = _Gate(clients, invokes)
    tasks = [asyncio.create_task(_client(url, i, invokes, gate)) for i in range(clients)]
    # Every client connects and registers first: the timed part is the chats only.
    failed = asyncio.ensure_future(asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION))
    await asyncio.wait(
        [failed, asyncio.ensure_future(gate.registered.wait())], return_when=asyncio.FIRST_COMPLETED
    )
    if failed.done():  # a client failed before every one registered: say why, not "registered"
        await asyncio.gather(*tasks)
    budget = bounded.current()
    budget.step(f"{clients} pages registered; {clients * invokes} chats")
    started = time.perf_counter()
    gate.start.set()
    per_client = await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - started
    latencies = sorted(x for client in per_client for x in client)
    total = clients * invokes
    return {
        "clients": clients,
        "invokes": total,
        "elapsed_s": elapsed,
        "per_invoke_ms": elapsed / total * 1000,
        "chat_p50_ms": latencies[len(latencies) // 2] * 1000,
        "chat_p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000,
        "chat_mean_ms": statistics.fmean(latencies) * 1000,
    }


def main(argv: list[str] | None = None) -> int:
    parser = bounded.Parser(prog="python -m bench.fleet", description=__doc__)
    parser.add_argument(
        "url", help="the server's chat URL without the session, e.g. ws://H:P/agents/chat"
    )
    parser.add_argument("--clients", type=bounded.positive_int, default=100)
    parser.add_argument("--invokes", type=bounded.positive_int, default=100)
    parser.add_time_limit(default=600)
    args = parser.parse_args(argv)
    if not args.url.startswith(("ws://", "wss://")):
        parser.error(f"url {args.url!r}: not a ws:// or wss:// URL")

    def body(budget: bounded.Budget) -> int:
        budget.step(f"{args.clients} pages connect to {args.url}")
        try:
            result = asyncio.run(run(args.url, args.clients, args.invokes))
        except OSError as exc:
            raise bounded.Failed(f"cannot reach {args.url}: {exc}") from exc
        sys.stdout.write(json.dumps(result) + "\n")
        return 0

    return bounded.run(parser.prog, args.time_limit, body)


if __name__ == "__main__":
    sys.exit(main())
