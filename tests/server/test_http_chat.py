"""The AI SDK's HTTP chat transport on a real server: a POST per turn answered as an event
stream, the GET that resumes it, abort, approvals, keep-alives, and every refusal."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from server_harness import ChunkCollector, FakeBrowser, settled, tool_spec
from sse_client import OPENED, HttpResponse, chat_body
from starlette.applications import Starlette
from starlette.routing import Mount

from clienttools_server.app import RunningServer, _EmbeddedServer, create_app, uvicorn_config
from clienttools_server.config import ServerConfig

SSE_HEADERS = {
    "content-type": "text/event-stream",
    "cache-control": "no-cache",
    "x-vercel-ai-ui-message-stream": "v1",
    "x-accel-buffering": "no",
}


@pytest.fixture(autouse=True)
async def close_responses() -> AsyncIterator[None]:
    yield
    while OPENED:
        OPENED.pop().cut()


async def post(
    server: RunningServer,
    body: bytes,
    session: str = "s1",
    headers: dict[str, str] | None = None,
    path: str | None = None,
) -> HttpResponse:
    hdrs = {"content-type": "application/json", **(headers or {})}
    return await HttpResponse.open(
        server.host, server.port, "POST", path or f"/agents/chat/{session}", body, hdrs
    )


async def get(server: RunningServer, path: str, **headers: str) -> HttpResponse:
    return await HttpResponse.open(server.host, server.port, "GET", path, None, headers)


def collect(collector: ChunkCollector, key: str, chunks: list[dict[str, Any]]) -> None:
    """Hand a whole response to the session's one node run (uiMessageChunkSchema and
    readUIMessageStream)."""
    for sequence, chunk in enumerate(chunks):
        collector.add(key, sequence, chunk)
    collector.finish(key, "end")


class Gate:
    """A page tool that waits until released, so a response can be cut while it runs."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, tool_input: dict[str, Any]) -> Any:
        self.entered.set()
        await self.release.wait()
        return {"slow": tool_input}


async def test_a_turn_calls_the_page_tool_inside_the_response(
    server: RunningServer, open_browser: Any, chunk_collector: ChunkCollector
) -> None:
    page = await open_browser(server, "s1")

    async def echo(tool_input: dict[str, Any]) -> Any:
        return {"echo": tool_input}

    await page.register([tool_spec("echo")], handlers={"echo": echo})
    response = await post(server, chat_body('call echo {"x": 1}', theme="dark"))
    assert response.status == 200
    for name, value in SSE_HEADERS.items():
        assert response.headers[name] == value
    blocks = [block async for block in response.events()]
    assert blocks[-1] == "data: [DONE]"
    assert all(b.startswith("data: ") and "\n" not in b for b in blocks), blocks
    chunks = [json.loads(b.removeprefix("data: ")) for b in blocks[:-1]]
    types = [c["type"] for c in chunks]
    assert types[0] == "start" and types[-1] == "finish"
    assert types.index("tool-input-available") < types.index("tool-output-available")
    assert types.index("tool-output-available") < types.index("text-delta", 3)
    output = next(c for c in chunks if c["type"] == "tool-output-available")
    assert output["output"] == {"echo": {"x": 1}}
    text = "".join(c["delta"] for c in chunks if c["type"] == "text-delta")
    assert text == 'echo -> {"echo":{"x":1}}'
    assert len(page.invokes) == 1
    collect(chunk_collector, "http:turn", chunks)
    await settled(server.hub)


