"""examples/fastapi_app.py, run as uvicorn runs it: the app's login sets a signed session
cookie, and the cookie is who the server sees (docs/security.md, docs/agents.md).

Alice logs in and her page (the CPython ToolClient, sending the cookie with its
handshake as a browser of the app's origin does) chats in her session; Bob,
logged in too, is refused her session (4403) and sees none of her executions;
root, the app's operator, sees them; no cookie, a forged one, a wrong password
are each refused.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from clienttools import ToolClient
from clienttools.native import NativeConnector
from clienttools_server.wire.auth import CLOSE_NOT_YOURS
from tests.support.http import Reply, http_json
from tests.support.server_process import ROOT, free_port
from tests.support.wait import wait_until

# Real server processes: the whole suite (make test), not the fast lane (make check).
pytestmark = pytest.mark.process

COOKIE = "clienttools_session"


@dataclass
class App:
    port: int

    async def http(self, method: str, path: str, body: object = None, cookie: str = "") -> Reply:
        headers = {"Cookie": f"{COOKIE}={cookie}"} if cookie else {}
        return await http_json("127.0.0.1", self.port, method, path, body, headers=headers)

    async def login(self, username: str) -> str:
        reply = await self.http(
            "POST", "/login", {"username": username, "password": f"{username}-demo-password"}
        )
        assert reply.status == 204, reply.body
        set_cookie = reply.headers["set-cookie"]
        assert "HttpOnly" in set_cookie and "SameSite=lax" in set_cookie
        return set_cookie.split(";")[0].split("=", 1)[1]

    def ws_url(self, session: str) -> str:
        return f"ws://127.0.0.1:{self.port}/clienttools/agents/chat/{session}"


@pytest.fixture
async def example() -> AsyncIterator[App]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "examples.fastapi_app:app", "--port", str(port),
         "--log-level", "warning"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:

        def up() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                    return bool(r.status == 200)
            except OSError:
                return False

        await wait_until(lambda: process.poll() is not None or up(), 30, what="uvicorn")
        assert process.poll() is None
        yield App(port)
    finally:
        process.terminate()
        process.wait(timeout=10)


async def test_the_apps_login_cookie_is_who_the_server_sees(example: App) -> None:
    alice = await example.login("alice")
    bob = await example.login("bob")
    root = await example.login("root")
    assert (await example.http("GET", "/me", cookie=alice)).json == {
        "principal": "alice", "operator": False,
    }  # fmt: skip
    page = ToolClient(
        example.ws_url("alice-desk"),
        connector=NativeConnector(additional_headers={"Cookie": f"{COOKIE}={alice}"}),
        reconnect=False,
    )

    @page.tool
    async def page_title() -> str:
        """The title of the page."""
        return "Mounted"

    await page.connect()
    try:
        message = await page.chat.send("call page_title {}")
        assert message.text == 'page_title -> "Mounted"'
        # Bob's cookie opens no socket on Alice's session, before any frame.
        async with connect(
            example.ws_url("alice-desk"), additional_headers={"Cookie": f"{COOKIE}={bob}"}
        ) as ws:
            with pytest.raises(ConnectionClosed):
                await asyncio.wait_for(ws.recv(), 10)
            assert (ws.close_code, ws.close_reason) == (CLOSE_NOT_YOURS, "")
        # No cookie, or a forged one: no handshake at all.
        for cookie in ("", alice[:-3] + "AAA"):
            headers = {"Cookie": f"{COOKIE}={cookie}"} if cookie else {}
            with pytest.raises(InvalidStatus) as refused:
                async with connect(example.ws_url("alice-desk"), additional_headers=headers):
                    pass
            assert refused.value.response.status_code == 403
    finally:
        await page.close()
    mine = await example.http("GET", "/clienttools/executions", cookie=alice)
    assert [e["session"] for e in mine.json["executions"]] == ["alice-desk"]
    run = mine.json["executions"][0]["executionId"]
    assert (await example.http("GET", "/clienttools/executions", cookie=bob)).json == {
        "executions": []
    }
    assert (await example.http("GET", f"/clienttools/executions/{run}", cookie=bob)).status == 404
    everyone = await example.http("GET", "/clienttools/executions", cookie=root)
    assert run in [e["executionId"] for e in everyone.json["executions"]]
    assert (await example.http("GET", "/clienttools/executions")).status == 401
    assert (await example.http("GET", "/me", cookie=alice[:-3] + "AAA")).status == 401
    wrong = await example.http("POST", "/login", {"username": "alice", "password": "guess"})
    assert (wrong.status, "set-cookie" in wrong.headers) == (401, False)
    nobody = await example.http("POST", "/login", {"username": "mallory", "password": "x"})
    assert nobody.status == 401
