"""A fault-injecting WebSocket proxy for reliability tests: asyncio, in-process, 127.0.0.1 only.

Every accepted TCP connection is piped to the upstream server. The HTTP upgrade
is passed through (minus `Sec-WebSocket-Extensions`, see below), then both
directions are parsed into RFC 6455 frames so that rules can delay, drop, stall
or cut the connection at an exact protocol frame. Frames are forwarded byte for
byte (masking and fragmentation untouched); rules see whole messages.

    proxy = FaultProxy("127.0.0.1", server_port)
    await proxy.start()                      # proxy.url("/agents/chat/s1") -> ws://127.0.0.1:<port>/...
    proxy.add_rule(Rule("up", frame_type("cf_agent_client_tool_result"), cut()))
    async with connect(proxy.url("/agents/chat/s1"), compression=None) as ws:
        ...                                  # the first result frame kills the connection
    assert ("up", "cf_agent_client_tool_result", "r1") in proxy.log
    await proxy.stop()

Sync tests (Playwright's sync API) use `ThreadedFaultProxy`, the same API without
`await`, running its own event loop in a daemon thread.

Compression: the proxy must read payloads, so it cannot work with
permessage-deflate. It strips the `Sec-WebSocket-Extensions` request header so
that no extension is ever negotiated: Chromium (which always offers
permessage-deflate) works unchanged. Python clients should still connect with
`websockets.asyncio.client.connect(..., compression=None)` to make the intent
explicit. If a server negotiates an extension anyway, frames are still piped
correctly but payloads with RSV1 set are not decoded (rules see `None`).

Units and matching. Rules are evaluated on *units*: a complete data message
(`"text"` / `"binary"`, all its fragments; they are held until the final
fragment and then forwarded together, unchanged) or a single control frame
(`"ping"`, `"pong"`, `"close"`). `match(frame, payload)` gets the JSON object of
a text message (else `None`) and the unmasked payload. By default a rule only
sees data messages; pass `kinds=` to target control frames. The first rule (in
insertion order) with budget left whose direction, kinds and match fit fires;
its `times` budget (None = unlimited) is spent by one firing, on any connection
(budgets are proxy-wide, so "the next result frame" means across reconnects).

Actions:
- `delay(s)`: this unit reaches the peer `s` seconds later. The proxy keeps
  reading, but later units of that direction queue behind it (one TCP stream
  cannot reorder).
- `jitter(s)`: like `delay`, by a random 0..`s` seconds drawn per unit (uniform), so a
  rule with `times=None` gives every frame its own latency; order is kept as for `delay`.
- `drop()`: the unit is swallowed.
- `cut()`: the connection is aborted (TCP RST towards both sides) before the
  unit is forwarded; units queued earlier in that direction are still delivered.
- `cut_after()`: forward the unit, then abort both sides.
- `stall(s)`: the direction freezes: the proxy stops reading from that sender
  for `s` seconds (TCP backpressure builds, pings are not answered), then
  forwards the unit and carries on.

Robustness: handshakes and upstream connects have timeouts, writes have a drain
timeout, any error aborts that connection only, and `stop()` cancels and awaits
every task the proxy owns. Network failures (resets, refused upstream, timeouts:
every OSError) go to `proxy.network_errors`; anything else, including a rule's
`match` raising (treated as "no match"), goes to `proxy.errors`, which a test
should assert is empty.

Not handled: TLS (`wss://`; tests use plain `ws://` on 127.0.0.1), HTTP
keep-alive before the upgrade, and the `Host` header, which is forwarded as
the proxy's address (a server that checks Host must allow it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import socket
import struct
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, TypeVar

Direction = Literal["up", "down"]
Matcher = Callable[[dict[str, Any] | None, bytes], bool]
T = TypeVar("T")

HOST = "127.0.0.1"
CONNECT_TIMEOUT = 5.0
HANDSHAKE_TIMEOUT = 10.0
DRAIN_TIMEOUT = 30.0
# After one side sends EOF, the other gets this long to finish its closing handshake.
HALF_CLOSE_GRACE = 2.0
MAX_HEAD_BYTES = 64 * 1024
MAX_FRAME_PAYLOAD = 256 * 1024 * 1024

OPCODE_KINDS = {
    0x0: "continuation",
    0x1: "text",
    0x2: "binary",
    0x8: "close",
    0x9: "ping",
    0xA: "pong",
}
DATA_KINDS: frozenset[str] = frozenset({"text", "binary"})
ALL_KINDS: frozenset[str] = frozenset({"text", "binary", "close", "ping", "pong"})


# --- rules and actions ---------------------------------------------------------------


@dataclass(frozen=True)
class Action:
    """What a rule does to the unit it matched. Build with delay(), drop(), cut(), ..."""

    kind: Literal["delay", "jitter", "drop", "cut", "cut_after", "stall"]
    seconds: float = 0.0


def delay(seconds: float) -> Action:
    return Action("delay", seconds)


def jitter(seconds: float) -> Action:
    return Action("jitter", seconds)


def drop() -> Action:
    return Action("drop")


def cut() -> Action:
    return Action("cut")


def cut_after() -> Action:
    return Action("cut_after")


def stall(seconds: float) -> Action:
    return Action("stall", seconds)


@dataclass(eq=False)
class Rule:
    """`action` applied to the next `times` units in `direction` that `match` accepts.

    `hits` counts firings, so a test can assert that a fault really happened.
    """

    direction: Direction
    match: Matcher
    action: Action
    times: int | None = 1
    kinds: frozenset[str] = DATA_KINDS
    hits: int = 0

    def __post_init__(self) -> None:
        if self.direction not in ("up", "down"):
            raise ValueError(f"direction must be 'up' or 'down', not {self.direction!r}")
        unknown = set(self.kinds) - ALL_KINDS
        if unknown:
            raise ValueError(f"unknown kinds {sorted(unknown)}; use {sorted(ALL_KINDS)}")
        self.kinds = frozenset(self.kinds)

    @property
    def exhausted(self) -> bool:
        return self.times is not None and self.hits >= self.times


def any_frame(frame: dict[str, Any] | None, payload: bytes) -> bool:
    """Matches every unit (of the rule's kinds)."""
    return True


def frame_type(*types: str) -> Matcher:
    """Matches JSON frames whose `type` is one of `types`."""

    def match(frame: dict[str, Any] | None, payload: bytes) -> bool:
        return frame is not None and frame.get("type") in types

    return match


def fields(**expected: Any) -> Matcher:
    """Matches JSON frames with these exact wire field values, e.g. fields(requestId="r1")."""

    def match(frame: dict[str, Any] | None, payload: bytes) -> bool:
        return frame is not None and all(k in frame and frame[k] == v for k, v in expected.items())

    return match


class LogEntry(NamedTuple):
    """One unit the proxy saw (before any action). Compares equal to a plain 3-tuple.

    `frame_type` is the JSON `type`, or `ws:text` / `ws:binary` (not a JSON object
    with a string type), `ws:close`, `ws:ping`, `ws:pong`, `ws:op<N>` (reserved).
    """

    direction: Direction
    frame_type: str
    request_id: str | None


class ActionEntry(NamedTuple):
    """One fault the proxy injected (`action` is the Action kind)."""

    action: str
    direction: Direction
    frame_type: str
    request_id: str | None


# --- frame parsing ---------------------------------------------------------------------


def unmask(payload: bytes, mask: bytes) -> bytes:
    """XOR the payload with the 4-byte mask; one big-int op, fast enough for megabytes."""
    n = len(payload)
    if n == 0:
        return b""
    key = (mask * (n // 4 + 1))[:n]
    return (int.from_bytes(payload, "big") ^ int.from_bytes(key, "big")).to_bytes(n, "big")


@dataclass
class RawFrame:
    fin: bool
    rsv1: bool
    opcode: int
    payload: bytes  # unmasked
    raw: bytes  # exactly as on the wire


async def read_frame(reader: asyncio.StreamReader) -> RawFrame:
    """Read one frame. Raises asyncio.IncompleteReadError at EOF (with the partial bytes)."""
    head = await reader.readexactly(2)
    raw = bytearray(head)
    try:
        length = head[1] & 0x7F
        if length == 126:
            ext = await reader.readexactly(2)
            raw += ext
            length = struct.unpack("!H", ext)[0]
        elif length == 127:
            ext = await reader.readexactly(8)
            raw += ext
            length = struct.unpack("!Q", ext)[0]
        if length > MAX_FRAME_PAYLOAD:
            raise ValueError(f"frame payload of {length} bytes is over the proxy's limit")
        mask = b""
        if head[1] & 0x80:
            mask = await reader.readexactly(4)
            raw += mask
        data = await reader.readexactly(length)
    except asyncio.IncompleteReadError as exc:
        # Keep every byte read so far: the proxy forwards it before the EOF.
        raise asyncio.IncompleteReadError(bytes(raw) + exc.partial, None) from None
    raw += data
    return RawFrame(
        fin=bool(head[0] & 0x80),
        rsv1=bool(head[0] & 0x40),
        opcode=head[0] & 0x0F,
        payload=unmask(data, mask) if mask else data,
        raw=bytes(raw),
    )


def describe(
    kind: str, payload: bytes, compressed: bool
) -> tuple[dict[str, Any] | None, str, str | None]:
    """(JSON object or None, log type, requestId) of one unit."""
    obj: dict[str, Any] | None = None
    if kind == "text" and not compressed:
        try:
            decoded = json.loads(payload.decode("utf-8"))
        except (ValueError, RecursionError):
            decoded = None
        if isinstance(decoded, dict):
            obj = decoded
    if obj is not None and isinstance(obj.get("type"), str):
        rid = obj.get("requestId")
        return obj, obj["type"], rid if isinstance(rid, str) else None
    return obj, f"ws:{kind}", None


def strip_extensions(head: bytes) -> bytes:
    """The request head without Sec-WebSocket-Extensions lines (so nobody negotiates deflate)."""
    lines = head.split(b"\r\n")
    kept = [ln for ln in lines if not ln.lower().startswith(b"sec-websocket-extensions:")]
    return b"\r\n".join(kept)


# --- the proxy ---------------------------------------------------------------------------

# Items on a direction's output queue: bytes to write at a time, EOF, or abort.
_EOF = "eof"
_CUT = "cut"


@dataclass
class _Out:
    at: float
    data: bytes | str  # bytes, or _EOF / _CUT


@dataclass(eq=False)
class ProxyConnection:
    """One client connection and its upstream twin."""

    index: int
    client_writer: asyncio.StreamWriter
    upstream_writer: asyncio.StreamWriter | None = None
    request_head: bytes = b""  # as forwarded upstream (extension header stripped)
    response_head: bytes = b""
    upgraded: bool = False
    closed: bool = False
    cut: bool = False
    log: list[LogEntry] = field(default_factory=list)
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)

    def abort(self) -> None:
        """Drop both TCP sides at once with RST, like a network failure, and stop every task."""
        self.cut = True
        for writer in (self.client_writer, self.upstream_writer):
            if writer is None or writer.transport.is_closing():
                continue
            sock = writer.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
        current = asyncio.current_task()
        for task in self.tasks:
            if task is not current:
                task.cancel()


class FaultProxy:
    """See the module docstring. Not thread-safe: use it from the loop that started it."""

    def __init__(self, upstream_host: str, upstream_port: int, host: str = HOST) -> None:
        self.upstream_host = upstream_host
        self.upstream_port = upstream_port
        self.host = host
        self.port = 0
        self.rules: list[Rule] = []
        self.log: list[LogEntry] = []
        self.actions: list[ActionEntry] = []
        # errors: what looks like a proxy or test bug (tests assert it stays empty).
        # network_errors: what real networks do (resets, refused upstream, timeouts).
        self.errors: list[str] = []
        self.network_errors: list[str] = []
        self.connections: list[ProxyConnection] = []
        self.refused = 0
        self.paused = False
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[Any]] = set()

    # --- lifecycle ---------------------------------------------------------------------

    async def start(self) -> FaultProxy:
        self._server = await asyncio.start_server(self._handle, self.host, 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        """Close the listener, abort every connection, and await every task the proxy owns."""
        if self._server is not None:
            self._server.close()
        self.cut_all()
        tasks = set(self._handlers)
        for conn in self.connections:
            tasks |= conn.tasks
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=5)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)
            self._server = None

    async def __aenter__(self) -> FaultProxy:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def url(self, path: str = "/") -> str:
        return f"ws://{self.host}:{self.port}{path}"

    # --- test controls -------------------------------------------------------------

    def add_rule(self, rule: Rule) -> Rule:
        self.rules.append(rule)
        return rule

    def clear_rules(self) -> None:
        self.rules.clear()

    def cut_all(self) -> int:
        """Abort every live connection now; returns how many."""
        live = self.live
        for conn in live:
            conn.abort()
        return len(live)

    def pause(self) -> None:
        """Refuse new connections (accept and close at once), as if the server were unreachable."""
        self.paused = True

    def resume(self) -> None:
        self.paused = False

    @property
    def live(self) -> list[ProxyConnection]:
        return [c for c in self.connections if not c.closed]

    async def wait_for(self, predicate: Callable[[FaultProxy], bool], timeout: float = 5.0) -> None:
        """Poll `predicate(proxy)` until true; TimeoutError (with the log tail) otherwise."""
        deadline = time.monotonic() + timeout
        while not predicate(self):
            if time.monotonic() > deadline:
                raise TimeoutError(f"condition not met in {timeout}s; log tail: {self.log[-10:]}")
            await asyncio.sleep(0.01)

    # --- per connection --------------------------------------------------------------

    async def _handle(
        self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        if self.paused:
            self.refused += 1
            self._handlers.discard(task)
            client_writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client_writer.wait_closed(), 1)
            return
        conn = ProxyConnection(index=len(self.connections), client_writer=client_writer)
        self.connections.append(conn)
        conn.tasks.add(task)
        try:
            await self._run(conn, client_reader)
        except asyncio.CancelledError:
            pass  # stop(), cut or a cut_all(): the finally block closes both sides
        except Exception as exc:
            self._record(conn, exc)
        finally:
            conn.closed = True
            # Synchronous part first, so a second cancel (stop() after a cut) cannot skip it.
            others = [t for t in conn.tasks if t is not task]
            for t in others:
                t.cancel()
            writers = [w for w in (conn.client_writer, conn.upstream_writer) if w is not None]
            for writer in writers:
                writer.close()
            # A proxy bug must never leave a task or a socket behind: wait, bounded.
            with contextlib.suppress(Exception, asyncio.CancelledError):
                if others:
                    await asyncio.wait(others, timeout=2)
                for writer in writers:
                    await asyncio.wait_for(writer.wait_closed(), 1)
            self._handlers.discard(task)

    async def _run(self, conn: ProxyConnection, client_reader: asyncio.StreamReader) -> None:
        upstream_reader, upstream_writer = await asyncio.wait_for(
            asyncio.open_connection(self.upstream_host, self.upstream_port), CONNECT_TIMEOUT
        )
        conn.upstream_writer = upstream_writer
        client_writer = conn.client_writer

        # Handshake: the request head (minus extensions) up, the response head down, untouched.
        request = await asyncio.wait_for(_read_head(client_reader), HANDSHAKE_TIMEOUT)
        conn.request_head = strip_extensions(request)
        upstream_writer.write(conn.request_head)
        await asyncio.wait_for(upstream_writer.drain(), DRAIN_TIMEOUT)
        response = await asyncio.wait_for(_read_head(upstream_reader), HANDSHAKE_TIMEOUT)
        conn.response_head = response
        client_writer.write(response)
        await asyncio.wait_for(client_writer.drain(), DRAIN_TIMEOUT)
        status = response.split(b"\r\n", 1)[0].split()
        conn.upgraded = len(status) >= 2 and status[1] == b"101"
        compressed = b"sec-websocket-extensions:" in response.lower()

        queues: dict[Direction, asyncio.Queue[_Out]] = {
            "up": asyncio.Queue(),
            "down": asyncio.Queue(),
        }
        pumps = [
            self._pump(conn, "up", client_reader, queues["up"], compressed),
            self._pump(conn, "down", upstream_reader, queues["down"], compressed),
        ]
        writers = [
            self._writer(conn, upstream_writer, queues["up"]),
            self._writer(conn, client_writer, queues["down"]),
        ]
        pump_tasks = [asyncio.create_task(p) for p in pumps]
        writer_tasks = [asyncio.create_task(w) for w in writers]
        conn.tasks.update(pump_tasks + writer_tasks)

        # The connection ends when both directions saw EOF, or one did and the grace passed,
        # or anything failed (the failing task's error is recorded, then everything is aborted).
        pending: set[asyncio.Task[Any]] = set(pump_tasks + writer_tasks)
        finished_writers = 0
        while pending and finished_writers < 2:
            timeout = HALF_CLOSE_GRACE if finished_writers else None
            done, pending = await asyncio.wait(
                pending, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
            if not done:
                return  # grace expired: the finally block closes both sides
            for t in done:
                if t.cancelled():
                    return
                exc = t.exception()
                if exc is not None:
                    if not conn.cut:
                        self._record(conn, exc)
                    conn.abort()
                    return
                if t in writer_tasks:
                    finished_writers += 1
            if conn.cut:
                return

    def _record(self, conn: ProxyConnection, exc: BaseException) -> None:
        # OSError covers resets, refused connects, broken pipes and (3.11+) TimeoutError.
        target = self.network_errors if isinstance(exc, OSError) else self.errors
        target.append(f"connection {conn.index}: {type(exc).__name__}: {exc}")

    async def _pump(
        self,
        conn: ProxyConnection,
        direction: Direction,
        reader: asyncio.StreamReader,
        out: asyncio.Queue[_Out],
        compressed: bool,
    ) -> None:
        """Read units from one side, log them, apply rules, queue them for the other side."""
        loop = asyncio.get_running_loop()
        if not conn.upgraded:
            # Not a WebSocket (a refused upgrade, say): plain bytes both ways.
            while chunk := await reader.read(65536):
                out.put_nowait(_Out(loop.time(), chunk))
            out.put_nowait(_Out(loop.time(), _EOF))
            return

        fragments: list[RawFrame] = []
        while True:
            try:
                frame = await read_frame(reader)
            except asyncio.IncompleteReadError as exc:
                # EOF: forward whatever was read (transparency), then the EOF itself.
                tail = b"".join(f.raw for f in fragments) + exc.partial
                if tail:
                    out.put_nowait(_Out(loop.time(), tail))
                out.put_nowait(_Out(loop.time(), _EOF))
                return
            if frame.opcode >= 0x8:
                # Control frames may sit between fragments; they are units of their own.
                kind = OPCODE_KINDS.get(frame.opcode, f"op{frame.opcode}")
                await self._unit(conn, direction, kind, frame.payload, frame.raw, False, out)
                continue
            fragments.append(frame)
            if not frame.fin:
                continue
            first = fragments[0]
            kind = OPCODE_KINDS.get(first.opcode, f"op{first.opcode}")
            payload = b"".join(f.payload for f in fragments)
            raw = b"".join(f.raw for f in fragments)
            fragments = []
            await self._unit(conn, direction, kind, payload, raw, compressed and first.rsv1, out)

    async def _unit(
        self,
        conn: ProxyConnection,
        direction: Direction,
        kind: str,
        payload: bytes,
        raw: bytes,
        compressed: bool,
        out: asyncio.Queue[_Out],
    ) -> None:
        loop = asyncio.get_running_loop()
        obj, ftype, rid = describe(kind, payload, compressed)
        entry = LogEntry(direction, ftype, rid)
        self.log.append(entry)
        conn.log.append(entry)
        rule = self._match(direction, kind, obj, payload)
        if rule is None:
            out.put_nowait(_Out(loop.time(), raw))
            return
        action = rule.action
        self.actions.append(ActionEntry(action.kind, direction, ftype, rid))
        if action.kind == "delay":
            out.put_nowait(_Out(loop.time() + action.seconds, raw))
        elif action.kind == "jitter":
            out.put_nowait(_Out(loop.time() + random.uniform(0.0, action.seconds), raw))
        elif action.kind == "drop":
            pass
        elif action.kind == "cut":
            out.put_nowait(_Out(loop.time(), _CUT))
        elif action.kind == "cut_after":
            out.put_nowait(_Out(loop.time(), raw))
            out.put_nowait(_Out(loop.time(), _CUT))
        elif action.kind == "stall":
            await asyncio.sleep(action.seconds)
            out.put_nowait(_Out(loop.time(), raw))
        else:  # pragma: no cover - Action.kind is a closed Literal
            raise ValueError(f"unknown action {action.kind!r}")

    def _match(
        self, direction: Direction, kind: str, obj: dict[str, Any] | None, payload: bytes
    ) -> Rule | None:
        for rule in self.rules:
            if rule.direction != direction or kind not in rule.kinds or rule.exhausted:
                continue
            try:
                hit = bool(rule.match(obj, payload))
            except Exception as exc:
                # A broken matcher is a test bug: record it and treat it as "no match".
                self.errors.append(f"rule match raised {type(exc).__name__}: {exc}")
                continue
            if hit:
                rule.hits += 1
                return rule
        return None

    async def _writer(
        self, conn: ProxyConnection, writer: asyncio.StreamWriter, queue: asyncio.Queue[_Out]
    ) -> None:
        loop = asyncio.get_running_loop()
        while True:
            item = await queue.get()
            wait = item.at - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if item.data is _CUT:
                conn.abort()
                return
            if item.data is _EOF:
                if writer.can_write_eof() and not writer.transport.is_closing():
                    with contextlib.suppress(OSError):
                        writer.write_eof()
                return
            assert isinstance(item.data, bytes)
            writer.write(item.data)
            await asyncio.wait_for(writer.drain(), DRAIN_TIMEOUT)


async def _read_head(reader: asyncio.StreamReader) -> bytes:
    """An HTTP head up to and including the blank line (bounded, so garbage cannot grow forever)."""
    head = bytearray()
    while not head.endswith(b"\r\n\r\n"):
        line = await reader.readline()
        if not line:
            raise ConnectionError("peer closed during the HTTP handshake")
        head += line
        if len(head) > MAX_HEAD_BYTES:
            raise ValueError("HTTP head over 64 KiB")
    return bytes(head)


# --- the same API for sync tests ----------------------------------------------------------


class ThreadedFaultProxy:
    """FaultProxy on its own event loop in a daemon thread; every method is synchronous.

    with ThreadedFaultProxy("127.0.0.1", server_port) as proxy:
        page.goto(f"{static}/client.html?ws={proxy.url('/agents/chat/s1')}")
        proxy.add_rule(Rule("down", frame_type("cf_agent_client_tool_invoke"), cut_after()))
        proxy.wait_for(lambda p: len(p.connections) >= 2)
    """

    def __init__(self, upstream_host: str, upstream_port: int, host: str = HOST) -> None:
        self.proxy = FaultProxy(upstream_host, upstream_port, host)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, daemon=True, name="faultproxy"
        )

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def _sync(self, fn: Callable[[], T]) -> T:
        async def run() -> T:
            return fn()

        return self._call(run())

    def start(self) -> ThreadedFaultProxy:
        self._thread.start()
        self._call(self.proxy.start())
        return self

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        try:
            self._call(self.proxy.stop())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            if not self._thread.is_alive():
                self._loop.close()

    def __enter__(self) -> ThreadedFaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        return self.proxy.port

    def url(self, path: str = "/") -> str:
        return self.proxy.url(path)

    # Rule list changes and aborts run on the proxy's loop, so they never race a pump.
    def add_rule(self, rule: Rule) -> Rule:
        return self._sync(lambda: self.proxy.add_rule(rule))

    def clear_rules(self) -> None:
        self._sync(self.proxy.clear_rules)

    def cut_all(self) -> int:
        return self._sync(self.proxy.cut_all)

    def pause(self) -> None:
        self._sync(self.proxy.pause)

    def resume(self) -> None:
        self._sync(self.proxy.resume)

    # Snapshots (copies), safe to read from the test thread.
    @property
    def log(self) -> list[LogEntry]:
        return list(self.proxy.log)

    @property
    def actions(self) -> list[ActionEntry]:
        return list(self.proxy.actions)

    @property
    def errors(self) -> list[str]:
        return list(self.proxy.errors)

    @property
    def network_errors(self) -> list[str]:
        return list(self.proxy.network_errors)

    @property
    def connections(self) -> list[ProxyConnection]:
        return list(self.proxy.connections)

    @property
    def live(self) -> list[ProxyConnection]:
        return self.proxy.live

    @property
    def refused(self) -> int:
        return self.proxy.refused

    def wait_for(self, predicate: Callable[[FaultProxy], bool], timeout: float = 5.0) -> None:
        """Poll `predicate(proxy)` (the underlying FaultProxy) until true, else TimeoutError."""
        deadline = time.monotonic() + timeout
        while not self._sync(lambda: predicate(self.proxy)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"condition not met in {timeout}s; log tail: {self.log[-10:]}")
            time.sleep(0.02)


__all__ = [
    "ALL_KINDS",
    "DATA_KINDS",
    "Action",
    "ActionEntry",
    "FaultProxy",
    "LogEntry",
    "ProxyConnection",
    "Rule",
    "ThreadedFaultProxy",
    "any_frame",
    "cut",
    "cut_after",
    "delay",
    "drop",
    "fields",
    "frame_type",
    "stall",
]
