"""A CPython fake browser on `websockets` and a collector of every chunk the server sends.

browser = await FakeBrowser.connect(server.ws_url("s1"), collector)
await browser.register([tool_spec("echo")], handlers={"echo": echo})
response = await browser.chat("call echo {\\"x\\": 1}")
assert response.text == 'echo -> {"x":1}'
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import sqlite3
import subprocess
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic_ai.models import StreamedResponse
from pydantic_ai.models.wrapper import WrapperModel
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from clienttools.protocol import parse_server_frame
from clienttools_server.agent.history import digest, history_from_ui
from clienttools_server.agent.scripted import scripted_model
from clienttools_server.canonical import canonical_json

ROOT = Path(__file__).resolve().parents[2]
NODE_DIR = ROOT / "tests" / "node"

Handler = Callable[[dict[str, Any]], Awaitable[Any]]


class ToolFailed(Exception):
    """Raised by a fake tool handler: becomes a result frame with `error`."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def tool_spec(name: str, **extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": name,
        "description": f"the {name} tool",
        "inputSchema": {"type": "object"},
    }
    spec.update(extra)
    return spec


@dataclass
class Response:
    request_id: str
    chunks: list[dict[str, Any]]
    final: dict[str, Any]

    @property
    def types(self) -> list[str]:
        return [c["type"] for c in self.chunks]

    @property
    def text(self) -> str:
        return "".join(c["delta"] for c in self.chunks if c["type"] == "text-delta")

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [c for c in self.chunks if c["type"] == kind]


@dataclass
class ChunkCollector:
    """Every response seen in the session, validated in ONE node run at the end."""

    responses: dict[str, dict[str, Any]] = field(default_factory=dict)

    def add(self, key: str, sequence: int, chunk: dict[str, Any]) -> None:
        entry = self.responses.setdefault(key, {"firstSequence": sequence, "chunks": []})
        entry["chunks"].append(chunk)

    def finish(self, key: str, kind: str) -> None:
        if key in self.responses:
            self.responses[key]["final"] = kind

    def validate_with_node(self) -> tuple[int, str]:
        batch = [
            {
                "id": key,
                # A whole response (from sequence 0 to `end`) must also build a
                # UIMessage in readUIMessageStream without errors.
                "complete": entry["firstSequence"] == 0 and entry.get("final") == "end",
                "chunks": entry["chunks"],
            }
            for key, entry in self.responses.items()
        ]
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
            json.dump(batch, handle)
            path = handle.name
        try:
            done = subprocess.run(
                ["node", str(NODE_DIR / "chunk_schema.mjs"), path],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=120,
            )
        finally:
            Path(path).unlink()
        return done.returncode, done.stdout + done.stderr


