"""Fuzzing the HTTP chat transport's POST body, seeded and reproducible, on a live server.

Hundreds of mutated DefaultChatTransport bodies (the mutations of
tests/support/frames.py: wrong types, missing and extra fields, broken JSON,
invalid UTF-8, lone surrogates, deep nesting, huge values) are posted to one
session while another session runs ordinary calls over its WebSocket. Every
answer is a complete event stream of valid UIMessageChunks ending in
``[DONE]`` (a body that is still a valid turn) or a 400 / 409 / 413 with a
JSON ``{"error"}``; the server answers a probe after every case (204, nothing
stuck); the other session's calls all complete with the right outputs.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

from clienttools_server.app import RunningServer, running_server
from clienttools_server.config import ServerConfig
from tests.reliability.harness import fuzz_beside_calls
from tests.reliability.results import Scenario
from tests.reliability.test_fuzz import fuzz_settings
from tests.server.sse_client import OPENED, HttpResponse
from tests.support.frames import json_values, mutated_frames, short_ids

pytestmark = pytest.mark.soak

ROOT = Path(__file__).resolve().parents[2]
REFUSALS = {400, 409, 413}


@pytest.fixture(autouse=True)
async def close_responses() -> AsyncIterator[None]:
    yield
    while OPENED:
        OPENED.pop().cut()


def chat_bodies() -> SearchStrategy[str]:
    """A body as DefaultChatTransport sends it: a valid turn, with some app fields."""
    message = st.fixed_dictionaries(
        {
            "id": short_ids,
            "role": st.just("user"),
            "parts": st.just([{"type": "text", "text": "hello"}]),
        }
    )
    body = st.fixed_dictionaries(
        {
            "id": short_ids,
            "messages": st.lists(message, min_size=1, max_size=2),
            "trigger": st.sampled_from(["submit-message", "regenerate-message"]),
        },
        optional={"messageId": short_ids, "theme": json_values()},
    )
    return body.map(json.dumps)


def draw_bodies(count: int) -> list[str | bytes]:
    cases: list[str | bytes] = []

    @fuzz_settings(count)
    @given(mutated_frames(chat_bodies()))
    def collect(wire: str | bytes) -> None:
        cases.append(wire)

    collect()
    return cases


class HttpFuzzer:
    """Posts each case, then a probe; checks every answer's status, framing and chunks."""

    def __init__(self, server: RunningServer) -> None:
        self.server = server
        self.statuses: Counter[int] = Counter()
        self.bad: list[str] = []
        # Whole accepted responses, validated by the ai package at the end.
        self.streams: list[list[dict[str, Any]]] = []

    async def send_case(self, wire: str | bytes, index: int) -> None:
        body = wire if isinstance(wire, bytes) else wire.encode("utf-8", "surrogatepass")
        where = f"case {index} ({len(body)} bytes: {body[:100]!r})"
        response = await HttpResponse.open(
            self.server.host, self.server.port, "POST", "/agents/chat/fuzz", body,
            {"content-type": "application/json"},
        )  # fmt: skip
        self.statuses[response.status] += 1
        if response.status == 200:
            await self._stream(response, where)
        elif response.status in REFUSALS:
            await self._refusal(response, where)
        else:
            self.bad.append(f"{where}: status {response.status}: {await response.body()!r}")
        probe = await HttpResponse.open(
            self.server.host, self.server.port, "GET", f"/agents/chat/fuzz/probe-{index}/stream"
        )
        if probe.status != 204:
            self.bad.append(f"{where}: the probe after it got {probe.status}")
        probe.cut()

    async def _stream(self, response: HttpResponse, where: str) -> None:
        if response.headers.get("x-vercel-ai-ui-message-stream") != "v1":
            self.bad.append(f"{where}: 200 without the UI message stream header")
        chunks: list[dict[str, Any]] = []
        async with asyncio.timeout(20):
            async for block in response.events():
                if block == "data: [DONE]" or block == ": keep-alive":
                    continue
                if not block.startswith("data: "):
                    self.bad.append(f"{where}: a block the ai package cannot parse: {block!r}")
                    continue
                chunks.append(json.loads(block.removeprefix("data: ")))
        if response.blocks[-1:] != ["data: [DONE]"]:
            self.bad.append(f"{where}: the stream did not end with [DONE]")
        self.streams.append(chunks)

    async def _refusal(self, response: HttpResponse, where: str) -> None:
        try:
            answer = json.loads(await response.body())
        except ValueError:
            self.bad.append(f"{where}: {response.status} without a JSON body")
            return
        if response.headers.get("content-type") != "application/json" or not (
            isinstance(answer, dict) and isinstance(answer.get("error"), str) and answer["error"]
        ):
            self.bad.append(f"{where}: {response.status} answered {answer!r}")


def validate_with_node(streams: list[list[dict[str, Any]]], tmp_path: Path) -> str | None:
    """None when every chunk passes uiMessageChunkSchema and each stream builds a message."""
    batch = [{"id": str(i), "complete": True, "chunks": c} for i, c in enumerate(streams)]
    path = tmp_path / "streams.json"
    path.write_text(json.dumps(batch))
    done = subprocess.run(
        ["node", str(ROOT / "tests" / "node" / "chunk_schema.mjs"), str(path)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    return None if done.returncode == 0 else done.stdout + done.stderr


async def test_live_server_survives_mutated_chat_bodies(
    scenario: Scenario, soak_factor: int, tmp_path: Path
) -> None:
    scenario.describe("fuzz", "live server: mutated HTTP chat bodies, another session calling")
    count = 200 * soak_factor
    cases = await asyncio.to_thread(draw_bodies, count)
    limit = ServerConfig().max_frame_bytes
    # Beside the drawn cases: the edges of the size limit, an empty body, a body in pieces.
    cases += [b"", b" " * (limit + 1), json.dumps({"id": "c", "x": "a" * limit}).encode()]
    config = ServerConfig(port=0, log_level="warning", tool_timeout=5.0)
    async with running_server(config) as server:
        fuzzer = HttpFuzzer(server)
        await fuzz_beside_calls(server, scenario, cases, fuzzer.send_case)
        stats = server.hub.stats()
    scenario.iterations = len(cases)
    scenario.note("statuses: " + ", ".join(f"{k}: {v}" for k, v in sorted(fuzzer.statuses.items())))
    assert not fuzzer.bad, fuzzer.bad[:5]
    assert scenario.cases == len(cases)
    # Both kinds of answer were exercised: some bodies stayed valid turns, most did not.
    assert fuzzer.statuses[200] > 0 and fuzzer.statuses[400] > count // 4, fuzzer.statuses
    assert fuzzer.statuses[413] >= 2
    assert stats["runs"] == stats["active_responses"] == 0, stats
    problem = validate_with_node(fuzzer.streams, tmp_path)
    assert problem is None, problem