async def test_a_cut_response_keeps_running_and_the_get_resumes_it(
    server: RunningServer, open_browser: Any, chunk_collector: ChunkCollector
) -> None:
    page = await open_browser(server, "s1")
    gate = Gate()
    await page.register([tool_spec("slow")], handlers={"slow": gate})
    response = await post(server, chat_body('call slow {"n": 2}'))
    first = await response.chunks_until("tool-input-available")
    await gate.entered.wait()
    response.cut()  # useChat().stop(): the fetch is aborted
    await asyncio.sleep(0.1)
    assert server.hub.stats()["runs"] == 1  # the run goes on
    resumed = await get(server, "/agents/chat/s1/chat-1/stream")
    assert resumed.status == 200
    assert resumed.headers["x-vercel-ai-ui-message-stream"] == "v1"
    replayed = await resumed.chunks_until("tool-input-available")
    assert replayed == first  # from the response's first chunk
    gate.release.set()
    rest = await resumed.chunks_until()
    assert resumed.blocks[-1] == "data: [DONE]"
    types = [c["type"] for c in rest]
    assert types[0] == "tool-output-available" and types[-1] == "finish"
    collect(chunk_collector, "http:resumed", replayed + rest)
    nothing = await get(server, "/agents/chat/s1/chat-1/stream")
    assert nothing.status == 204
    assert await nothing.body() == b""
    await settled(server.hub)


async def test_nothing_active_answers_204(server: RunningServer) -> None:
    response = await get(server, "/agents/chat/s1/never-used/stream")
    assert response.status == 204


async def test_keep_alive_comments_while_a_page_tool_runs(
    start_server: Any, open_browser: Any
) -> None:
    server = await start_server(sse_keepalive=0.05)
    page = await open_browser(server, "s1")
    gate = Gate()
    await page.register([tool_spec("slow")], handlers={"slow": gate})
    response = await post(server, chat_body("call slow {}"))
    await response.chunks_until("tool-input-available")
    await gate.entered.wait()
    await asyncio.sleep(0.5)  # ten intervals: at least three even on a loaded machine
    gate.release.set()
    await response.chunks_until()
    after_input = response.blocks[response.blocks.index(next(
        b for b in response.blocks if '"tool-input-available"' in b
    )) + 1 :]  # fmt: skip
    kept = []
    for block in after_input:
        if '"tool-output-available"' in block:
            break
        kept.append(block)
    assert len(kept) >= 3 and set(kept) == {": keep-alive"}, kept
    await settled(server.hub)


async def test_a_second_post_while_the_chat_streams_is_409_and_other_chats_go_on(
    server: RunningServer, open_browser: Any
) -> None:
    page = await open_browser(server, "s1")
    gate = Gate()
    await page.register([tool_spec("slow")], handlers={"slow": gate})
    first = await post(server, chat_body("call slow {}"))
    await first.chunks_until("tool-input-available")
    second = await post(server, chat_body("hello again"))
    assert second.status == 409
    assert second.headers["content-type"] == "application/json"
    assert await second.json() == {"error": "a response is already streaming for this chat"}
    other = await post(server, chat_body("hello", chat_id="chat-2"))
    assert other.status == 200
    assert [c["type"] for c in await other.chunks_until()][-1] == "finish"
    gate.release.set()
    assert [c["type"] for c in await first.chunks_until()][-1] == "finish"
    await settled(server.hub)


async def test_the_abort_route_stops_the_run(server: RunningServer, open_browser: Any) -> None:
    page = await open_browser(server, "s1")
    gate = Gate()
    await page.register([tool_spec("slow")], handlers={"slow": gate})
    response = await post(server, chat_body("call slow {}"))
    await response.chunks_until("tool-input-available")
    await gate.entered.wait()
    aborted = await post(server, b"", path="/agents/chat/s1/chat-1/abort")
    assert aborted.status == 200
    assert await aborted.json() == {"aborted": True}
    rest = await response.chunks_until()
    assert rest[-1]["type"] == "abort"
    assert response.blocks[-1] == "data: [DONE]"
    cancel = await page.expect("cf_agent_client_tool_cancel")
    assert cancel["reason"] == "aborted"
    again = await post(server, b"", path="/agents/chat/s1/chat-1/abort")
    assert await again.json() == {"aborted": False}
    # Another session cannot abort this one's chat.
    response = await post(server, chat_body("call slow {}", chat_id="chat-3"))
    await response.chunks_until("tool-input-available")
    foreign = await post(server, b"", path="/agents/chat/s2/chat-3/abort")
    assert await foreign.json() == {"aborted": False}
    gate.release.set()
    assert (await response.chunks_until())[-1]["type"] == "finish"
    await settled(server.hub)


