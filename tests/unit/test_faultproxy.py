"""The fault proxy itself, between a tiny `websockets` echo server and client on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
from websockets.http11 import Request, Response
from websockets.sync.client import connect as sync_connect
from websockets.sync.server import ServerConnection as SyncServerConnection
from websockets.sync.server import serve as sync_serve

from tests.support.faultproxy import (
    FaultProxy,
    LogEntry,
    Rule,
    ThreadedFaultProxy,
    any_frame,
    cut,
    cut_after,
    delay,
    drop,
    fields,
    frame_type,
    jitter,
    stall,
)


def msg(kind: str, rid: str | None = None, **extra: Any) -> str:
    frame: dict[str, Any] = {"type": kind, **extra}
    if rid is not None:
        frame["requestId"] = rid
    return json.dumps(frame)


@dataclass
class Echo:
    """What the echo server saw. `{"type": "fragment"}` is answered in three fragments."""

    port: int = 0
    received: list[str | bytes] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)


@pytest.fixture
async def echo() -> AsyncIterator[Echo]:
    state = Echo()

    async def handler(ws: ServerConnection) -> None:
        assert ws.request is not None
        state.requests.append(ws.request)
        try:
            async for message in ws:
                state.received.append(message)
                if message == msg("fragment"):
                    await ws.send(['{"type":"frag', 'mented","requestId"', ':"f1"}'])
                else:
                    await ws.send(message)
        except ConnectionClosed:
            pass  # cuts are the point of these tests

    def process_request(ws: ServerConnection, request: Request) -> Response | None:
        if request.path == "/missing":
            return ws.respond(404, "no such chat\n")
        return None

    async with serve(handler, "127.0.0.1", 0, process_request=process_request) as server:
        state.port = server.sockets[0].getsockname()[1] if server.sockets else 0
        yield state


@pytest.fixture
async def proxy(echo: Echo) -> AsyncIterator[FaultProxy]:
    fp = await FaultProxy("127.0.0.1", echo.port).start()
    yield fp
    await fp.stop()
    assert fp.errors == []


def client(proxy: FaultProxy, **kwargs: Any) -> Any:
    kwargs.setdefault("compression", None)
    kwargs.setdefault("open_timeout", 5)
    kwargs.setdefault("close_timeout", 2)
    return connect(proxy.url("/agents/chat/s1"), **kwargs)


async def recv(ws: ClientConnection, timeout: float = 5) -> str | bytes:
    return await asyncio.wait_for(ws.recv(), timeout)


async def test_passthrough_many_frames_both_ways(proxy: FaultProxy, echo: Echo) -> None:
    big = msg("big", "r-big", blob="x" * 200_000)  # 64-bit extended length
    medium = msg("medium", "r-med", blob="y" * 1_000)  # 16-bit extended length
    sent: list[str | bytes] = [msg("cf_agent_pong", None, t=i) for i in range(100)]
    sent += [msg("cf_agent_client_tool_result", f"r{i}", output=i) for i in range(100)]
    sent += [big, medium, b"\x00\x01binary\xff", "not json {", msg("unicode", "r-\u00e9\U0001f600")]
    async with client(proxy) as ws:
        for m in sent:
            await ws.send(m)
        echoed = [await recv(ws) for _ in sent]
        assert echoed == sent
        # Fragmented both ways: the client sends three fragments, the server answers in three.
        await ws.send(['{"type":"frag', 'mented","requestId"', ':"f0"}'])
        assert json.loads(await recv(ws)) == {"type": "fragmented", "requestId": "f0"}
        await ws.send(msg("fragment"))
        assert json.loads(await recv(ws)) == {"type": "fragmented", "requestId": "f1"}
        # Control frames pass too.
        pong = await ws.ping(b"hi")
        await asyncio.wait_for(pong, 5)
    assert echo.received[: len(sent)] == sent
    await proxy.wait_for(lambda p: ("down", "ws:close", None) in p.log)
    log = proxy.log
    assert log.count(LogEntry("up", "cf_agent_client_tool_result", "r7")) == 1
    assert ("down", "cf_agent_client_tool_result", "r7") in log
    assert ("up", "big", "r-big") in log and ("down", "big", "r-big") in log
    assert ("up", "ws:binary", None) in log and ("up", "ws:text", None) in log
    assert ("up", "fragmented", "f0") in log and ("down", "fragmented", "f1") in log
    assert ("up", "ws:ping", None) in log and ("down", "ws:pong", None) in log
    assert ("up", "ws:close", None) in log
    assert proxy.actions == []


async def test_delay_holds_the_frame_and_keeps_order(proxy: FaultProxy) -> None:
    rule = proxy.add_rule(Rule("up", frame_type("slow"), delay(0.4)))
    async with client(proxy) as ws:
        await ws.send(msg("quick", "r0"))
        assert json.loads(await recv(ws))["requestId"] == "r0"
        start = time.monotonic()
        await ws.send(msg("slow", "r1"))
        await ws.send(msg("quick", "r2"))
        assert json.loads(await recv(ws))["requestId"] == "r1"
        assert time.monotonic() - start >= 0.35
        assert json.loads(await recv(ws))["requestId"] == "r2"  # queued behind, never reordered
        # Budget spent: the next slow frame is not delayed.
        start = time.monotonic()
        await ws.send(msg("slow", "r3"))
        await recv(ws)
        assert time.monotonic() - start < 0.3
    assert rule.hits == 1
    assert [(a.action, a.request_id) for a in proxy.actions] == [("delay", "r1")]


async def test_jitter_delays_each_frame_by_its_own_amount_in_order(proxy: FaultProxy) -> None:
    proxy.add_rule(Rule("up", any_frame, jitter(0.2), times=None))
    async with client(proxy) as ws:
        # All at once: each gets its own delay, and none overtakes another.
        for i in range(10):
            await ws.send(msg("burst", f"b{i}"))
        assert [json.loads(await recv(ws))["requestId"] for _ in range(10)] == [
            f"b{i}" for i in range(10)
        ]
        # One at a time: the delays differ (all ten under 50 ms has odds of about 1e-6).
        waits = []
        for i in range(10):
            start = time.monotonic()
            await ws.send(msg("single", f"s{i}"))
            await recv(ws)
            waits.append(time.monotonic() - start)
        assert max(waits) >= 0.05
    assert [a.action for a in proxy.actions] == ["jitter"] * 20


async def test_drop_swallows_exactly_the_budget(proxy: FaultProxy, echo: Echo) -> None:
    rule = proxy.add_rule(Rule("up", fields(type="result"), drop(), times=2))
    async with client(proxy) as ws:
        for i in range(4):
            await ws.send(msg("result", f"r{i}"))
        assert json.loads(await recv(ws))["requestId"] == "r2"
        assert json.loads(await recv(ws))["requestId"] == "r3"
    assert [json.loads(m)["requestId"] for m in echo.received] == ["r2", "r3"]
    assert rule.hits == 2 and rule.exhausted
    # The log records what the proxy saw, dropped or not.
    assert [
        e.request_id for e in proxy.log if e.frame_type == "result" and e.direction == "up"
    ] == [
        "r0",
        "r1",
        "r2",
        "r3",
    ]


async def test_drop_in_the_down_direction(proxy: FaultProxy) -> None:
    proxy.add_rule(Rule("down", fields(requestId="r1"), drop()))
    async with client(proxy) as ws:
        await ws.send(msg("a", "r1"))
        await ws.send(msg("a", "r2"))
        assert json.loads(await recv(ws))["requestId"] == "r2"


async def test_cut_aborts_before_forwarding(proxy: FaultProxy, echo: Echo) -> None:
    proxy.add_rule(Rule("up", frame_type("boom"), cut()))
    async with client(proxy) as ws:
        await ws.send(msg("a", "r1"))
        await recv(ws)
        await ws.send(msg("boom", "r2"))
        with pytest.raises(ConnectionClosed):
            await recv(ws)
    await proxy.wait_for(lambda p: not p.live)
    assert [json.loads(m)["type"] for m in echo.received] == ["a"]
    assert proxy.connections[0].cut
    assert proxy.actions[0][:2] == ("cut", "up")


async def test_cut_after_forwards_then_aborts(proxy: FaultProxy, echo: Echo) -> None:
    proxy.add_rule(Rule("down", frame_type("last"), cut_after()))
    async with client(proxy) as ws:
        await ws.send(msg("last", "r1"))
        assert json.loads(await recv(ws))["type"] == "last"
        with pytest.raises(ConnectionClosed):
            await recv(ws)
    assert len(echo.received) == 1


async def test_cut_after_upstream_reaches_the_server(proxy: FaultProxy, echo: Echo) -> None:
    proxy.add_rule(Rule("up", frame_type("result"), cut_after()))
    async with client(proxy) as ws:
        await ws.send(msg("result", "r1"))
        with pytest.raises(ConnectionClosed):
            await recv(ws)
    for _ in range(200):
        if echo.received:
            break
        await asyncio.sleep(0.01)
    assert echo.received == [msg("result", "r1")]


async def test_stall_freezes_one_direction(proxy: FaultProxy) -> None:
    proxy.add_rule(Rule("down", frame_type("a"), stall(0.5)))
    async with client(proxy) as ws:
        start = time.monotonic()
        await ws.send(msg("a", "r1"))
        await ws.send(msg("b", "r2"))
        assert json.loads(await recv(ws))["requestId"] == "r1"
        assert time.monotonic() - start >= 0.45
        assert json.loads(await recv(ws))["requestId"] == "r2"


async def test_stalled_pongs_are_not_answered(proxy: FaultProxy) -> None:
    # What a dead-connection detector (C12) needs: pings go out, nothing comes back.
    proxy.add_rule(Rule("down", any_frame, drop(), times=None, kinds=frozenset({"pong"})))
    async with client(proxy) as ws:
        pong = await ws.ping()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.shield(pong), 0.3)
        await ws.send(msg("still", "r1"))  # data keeps flowing
        assert json.loads(await recv(ws))["type"] == "still"
        pong.cancel()


async def test_cut_all_closes_every_live_connection(proxy: FaultProxy) -> None:
    async with client(proxy) as ws1, client(proxy) as ws2:
        await proxy.wait_for(lambda p: len(p.live) == 2)
        assert proxy.cut_all() == 2
        for ws in (ws1, ws2):
            with pytest.raises(ConnectionClosed):
                await recv(ws)
    await proxy.wait_for(lambda p: not p.live)


async def test_pause_refuses_and_resume_accepts(proxy: FaultProxy) -> None:
    proxy.pause()
    with pytest.raises((InvalidHandshake, ConnectionClosed, OSError, EOFError)):
        async with client(proxy):
            pass
    assert proxy.refused == 1 and proxy.connections == []
    proxy.resume()
    async with client(proxy) as ws:
        await ws.send(msg("a", "r1"))
        await recv(ws)


async def test_pause_keeps_live_connections(proxy: FaultProxy) -> None:
    async with client(proxy) as ws:
        proxy.pause()
        await ws.send(msg("a", "r1"))
        assert json.loads(await recv(ws))["requestId"] == "r1"


async def test_extension_header_is_stripped(proxy: FaultProxy, echo: Echo) -> None:
    # websockets offers permessage-deflate by default, like Chromium; the proxy removes the offer.
    async with connect(proxy.url("/x"), open_timeout=5) as ws:
        assert ws.request is not None and "Sec-WebSocket-Extensions" in ws.request.headers
        assert ws.response is not None and "Sec-WebSocket-Extensions" not in ws.response.headers
        await ws.send(msg("compressible", "r1", blob="z" * 5000))
        await recv(ws)
    assert "Sec-WebSocket-Extensions" not in echo.requests[0].headers
    assert b"sec-websocket-extensions" not in proxy.connections[0].request_head.lower()
    assert ("up", "compressible", "r1") in proxy.log  # payload readable: nothing was deflated


async def test_refused_upgrade_is_passed_through(proxy: FaultProxy) -> None:
    with pytest.raises(InvalidStatus) as info:
        async with connect(proxy.url("/missing"), compression=None, open_timeout=5):
            pass
    assert info.value.response.status_code == 404
    await proxy.wait_for(lambda p: not p.live)
    assert not proxy.connections[0].upgraded


async def test_unreachable_upstream_is_a_network_error() -> None:
    # A server that is down (restart tests): the client's connect fails, the proxy carries on.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead_port = probe.getsockname()[1]
    async with FaultProxy("127.0.0.1", dead_port) as fp:
        with pytest.raises((InvalidHandshake, ConnectionClosed, OSError, EOFError)):
            async with connect(fp.url("/s"), compression=None, open_timeout=5):
                pass
        await fp.wait_for(lambda p: not p.live)
        assert fp.errors == []
        assert len(fp.network_errors) == 1 and "ConnectionRefusedError" in fp.network_errors[0]


async def test_broken_matcher_is_recorded_not_fatal(proxy: FaultProxy) -> None:
    def broken(frame: dict[str, Any] | None, payload: bytes) -> bool:
        raise RuntimeError("matcher bug")

    proxy.add_rule(Rule("up", broken, drop()))
    async with client(proxy) as ws:
        await ws.send(msg("a", "r1"))
        assert json.loads(await recv(ws))["requestId"] == "r1"
    assert any("matcher bug" in e for e in proxy.errors)
    proxy.errors.clear()


async def test_stop_leaves_no_tasks(echo: Echo) -> None:
    before = asyncio.all_tasks()
    fp = await FaultProxy("127.0.0.1", echo.port).start()
    fp.add_rule(Rule("down", any_frame, stall(3600)))  # a frozen direction must not block stop()
    ws1 = await client(fp)
    ws2 = await client(fp)
    await ws1.send(msg("a", "r1"))
    await fp.wait_for(lambda p: len(p.actions) == 1)
    assert len(asyncio.all_tasks() - before) > 4  # handlers, pumps and writers were running
    await fp.stop()
    for ws in (ws1, ws2):
        with pytest.raises(ConnectionClosed):
            await recv(ws)
        await ws.close()
    # Proxy tasks are gone the moment stop() returns; no other task is left either.
    leftover = asyncio.all_tasks() - before - {asyncio.current_task()}
    assert leftover == set()
    assert fp.errors == []


def test_threaded_proxy_sync_api() -> None:
    received: list[str | bytes] = []

    def handler(ws: SyncServerConnection) -> None:
        try:
            for message in ws:
                received.append(message)
                ws.send(message)
        except ConnectionClosed:
            pass

    with sync_serve(handler, "127.0.0.1", 0) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            with ThreadedFaultProxy("127.0.0.1", server.socket.getsockname()[1]) as proxy:
                rule = proxy.add_rule(Rule("down", frame_type("bye"), cut_after()))
                with sync_connect(proxy.url("/s"), compression=None, open_timeout=5) as ws:
                    ws.send(msg("hello", "r1"))
                    assert json.loads(ws.recv(timeout=5))["requestId"] == "r1"
                    ws.send(msg("bye", "r2"))
                    assert json.loads(ws.recv(timeout=5))["requestId"] == "r2"
                    with pytest.raises(ConnectionClosed):
                        ws.recv(timeout=5)
                proxy.wait_for(lambda p: not p.live)
                assert rule.hits == 1
                assert ("up", "hello", "r1") in proxy.log
                proxy.pause()
                with pytest.raises((InvalidHandshake, ConnectionClosed, OSError, EOFError)):
                    sync_connect(proxy.url("/s"), compression=None, open_timeout=5)
                assert proxy.refused == 1
                proxy.resume()
                with sync_connect(proxy.url("/s"), compression=None, open_timeout=5) as ws:
                    proxy.wait_for(lambda p: len(p.live) == 1)
                    assert proxy.cut_all() == 1
                    with pytest.raises(ConnectionClosed):
                        ws.recv(timeout=5)
                assert proxy.errors == []
        finally:
            server.shutdown()
            thread.join(5)
    assert received == [msg("hello", "r1"), msg("bye", "r2")]
