"""Principals, the authorizer hook, signed tokens and the ``token`` command (docs/security.md).

Signed tokens are checked as a pure function first (every byte of a token
flipped, random tokens, forged payloads), then through a real server: an
authorizer of the app's own (sync, async, failing, answering nonsense), the
session a principal owns refused to another with 4403 before any frame, and
uvicorn's logs that no longer show a ``?token=``. The cross-tenant suite with
real processes is tests/server/test_cross_tenant.py.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import re
import subprocess
import sys
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from server_harness import FakeBrowser
from starlette.requests import HTTPConnection
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from clienttools_server.app import RunningServer, create_app, running_server, uvicorn_config
from clienttools_server.config import ServerConfig
from clienttools_server.wire.auth import (
    ADMIN,
    CLOSE_NOT_YOURS,
    SHARED,
    Principal,
    RedactTokens,
    TokenRefused,
    _signature,
    mint_token,
    verify_token,
)
from tests.support.http import http_json
from tests.support.server_process import ROOT

SECRET = "correct-horse-battery-staple"
T0 = 1_800_000_000.0
TOKEN_SHAPE = re.compile(r"^ct1\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]{43}$")


# --------------------------------------------------------------------------- signed tokens


def test_a_token_names_its_principal_session_and_operator_flag() -> None:
    plain = mint_token(SECRET, "alice", ttl=60, now=T0)
    assert TOKEN_SHAPE.match(plain)
    assert verify_token(SECRET, plain, now=T0) == Principal("alice")
    scoped = mint_token(SECRET, "alice", session="desk", operator=True, ttl=60, now=T0)
    assert verify_token(SECRET, scoped, now=T0 + 59) == Principal("alice", True, "desk")


def test_a_token_expires_after_its_ttl() -> None:
    token = mint_token(SECRET, "alice", ttl=10, now=T0)
    assert verify_token(SECRET, token, now=T0 + 9.9).id == "alice"
    for later in (T0 + 10, T0 + 11, T0 + 86_400):
        with pytest.raises(TokenRefused) as refused:
            verify_token(SECRET, token, now=later)
        # The signature held, so the log may say whose token expired.
        assert (refused.value.reason, refused.value.principal) == ("expired", "alice")


def test_every_byte_of_a_token_flipped_is_refused() -> None:
    token = mint_token(SECRET, "alice", session="desk", ttl=60, now=T0)
    for index in range(len(token)):
        for flip in (1, 2, 32):
            changed = chr(ord(token[index]) ^ flip)
            tampered = token[:index] + changed + token[index + 1 :]
            with pytest.raises(TokenRefused) as refused:
                verify_token(SECRET, tampered, now=T0)
            assert refused.value.principal is None, (index, flip)


@pytest.mark.parametrize(
    "tampered",
    [
        "",
        "ct1",
        "ct1..",
        "ct1.e30.",
        "ct2.e30.AAAA",
        "ct1.e30.AAAA.AAAA",
        "ct1.e30=.AAAA",
        "ct1.e30.AAAA ",
        "ct1.e30\n.AAAA\n",
        "x" * 5000,
    ],
)
def test_malformed_tokens_are_refused(tampered: str) -> None:
    with pytest.raises(TokenRefused):
        verify_token(SECRET, tampered, now=T0)


def test_truncated_extended_and_reused_tokens_are_refused() -> None:
    token = mint_token(SECRET, "alice", ttl=60, now=T0)
    other = mint_token(SECRET, "bob", ttl=60, now=T0)
    prefix, payload, signature = token.split(".")
    _, other_payload, other_signature = other.split(".")
    for wrong in (
        token[:-1],
        token + "A",
        f"{prefix}.{other_payload}.{signature}",  # bob's claims under alice's signature
        f"{prefix}.{payload}.{other_signature}",
        f"{prefix}.{payload}{payload}.{signature}",
    ):
        with pytest.raises(TokenRefused):
            verify_token(SECRET, wrong, now=T0)


def test_a_token_of_another_secret_is_refused() -> None:
    token = mint_token("another-secret-of-16+", "alice", ttl=60, now=T0)
    with pytest.raises(TokenRefused) as refused:
        verify_token(SECRET, token, now=T0)
    assert refused.value.reason == "bad signature"


def _signed(claims: Any) -> str:
    """A token with a valid signature over any payload: what only a secret holder could make."""
    payload = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    return f"ct1.{payload}.{_signature(SECRET, 'ct1.' + payload)}"


@pytest.mark.parametrize(
    "claims",
    [
        [],
        {"exp": 2_000_000_000, "op": False, "p": "alice"},
        {"exp": 2_000_000_000, "op": False, "p": "alice", "s": None, "extra": 1},
        {"exp": "2000000000", "op": False, "p": "alice", "s": None},
        {"exp": 2e9, "op": False, "p": "alice", "s": None},
        {"exp": 2_000_000_000, "op": 1, "p": "alice", "s": None},
        {"exp": 2_000_000_000, "op": False, "p": 7, "s": None},
        {"exp": 2_000_000_000, "op": False, "p": "alice", "s": ["desk"]},
    ],
)
def test_a_signed_payload_of_the_wrong_shape_is_refused(claims: Any) -> None:
    with pytest.raises(TokenRefused) as refused:
        verify_token(SECRET, _signed(claims), now=T0)
    assert refused.value.reason == "malformed"


@pytest.mark.parametrize(
    ("arguments", "fragment"),
    [
        ({"secret": "short"}, "at least 16"),
        ({"principal": ""}, "principal must be"),
        ({"principal": "p" * 257}, "principal must be"),
        ({"session": ""}, "session must be"),
        ({"ttl": 0}, "ttl"),
        ({"ttl": -5}, "ttl"),
        ({"ttl": float("nan")}, "ttl"),
        ({"ttl": float("inf")}, "ttl"),
    ],
)
def test_mint_refuses_what_it_cannot_sign(arguments: dict[str, Any], fragment: str) -> None:
    call: dict[str, Any] = {"secret": SECRET, "principal": "alice", "ttl": 60.0, **arguments}
    with pytest.raises(ValueError, match=fragment):
        mint_token(call.pop("secret"), call.pop("principal"), **call)


@settings(max_examples=400, deadline=None)
@given(st.text(max_size=300) | st.from_regex(r"\Act1\.[A-Za-z0-9_-]{0,120}\.[A-Za-z0-9_-]{43}\Z"))
def test_random_tokens_never_admit_anyone(token: str) -> None:
    with pytest.raises(TokenRefused):
        verify_token(SECRET, token, now=T0)


VALID = mint_token(SECRET, "alice", session="desk", ttl=3600, now=T0)


@settings(max_examples=400, deadline=None)
@given(st.integers(0, len(VALID)), st.integers(0, 8), st.text(min_size=0, max_size=8))
def test_random_edits_of_a_valid_token_never_admit_anyone(at: int, cut: int, insert: str) -> None:
    edited = VALID[:at] + insert + VALID[at + cut :]
    if edited == VALID:
        return
    with pytest.raises(TokenRefused):
        verify_token(SECRET, edited, now=T0)


# --------------------------------------------------------------------------- the command


def _token_command(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "clienttools_server", "token", *arguments],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


@pytest.mark.process
def test_the_token_command_prints_one_token_and_nothing_else() -> None:
    done = _token_command(
        "--secret", SECRET, "--principal", "alice", "--session", "desk", "--operator",
        "--ttl", "120",
    )  # fmt: skip
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.endswith("\n") and done.stdout.count("\n") == 1
    token = done.stdout.strip()
    assert TOKEN_SHAPE.match(token)
    assert verify_token(SECRET, token, now=time.time()) == Principal("alice", True, "desk")
    with pytest.raises(TokenRefused):
        verify_token(SECRET, token, now=time.time() + 121)


@pytest.mark.process
@pytest.mark.parametrize(
    ("arguments", "fragment"),
    [
        ((), "required"),
        (("--principal", "alice", "--ttl", "60"), "--secret"),
        (("--secret", "short", "--principal", "alice", "--ttl", "60"), "at least 16"),
        (("--secret", SECRET, "--ttl", "60"), "--principal"),
        (("--secret", SECRET, "--principal", "alice"), "--ttl"),
        (("--secret", SECRET, "--principal", "", "--ttl", "60"), "principal must be"),
        (("--secret", SECRET, "--principal", "a", "--session", "", "--ttl", "6"), "session"),
        (("--secret", SECRET, "--principal", "alice", "--ttl", "soon"), "number of seconds"),
        (("--secret", SECRET, "--principal", "alice", "--ttl", "0"), "positive"),
        (("--secret", SECRET, "--principal", "alice", "--ttl", "inf"), "positive"),
        (("--secret", SECRET, "--principal", "alice", "--ttl", "6", "--nope"), "unrecognized"),
    ],
)
def test_a_bad_token_flag_is_one_line_and_exit_2(arguments: tuple[str, ...], fragment: str) -> None:
    done = _token_command(*arguments)
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith("clienttools-server token: error: ") and fragment in lines[0]
    assert SECRET not in done.stderr


# --------------------------------------------------------------------------- a real server


async def _closed_before_any_frame(url: str) -> tuple[int | None, str | None, list[Any]]:
    """Open a socket and read until it closes: (close code, reason, frames received)."""
    frames: list[Any] = []
    async with connect(url) as ws:
        try:
            async with asyncio.timeout(5):
                async for frame in ws:
                    frames.append(frame)
        except ConnectionClosed:
            pass
        return ws.close_code, ws.close_reason, frames


def _user(connection: HTTPConnection) -> Principal | None:
    """An app's authorizer: the user is a header (or ``?user=`` on a socket)."""
    name = connection.headers.get("x-user") or connection.query_params.get("user")
    if not name:
        return None
    return Principal(name, operator=name == "root")


