"""Who may see what (O1-O4), across real server processes: SQLite, and two on one PostgreSQL.

Alice's page opens session ``desk`` and starts a chat whose run pauses on
three steps: a page call nobody answers (``lookup``) and two approvals
(``transfer``). Then Bob, a principal of his own with a valid signed token,
tries everything against it, on the other process when there are two: each
attempt in ATTEMPTS. Every one is refused as O1-O4 say (the socket closes
with 4403 before any frame, an HTTP route answers exactly what it answers for
an execution that does not exist, a listing leaves Alice's sessions out),
nothing of Alice's is in any answer or close reason, and afterwards her run is
exactly as it was. Then an operator does each of the same things, and Alice's
response ends with what the operator decided.

ATTEMPTS is a table: a case is a name and a coroutine that makes the attempt
and checks its refusal, returning every byte that came back so the test can
check none of it is Alice's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from server_harness import ChunkCollector, FakeBrowser, tool_spec
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from clienttools_server.wire.auth import CLOSE_NOT_YOURS, mint_token
from tests.support.http import Reply, http_json
from tests.support.server_process import ServerProcess, running
from tests.support.wait import wait_until

# Real server processes: the whole suite (make test), not the fast lane (make check).
pytestmark = pytest.mark.process

SECRET = "cross-tenant-secret-0123456789"
SESSION = "desk"
CHAT = "alice-chat"
PROMPT = 'call lookup {"city": "Berlin"}\ncall transfer {"amount": 5}\ncall transfer {"amount": 7}'

ALICE = mint_token(SECRET, "alice", ttl=3600)
BOB = mint_token(SECRET, "bob", ttl=3600)
OPERATOR = mint_token(SECRET, "ops", operator=True, ttl=3600)
TOKENS = (ALICE, BOB, OPERATOR)


@dataclass
class Tenancy:
    """Alice's page and paused run on ``home``; the others try on ``away``."""

    home: ServerProcess
    away: ServerProcess
    logs: list[Path]
    page: FakeBrowser
    request_id: str
    run: str
    lookup: int  # seq of the page call nobody answers
    approvals: list[int]  # seqs of the two approval steps
    invoke: dict[str, Any]  # the invoke of lookup, as Alice's page got it
    approval_call: str  # the toolCallId Alice's page would answer

    async def http(
        self, method: str, path: str, token: str | None, body: Any = None, *, home: bool = False
    ) -> Reply:
        server = self.home if home else self.away
        return await http_json("127.0.0.1", server.port, method, path, body, token=token)

    def ws_url(self, token: str, session: str = SESSION, *, home: bool = False) -> str:
        server = self.home if home else self.away
        return f"{server.ws_url(session)}?token={token}"

    async def detail(self) -> dict[str, Any]:
        reply = await self.http("GET", f"/executions/{self.run}", OPERATOR, home=True)
        assert reply.status == 200, reply.body
        found: dict[str, Any] = reply.json
        return found

    def secrets(self) -> list[str]:
        """What must never appear in anything Bob gets back: Alice's data."""
        ids = [self.run, SESSION, CHAT, self.invoke["requestId"], self.approval_call]
        return [*ids, "Berlin", "lookup", "transfer", ALICE]


@pytest.fixture(params=["sqlite", "postgres"], ids=["sqlite", "postgres-2-processes"])
async def tenancy(
    request: pytest.FixtureRequest, tmp_path: Path, chunk_collector: ChunkCollector
) -> AsyncIterator[Tenancy]:
    args = ["--secret", SECRET, "--log-level", "info"]
    if request.param == "sqlite":
        args += ["--db", str(tmp_path / "ledger.sqlite3")]
        servers = [ServerProcess(args, log=tmp_path / "server-1.log")]
    else:
        url = request.getfixturevalue("postgres").fresh_url()
        servers = [
            ServerProcess([*args, "--db", url], log=tmp_path / f"server-{n}.log") for n in (1, 2)
        ]
    async with running(servers):
        home, away = servers[0], servers[-1]
        page = await FakeBrowser.connect(f"{home.ws_url(SESSION)}?token={ALICE}", chunk_collector)
        try:

            async def moved(arguments: dict[str, Any]) -> str:
                return f"moved {arguments['amount']}"

            await page.register(
                [tool_spec("lookup"), tool_spec("transfer", needsApproval=True)],
                handlers={"transfer": moved},
            )
            request_id = await page.start_chat(PROMPT, chat_id=CHAT)
            invoke = await page.expect("cf_agent_client_tool_invoke", 20, toolName="lookup")
            approval = await page.chunk(request_id, "tool-approval-request", 20)

            async def paused() -> list[dict[str, Any]]:
                reply = await http_json(
                    "127.0.0.1", home.port, "GET", "/executions?status=paused", token=OPERATOR
                )
                found: list[dict[str, Any]] = reply.json["executions"]
                return found if found and len(found[0]["pending"]) >= 3 else []

            await wait_until(paused, 20, "three pending steps")
            [execution] = await paused()
            pending = execution["pending"]
            yield Tenancy(
                home, away, [s.log for s in servers if s.log is not None], page, request_id,
                execution["executionId"],
                lookup=next(p["seq"] for p in pending if p["toolName"] == "lookup"),
                approvals=[p["seq"] for p in pending if p["resolution"] == "approval"],
                invoke=invoke, approval_call=approval["toolCallId"],
            )  # fmt: skip
        finally:
            await page.close()


