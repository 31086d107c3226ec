"""The pydantic-ai agent loop end to end: a real server process, the CPython client as the page.

One turn is one response: the model's tool calls (``tool-input-available``),
the page's results (``tool-output-available``) and then the answer arrive in
it, with no ``end`` in between, and every chunk is valid for the ``ai``
package (the session's chunk collector validates them with Node).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from server_harness import ChunkCollector

from clienttools import ToolClient
from clienttools_server.ledger import SqliteLedger
from tests.support.faultproxy import FaultProxy, Rule, drop
from tests.support.server_process import ROOT, ServerProcess

# Most of its tests start the server as OS processes: the file is not in `make check`.
pytestmark = pytest.mark.process


class Tap:
    """Sees every frame the server sends the page (a proxy rule that never fires)."""

    def __init__(self) -> None:
        self.frames: list[dict[str, Any]] = []

    def rule(self) -> Rule:
        return Rule("down", self._see, drop(), times=None)

    def _see(self, frame: dict[str, Any] | None, payload: bytes) -> bool:
        if frame is not None:
            self.frames.append(frame)
        return False

    def response(self, collector: ChunkCollector, key: str) -> list[dict[str, Any]]:
        """The one response the page got: its chunks, checked to run from start to one end."""
        framed = [f for f in self.frames if f.get("type") in ("start", "chunk", "end", "error")]
        assert [f["type"] for f in framed if f["type"] != "chunk"] == ["start", "end"], framed
        assert len({f["requestId"] for f in framed}) == 1
        chunks = [f for f in framed if f["type"] == "chunk"]
        assert [f["sequence"] for f in chunks] == list(range(len(chunks)))
        for frame in chunks:
            collector.add(key, frame["sequence"], frame["chunk"])
        collector.finish(key, "end")
        return [f["chunk"] for f in chunks]


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Any]:
    started: list[ServerProcess] = []

    async def serve(*args: str, env: dict[str, str] | None = None) -> ServerProcess:
        server = ServerProcess(list(args), log=tmp_path / "server.log", env=env)
        await asyncio.to_thread(server.start)
        started.append(server)
        return server

    yield serve
    for server in started:
        await asyncio.to_thread(server.stop)


@contextlib.asynccontextmanager
async def tapped_page(server: ServerProcess, path: str) -> AsyncIterator[tuple[Tap, ToolClient]]:
    """A page that talks to ``server`` through a proxy whose :class:`Tap` sees what it gets."""
    tap = Tap()
    async with FaultProxy("127.0.0.1", server.port) as proxy:
        proxy.rules.append(tap.rule())
        yield tap, ToolClient(proxy.url(path))


def _types(chunks: list[dict[str, Any]]) -> list[str]:
    return [c["type"] for c in chunks]


async def test_test_model_calls_the_page_tools_inside_one_response(
    served: Any, chunk_collector: ChunkCollector
) -> None:
    server = await served("--model", "test")
    async with tapped_page(server, "/agents/chat/tm") as (tap, page):

        @page.tool
        async def shout(text: str) -> str:
            """Say it louder."""
            return text.upper()

        await page.connect()
        try:
            message = await page.chat.send("hello")
        finally:
            await page.close()
    chunks = tap.response(chunk_collector, "agent-loop-test-model")
    [part] = [p for p in message.tool_parts if p.name == "shout"]
    assert part.state == "output-available"
    assert part.output == str(part.input["text"]).upper()
    types = _types(chunks)
    assert types.index("tool-input-available") < types.index("tool-output-available")
    assert types.index("tool-output-available") < len(types) - types[::-1].index("text-delta")
    assert types[-1] == "finish" and message.text


async def test_two_page_tools_in_parallel_then_the_answer(
    served: Any, chunk_collector: ChunkCollector
) -> None:
    server = await served("--agent", "tests.server.loop_agents:parallel")
    both_running = asyncio.Barrier(2)
    async with tapped_page(server, "/agents/chat/par") as (tap, page):

        @page.tool
        async def locate() -> dict[str, str]:
            """Where the user is."""
            await asyncio.wait_for(both_running.wait(), 10)  # only if both run at once
            return {"city": "Berlin"}

        @page.tool
        async def weather(when: str) -> dict[str, str]:
            """The weather where the user is."""
            await asyncio.wait_for(both_running.wait(), 10)
            return {"sky": "sunny"}

        await page.connect()
        try:
            message = await page.chat.send("where am I, and how is the weather?")
        finally:
            await page.close()
    assert message.text == "You are in Berlin, where it is sunny."
    assert [(p.name, p.state) for p in message.tool_parts] == [
        ("locate", "output-available"),
        ("weather", "output-available"),
    ]
    types = _types(tap.response(chunk_collector, "agent-loop-parallel"))
    inputs = [i for i, t in enumerate(types) if t == "tool-input-available"]
    outputs = [i for i, t in enumerate(types) if t == "tool-output-available"]
    texts = [i for i, t in enumerate(types) if t == "text-delta"]
    assert len(inputs) == 2 and len(outputs) == 2
    assert max(inputs) < min(outputs) and max(outputs) < min(texts)
    assert types.count("start-step") == 2 and types[-1] == "finish"


async def test_sigkill_mid_call_does_not_ask_the_model_again(served: Any, tmp_path: Path) -> None:
    db, requests = tmp_path / "ledger.sqlite3", tmp_path / "requests.txt"
    args = ("--agent", "tests.server.loop_agents:slow", "--db", str(db))
    env = {"LOOP_AGENT_REQUESTS": str(requests)}
    server = await served(*args, env=env)
    started, release = asyncio.Event(), asyncio.Event()
    page = ToolClient(server.ws_url("crash"))

    @page.tool
    async def slow() -> dict[str, bool]:
        """Takes its time."""
        started.set()
        await release.wait()
        return {"done": True}

    await page.connect()
    try:
        reply = asyncio.create_task(page.chat.send("go"))
        await asyncio.wait_for(started.wait(), 20)
        await asyncio.to_thread(server.kill)
        assert requests.read_text().count("request") == 1
        await asyncio.to_thread(server.start)
        release.set()
        message = await asyncio.wait_for(reply, 60)
    finally:
        await page.close()
    assert message.text == 'slow said {"done": true}'
    # The first model step was recorded before the kill: the replay did not ask again.
    assert requests.read_text().count("request") == 2
    await asyncio.to_thread(server.stop)
    async with SqliteLedger(db) as ledger:
        [execution] = await ledger.executions()
        steps = await ledger.steps(execution.id)
    assert execution.status == "completed"
    assert [(s.kind, s.name, s.state) for s in steps] == [
        ("model", "one-slow-call", "applied"),
        ("tool", "slow", "applied"),
        ("model", "one-slow-call", "applied"),
    ]


async def test_example_agent_serves_its_tool_and_the_pages(
    served: Any, chunk_collector: ChunkCollector
) -> None:
    server = await served("--agent", "examples.agent:agent")
    async with tapped_page(server, "/agents/chat/ex") as (tap, page):

        @page.tool
        async def page_title() -> str:
            """The title of the page."""
            return "Demo"

        await page.connect()
        try:
            message = await page.chat.send(
                'call exchange_rate {"base": "EUR", "quote": "USD"}\ncall page_title {}'
            )
        finally:
            await page.close()
    assert message.text == 'exchange_rate -> 1.08\npage_title -> "Demo"'
    tap.response(chunk_collector, "agent-loop-example")


@pytest.mark.parametrize(
    ("model", "says"),
    [
        ("nonsense", "unknown model 'nonsense'"),
        ("openai:gpt-4o", "openai"),
        ("anthropic:claude-sonnet-4-5", "anthropic"),
    ],
)
def test_a_model_that_cannot_be_served_is_one_line_and_exit_2(model: str, says: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    done = subprocess.run(
        [sys.executable, "-m", "clienttools_server", "--model", model, "--port", "0"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith("clienttools-server: ") and says in lines[0]


def test_an_agent_that_cannot_be_loaded_is_one_line_and_exit_2() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "clienttools_server", "--agent", "examples.agent:nothing"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "clienttools-server: 'examples.agent' has no attribute 'nothing'"
    )


def test_the_docs_mount_example_is_the_tested_file() -> None:
    doc = (ROOT / "docs" / "agents.md").read_text()
    [block] = re.findall(r"```python\n(.*?)```", doc, re.S)
    example = (ROOT / "examples" / "fastapi_app.py").read_text()
    for line in block.splitlines():
        code = line.split("  #")[0].rstrip()
        assert code in example, code
