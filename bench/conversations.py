"""What storing conversations costs the server: CPU per chat, bytes per chat, GET /chats/{id}.

    python -m bench.conversations                          # this tree only
    python -m bench.conversations --base ../conv-base      # A/B: another tree without the store

The server runs as a subprocess (``python -m clienttools_server --db FILE``),
the load in this process. Each chat is what a page does: a page socket
registers an ``echo`` tool and answers its invokes; a chat socket subscribes to
the chat (this tree only: the other has no such frame) and sends two turns,
each a browser tool call and the model's text, the second turn with the whole
history as the ``ai`` package sends it. The server's own CPU time
(/proc/PID/stat) around the load, divided by the chats, is the figure; runs
of the two trees alternate (A B A B ...) so both see the same machine.

Then, on this tree: the bytes stored for a chat of 10 messages (5 turns), and
the p50 of ``GET /chats/{id}`` for a chat of 200 messages.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.support.http import http_json
from websockets.asyncio.client import ClientConnection, connect

from bench.serverload import _cpu_seconds, _free_port, _wait_listening

ROOT = Path(__file__).resolve().parent.parent
TOOLS = [{"name": "echo", "description": "Echo.", "inputSchema": {"type": "object"}}]


class Server:
    """``python -m clienttools_server --db FILE`` from ``tree`` (its client and server code)."""

    def __init__(self, tree: Path, db: Path) -> None:
        self.port = _free_port()
        env = {**os.environ, "PYTHONPATH": f"{tree / 'client'}:{tree / 'server'}"}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "clienttools_server", "--port", str(self.port),
             "--log-level", "warning", "--db", str(db)],
            env=env, cwd=tree, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        _wait_listening(self.port, self.process)

    def url(self, session: str) -> str:
        return f"ws://127.0.0.1:{self.port}/agents/chat/{session}"

    def cpu(self) -> float:
        seconds = _cpu_seconds(self.process.pid)
        assert seconds is not None, "/proc is needed"
        return seconds

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


async def _page(server: Server, session: str) -> tuple[ClientConnection, asyncio.Task[None]]:
    ws = await connect(server.url(session), max_size=None)
    await ws.send(json.dumps({"type": "cf_agent_client_tools", "protocol": 1,
                              "clientId": f"page-{session}", "tools": TOOLS}))  # fmt: skip
    json.loads(await ws.recv())  # the ack

    async def answer() -> None:
        async for text in ws:
            frame = json.loads(text)
            if frame["type"] == "cf_agent_client_tool_invoke":
                await ws.send(json.dumps({"type": "cf_agent_client_tool_result",
                                          "requestId": frame["requestId"],
                                          "output": frame["input"]}))  # fmt: skip

    return ws, asyncio.create_task(answer())


async def _turn(ws: ClientConnection, chat_id: str, history: list[Any], n: int) -> None:
    """One turn: send with the whole history; the answer rebuilt from its chunks' text."""
    request_id = f"{chat_id}-r{n}"
    user = {"id": f"{chat_id}-u{n}", "role": "user",
            "parts": [{"type": "text", "text": f'call echo {{"n": {n}}}'}]}  # fmt: skip
    history.append(user)
    await ws.send(json.dumps({"type": "send", "requestId": request_id, "id": chat_id,
                              "trigger": "submit-message", "messages": history,
                              "headers": {}, "body": {}}))  # fmt: skip
    message_id, tool, text = "", {}, ""
    while True:
        frame = json.loads(await ws.recv())
        if frame.get("requestId") != request_id:
            continue
        if frame["type"] in ("end", "error"):
            break
        if frame["type"] == "chunk":
            chunk = frame["chunk"]
            if chunk["type"] == "start":
                message_id = chunk["messageId"]
            elif chunk["type"] == "tool-input-available":
                tool = {"type": "tool-echo", "toolCallId": chunk["toolCallId"],
                        "state": "input-available", "input": chunk["input"]}  # fmt: skip
            elif chunk["type"] == "tool-output-available":
                tool = {**tool, "state": "output-available", "output": chunk["output"]}
            elif chunk["type"] == "text-delta":
                text += chunk["delta"]
    history.append({"id": message_id, "role": "assistant", "parts": [
        {"type": "step-start"}, tool, {"type": "step-start"},
        {"type": "text", "text": text, "state": "done"}]})  # fmt: skip