# --------------------------------------------------------------------------- the attempts


async def socket_refused(url: str, frames: list[dict[str, Any]]) -> str:
    """Open ``url``, send ``frames``, read to the close: 4403, no reason, no frame at all."""
    received: list[Any] = []
    async with connect(url) as ws:
        for frame in frames:
            with contextlib.suppress(ConnectionClosed):
                await ws.send(json.dumps(frame))
        with contextlib.suppress(ConnectionClosed):
            async with asyncio.timeout(10):
                async for message in ws:
                    received.append(message)
        assert (ws.close_code, ws.close_reason, received) == (CLOSE_NOT_YOURS, "", [])
    return ""


async def as_if_missing(t: Tenancy, method: str, path: str, token: str, body: Any = None) -> str:
    """The answer to ``path``, checked to be word for word the answer for a made-up execution."""
    reply = await t.http(method, path, token, body)
    stranger = uuid.uuid4().hex
    missing = await t.http(method, path.replace(t.run, stranger), token, body)
    assert reply.status == missing.status, (reply.status, reply.body)
    assert reply.status in (404, 422), reply.body
    assert reply.body.replace(t.run.encode(), stranger.encode()) == missing.body
    assert {k for k in reply.headers if k != "date"} == {k for k in missing.headers if k != "date"}
    return reply.body.decode().replace(t.run, "")  # the id was Bob's own input


def _send(chat: str) -> dict[str, Any]:
    return {
        "type": "send", "requestId": "bob-1", "id": chat, "trigger": "submit-message",
        "messages": [{"id": "u1", "role": "user", "parts": [{"type": "text", "text": "hi"}]}],
        "headers": {}, "body": {},
    }  # fmt: skip


def _resume(chat: str) -> dict[str, Any]:
    return {"type": "resume", "requestId": "bob-2", "id": chat, "headers": {}, "body": {}}


def _tools() -> dict[str, Any]:
    return {
        "type": "cf_agent_client_tools", "protocol": 1, "clientId": "bob-page",
        "tools": [tool_spec("lookup")],
    }  # fmt: skip


async def _connect(t: Tenancy, token: str) -> str:
    return await socket_refused(t.ws_url(token), [])


async def _register(t: Tenancy, token: str) -> str:
    return await socket_refused(t.ws_url(token), [_tools()])


async def _send_chat(t: Tenancy, token: str) -> str:
    return await socket_refused(t.ws_url(token), [_send(CHAT)])


async def _resume_chat(t: Tenancy, token: str) -> str:
    return await socket_refused(t.ws_url(token), [_resume(CHAT)])


async def _answer_invoke(t: Tenancy, token: str) -> str:
    result = {"type": "cf_agent_client_tool_result", "requestId": t.invoke["requestId"]}
    return await socket_refused(t.ws_url(token), [_tools(), {**result, "output": "stolen"}])


async def _approve_on_socket(t: Tenancy, token: str) -> str:
    frame = {"type": "cf_agent_tool_approval", "toolCallId": t.approval_call, "approved": True}
    return await socket_refused(t.ws_url(token), [frame])