async def test_an_app_authorizer_decides_and_owners_keep_their_sessions(
    chunk_collector: Any,
) -> None:
    config = ServerConfig(port=0, log_level="warning", token="ignored-with-an-authorizer")
    async with running_server(config, authorize=_user) as server:
        alice = await FakeBrowser.connect(server.ws_url("desk") + "?user=alice", chunk_collector)
        try:
            assert (await alice.chat("hi")).final["type"] == "end"
            code, reason, frames = await _closed_before_any_frame(
                server.ws_url("desk") + "?user=bob"
            )
            assert (code, reason, frames) == (CLOSE_NOT_YOURS, "", [])
            with pytest.raises(InvalidStatus) as refused:  # no principal: the handshake fails
                await _closed_before_any_frame(server.ws_url("desk"))
            assert refused.value.response.status_code == 403
            root = await FakeBrowser.connect(server.ws_url("desk") + "?user=root", chunk_collector)
            assert (await root.chat("hi", chat_id="root-chat")).final["type"] == "end"
            await root.close()
            attic = await FakeBrowser.connect(
                server.ws_url("attic") + "?user=root", chunk_collector
            )
            # A chat id of its own: chat-1 belongs to desk, where it was first used (H5).
            assert (await attic.chat("hi", chat_id="attic-chat")).final["type"] == "end"
            await attic.close()
            # Alice's socket went on through all of it.
            assert (await alice.chat("again")).final["type"] == "end"
            port = server.port
            bob = await http_json(
                "127.0.0.1", port, "GET", "/executions", headers={"X-User": "bob"}
            )
            mine = await http_json(
                "127.0.0.1", port, "GET", "/executions", headers={"X-User": "alice"}
            )
            everyone = await http_json(
                "127.0.0.1", port, "GET", "/executions", headers={"X-User": "root"}
            )
            nobody = await http_json("127.0.0.1", port, "GET", "/executions")
            assert (bob.status, bob.json) == (200, {"executions": []})
            assert {e["session"] for e in mine.json["executions"]} == {"desk"}
            assert len(mine.json["executions"]) == 3  # root's chat in desk is desk's
            assert {e["session"] for e in everyone.json["executions"]} == {"desk", "attic"}
            assert len(everyone.json["executions"]) == 4
            assert nobody.status == 401 and nobody.body == b""
        finally:
            await alice.close()


