"""H3 across processes: tabs of one chat on process a and on process b get every change.

Two server processes on one PostgreSQL; the session's page is on b (through the
balancer), one tab straight to a, one straight to b. A turn sent on a, the next
on b, then a clear on a: both tabs see each stored state, in order.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from tests.reliability.harness import ChatPeer, prompt_for
from tests.server.server_harness import FakeBrowser
from tests.support.cluster import Cluster, CountingPage, by_path
from tests.support.postgres import PostgresServer

CHAT = "x-chat"


async def _subscribe(tab: FakeBrowser) -> None:
    await tab.send({"type": "cf_agent_chat_subscribe", "id": CHAT})
    await tab.expect("cf_agent_chat_messages", id=CHAT)


async def _until(tab: FakeBrowser, done: Any, timeout: float = 30.0) -> list[dict[str, Any]]:
    """The messages frames up to the first for which ``done(frame)`` holds."""
    seen: list[dict[str, Any]] = []
    async with asyncio.timeout(timeout):
        while True:
            seen.append(await tab.expect("cf_agent_chat_messages", timeout=timeout))
            if done(seen[-1]):
                return seen


def _answered(count: int) -> Any:
    def done(frame: dict[str, Any]) -> bool:
        messages = frame["messages"]
        if len(messages) != count or messages[-1]["role"] != "assistant":
            return False
        texts = [p.get("text", "") for p in messages[-1]["parts"] if p["type"] == "text"]
        return bool(texts) and texts[-1].startswith("work -> ")

    return done


async def _send(tab: FakeBrowser, request_id: str, messages: list[dict[str, Any]]) -> None:
    await tab.send(
        {"type": "send", "requestId": request_id, "id": CHAT, "trigger": "submit-message",
         "messages": messages, "headers": {}, "body": {}}
    )  # fmt: skip


async def test_tabs_on_two_processes_of_one_chat_get_every_change(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    async with Cluster(
        postgres.fresh_url(), tmp_path, 2, pick=by_path({"/agents/chat/x": "b"})
    ) as cluster:
        page = await CountingPage.open(cluster.ws_url("x"))
        on_a = await ChatPeer.open(cluster.direct_url("a", "x"))
        on_b = await ChatPeer.open(cluster.direct_url("b", "x"))
        try:
            a, b = on_a.browser, on_b.browser
            await _subscribe(a)
            await _subscribe(b)
            first = {"id": "u1", "role": "user",
                     "parts": [{"type": "text", "text": prompt_for("t1", [3])}]}  # fmt: skip
            await _send(a, "r1", [first])
            seen_a = await _until(a, _answered(2))
            seen_b = await _until(b, _answered(2))
            await a.response("r1", timeout=30)
            # Both saw the same states, each version once and in order, up to the answer.
            assert [f["version"] for f in seen_b] == sorted({f["version"] for f in seen_b})
            assert seen_b[-1] == seen_a[-1]
            assert seen_a[0]["messages"] == [first]
            # The next turn, sent on b, extends the history stored by a.
            history = seen_a[-1]["messages"]
            second = {"id": "u2", "role": "user",
                      "parts": [{"type": "text", "text": prompt_for("t2", [4])}]}  # fmt: skip
            await _send(b, "r2", [*history, second])
            turn_b = await _until(b, _answered(4))
            turn_a = await _until(a, _answered(4))
            await b.response("r2", timeout=30)
            assert turn_a[-1] == turn_b[-1]
            assert turn_a[-1]["messages"][:3] == [*history, second]
            assert [f["version"] for f in turn_a] == sorted({f["version"] for f in turn_a})
            assert turn_a[0]["version"] > seen_a[-1]["version"]
            # A clear on a empties the chat on b too, at the next version.
            await a.send({"type": "cf_agent_chat_clear", "id": CHAT})
            cleared_b = await _until(b, lambda f: f["messages"] == [])
            cleared_a = await _until(a, lambda f: f["messages"] == [])
            assert cleared_a[-1] == cleared_b[-1]
            assert cleared_a[-1]["version"] == turn_a[-1]["version"] + 1
            await page.settle()
            assert page.executions == {("t1", 3): 1, ("t2", 4): 1}
        finally:
            await page.close()
            await on_a.close()
            await on_b.close()
        assert not cluster.balancer.errors, cluster.balancer.errors