async def _from_own_session(t: Tenancy, token: str, frame: dict[str, Any]) -> str:
    """On a session of his own, Bob names Alice's chat by its id: refused as H5 says."""
    async with connect(t.ws_url(token, session="bob-own")) as ws:
        await ws.send(json.dumps(frame))
        async with asyncio.timeout(10):
            answer = json.loads(await ws.recv())
        assert answer["type"] == "cf_agent_protocol_error", answer
        assert set(answer) <= {"type", "message", "requestId"}, answer
        return json.dumps(answer)


async def _resume_from_own_session(t: Tenancy, token: str) -> str:
    return await _from_own_session(t, token, _resume(CHAT))


async def _subscribe_from_own_session(t: Tenancy, token: str) -> str:
    return await _from_own_session(t, token, {"type": "cf_agent_chat_subscribe", "id": CHAT})


async def _clear_from_own_session(t: Tenancy, token: str) -> str:
    return await _from_own_session(t, token, {"type": "cf_agent_chat_clear", "id": CHAT})


async def _subscribe(t: Tenancy, token: str) -> str:
    return await socket_refused(t.ws_url(token), [{"type": "cf_agent_chat_subscribe", "id": CHAT}])


async def _clear(t: Tenancy, token: str) -> str:
    return await socket_refused(t.ws_url(token), [{"type": "cf_agent_chat_clear", "id": CHAT}])


async def chat_as_if_missing(t: Tenancy, method: str, path: str, token: str) -> str:
    """The answer to ``path``, checked to be word for word the answer for a made-up chat."""
    reply = await t.http(method, path, token)
    stranger = uuid.uuid4().hex
    missing = await t.http(method, path.replace(CHAT, stranger), token)
    assert reply.status == missing.status, (reply.status, reply.body)
    assert reply.status in (404, 422), reply.body
    assert reply.body.replace(CHAT.encode(), stranger.encode()) == missing.body
    assert {k for k in reply.headers if k != "date"} == {k for k in missing.headers if k != "date"}
    return reply.body.decode().replace(CHAT, "")  # the id was Bob's own input


async def _list_chats(t: Tenancy, token: str) -> str:
    reply = await t.http("GET", "/chats", token)
    assert (reply.status, reply.json) == (200, {"chats": []})
    return reply.body.decode()


async def _list_chats_of_session(t: Tenancy, token: str) -> str:
    reply = await t.http("GET", f"/chats?session={SESSION}", token)
    assert (reply.status, reply.json) == (200, {"chats": []})
    return reply.body.decode()


async def _list_chats_before(t: Tenancy, token: str) -> str:
    return await chat_as_if_missing(t, "GET", f"/chats?before={CHAT}", token)


async def _read_chat(t: Tenancy, token: str) -> str:
    return await chat_as_if_missing(t, "GET", f"/chats/{CHAT}", token)


async def _delete_chat(t: Tenancy, token: str) -> str:
    return await chat_as_if_missing(t, "DELETE", f"/chats/{CHAT}", token)


async def _list(t: Tenancy, token: str) -> str:
    reply = await t.http("GET", "/executions", token)
    assert (reply.status, reply.json) == (200, {"executions": []})
    return reply.body.decode()


async def _list_session(t: Tenancy, token: str) -> str:
    reply = await t.http("GET", f"/executions?session={SESSION}&status=paused", token)
    assert (reply.status, reply.json) == (200, {"executions": []})
    return reply.body.decode()


async def _list_before(t: Tenancy, token: str) -> str:
    return await as_if_missing(t, "GET", f"/executions?before={t.run}", token)


async def _read(t: Tenancy, token: str) -> str:
    return await as_if_missing(t, "GET", f"/executions/{t.run}", token)


async def _resolve(t: Tenancy, token: str) -> str:
    path = f"/executions/{t.run}/steps/{t.lookup}/resolve"
    return await as_if_missing(t, "POST", path, token, {"output": "stolen"})


async def _approve(t: Tenancy, token: str) -> str:
    path = f"/executions/{t.run}/steps/{t.approvals[0]}/approve"
    return await as_if_missing(t, "POST", path, token, {"approved": True})


async def _reject(t: Tenancy, token: str) -> str:
    path = f"/executions/{t.run}/steps/{t.approvals[1]}/reject"
    return await as_if_missing(t, "POST", path, token, {"message": "no"})


async def _reject_missing_seq(t: Tenancy, token: str) -> str:
    return await as_if_missing(t, "POST", f"/executions/{t.run}/steps/99/reject", token, {})


