"""ToolClient + NativeConnector against a tiny scripted `websockets` server on 127.0.0.1.

Real sockets, real asyncio tasks and timers; the server is a few lines of script
per test, so each test says exactly what the server does.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from websockets.asyncio.server import Server, ServerConnection, serve

from clienttools.client import CLIENT_TRANSITIONS, ClientEvent, ToolClient
from clienttools.native import NativeConnector
from clienttools.rules import LocalProtocolError
from clienttools.tools import ToolContext
from clienttools.transport import (
    ConnectionFailed,
    MemoryOutboxStore,
    RegistrationTimeout,
    ToolsRejected,
)
from tests.support.wait import wait_until


class ScriptedServer:
    """Accepts sockets, records every frame, acks tools frames unless told otherwise."""

    def __init__(self, *, ack_tools: bool = True, reject: dict[str, str] | None = None) -> None:
        self.ack_tools = ack_tools
        self.reject = reject or {}
        self.ack_results = False
        self.connections: list[ServerConnection] = []
        self.paths: list[str] = []
        self.frames: asyncio.Queue[tuple[int, dict[str, Any]]] = asyncio.Queue()
        self.server: Server | None = None
        self.url = ""

    async def start(self) -> ScriptedServer:
        self.server = await serve(self._handle, "127.0.0.1", 0)
        port = next(iter(self.server.sockets)).getsockname()[1]
        self.url = f"ws://127.0.0.1:{port}/agents/chat/test"
        return self

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    async def _handle(self, ws: ServerConnection) -> None:
        index = len(self.connections)
        self.connections.append(ws)
        assert ws.request is not None
        self.paths.append(ws.request.path)
        async for message in ws:
            frame = json.loads(message)
            await self.frames.put((index, frame))
            if frame["type"] == "cf_agent_client_tools" and self.ack_tools:
                names = [t["name"] for t in frame["tools"]]
                await ws.send(
                    json.dumps(
                        {
                            "type": "cf_agent_client_tools_ack",
                            "accepted": [n for n in names if n not in self.reject],
                            "rejected": [{"name": n, "reason": r} for n, r in self.reject.items()],
                        }
                    )
                )
            if frame["type"] == "cf_agent_client_tool_result" and self.ack_results:
                await self.ack(frame["requestId"], connection=index)

    async def send(self, frame: dict[str, Any], connection: int = -1) -> None:
        await self.connections[connection].send(json.dumps(frame))

    async def invoke(self, request_id: str, tool: str, input: dict[str, Any], **extra: Any) -> None:
        frame = {
            "type": "cf_agent_client_tool_invoke",
            "requestId": request_id,
            "toolCallId": f"call-{request_id}",
            "toolName": tool,
            "input": input,
            **extra,
        }
        await self.send(frame)

    async def ack(self, request_id: str, connection: int = -1) -> None:
        frame = {
            "type": "cf_agent_client_tool_result_ack",
            "requestId": request_id,
            "outcome": "applied",
        }
        await self.send(frame, connection)

    async def next_frame(self, type: str, timeout: float = 2.0) -> tuple[int, dict[str, Any]]:
        """The next frame of `type` (others are skipped), with the index of its connection."""
        async with asyncio.timeout(timeout):
            while True:
                index, frame = await self.frames.get()
                if frame["type"] == type:
                    return index, frame

    async def no_frame(self, type: str, within: float) -> None:
        with pytest.raises(TimeoutError):
            await self.next_frame(type, timeout=within)


@pytest.fixture
async def server() -> AsyncIterator[ScriptedServer]:
    scripted = await ScriptedServer().start()
    yield scripted
    await scripted.stop()


def clienttools_tasks() -> list[asyncio.Task[Any]]:
    return [t for t in asyncio.all_tasks() if t.get_name().startswith("clienttools")]


@pytest.fixture
async def client(server: ScriptedServer) -> AsyncIterator[ToolClient]:
    client = ToolClient(server.url, connector=NativeConnector(), connect_timeout=2.0)
    add_tools(client)
    yield client
    await client.close()
    assert clienttools_tasks() == []


class Flags:
    cancelled: list[str]

    def __init__(self) -> None:
        self.cancelled = []


def add_tools(client: ToolClient) -> Flags:
    flags = Flags()

    @client.tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @client.tool(name="nap")
    async def nap(seconds: float, ctx: ToolContext) -> str:
        """Sleep, reporting progress; notes a cancellation."""
        try:
            await ctx.progress(0.0, 1.0)
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            flags.cancelled.append(ctx.request_id)
            raise
        return f"slept {seconds}"

    client.flags = flags  # type: ignore[attr-defined]
    return flags


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


# --- connect ---------------------------------------------------------------------------


async def test_connect_returns_after_the_tools_ack(server: ScriptedServer) -> None:
    server.ack_tools = False
    client = ToolClient(server.url, connect_timeout=2.0)
    add_tools(client)
    statuses: list[str] = []
    client.on_status(statuses.append)
    connecting = asyncio.create_task(client.connect())
    _, tools = await server.next_frame("cf_agent_client_tools")
    assert {t["name"] for t in tools["tools"]} == {"add", "nap"}
    # A ping answered proves the client is reading this socket, and still waiting.
    await server.send({"type": "cf_agent_ping", "t": 1})
    await server.next_frame("cf_agent_pong")
    assert not connecting.done() and not client.connected
    await server.send({"type": "cf_agent_client_tools_ack", "accepted": ["add", "nap"]})
    await asyncio.wait_for(connecting, 1.0)
    assert client.connected and statuses == ["connecting", "open"]
    await client.close()
    assert statuses[-1] == "closed" and not client.connected
    assert clienttools_tasks() == []


async def test_connect_to_a_refused_port_fails_fast_and_clearly() -> None:
    url = f"ws://127.0.0.1:{free_port()}/agents/chat/x"
    client = ToolClient(url, token="secret", connect_timeout=2.0)
    started = time.monotonic()
    with pytest.raises(ConnectionFailed) as failure:
        await client.connect()
    assert time.monotonic() - started < 1.0
    message = str(failure.value)
    assert url.split("?")[0] in message and "refused" in message
    assert "secret" not in message, "the token never shows up in errors"
    assert client.status == "closed" and clienttools_tasks() == []


async def test_connect_to_a_server_that_never_acks_times_out(server: ScriptedServer) -> None:
    server.ack_tools = False
    client = ToolClient(server.url, connect_timeout=0.5)
    started = time.monotonic()
    with pytest.raises(RegistrationTimeout) as failure:
        await client.connect()
    assert 0.4 < time.monotonic() - started < 1.5
    assert server.url in str(failure.value) and "acknowledge" in str(failure.value)
    assert clienttools_tasks() == []


async def test_connect_raises_when_tools_are_rejected(server: ScriptedServer) -> None:
    server.reject = {"nap": "tool name reserved"}
    client = ToolClient(server.url, connect_timeout=2.0)
    add_tools(client)
    with pytest.raises(ToolsRejected) as failure:
        await client.connect()
    assert "'nap': tool name reserved" in str(failure.value)
    assert [t.name for t in failure.value.rejected] == ["nap"]
    assert client.status == "closed" and clienttools_tasks() == []


async def test_connect_says_why_the_server_closed_the_socket() -> None:
    async def refuse(ws: ServerConnection) -> None:
        await ws.close(1008, "bad token")

    policing = await serve(refuse, "127.0.0.1", 0)
    port = next(iter(policing.sockets)).getsockname()[1]
    client = ToolClient(f"ws://127.0.0.1:{port}/agents/chat/x", connect_timeout=2.0)
    with pytest.raises(ConnectionFailed, match=r"code 1008 \(bad token\) before acknowledging"):
        await client.connect()
    policing.close()
    await policing.wait_closed()
    assert clienttools_tasks() == []


async def test_connect_reports_an_http_refusal() -> None:
    def forbid(connection: ServerConnection, request: Any) -> Any:
        return connection.respond(403, "origin not allowed\n")

    guarded = await serve(lambda ws: ws.wait_closed(), "127.0.0.1", 0, process_request=forbid)
    port = next(iter(guarded.sockets)).getsockname()[1]
    client = ToolClient(f"ws://127.0.0.1:{port}/agents/chat/x", connect_timeout=2.0)
    with pytest.raises(ConnectionFailed, match="answered HTTP 403"):
        await client.connect()
    guarded.close()
    await guarded.wait_closed()
    assert clienttools_tasks() == []


async def test_token_goes_in_the_query_string(server: ScriptedServer) -> None:
    async with ToolClient(server.url + "?x=1", token="s3cret") as client:
        assert client.connected
    assert server.paths == ["/agents/chat/test?x=1&token=s3cret"]
    assert clienttools_tasks() == []


# --- calls -----------------------------------------------------------------------------


async def test_invoke_gets_a_result(server: ScriptedServer, client: ToolClient) -> None:
    await client.connect()
    await server.invoke("r1", "add", {"a": 2, "b": 40})
    _, result = await server.next_frame("cf_agent_client_tool_result")
    assert result == {"type": "cf_agent_client_tool_result", "requestId": "r1", "output": 42}
    await server.invoke("r2", "nap", {"seconds": 0.01})
    _, progress = await server.next_frame("cf_agent_client_tool_progress")
    assert progress["requestId"] == "r2" and progress["progress"] == 0
    _, result = await server.next_frame("cf_agent_client_tool_result")
    assert result["output"] == "slept 0.01"
    await server.invoke("r3", "add", {"a": "x"})
    _, result = await server.next_frame("cf_agent_client_tool_result")
    assert result["error"]["code"] == "invalid_input"


async def test_three_slow_tools_run_at_once(server: ScriptedServer, client: ToolClient) -> None:
    gate = asyncio.Event()

    @client.tool
    async def wait_for_gate(ctx: ToolContext) -> str:
        """Report that it started, then wait until the test opens the gate."""
        await ctx.progress(0.0)
        await gate.wait()
        return ctx.request_id

    await client.connect()
    for i in range(3):
        await server.invoke(f"r{i}", "wait_for_gate", {})
    started = [await server.next_frame("cf_agent_client_tool_progress") for _ in range(3)]
    assert sorted(frame["requestId"] for _, frame in started) == ["r0", "r1", "r2"]
    assert sorted(client.session.running_request_ids()) == ["r0", "r1", "r2"]  # all at once
    gate.set()
    results = [await server.next_frame("cf_agent_client_tool_result") for _ in range(3)]
    assert sorted(frame["output"] for _, frame in results) == ["r0", "r1", "r2"]


async def test_cancel_reaches_the_tool_and_no_result_follows(
    server: ScriptedServer, client: ToolClient
) -> None:
    await client.connect()
    await server.invoke("r1", "nap", {"seconds": 5})
    await server.next_frame("cf_agent_client_tool_progress")
    await server.send(
        {"type": "cf_agent_client_tool_cancel", "requestId": "r1", "reason": "aborted"}
    )
    await wait_until(lambda: client.flags.cancelled == ["r1"], 2, "the cancel")  # type: ignore[attr-defined]
    await server.no_frame("cf_agent_client_tool_result", within=0.3)


async def test_timeout_ms_cancels_the_tool_and_answers_timeout(
    server: ScriptedServer, client: ToolClient
) -> None:
    await client.connect()
    started = time.monotonic()
    await server.invoke("r1", "nap", {"seconds": 5}, timeoutMs=200)
    _, result = await server.next_frame("cf_agent_client_tool_result")
    assert 0.15 < time.monotonic() - started < 0.6
    assert result["error"]["code"] == "timeout"
    await wait_until(lambda: client.flags.cancelled == ["r1"], 2, "the cancel")  # type: ignore[attr-defined]


async def test_ping_is_answered(server: ScriptedServer, client: ToolClient) -> None:
    await client.connect()
    await server.send({"type": "cf_agent_ping", "t": 7})
    _, pong = await server.next_frame("cf_agent_pong")
    assert pong == {"type": "cf_agent_pong", "t": 7.0}


async def test_garbage_frames_do_not_break_the_connection(
    server: ScriptedServer, client: ToolClient
) -> None:
    await client.connect()
    await server.connections[-1].send(b"\x00\x01binary")
    await server.connections[-1].send("{not json")
    await server.send({"type": "cf_agent_client_tool_invoke", "requestId": "bad"})
    _, refused = await server.next_frame("cf_agent_client_tool_result")
    assert refused["error"]["code"] == "invalid_request"
    await server.invoke("r1", "add", {"a": 1, "b": 1})
    _, result = await server.next_frame("cf_agent_client_tool_result")
    assert result["output"] == 2 and client.connected and len(server.connections) == 1


async def test_tools_added_while_connected_are_announced(
    server: ScriptedServer, client: ToolClient
) -> None:
    await client.connect()
    await server.next_frame("cf_agent_client_tools")

    @client.tool
    def shout(text: str) -> str:
        """Upper-case the text."""
        return text.upper()

    _, tools = await server.next_frame("cf_agent_client_tools")
    assert "shout" in {t["name"] for t in tools["tools"]}


# --- reconnect, outbox, liveness -------------------------------------------------------


async def test_reconnect_reregisters_and_resends_the_unacked_result(
    server: ScriptedServer, client: ToolClient
) -> None:
    statuses: list[str] = []
    client.on_status(statuses.append)
    await client.connect()
    await server.invoke("r1", "add", {"a": 1, "b": 2})
    await server.next_frame("cf_agent_client_tool_result")
    assert "r1" in client.session.outbox()
    dropped = time.monotonic()
    server.connections[0].transport.abort()  # no close frame: like a network failure
    index, _ = await server.next_frame("cf_agent_client_tools")
    assert index == 1 and time.monotonic() - dropped < 1.2  # first retry within 1 s
    index, result = await server.next_frame("cf_agent_client_tool_result")
    assert index == 1 and result["output"] == 3
    assert "r1" in client.session.outbox(), "still unacknowledged"
    await server.ack("r1")
    await wait_until(lambda: client.session.outbox() == {}, 2, "the ack to clear the outbox")
    # "open" is reported by the supervisor's task, which may run after the ack is handled.
    await wait_until(lambda: statuses[-1:] == ["open"], 2, "the status to be open again")
    assert statuses == ["connecting", "open", "reconnecting", "open"]
    server.connections[1].transport.abort()
    await server.next_frame("cf_agent_client_tools")
    await server.no_frame("cf_agent_client_tool_result", within=0.2)


async def test_unacked_results_survive_a_new_client_with_the_same_store(
    server: ScriptedServer,
) -> None:
    store = MemoryOutboxStore()
    first = ToolClient(server.url, outbox_store=store)
    add_tools(first)
    await first.connect()
    await server.invoke("r1", "add", {"a": 1, "b": 2})
    await server.next_frame("cf_agent_client_tool_result")
    await first.close()
    assert store.text is not None and "r1" in store.text

    second = ToolClient(server.url, outbox_store=store)  # as after a page reload
    add_tools(second)
    await second.connect()
    await server.next_frame("cf_agent_client_tools")
    _, result = await server.next_frame("cf_agent_client_tool_result")
    assert result["requestId"] == "r1" and result["output"] == 3
    await server.invoke("r1", "add", {"a": 1, "b": 2}, attempt=2)
    _, again = await server.next_frame("cf_agent_client_tool_result")
    assert again == result
    await server.ack("r1")
    await wait_until(
        lambda: json.loads(store.text)["results"] == [], 2, "the ack to clear the store"
    )
    await second.close()
    assert clienttools_tasks() == []


async def test_a_silent_connection_is_replaced(server: ScriptedServer) -> None:
    client = ToolClient(server.url, ping_interval=0.2)  # dead after 0.5 s of silence
    await client.connect()
    await server.next_frame("cf_agent_client_tools")
    index, _ = await server.next_frame("cf_agent_client_tools", timeout=2.0)
    assert index == 1
    await client.close()
    assert clienttools_tasks() == []


async def test_without_reconnect_an_unexpected_close_closes_the_client(
    server: ScriptedServer,
) -> None:
    client = ToolClient(server.url, reconnect=False)
    await client.connect()
    await server.connections[0].close()
    await asyncio.wait_for(client.wait_closed(), 2.0)
    assert client.status == "closed" and len(server.connections) == 1
    await asyncio.sleep(0)
    assert clienttools_tasks() == []


async def test_close_cancels_running_tools_and_leaves_no_tasks(server: ScriptedServer) -> None:
    before = asyncio.all_tasks()
    client = ToolClient(server.url)
    flags = add_tools(client)
    await client.connect()
    await server.invoke("r1", "nap", {"seconds": 5})
    await server.next_frame("cf_agent_client_tool_progress")
    await client.close()
    assert flags.cancelled == ["r1"]
    await server.no_frame("cf_agent_client_tool_result", within=0.1)
    assert not client._timer.armed
    await server.stop()  # its handler tasks end too; then nothing is left from this test
    assert asyncio.all_tasks() == before
    await client.close()  # twice is fine


# --- chat over the same socket ---------------------------------------------------------


async def test_chat_frames_share_the_socket(server: ScriptedServer, client: ToolClient) -> None:
    await client.connect()
    reply = asyncio.create_task(client.chat.send("hi"))
    _, send = await server.next_frame("send")
    request_id = send["requestId"]
    await server.send({"type": "start", "requestId": request_id})
    for sequence, chunk in enumerate(
        [
            {"type": "start"},
            {"type": "text-start", "id": "t"},
            {"type": "text-delta", "id": "t", "delta": "hello"},
            {"type": "text-end", "id": "t"},
            {"type": "finish"},
        ]
    ):
        await server.send(
            {"type": "chunk", "requestId": request_id, "sequence": sequence, "chunk": chunk}
        )
    await server.send({"type": "end", "requestId": request_id})
    message = await asyncio.wait_for(reply, 2.0)
    assert message.text == "hello"


def test_the_chat_id_defaults_to_the_session_so_a_reload_can_resume() -> None:
    client = ToolClient("ws://127.0.0.1:1/agents/chat/my%20room?x=1", token="t")
    assert client.chat.state.chat_id == "my room"
    assert ToolClient("ws://h/agents/chat/s", chat_id="c").chat.state.chat_id == "c"


# --- the status table ------------------------------------------------------------------


def test_status_table_closes_from_anywhere_and_connects_only_from_rest() -> None:
    assert all(events[ClientEvent.CLOSED] == "closed" for events in CLIENT_TRANSITIONS.values())
    connectable = {
        status for status, events in CLIENT_TRANSITIONS.items() if ClientEvent.CONNECT in events
    }
    assert connectable == {"idle", "closed"}
    reopened = {
        status for status, events in CLIENT_TRANSITIONS.items() if ClientEvent.OPENED in events
    }
    assert reopened == {"connecting", "reconnecting"}


async def test_a_step_the_status_table_does_not_list_raises(server: ScriptedServer) -> None:
    client = ToolClient(server.url, connect_timeout=2.0)
    with pytest.raises(LocalProtocolError):
        client._step(ClientEvent.OPENED)  # idle: nothing was opening
    assert client.status == "idle"