class FakeBrowser:
    """One page's socket: records frames, answers invokes with handlers, checks sequences."""

    def __init__(self, ws: ClientConnection, collector: ChunkCollector) -> None:
        self.ws = ws
        self.collector = collector
        self.inbox: list[dict[str, Any]] = []
        self.handlers: dict[str, Handler] = {}
        self.invokes: list[dict[str, Any]] = []
        self.acks: dict[str, list[str]] = {}
        self.chunks: dict[str, list[dict[str, Any]]] = {}
        self.next_sequence: dict[str, int] = {}
        # requestId of a resume -> the first sequence it should get
        self.resume_from: dict[str, int] = {}
        self.violations: list[str] = []
        self.client_id = "page-" + secrets.token_hex(4)
        self._changed = asyncio.Condition()
        self._tasks: set[asyncio.Task[None]] = set()
        self._reader = asyncio.create_task(self._read())
        self.close_code: int | None = None

    @classmethod
    async def connect(
        cls, url: str, collector: ChunkCollector, *, origin: str | None = None
    ) -> FakeBrowser:
        ws = await connect(url, origin=origin, max_size=None)  # type: ignore[arg-type]
        return cls(ws, collector)

    async def close(self) -> None:
        await self.ws.close()
        await self._reader
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # -- receiving --------------------------------------------------------------------

    async def _read(self) -> None:
        try:
            async for text in self.ws:
                assert isinstance(text, str)
                self._receive(text)
                async with self._changed:
                    self._changed.notify_all()
        except ConnectionClosed:
            pass
        finally:
            self.close_code = self.ws.close_code
            async with self._changed:
                self._changed.notify_all()

    def _receive(self, text: str) -> None:
        parse_server_frame(text)  # every server frame must be a valid protocol frame
        frame = json.loads(text)
        kind = frame["type"]
        if kind == "chunk":
            rid, seq = frame["requestId"], frame["sequence"]
            expected = self.next_sequence.get(rid)
            if expected is None:
                self.violations.append(f"chunk for {rid} without a start")
            elif seq != expected:
                self.violations.append(f"{rid}: sequence {seq}, expected {expected}")
            self.next_sequence[rid] = seq + 1
            self.chunks.setdefault(rid, []).append(frame["chunk"])
            self.collector.add(f"{id(self)}:{rid}", seq, frame["chunk"])
            return
        if kind == "start":
            rid = frame["requestId"]
            self.next_sequence.setdefault(rid, self.resume_from.get(rid, 0))
        if kind in ("end", "error"):
            self.collector.finish(f"{id(self)}:{frame['requestId']}", kind)
        if kind == "cf_agent_client_tool_result_ack":
            self.acks.setdefault(frame["requestId"], []).append(frame["outcome"])
        if kind == "cf_agent_client_tool_invoke":
            self.invokes.append(frame)
            handler = self.handlers.get(frame["toolName"])
            if handler is not None:
                task = asyncio.create_task(self._answer(handler, frame))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
                return
        self.inbox.append(frame)

    async def _answer(self, handler: Handler, invoke: dict[str, Any]) -> None:
        try:
            output = await handler(invoke["input"])
        except ToolFailed as exc:
            await self.send_result(
                invoke["requestId"], error={"code": exc.code, "message": exc.message}
            )
        else:
            await self.send_result(invoke["requestId"], output=output)

    async def expect(self, kind: str, timeout: float = 5.0, **fields: Any) -> dict[str, Any]:
        """The first unclaimed frame of this type (and these field values); it is claimed."""

        def find() -> dict[str, Any] | None:
            for index, frame in enumerate(self.inbox):
                if frame["type"] == kind and all(frame.get(k) == v for k, v in fields.items()):
                    return self.inbox.pop(index)
            return None

        async with asyncio.timeout(timeout), self._changed:
            while True:
                found = find()
                if found is not None:
                    return found
                if self._reader.done():
                    raise AssertionError(f"socket closed ({self.close_code}) before a {kind} frame")
                await self._changed.wait()

    async def chunk(self, request_id: str, kind: str, timeout: float = 5.0) -> dict[str, Any]:
        """The first chunk of this type in the response to `request_id`, once it arrived."""
        async with asyncio.timeout(timeout), self._changed:
            while True:
                for chunk in self.chunks.get(request_id, []):
                    if chunk["type"] == kind:
                        return chunk
                if self._reader.done():
                    raise AssertionError(f"socket closed ({self.close_code}) before a {kind} chunk")
                await self._changed.wait()

    async def expect_closed(self, timeout: float = 5.0) -> int | None:
        async with asyncio.timeout(timeout):
            await asyncio.shield(self._reader)
        return self.close_code

    async def nothing(self, kind: str, wait: float = 0.2) -> None:
        """Assert that no frame of this type arrives within `wait` seconds."""
        await asyncio.sleep(wait)
        assert not [f for f in self.inbox if f["type"] == kind], self.inbox

    # -- sending ----------------------------------------------------------------------

    async def send(self, frame: dict[str, Any]) -> None:
        if frame.get("type") == "resume":
            last = frame.get("lastSequence")
            self.resume_from[frame["requestId"]] = 0 if last is None else last + 1
        await self.ws.send(json.dumps(frame))

    async def send_raw(self, data: str | bytes) -> None:
        await self.ws.send(data)

    async def register(
        self,
        tools: list[dict[str, Any]],
        handlers: dict[str, Handler] | None = None,
        client_id: str | None = None,
    ) -> dict[str, Any]:
        self.handlers.update(handlers or {})
        if client_id is not None:
            self.client_id = client_id
        await self.send(
            {
                "type": "cf_agent_client_tools",
                "protocol": 1,
                "clientId": self.client_id,
                "tools": tools,
            }
        )
        return await self.expect("cf_agent_client_tools_ack")

    async def send_result(self, request_id: str, **result: Any) -> None:
        await self.send({"type": "cf_agent_client_tool_result", "requestId": request_id, **result})

    async def ack_for(self, request_id: str, timeout: float = 5.0) -> dict[str, Any]:
        return await self.expect("cf_agent_client_tool_result_ack", timeout, requestId=request_id)

    async def start_chat(self, text: str, chat_id: str = "chat-1") -> str:
        request_id = "req-" + secrets.token_hex(6)
        await self.send(
            {
                "type": "send",
                "requestId": request_id,
                "id": chat_id,
                "trigger": "submit-message",
                "messages": [
                    {
                        "id": "u-" + request_id,
                        "role": "user",
                        "parts": [{"type": "text", "text": text}],
                    }
                ],
                "headers": {},
                "body": {},
            }
        )
        await self.expect("start", requestId=request_id)
        return request_id

    async def response(self, request_id: str, timeout: float = 5.0) -> Response:
        async with asyncio.timeout(timeout), self._changed:
            while True:
                for index, frame in enumerate(self.inbox):
                    if frame["type"] in ("end", "error") and frame["requestId"] == request_id:
                        final = self.inbox.pop(index)
                        return Response(request_id, self.chunks.get(request_id, []), final)
                if self._reader.done():
                    raise AssertionError(f"socket closed before the end of {request_id}")
                await self._changed.wait()

    async def chat(self, text: str, chat_id: str = "chat-1", timeout: float = 5.0) -> Response:
        return await self.response(await self.start_chat(text, chat_id), timeout)