async def _over_http_chat(t: Tenancy, token: str, method: str, path: str, body: Any) -> str:
    """The AI SDK's HTTP chat transport on Alice's session: 404, as for a session of nothing."""
    reply = await t.http(method, f"/agents/chat/{SESSION}{path}", token, body)
    assert (reply.status, reply.json) == (404, {"error": "no such session"}), reply.body
    return reply.body.decode()


async def _post_chat(t: Tenancy, token: str) -> str:
    body = {"id": CHAT, "trigger": "submit-message", "messages": _send(CHAT)["messages"]}
    return await _over_http_chat(t, token, "POST", "", body)


async def _stream_chat(t: Tenancy, token: str) -> str:
    return await _over_http_chat(t, token, "GET", f"/{CHAT}/stream", None)


async def _abort_chat(t: Tenancy, token: str) -> str:
    return await _over_http_chat(t, token, "POST", f"/{CHAT}/abort", {})


async def _approve_over_http_chat(t: Tenancy, token: str) -> str:
    body = {"toolCallId": t.approval_call, "approved": True}
    return await _over_http_chat(t, token, "POST", f"/{CHAT}/approval", body)


Attempt = Callable[[Tenancy, str], Awaitable[str]]

#: Everything another principal might try against a session not its own.
ATTEMPTS: list[tuple[str, Attempt]] = [
    ("connect", _connect),
    ("register tools", _register),
    ("send", _send_chat),
    ("resume", _resume_chat),
    ("answer an invoke", _answer_invoke),
    ("approve on a socket", _approve_on_socket),
    ("resume from its own session", _resume_from_own_session),
    ("subscribe to the chat", _subscribe),
    ("clear the chat", _clear),
    ("subscribe from its own session", _subscribe_from_own_session),
    ("clear from its own session", _clear_from_own_session),
    ("list chats", _list_chats),
    ("list the session's chats", _list_chats_of_session),
    ("list chats before the chat", _list_chats_before),
    ("read the chat", _read_chat),
    ("delete the chat", _delete_chat),
    ("post a turn over HTTP", _post_chat),
    ("resume over HTTP", _stream_chat),
    ("abort over HTTP", _abort_chat),
    ("approve over HTTP", _approve_over_http_chat),
    ("list", _list),
    ("list the session", _list_session),
    ("list before an execution", _list_before),
    ("read", _read),
    ("resolve", _resolve),
    ("approve", _approve),
    ("reject", _reject),
    ("reject a missing step", _reject_missing_seq),
]


async def test_another_principal_is_refused_everything_and_learns_nothing(
    tenancy: Tenancy,
) -> None:
    t = tenancy
    before = await t.detail()
    for name, attempt in ATTEMPTS:
        answer = await attempt(t, BOB)
        leaked = [secret for secret in t.secrets() if secret in answer]
        assert not leaked, (name, leaked, answer)
    # Alice's run is as it was; her socket never closed; her response is still open.
    assert await t.detail() == before
    assert t.page.close_code is None
    assert not [f for f in t.page.inbox if f["type"] in ("end", "error")]
    # Each refusal is in a log with who, which session and where; no token in any log.
    logs = "\n".join(log.read_text(errors="replace") for log in t.logs)
    assert f"refused principal 'bob' on session '{SESSION}' (WS /agents/chat/{SESSION})" in logs
    assert f"refused principal 'bob' on session '{SESSION}' (GET /executions/{t.run})" in logs
    assert f"(POST /executions/{t.run}/steps/{t.lookup}/resolve)" in logs
    for token in TOKENS:
        assert token.split(".")[2] not in logs


