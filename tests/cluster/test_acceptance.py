"""Three server processes on one PostgreSQL, behind a load balancer with no sticky sessions.

Pages and chats connect through the balancer (tests/support/cluster.py), so
the page of a session and its chats land on any of the three, and a socket
that drops comes back on another process, as behind any real balancer. The
model is the scripted one, counting its requests in a file the processes
share (tests/server/lease_agents.py); the pages are the real ToolClient,
counting every run of their tool.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

from tests.reliability.harness import ChatPeer, prompt_for, transcript_of
from tests.server.server_harness import Response
from tests.support.cluster import Cluster, CountingPage, by_session, runs_by_chat
from tests.support.postgres import PostgresServer


def expected_text(numbers: list[int]) -> str:
    """The scripted model's last answer: one line per call, in call order."""
    return "\n".join(f'work -> {{"n":{n},"sq":{n * n}}}' for n in numbers)


def expected_outcomes(numbers: list[int]) -> list[tuple[str, object]]:
    return [("work", {"n": n, "sq": n * n}) for n in numbers]


async def chat_once(url: str, chat_id: str, tag: str, numbers: list[int]) -> Response:
    chat = await ChatPeer.open(url)
    try:
        request_id = await chat.browser.start_chat(prompt_for(tag, numbers), chat_id)
        response = await chat.response(request_id)
        assert not chat.violations, chat.violations
        return response
    finally:
        await chat.close()


async def test_a_thousand_chats_over_a_hundred_sessions(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    sessions, per_session, numbers = 100, 10, [1, 2]
    async with Cluster(postgres.fresh_url(), tmp_path, 3, pick=by_session("abc")) as cluster:
        names = [f"s{i}" for i in range(sessions)]
        opened = await asyncio.gather(*(CountingPage.open(cluster.ws_url(s)) for s in names))
        pages = dict(zip(names, opened, strict=True))
        page_at = {s: cluster.balancer.holding(f"/agents/chat/{s}") for s in names}
        try:

            async def session_chats(session: str) -> list[Response]:
                return [
                    await chat_once(
                        cluster.ws_url(session), f"{session}-c{k}", f"{session}-c{k}", numbers
                    )
                    for k in range(per_session)
                ]

            responses = await asyncio.gather(*(session_chats(s) for s in names))
            for page in pages.values():
                await page.settle()
            with cluster.reader() as ledger:
                runs = runs_by_chat(ledger)
        finally:
            await asyncio.gather(*(page.close() for page in pages.values()))
        placed = list(cluster.balancer.placed)
        assert not cluster.balancer.errors, cluster.balancer.errors
    # Every page and every chat landed somewhere; spread over all three.
    assert all(len(where) == 1 for where in page_at.values()), page_at
    chats_at = Counter(name for path, name in placed[sessions:])
    assert set(chats_at) == {"a", "b", "c"} and sum(chats_at.values()) == sessions * per_session
    for session_responses in responses:
        for response in session_responses:
            transcript = transcript_of(response)
            assert transcript.final == "end"
            assert transcript.text == expected_text(numbers)
            assert transcript.outcomes == expected_outcomes(numbers)
    assert len(runs) == sessions * per_session
    assert {run.status for run in runs.values()} == {"completed"}
    # Each tool ran exactly once, on its session's page.
    for session, page in pages.items():
        assert page.executions == Counter(
            {(f"{session}-c{k}", n): 1 for k in range(per_session) for n in numbers}
        )
    # Two model steps a chat, each requested once (the first line of a prompt names its chat).
    requests = cluster.model_requests()
    assert set(requests.values()) == {1} and len(requests) == 2 * sessions * per_session
