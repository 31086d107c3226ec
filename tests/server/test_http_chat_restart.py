"""A run started over HTTP survives a server SIGKILL (S8): the restarted server takes it over
and the GET route resumes its response, from the first chunk, to ``[DONE]``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.reliability.harness import prompt_for
from tests.server.sse_client import OPENED, HttpResponse, chat_body
from tests.server.test_leases import GatedPage
from tests.support.server_process import ServerProcess, running
from tests.support.wait import wait_until

# Real server processes: the whole suite (make test), not the fast lane (make check).
pytestmark = pytest.mark.process

TIMEOUT = 60.0


@pytest.fixture(autouse=True)
async def close_responses() -> AsyncIterator[None]:
    yield
    while OPENED:
        OPENED.pop().cut()


async def test_a_killed_servers_run_is_resumed_by_get_after_the_restart(tmp_path: Path) -> None:
    # A short lease: the restarted process takes the killed one's run over once it lapses.
    server = ServerProcess(
        ["--db", str(tmp_path / "ledger.sqlite3"), "--lease", "2"], log=tmp_path / "server.log"
    )
    gate = asyncio.Event()
    async with running([server]):
        page = await GatedPage.open(server.ws_url("s"), gate)
        try:
            body = chat_body(prompt_for("r", [5]), "c1")
            posted = await HttpResponse.open(
                "127.0.0.1", server.port, "POST", "/agents/chat/s", body
            )
            before = await posted.chunks_until("tool-input-available")
            await wait_until(lambda: ("r", 5) in page.running, TIMEOUT, "the tool to run")
            server.kill()
            await posted.chunks_until()  # the connection is gone: the stream just stops
            assert posted.blocks[-1] != "data: [DONE]"
            await asyncio.to_thread(server.start)

            async def resumed() -> HttpResponse:
                while True:
                    got = await HttpResponse.open(
                        "127.0.0.1", server.port, "GET", "/agents/chat/s/c1/stream"
                    )
                    if got.status == 200:
                        return got
                    assert got.status == 204
                    got.cut()
                    await asyncio.sleep(0.2)

            # The tool still runs on the page (its gate is shut): the taken-over run waits
            # for it, so its response is there to resume.
            again = await asyncio.wait_for(resumed(), TIMEOUT)
            replayed = await asyncio.wait_for(again.chunks_until("tool-input-available"), TIMEOUT)
            gate.set()
            rest = await asyncio.wait_for(again.chunks_until(), TIMEOUT)
        finally:
            await page.close()
    assert again.blocks[-1] == "data: [DONE]"
    assert [c["type"] for c in replayed] == [c["type"] for c in before]
    output = next(c for c in rest if c["type"] == "tool-output-available")
    assert output["output"] == {"n": 5, "sq": 25}
    assert rest[-1]["type"] == "finish"
    assert page.executions == {("r", 5): 1}  # not run again