async def test_an_operator_may_do_each_of_it(tenancy: Tenancy, chunk_collector: Any) -> None:
    t = tenancy
    ops = await FakeBrowser.connect(t.ws_url(OPERATOR), chunk_collector)
    try:
        # Resume Alice's chat: its response so far, from another process when there are two.
        await ops.send(_resume(CHAT))
        await ops.expect("start", 20, requestId="bob-2")
        assert (await ops.chunk("bob-2", "tool-approval-request", 20))["type"]
    finally:
        await ops.close()
    listed = await t.http("GET", "/executions?status=paused", OPERATOR)
    assert t.run in [e["executionId"] for e in listed.json["executions"]]
    assert (await t.http("GET", f"/executions/{t.run}", OPERATOR)).status == 200
    chats = await t.http("GET", f"/chats?session={SESSION}", OPERATOR)
    assert [c["id"] for c in chats.json["chats"]] == [CHAT]
    assert (await t.http("GET", f"/chats/{CHAT}", OPERATOR)).json["session"] == SESSION
    assert (await t.http("DELETE", f"/chats/{CHAT}", OPERATOR)).status == 409  # it streams
    steps = f"/executions/{t.run}/steps"
    for path, body in (
        (f"{steps}/{t.lookup}/resolve", {"output": "sunny"}),
        (f"{steps}/{t.approvals[0]}/approve", {"approved": True}),
        (f"{steps}/{t.approvals[1]}/reject", {"message": "too much"}),
    ):
        reply = await t.http("POST", path, OPERATOR, body)
        assert (reply.status, reply.json) == (200, {"outcome": "applied"}), path
    # Alice's response goes on with what the operator decided, on her own socket.
    response = await t.page.response(t.request_id, timeout=30)
    assert response.final["type"] == "end"
    assert response.text == (
        'lookup -> "sunny"\ntransfer -> "moved 5"\ntransfer failed: denied: too much'
    )
    stored = await t.http("GET", f"/chats/{CHAT}", OPERATOR)
    assert [m["role"] for m in stored.json["messages"]] == ["user", "assistant"]
    assert (await t.http("DELETE", f"/chats/{CHAT}", OPERATOR)).status == 204
    # And tools and a chat of its own in Alice's session, once her run is done (tools
    # registered in the middle of it would change what the scripted model answers).
    ops = await FakeBrowser.connect(t.ws_url(OPERATOR), chunk_collector)
    try:
        ack = await ops.register([tool_spec("ops_tool")])
        assert ack["accepted"] == ["ops_tool"]
        assert (await ops.chat("hi", chat_id="ops-chat", timeout=20)).final["type"] == "end"
    finally:
        await ops.close()


# --------------------------------------------------------------------------- signed tokens


def _flipped(token: str, at: int) -> str:
    return token[:at] + chr(ord(token[at]) ^ 1) + token[at + 1 :]


async def test_signed_tokens_that_do_not_hold_admit_nobody(tenancy: Tenancy) -> None:
    t = tenancy
    expired = mint_token(SECRET, "alice", ttl=1, now=time.time() - 60)
    other_secret = mint_token("some-other-secret-entirely", "alice", ttl=3600)
    unauthenticated = {
        "expired": expired,
        "tampered payload": _flipped(ALICE, 10),
        "tampered signature": _flipped(ALICE, len(ALICE) - 5),
        "another secret": other_secret,
        "a shared token": "not-a-signed-token",
        "empty": "",
    }
    for name, token in unauthenticated.items():
        with pytest.raises(InvalidStatus) as refused:
            await socket_refused(t.ws_url(token), [])
        assert refused.value.response.status_code == 403, name
        for path in ("/executions", f"/executions/{t.run}"):
            reply = await t.http("GET", path, token)
            assert (reply.status, reply.body) == (401, b""), (name, path)
    missing = await t.http("GET", f"/executions/{t.run}", None)
    assert (missing.status, missing.body) == (401, b"")
    with pytest.raises(InvalidStatus):
        async with connect(t.away.ws_url(SESSION)):
            pass
    # Valid tokens of the wrong scope or principal: treated as another principal's.
    wrong_session = mint_token(SECRET, "alice", session="elsewhere", ttl=3600)
    wrong_principal = mint_token(SECRET, "carol", ttl=3600)
    scoped_operator = mint_token(SECRET, "ops", session="elsewhere", operator=True, ttl=3600)
    for token in (wrong_session, wrong_principal, scoped_operator):
        await socket_refused(t.ws_url(token), [_tools()])
        await as_if_missing(t, "GET", f"/executions/{t.run}", token)
        assert (await t.http("GET", "/executions", token)).json == {"executions": []}
    # The right scope works: Alice's token for her own session only.
    mine = mint_token(SECRET, "alice", session=SESSION, ttl=3600)
    assert (await t.http("GET", f"/executions/{t.run}", mine)).status == 200
    listed = await t.http("GET", "/executions", mine)
    assert [e["executionId"] for e in listed.json["executions"]] == [t.run]
    assert t.page.close_code is None