@pytest.mark.parametrize("kind", ["async", "raises", "nonsense", "empty id"])
async def test_async_failing_and_nonsense_authorizers(
    kind: str, chunk_collector: Any, caplog: pytest.LogCaptureFixture
) -> None:
    async def asynchronous(connection: HTTPConnection) -> Principal | None:
        await asyncio.sleep(0)
        return _user(connection)

    def raises(connection: HTTPConnection) -> Principal | None:
        raise RuntimeError("the user store is down")

    def nonsense(connection: HTTPConnection) -> Any:
        return "alice"

    def empty(connection: HTTPConnection) -> Principal | None:
        return Principal("")

    authorizers = {"async": asynchronous, "raises": raises, "nonsense": nonsense}
    authorizer = authorizers.get(kind, empty)
    config = ServerConfig(port=0, log_level="warning")
    with caplog.at_level(logging.INFO, "clienttools_server.wire.auth"):
        async with running_server(config, authorize=authorizer) as server:
            url = server.ws_url("desk") + "?user=alice"
            reply = await http_json(
                "127.0.0.1", server.port, "GET", "/executions", headers={"X-User": "alice"}
            )
            if kind == "async":
                tab = await FakeBrowser.connect(url, chunk_collector)
                assert (await tab.chat("hi")).final["type"] == "end"
                await tab.close()
                assert reply.status == 200
                return
            # An authorizer that fails refuses: failing open would admit anyone.
            with pytest.raises(InvalidStatus):
                await _closed_before_any_frame(url)
            assert reply.status == 401
    said = {"raises": "the authorizer failed", "nonsense": "not a Principal"}.get(
        kind, "id or session is not 1 to 256 characters"
    )
    assert any(said in record.getMessage() for record in caplog.records)


