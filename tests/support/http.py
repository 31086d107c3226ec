"""A tiny HTTP/1.1 JSON client on asyncio streams: one request per connection, real sockets.

reply = await http_json("127.0.0.1", port, "GET", "/executions?status=paused", token="t")
reply.status, reply.json      # 200, {"executions": [...]}
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Reply:
    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def json(self) -> Any:
        return json.loads(self.body)


async def http_json(
    host: str,
    port: int,
    method: str,
    path: str,
    body: Any = None,
    *,
    token: str | None = None,
    raw: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 30.0,
) -> Reply:
    """Send one request (``body`` as JSON, or ``raw`` bytes as is) and read the whole reply."""
    payload = raw if raw is not None else b"" if body is None else json.dumps(body).encode()
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}:{port}", "Connection: close"]
    if payload or method == "POST":
        lines += ["Content-Type: application/json", f"Content-Length: {len(payload)}"]
    if token is not None:
        lines.append(f"Authorization: Bearer {token}")
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    async with asyncio.timeout(timeout):
        reader, writer = await asyncio.open_connection(host, port)
        data = b""
        try:
            writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + payload)
            # A server that answers before reading the whole body (one too large)
            # closes while we still send: its answer is read all the same.
            with contextlib.suppress(ConnectionError):
                await writer.drain()
            with contextlib.suppress(ConnectionError):
                while chunk := await reader.read(65536):
                    data += chunk
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
    head, _, rest = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    found = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        found[name.strip().lower()] = value.strip()
    if found.get("transfer-encoding") == "chunked":
        rest = _unchunk(rest)
    return Reply(int(status_line.split()[1]), rest, found)


def _unchunk(data: bytes) -> bytes:
    out = bytearray()
    while data:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out += data[:size]
        data = data[size + 2 :]
    return bytes(out)