async def test_an_approval_inside_the_stream(server: RunningServer, open_browser: Any) -> None:
    page = await open_browser(server, "s1")

    async def delete(tool_input: dict[str, Any]) -> Any:
        return {"deleted": tool_input["name"]}

    await page.register([tool_spec("delete", needsApproval=True)], handlers={"delete": delete})
    response = await post(server, chat_body('call delete {"name": "a.txt"}'))
    asked = (await response.chunks_until("tool-approval-request"))[-1]
    path = "/agents/chat/s1/chat-1/approval"
    wrong = await post(
        server, json.dumps({"toolCallId": "nope", "approved": True}).encode(), path=path
    )
    assert wrong.status == 409
    assert "no approval is pending" in (await wrong.json())["error"]
    bad = await post(server, json.dumps({"toolCallId": asked["toolCallId"]}).encode(), path=path)
    assert bad.status == 400
    assert "approved" in (await bad.json())["error"]
    # As AbstractChat.addToolApprovalResponse takes it: the approvalId as `id`.
    body = json.dumps({"id": asked["approvalId"], "approved": True}).encode()
    answer = await post(server, body, path=path)
    assert answer.status == 200
    assert await answer.json() == {"outcome": "applied"}
    rest = await response.chunks_until()
    output = next(c for c in rest if c["type"] == "tool-output-available")
    assert output["output"] == {"deleted": "a.txt"}
    assert rest[-1]["type"] == "finish"
    await settled(server.hub)


BAD_BODIES: list[tuple[bytes, str]] = [
    (b"{not json", "not valid JSON"),
    (b"[1, 2]", "must be a JSON object"),
    (b"\xff\xfe", "not valid UTF-8"),
    (b'{"id": "c", "messages": [], "trigger": "submit-message", "x": NaN}', "not valid JSON"),
    (b'{"messages": [], "trigger": "submit-message"}', "'id'"),
    (b'{"id": "c", "trigger": "submit-message"}', "'messages'"),
    (b'{"id": "c", "messages": []}', "'trigger'"),
    (b'{"id": 5, "messages": [], "trigger": "submit-message"}', "id"),
    (b'{"id": "c", "messages": "hi", "trigger": "submit-message"}', "messages"),
    (b'{"id": "c", "messages": [], "trigger": "resume-stream"}', "trigger"),
    (b'{"id": "c", "messages": [], "trigger": "explode"}', "trigger"),
    (b'{"id": "c", "messages": [], "trigger": "submit-message", "messageId": 3}', "messageId"),
    (b'{"id": "", "messages": [], "trigger": "submit-message"}', "id"),
    (b'{"id": "c", "messages": [], "trigger": "submit-message", "s": "\\ud800"}', "UTF-8"),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
]


@pytest.mark.parametrize(("body", "says"), BAD_BODIES)
async def test_a_bad_body_is_400_with_a_json_error(
    server: RunningServer, body: bytes, says: str
) -> None:
    response = await post(server, body)
    assert response.status == 400
    error = (await response.json())["error"]
    assert says in error, error
    await settled(server.hub)


async def test_an_oversize_body_is_413(server: RunningServer) -> None:
    big = chat_body("x" * (server.hub.config.max_frame_bytes + 1))
    response = await post(server, big)
    assert response.status == 413
    assert "larger than 1,048,576 bytes" in (await response.json())["error"]
    ok = await post(server, chat_body("hello"))
    assert ok.status == 200
    await ok.body()


async def test_the_token_and_the_origin(start_server: Any) -> None:
    server = await start_server(token="secret", admin_token="admin")
    body = chat_body("hello")
    for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": "Basic secret"}):
        refused = await post(server, body, headers=headers)
        assert refused.status == 401
        assert refused.headers["www-authenticate"] == "Bearer"
        assert await refused.json() == {"error": "unauthorized"}
    resume = await get(server, "/agents/chat/s1/chat-1/stream")
    assert resume.status == 401
    for token in ("secret", "admin"):
        ok = await post(
            server, chat_body("hi", chat_id=token), headers={"authorization": f"Bearer {token}"}
        )
        assert ok.status == 200
        await ok.body()
    foreign = await post(
        server, body, headers={"authorization": "Bearer secret", "origin": "http://evil.example"}
    )
    assert foreign.status == 403
    assert await foreign.json() == {"error": "this origin is not allowed"}
    own = f"http://{server.host}:{server.port}"
    same = await post(server, body, headers={"authorization": "Bearer secret", "origin": own})
    assert same.status == 200
    await same.body()
    await settled(server.hub)