async def settled(hub: Any, timeout: float = 2.0) -> None:
    """Wait until the server holds no runs, pending calls, timers or approvals."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout):
            while any(v for k, v in hub.stats().items() if k != "sessions"):
                await asyncio.sleep(0.01)
    stats = hub.stats()
    assert all(v == 0 for k, v in stats.items() if k != "sessions"), stats


class CountingModel(WrapperModel):
    """The scripted model, counting how often it is asked (replay must not ask)."""

    def __init__(self) -> None:
        super().__init__(scripted_model())
        self.calls = 0

    @contextlib.asynccontextmanager
    async def request_stream(self, *args: Any, **kwargs: Any) -> AsyncIterator[StreamedResponse]:
        self.calls += 1
        async with super().request_stream(*args, **kwargs) as response:
            yield response


class GatedModel(WrapperModel):
    """The scripted model, held at its first step until released."""

    def __init__(self) -> None:
        super().__init__(scripted_model())
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    @contextlib.asynccontextmanager
    async def request_stream(self, *args: Any, **kwargs: Any) -> AsyncIterator[StreamedResponse]:
        self.entered.set()
        await self.release.wait()
        async with super().request_stream(*args, **kwargs) as response:
            yield response


def user_message(text: str) -> dict[str, Any]:
    return {"id": "u", "role": "user", "parts": [{"type": "text", "text": text}]}


def first_step_input(text: str) -> str:
    """The recorded input of the first model step of a chat that starts with ``text``."""
    return canonical_json({"step": 0, "messages": digest(history_from_ui([user_message(text)]))})


def sqlite_rows(db: Path) -> list[Any]:
    """Every row of a SQLite ledger file, to compare byte for byte before and after."""
    with sqlite3.connect(db) as raw:
        rows = raw.execute("SELECT * FROM executions ORDER BY id").fetchall()
        rows += raw.execute("SELECT * FROM steps ORDER BY execution_id, seq").fetchall()
    raw.close()
    return rows