async def _chat(server: Server, session: str, turns: int, subscribe: bool) -> None:
    page, answering = await _page(server, session)
    chat = await connect(server.url(session), max_size=None)
    try:
        if subscribe:
            await chat.send(json.dumps({"type": "cf_agent_chat_subscribe", "id": session}))
        history: list[Any] = []
        for n in range(turns):
            await _turn(chat, session, history, n)
    finally:
        await chat.close()
        answering.cancel()
        await page.close()


async def _load(server: Server, chats: int, turns: int, subscribe: bool, tag: str) -> float:
    """Server CPU seconds per chat for ``chats`` chats, 10 at a time."""
    await _chat(server, f"{tag}-warm", turns, subscribe)  # imports, first connections
    began = server.cpu()
    gate = asyncio.Semaphore(10)

    async def one(i: int) -> None:
        async with gate:
            await _chat(server, f"{tag}-{i}", turns, subscribe)

    await asyncio.gather(*(one(i) for i in range(chats)))
    return (server.cpu() - began) / chats


def cpu_per_chat(tree: Path, subscribe: bool, chats: int, turns: int, tag: str) -> float:
    with tempfile.TemporaryDirectory(prefix="clienttools-conv-") as tmp:
        server = Server(tree, Path(tmp) / "ledger.sqlite3")
        try:
            return asyncio.run(_load(server, chats, turns, subscribe, tag))
        finally:
            server.stop()


def stored_figures(tree: Path, gets: int) -> dict[str, float]:
    """Bytes stored for a 10-message chat; GET /chats/{id} p50 for a 200-message one."""
    with tempfile.TemporaryDirectory(prefix="clienttools-conv-") as tmp:
        db = Path(tmp) / "ledger.sqlite3"
        server = Server(tree, db)
        try:
            asyncio.run(_chat(server, "ten", 5, True))
            asyncio.run(_chat(server, "long", 100, True))
            raw = sqlite3.connect(db)
            try:
                (json_bytes, rows) = raw.execute(
                    "SELECT sum(length(CAST(message_json AS BLOB))), count(*) "
                    "FROM chat_messages WHERE chat_id = 'ten'"
                ).fetchone()
                [(count,)] = raw.execute(
                    "SELECT count(*) FROM chat_messages WHERE chat_id = 'long'"
                ).fetchall()
            finally:
                raw.close()
            assert rows == 10 and count == 200, (rows, count)

            async def timed() -> list[float]:
                seconds = []
                for _ in range(gets):
                    began = time.perf_counter()
                    reply = await http_json("127.0.0.1", server.port, "GET", "/chats/long")
                    seconds.append(time.perf_counter() - began)
                    assert reply.status == 200 and len(reply.json["messages"]) == 200
                return seconds

            samples = asyncio.run(timed())
            body = asyncio.run(http_json("127.0.0.1", server.port, "GET", "/chats/long")).body
        finally:
            server.stop()
    return {
        "bytes_per_10_message_chat": float(json_bytes),
        "get_200_p50_ms": statistics.median(samples) * 1000,
        "get_200_p90_ms": statistics.quantiles(samples, n=10)[-1] * 1000,
        "get_200_body_bytes": float(len(body)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.conversations")
    parser.add_argument("--base", type=Path, help="a tree without the conversation store")
    parser.add_argument("--runs", type=int, default=3, help="runs of each tree (alternating)")
    parser.add_argument("--chats", type=int, default=60)
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--gets", type=int, default=200)
    args = parser.parse_args()
    figures: dict[str, Any] = {"with_store_ms": [], "base_ms": []}
    for run in range(args.runs):
        if args.base is not None:
            base = cpu_per_chat(args.base, False, args.chats, args.turns, f"b{run}")
            figures["base_ms"].append(round(base * 1000, 2))
        new = cpu_per_chat(ROOT, True, args.chats, args.turns, f"n{run}")
        figures["with_store_ms"].append(round(new * 1000, 2))
        print(json.dumps(figures), flush=True)
    if figures["base_ms"]:
        figures["ratio_of_medians"] = round(
            statistics.median(figures["with_store_ms"]) / statistics.median(figures["base_ms"]), 3
        )
    figures.update({k: round(v, 2) for k, v in stored_figures(ROOT, args.gets).items()})
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