@contextlib.asynccontextmanager
async def mounted(prefix: str) -> AsyncIterator[RunningServer]:
    """create_app mounted under ``prefix`` in a parent app, as examples/fastapi_app.py does."""
    config = ServerConfig(port=0, log_level="warning")
    inner = create_app(config)
    outer = Starlette(
        routes=[Mount(prefix, app=inner)],
        lifespan=lambda _: inner.router.lifespan_context(inner),
    )
    server = _EmbeddedServer(uvicorn_config(outer, config))
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.005)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield RunningServer(inner, config.host, port)
    finally:
        server.should_exit = True
        await task


async def test_mounted_under_a_prefix(chunk_collector: ChunkCollector) -> None:
    async with mounted("/clienttools") as server:
        url = f"ws://{server.host}:{server.port}/clienttools/agents/chat/s1"
        page = await FakeBrowser.connect(url, chunk_collector)

        async def echo(tool_input: dict[str, Any]) -> Any:
            return tool_input

        await page.register([tool_spec("echo")], handlers={"echo": echo})
        response = await post(
            server, chat_body('call echo {"a": 1}'), path="/clienttools/agents/chat/s1"
        )
        chunks = await response.chunks_until()
        assert next(c for c in chunks if c["type"] == "tool-output-available")["output"] == {"a": 1}
        nothing = await get(server, "/clienttools/agents/chat/s1/chat-1/stream")
        assert nothing.status == 204
        await page.close()
        await settled(server.hub)


async def test_a_page_on_another_allowed_origin_gets_cors_headers(start_server: Any) -> None:
    app = "http://app.example:3000"
    server = await start_server(allow_origins=(app,))
    preflight = await HttpResponse.open(
        server.host, server.port, "OPTIONS", "/agents/chat/s1", None,
        {"origin": app, "access-control-request-method": "POST",
         "access-control-request-headers": "content-type"},
    )  # fmt: skip
    assert preflight.status == 204
    assert preflight.headers["access-control-allow-origin"] == app
    assert "POST" in preflight.headers["access-control-allow-methods"]
    assert "content-type" in preflight.headers["access-control-allow-headers"]
    ok = await post(server, chat_body("hello"), headers={"origin": app})
    assert ok.status == 200
    assert ok.headers["access-control-allow-origin"] == app
    assert ok.headers["access-control-expose-headers"] == "x-vercel-ai-ui-message-stream"
    await ok.body()
    nothing = await get(server, "/agents/chat/s1/none/stream", origin=app)
    assert nothing.status == 204
    assert nothing.headers["access-control-allow-origin"] == app
    evil = "http://evil.example"
    refused = await HttpResponse.open(
        server.host, server.port, "OPTIONS", "/agents/chat/s1/c/abort", None, {"origin": evil}
    )
    assert refused.status == 403
    assert "access-control-allow-origin" not in refused.headers
    blocked = await post(server, chat_body("hello"), headers={"origin": evil})
    assert blocked.status == 403
    assert "access-control-allow-origin" not in blocked.headers
    plain = await post(server, chat_body("hello", chat_id="c2"))
    assert "access-control-allow-origin" not in plain.headers
    await plain.body()
    await settled(server.hub)


async def test_a_session_name_over_the_limit_is_404(server: RunningServer) -> None:
    response = await post(server, chat_body("hello"), session="s" * 257)
    assert response.status == 404
    assert await response.json() == {"error": "no such session"}
    longest = await post(server, chat_body("hello"), session="s" * 256)
    assert longest.status == 200
    await longest.body()
    await settled(server.hub)
