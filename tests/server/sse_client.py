"""A small HTTP/1.1 client on asyncio streams, for the event-stream routes: one request a
connection, the body read as it arrives (chunked or not), the connection cut at will.

response = await HttpResponse.open(server.host, server.port, "POST", "/agents/chat/s1", body)
assert response.status == 200
async for event in response.events():   # "data: {...}", ": keep-alive", "data: [DONE]"
    ...
response.cut()                          # drop it mid-stream, as an aborted fetch does
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

# Every response opened, so that a test's fixture can close those it left open.
OPENED: list[HttpResponse] = []


@dataclass
class HttpResponse:
    status: int
    headers: dict[str, str]
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    _chunked: bool = False
    _left: int | None = None
    _buffer: str = ""
    _ended: bool = False
    blocks: list[str] = field(default_factory=list)

    @classmethod
    async def open(
        cls,
        host: str,
        port: int,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> HttpResponse:
        reader, writer = await asyncio.open_connection(host, port)
        lines = [f"{method} {path} HTTP/1.1", f"host: {host}:{port}", "connection: close"]
        for name, value in (headers or {}).items():
            lines.append(f"{name}: {value}")
        if body is not None:
            lines.append(f"content-length: {len(body)}")
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b""))
        await writer.drain()
        status_line = (await reader.readline()).decode()
        status = int(status_line.split()[1])
        found: dict[str, str] = {}
        while (line := (await reader.readline()).decode().rstrip("\r\n")) != "":
            name, _, value = line.partition(":")
            found[name.strip().lower()] = value.strip()
        response = cls(status, found, reader, writer)
        OPENED.append(response)
        response._chunked = found.get("transfer-encoding", "").lower() == "chunked"
        if "content-length" in found:
            response._left = int(found["content-length"])
        return response

    async def read_some(self) -> bytes | None:
        """The next piece of the body as the server wrote it; None at its end."""
        if self._ended:
            return None
        if self._chunked:
            size = int((await self.reader.readline()).strip() or b"0", 16)
            if size == 0:
                await self.reader.readline()
                self._ended = True
                return None
            data = await self.reader.readexactly(size)
            await self.reader.readexactly(2)
            return data
        if self._left is not None:
            if self._left == 0:
                self._ended = True
                return None
            data = await self.reader.read(self._left)
            self._left -= len(data)
        else:
            data = await self.reader.read(65536)
        if not data:
            self._ended = True
            return None
        return data

    async def body(self) -> bytes:
        parts = []
        while (data := await self.read_some()) is not None:
            parts.append(data)
        self.cut()
        return b"".join(parts)

    async def json(self) -> Any:
        return json.loads(await self.body())

    async def events(self) -> AsyncIterator[str]:
        """Each block of the event stream (the text before a blank line), as it arrives."""
        while True:
            while "\n\n" in self._buffer:
                block, self._buffer = self._buffer.split("\n\n", 1)
                self.blocks.append(block)
                yield block
            data = await self.read_some()
            if data is None:
                self.cut()
                if self._buffer:
                    self.blocks.append(self._buffer)
                    yield self._buffer  # a block without its blank line: a framing error
                return
            self._buffer += data.decode()

    async def chunks_until(self, kind: str | None = None) -> list[dict[str, Any]]:
        """The chunks up to and with the first of type ``kind`` (None: to the end)."""
        chunks: list[dict[str, Any]] = []
        async for block in self.events():
            if block.startswith("data: ") and block != "data: [DONE]":
                chunks.append(json.loads(block.removeprefix("data: ")))
                if chunks[-1]["type"] == kind:
                    break
        return chunks

    def cut(self) -> None:
        self.writer.close()


def chat_body(
    text: str, chat_id: str = "chat-1", history: list[dict[str, Any]] | None = None, **extra: Any
) -> bytes:
    """A POST body as DefaultChatTransport sends it for one new user message."""
    messages = list(history or [])
    messages.append(
        {"id": f"u{len(messages)}", "role": "user", "parts": [{"type": "text", "text": text}]}
    )
    body = {**extra, "id": chat_id, "messages": messages, "trigger": "submit-message"}
    return json.dumps(body).encode()
