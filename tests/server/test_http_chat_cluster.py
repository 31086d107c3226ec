"""The HTTP chat transport across server processes on one PostgreSQL ledger (real processes).

A POST on one process streams the run it owns; the GET on another process
resumes that response from the shared chunk log, from its first chunk, live
to ``[DONE]``; the abort route there stops the run on its owner, and a POST
for the chat there while it streams is refused with 409, as on the owner.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.reliability.harness import prompt_for
from tests.server.sse_client import OPENED, HttpResponse, chat_body
from tests.server.test_leases import GatedPage
from tests.server.test_streams_cluster import LEASE, TIMEOUT, processes
from tests.support.postgres import PostgresServer
from tests.support.server_process import ServerProcess
from tests.support.wait import wait_until

# Real server processes: the whole suite (make test), not the fast lane (make check).
pytestmark = pytest.mark.process


@pytest.fixture(autouse=True)
async def close_responses() -> AsyncIterator[None]:
    yield
    while OPENED:
        OPENED.pop().cut()


async def http(
    server: ServerProcess, method: str, path: str, body: bytes | None = None
) -> HttpResponse:
    headers = {"content-type": "application/json"} if body is not None else {}
    return await HttpResponse.open("127.0.0.1", server.port, method, path, body, headers)


async def test_a_post_on_one_process_is_resumed_with_get_on_another(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    gate = asyncio.Event()
    async with processes(postgres.fresh_url(), tmp_path, a=LEASE, b=LEASE) as (a, b):
        page = await GatedPage.open(a.ws_url("s"), gate)
        try:
            on_a = await http(a, "POST", "/agents/chat/s", chat_body(prompt_for("t", [1, 2]), "c1"))
            assert on_a.status == 200
            await wait_until(lambda: len(page.running) == 2, TIMEOUT, "both tools to run")
            seen = await on_a.chunks_until("tool-input-available")
            on_a.cut()  # the fetch is aborted: the run goes on, on A
            busy = await http(b, "POST", "/agents/chat/s", chat_body("hello", "c1"))
            assert busy.status == 409
            assert await busy.json() == {"error": "a response is already streaming for this chat"}
            on_b = await http(b, "GET", "/agents/chat/s/c1/stream")
            assert on_b.status == 200
            replayed = await asyncio.wait_for(on_b.chunks_until("tool-input-available"), TIMEOUT)
            assert replayed == seen
            gate.set()
            rest = await asyncio.wait_for(on_b.chunks_until(), TIMEOUT)
            assert on_b.blocks[-1] == "data: [DONE]"
            nothing = await http(b, "GET", "/agents/chat/s/c1/stream")
            assert nothing.status == 204
        finally:
            await page.close()
    types = [c["type"] for c in replayed + rest]
    assert types[0] == "start" and types[-1] == "finish"
    assert types.count("tool-output-available") == 2
    assert page.executions == {("t", 1): 1, ("t", 2): 1}


async def test_the_abort_route_on_another_process_stops_the_run(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    gate = asyncio.Event()
    async with processes(postgres.fresh_url(), tmp_path, a=LEASE, b=LEASE) as (a, b):
        page = await GatedPage.open(a.ws_url("s"), gate)
        try:
            on_a = await http(a, "POST", "/agents/chat/s", chat_body(prompt_for("x", [7]), "c1"))
            await wait_until(lambda: ("x", 7) in page.running, TIMEOUT, "the tool to run")
            aborted = await http(b, "POST", "/agents/chat/s/c1/abort", b"")
            assert json.loads(await aborted.body()) == {"aborted": True}
            chunks = await asyncio.wait_for(on_a.chunks_until(), TIMEOUT)
            await wait_until(lambda: ("x", 7) in page.cancelled, TIMEOUT, "the tool's cancel")
        finally:
            await page.close()
    assert chunks[-1]["type"] == "abort"
    assert on_a.blocks[-1] == "data: [DONE]"