async def test_without_an_authorizer_the_token_rules_give_the_shared_principal_and_admin(
    start_server: Any,
) -> None:
    server: RunningServer = await start_server(token="page-token-1", admin_token="admin-token-1")
    access = server.app.state.access
    # The same principal for every holder of the page token: nothing changes for them.
    assert await access.authorize(_ws(server, "?token=page-token-1")) == SHARED
    assert await access.authorize(_ws(server, "?token=admin-token-1")) is None
    assert await access.authorize(_http(server, "page-token-1")) == SHARED
    assert await access.authorize(_http(server, "admin-token-1")) == ADMIN
    assert await access.authorize(_http(server, "wrong")) is None
    assert await access.authorize(_http(server, None)) is None


async def test_with_a_secret_signed_tokens_name_principals_and_nothing_else_passes(
    start_server: Any,
) -> None:
    server: RunningServer = await start_server(secret=SECRET, admin_token="admin-token-1")
    access = server.app.state.access
    token = mint_token(SECRET, "alice", session="desk", ttl=60)
    assert await access.authorize(_ws(server, f"?token={token}")) == Principal(
        "alice", False, "desk"
    )
    assert await access.authorize(_http(server, token)) == Principal("alice", False, "desk")
    assert await access.authorize(_http(server, "admin-token-1")) == ADMIN
    # No token set for pages: with a secret that does not open the socket to everyone.
    assert await access.authorize(_ws(server, "")) is None
    assert await access.authorize(_ws(server, "?token=" + token[:-2])) is None


def test_a_short_secret_is_refused_by_the_config() -> None:
    with pytest.raises(ValueError, match="at least 16"):
        ServerConfig(secret="short")


