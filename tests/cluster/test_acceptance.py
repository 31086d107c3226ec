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
import random
import secrets
import time
from collections import Counter
from pathlib import Path

from clienttools_server.ledger import Execution
from tests.reliability.harness import ChatPeer, prompt_for, transcript_of
from tests.server.server_harness import Response
from tests.support.cluster import (
    Cluster,
    CountingPage,
    at_random,
    by_path,
    final_text,
    runs_by_chat,
    tool_outcomes,
)
from tests.support.postgres import PostgresServer
from tests.support.wait import wait_until


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


async def resume(chat: ChatPeer, chat_id: str, last_sequence: int) -> str:
    """Ask for the chat's response after `last_sequence` (-1: all of it); the resume's id."""
    request_id = "res-" + secrets.token_hex(6)
    frame: dict[str, object] = {"type": "resume", "requestId": request_id, "id": chat_id}
    if last_sequence >= 0:
        frame["lastSequence"] = last_sequence
    await chat.browser.send({**frame, "headers": {}, "body": {}})
    return request_id


async def test_a_thousand_chats_over_a_hundred_sessions(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    # One call a chat: the parallel calls of one chat are the other tests' business.
    sessions, per_session, numbers = 100, 10, [7]
    pick = at_random(random.Random(14))  # each connection anywhere: pages, chats, reconnects
    async with Cluster(postgres.fresh_url(), tmp_path, 3, pick=pick) as cluster:
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
            async with cluster.reader() as ledger:
                runs = await runs_by_chat(ledger)
        finally:
            await asyncio.gather(*(page.close() for page in pages.values()))
        placed = list(cluster.balancer.placed)
        assert not cluster.balancer.errors, cluster.balancer.errors
    # Every page and every chat landed somewhere; spread over all three.
    assert all(len(where) == 1 for where in page_at.values()), page_at
    chats_at = Counter(name for path, name in placed[sessions:])
    assert set(chats_at) == {"a", "b", "c"} and sum(chats_at.values()) == sessions * per_session
    # About two chats in three on another process than their page's (one in three
    # on the same): both paths are taken, many times.
    across = sum(name not in page_at[path.rsplit("/", 1)[1]] for path, name in placed[sessions:])
    assert 500 <= across <= 830, across
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


async def test_a_chat_on_one_process_calls_a_tool_on_a_page_connected_to_another(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    async with Cluster(
        postgres.fresh_url(), tmp_path, 3, pick=by_path({"/agents/chat/x": "b"})
    ) as cluster:
        page = await CountingPage.open(cluster.ws_url("x"))
        try:
            response = await chat_once(cluster.direct_url("a", "x"), "x1", "x1", [3, 4])
            await page.settle()
            holding = cluster.balancer.holding("/agents/chat/x")
            async with cluster.reader() as ledger:
                [run] = (await runs_by_chat(ledger)).values()
        finally:
            await page.close()
        assert not cluster.balancer.errors, cluster.balancer.errors
        placed = list(cluster.balancer.placed)
    assert placed == [("/agents/chat/x", "b")] and holding == ["b"]  # the page never moved
    transcript = transcript_of(response)  # one stream, start to end, on a
    assert (transcript.final, transcript.text) == ("end", expected_text([3, 4]))
    assert transcript.outcomes == expected_outcomes([3, 4])
    assert page.executions == {("x1", 3): 1, ("x1", 4): 1}
    assert (run.status, run.generation) == ("completed", 1)
    assert "resuming run" not in cluster.log("b") + cluster.log("c")


async def test_the_runs_of_a_killed_owner_complete_on_the_survivors(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    lease, chats, numbers = 3.0, 30, [1, 2]
    gate = asyncio.Event()
    # Every page on b or c; every chat on a, which owns the runs.
    placement = {f"/agents/chat/k{i}": "bc"[i % 2] for i in range(chats)}
    async with Cluster(
        postgres.fresh_url(), tmp_path, 3, lease=lease, pick=by_path(placement)
    ) as cluster:
        pages = await asyncio.gather(
            *(CountingPage.open(cluster.ws_url(f"k{i}"), gate) for i in range(chats))
        )
        chats_on_a: list[ChatPeer] = []
        resumed: list[ChatPeer] = []
        try:
            started = []
            for i in range(chats):
                chats_on_a.append(await ChatPeer.open(cluster.direct_url("a", f"k{i}")))
                started.append(
                    await chats_on_a[-1].browser.start_chat(prompt_for(f"k{i}", numbers), f"k{i}")
                )
            await wait_until(
                lambda: all(len(page.running) == len(numbers) for page in pages),
                60.0,
                "every tool to run",
            )
            async with cluster.reader() as ledger:
                owners = {run.owner for run in (await runs_by_chat(ledger)).values()}
            before = cluster.model_requests()
            first_lines = [prompt_for(f"k{i}", numbers).splitlines()[0] for i in range(chats)]
            await cluster.kill("a")  # in the middle of every call
            killed = time.monotonic()
            gate.set()
            # Each chat comes back through the balancer, on b or c, and resumes its
            # response after the last chunk it got from a.
            cluster.balancer.pick = at_random(random.Random(30))
            seen: list[list[dict[str, object]]] = []
            resumes = []
            for i, (old, request_id) in enumerate(zip(chats_on_a, started, strict=True)):
                await old.browser.expect_closed(10.0)
                seen.append(list(old.browser.chunks.get(request_id, [])))
                resumed.append(await ChatPeer.open(cluster.ws_url(f"k{i}")))
                resumes.append(await resume(resumed[-1], f"k{i}", len(seen[-1]) - 1))
            responses = [
                await peer.response(rid, lease + 60.0)
                for peer, rid in zip(resumed, resumes, strict=True)
            ]
            async with cluster.reader() as ledger:

                async def completed() -> bool:
                    so_far = await runs_by_chat(ledger)
                    return {r.status for r in so_far.values()} == {"completed"}

                await wait_until(completed, lease + 60.0, "every run to complete on a survivor")
                elapsed = time.monotonic() - killed
                runs = await runs_by_chat(ledger)
                steps = {chat_id: await ledger.steps(run.id) for chat_id, run in runs.items()}
            for page in pages:
                await page.settle()
            # The undisturbed twin: the same calls, chat on b and page on c, nothing killed.
            cluster.balancer.pick = by_path({"/agents/chat/base": "c"})
            base_page = await CountingPage.open(cluster.ws_url("base"))
            base = await chat_once(cluster.direct_url("b", "base"), "base", "base", numbers)
            await base_page.close()
            placed = list(cluster.balancer.placed)
        finally:
            for peer in chats_on_a + resumed:
                await peer.close()
            await asyncio.gather(*(page.close() for page in pages))
        assert not cluster.balancer.errors, cluster.balancer.errors
    assert before == Counter((line, 0) for line in first_lines)
    assert elapsed <= lease + 5.0, f"the runs completed {elapsed:.1f} s after the kill"
    assert len(owners) == 1 and None not in owners
    # Each page once, where it was put, and never again (it never moved); each chat
    # once more after the kill, on a survivor.
    for i in range(chats):
        path = f"/agents/chat/k{i}"
        page_at, chat_at = (name for where, name in placed if where == path)
        assert page_at == "bc"[i % 2] and chat_at in ("b", "c")
    base_text = transcript_of(base).text
    assert base_text == expected_text(numbers)
    for i, page in enumerate(pages):
        run = runs[f"k{i}"]
        assert run.generation == 2 and run.owner not in owners  # taken over, once
        assert tool_outcomes(steps[f"k{i}"]) == [{"n": n, "sq": n * n} for n in numbers]
        assert final_text(steps[f"k{i}"]) == base_text
        assert page.executions == {(f"k{i}", n): 1 for n in numbers}  # each tool ran once
        # What the chat saw, from a and then from a survivor, is one whole response.
        whole = Response(started[i], seen[i] + responses[i].chunks, responses[i].final)
        assert transcript_of(whole) == transcript_of(base)
        assert not resumed[i].violations, resumed[i].violations
    # Each model step was requested once: the recorded ones (the calls, before the
    # kill) not again by the process that took the run over.
    requests = cluster.model_requests()
    assert set(requests.values()) == {1}, requests
    assert len(requests) == 2 * chats + 2  # two steps a chat, and the twin's two


async def test_the_pages_of_a_killed_process_reconnect_and_their_calls_are_delivered_again(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    lease, chats, numbers = 3.0, 10, [1, 2]
    gate = asyncio.Event()
    # Every page on b; every chat on a, which owns the runs and keeps them.
    placement = {f"/agents/chat/p{i}": "b" for i in range(chats)}
    async with Cluster(
        postgres.fresh_url(), tmp_path, 3, lease=lease, pick=by_path(placement)
    ) as cluster:
        pages = await asyncio.gather(
            *(CountingPage.open(cluster.ws_url(f"p{i}"), gate) for i in range(chats))
        )
        peers: list[ChatPeer] = []
        try:
            requests: list[str] = []
            for i in range(chats):
                peers.append(await ChatPeer.open(cluster.direct_url("a", f"p{i}")))
                requests.append(
                    await peers[-1].browser.start_chat(prompt_for(f"p{i}", numbers), f"p{i}")
                )
            await wait_until(
                lambda: all(len(page.running) == len(numbers) for page in pages),
                60.0,
                "every tool to run",
            )
            await cluster.kill("b")
            # The pages come back through the balancer on a or c, and the runs on a
            # deliver their calls there again; the tools are still running.
            paths = [f"/agents/chat/p{i}" for i in range(chats)]
            await wait_until(
                lambda: all(cluster.balancer.holding(path) in (["a"], ["c"]) for path in paths),
                30.0,
                "every page to reconnect",
            )
            async with cluster.reader() as ledger:

                async def delivered_again() -> bool:
                    attempts = [
                        s.attempts
                        for run in (await runs_by_chat(ledger)).values()
                        for s in await ledger.steps(run.id)
                        if s.kind == "tool"
                    ]
                    return len(attempts) == chats * len(numbers) and min(attempts) >= 2

                await wait_until(delivered_again, 30.0, "every call to be delivered again")
            moved_to = [cluster.balancer.holding(path)[0] for path in paths]
            gate.set()
            responses = [
                await peer.response(request_id)
                for peer, request_id in zip(peers, requests, strict=True)
            ]
            for page in pages:
                await page.settle()
            async with cluster.reader() as ledger:
                runs = await runs_by_chat(ledger)
        finally:
            for peer in peers:
                await peer.close()
            await asyncio.gather(*(page.close() for page in pages))
        assert not cluster.balancer.errors, cluster.balancer.errors
    assert set(moved_to) <= {"a", "c"}
    for i, (page, response) in enumerate(zip(pages, responses, strict=True)):
        transcript = transcript_of(response)  # one stream on a, start to end
        assert (transcript.final, transcript.text) == ("end", expected_text(numbers))
        assert transcript.outcomes == expected_outcomes(numbers)
        assert page.executions == {(f"p{i}", n): 1 for n in numbers}  # each tool ran once
        assert page.cancelled == set()
        assert (runs[f"p{i}"].status, runs[f"p{i}"].generation) == ("completed", 1)


async def test_a_stale_owner_writes_nothing_for_the_run_a_third_process_took(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    """tests/server/test_leases.py has this for two processes, the page moving with the run;
    here the page stays on a third process, which the new owner reaches through the bus."""
    lease = 2.0
    gate = asyncio.Event()
    async with Cluster(
        postgres.fresh_url(), tmp_path, 3, lease=lease, pick=by_path({"/agents/chat/st": "b"})
    ) as cluster:
        page = await CountingPage.open(cluster.ws_url("st"), gate)
        chat = await ChatPeer.open(cluster.direct_url("a", "st"))
        try:
            await chat.browser.start_chat(prompt_for("st", [5]), "st1")
            await wait_until(lambda: ("st", 5) in page.running, 30.0, "the tool to run")
            async with cluster.reader() as ledger:

                async def run() -> Execution:
                    return (await runs_by_chat(ledger))["st1"]

                async def taken_over() -> bool:
                    return (await run()).generation == 2

                async def delivered_again() -> bool:
                    tools = [s for s in await ledger.steps(first.id) if s.kind == "tool"]
                    return [s.attempts for s in tools] == [2]

                async def completed() -> bool:
                    return (await run()).status == "completed"

                first = await run()
                # Paused past its lease: b or c takes the run over and delivers the call
                # again to the page, which stayed on b.
                cluster.pause("a")
                await wait_until(taken_over, lease + 30.0, "the take-over")
                await wait_until(delivered_again, 30.0, "the call to be delivered again")
                taken, steps_taken = await run(), await ledger.steps(first.id)
                # Back: a finds out at its next renewal, and stops the run.
                cluster.resume("a")
                await wait_until(lambda: "lease lost" in cluster.log("a"), 30.0, "the stale one")
                after, steps_after = await run(), await ledger.steps(first.id)
                gate.set()
                await wait_until(completed, 30.0, "the run to complete")
                done, steps_done = await run(), await ledger.steps(first.id)
            holding = cluster.balancer.holding("/agents/chat/st")
        finally:
            await chat.close()
            await page.close()
        assert not cluster.balancer.errors, cluster.balancer.errors
    assert (first.generation, taken.generation) == (1, 2) and taken.owner != first.owner
    assert holding == ["b"]  # the page never moved
    # Nothing written by the stale process: not the step (no "cancelled" error, no
    # attempt), not the execution (its owner, generation, status, updated time).
    assert steps_after == steps_taken
    same = ("status", "owner", "generation", "updated_at", "error")
    assert [getattr(after, f) for f in same] == [getattr(taken, f) for f in same]
    assert page.cancelled == set()  # the page was not told to abort the tool
    assert page.executions == {("st", 5): 1}
    assert (done.status, done.generation, done.owner) == ("completed", 2, taken.owner)
    assert tool_outcomes(steps_done) == [{"n": 5, "sq": 25}]