def _ws(server: RunningServer, query: str) -> HTTPConnection:
    return HTTPConnection(
        {
            "type": "websocket", "path": "/agents/chat/desk", "query_string": query[1:].encode(),
            "headers": [], "app": server.app,
        }
    )  # fmt: skip


def _http(server: RunningServer, token: str | None) -> HTTPConnection:
    headers = [] if token is None else [(b"authorization", f"Bearer {token}".encode())]
    return HTTPConnection(
        {
            "type": "http", "method": "GET", "path": "/executions", "query_string": b"",
            "headers": headers, "app": server.app,
        }
    )  # fmt: skip


# --------------------------------------------------------------------------- what is logged


def test_log_lines_never_show_a_query_token() -> None:
    record = logging.LogRecord(
        "uvicorn.error", logging.INFO, __file__, 1, '%s - "WebSocket %s" [accepted]',
        ("127.0.0.1:5", "/agents/chat/desk?x=1&token=ct1.abc.def&y=2"), None,
    )  # fmt: skip
    assert RedactTokens().filter(record)
    assert record.getMessage() == (
        '127.0.0.1:5 - "WebSocket /agents/chat/desk?x=1&token=[redacted]&y=2" [accepted]'
    )


def test_trace_logs_of_a_scope_never_show_a_query_token() -> None:
    # --log-level trace: uvicorn.asgi logs each scope, its query string as bytes.
    config = ServerConfig(port=0, log_level="trace")
    uvicorn_config(create_app(config), config)
    scope = {"path": "/agents/chat/desk", "query_string": b"token=ct1.abc.def&x=1"}
    record = logging.LogRecord(
        "uvicorn.asgi", 5, __file__, 1, "%s - ASGI [%d] Started scope=%s",
        ("127.0.0.1:5", 3, scope), None,
    )  # fmt: skip
    assert logging.getLogger("uvicorn.asgi").filter(record)
    assert "ct1.abc" not in record.getMessage()
    assert "b'token=[redacted]&x=1'" in record.getMessage()


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


async def test_a_servers_logs_name_who_was_refused_and_never_a_token(
    chunk_collector: Any,
) -> None:
    alice = mint_token(SECRET, "alice", ttl=60)
    bob = mint_token(SECRET, "bob", ttl=60)
    expired = mint_token(SECRET, "carol", ttl=1, now=time.time() - 60)
    config = ServerConfig(port=0, log_level="info", secret=SECRET)
    lines = _Lines()
    # uvicorn's loggers do not propagate: the handler goes on each, after its filters.
    names = ("uvicorn.error", "uvicorn.access", "clienttools_server")
    try:
        async with running_server(config) as server:
            for name in names:
                logging.getLogger(name).addHandler(lines)
            logging.getLogger("clienttools_server").setLevel(logging.INFO)
            tab = await FakeBrowser.connect(server.ws_url("desk", alice), chunk_collector)
            assert (await tab.chat("hi")).final["type"] == "end"
            code, _, _ = await _closed_before_any_frame(server.ws_url("desk", bob))
            assert code == CLOSE_NOT_YOURS
            with pytest.raises(InvalidStatus):
                await _closed_before_any_frame(server.ws_url("desk", expired))
            await http_json("127.0.0.1", server.port, "GET", "/executions", token=bob)
            await tab.close()
    finally:
        for name in names:
            logging.getLogger(name).removeHandler(lines)
        logging.getLogger("clienttools_server").setLevel(logging.NOTSET)
    text = "\n".join(lines.lines)
    for token in (alice, bob, expired):
        assert token not in text
        assert token.split(".")[2] not in text
    assert "refused principal 'bob' on session 'desk' (WS /agents/chat/desk)" in text
    assert "refused WS /agents/chat/desk: a signed token of principal 'carol': expired" in text
    assert '"WebSocket /agents/chat/desk?token=[redacted]" [accepted]' in text
