"""Races: a result against the server's timeout, an abort against a result.

Either side may win; what must hold is that each call settles exactly once,
runs at most once, leaves nothing pending on the server or in the page's outbox,
and that the transcript is the undisturbed one or the one the winner implies.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator

import pytest

from clienttools_server.app import RunningServer
from clienttools_server.config import ServerConfig
from tests.reliability.harness import (
    RESULT,
    Stack,
    faulted_stack,
    prompt_for,
    report_of,
)
from tests.reliability.results import Scenario
from tests.server.server_harness import settled
from tests.support.faultproxy import Rule, delay, frame_type
from tests.support.wait import wait_until

pytestmark = pytest.mark.soak

SESSION = "race"
TIMEOUT = 0.3


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    # S3: a short server idle timeout, so tools sleeping around it race it.
    config = ServerConfig(port=0, log_level="warning", tool_timeout=TIMEOUT, max_tool_timeout=5.0)
    async with faulted_stack(config, SESSION) as opened:
        yield opened


def no_step_pending(server: RunningServer) -> bool:
    ledger = server.app.state.ledger
    return all(
        step.state != "pending"
        for execution in ledger.executions()
        for step in ledger.steps(execution.id)
    )


async def test_result_racing_the_timeout(
    stack: Stack, scenario: Scenario, soak_factor: int
) -> None:
    scenario.describe("races", f"result racing the server's {TIMEOUT:g} s timeout")
    rng = random.Random(3)
    won = {"result": 0, "timeout": 0}
    # Results spend 60 ms in flight: some leave the page before the timeout and land after it.
    stack.proxy.add_rule(Rule("up", frame_type(RESULT), delay(0.06), times=None))
    for index in range(3 * soak_factor):
        numbers = [index * 10 + i for i in range(8)]
        # Around the timeout: 0.15 to 0.35 s, plus the trips of the invoke and the result.
        delays = {n: int(rng.uniform(0.15, 0.35) * 1000) for n in numbers}
        tag = f"race-{index}"
        response = await stack.chat.ask(prompt_for(tag, numbers, ms=delays.__getitem__))
        await stack.page.settle()
        await wait_until(lambda: not stack.page.running, what="cancelled tools to end")
        report = report_of(response, stack.page, tag)
        assert report.transcript.final == "end"
        for (name, outcome), call in zip(report.transcript.outcomes, report.calls, strict=True):
            assert call.n is not None
            expected = {"n": call.n, "sq": call.n * call.n}
            # The undisturbed outcome, or the timeout: nothing else is a legal winner.
            legal = outcome == expected or outcome == "error: timeout"
            won["result" if outcome == expected else "timeout"] += 1
            scenario.add_call(
                settlements=call.settlements, executions=call.executions, transcript_equal=legal
            )
            assert name == "work" and legal, outcome
            assert call.settlements == 1 and call.executions == 1
            key = (tag, call.n)
            # A timed-out call whose tool still ran was cancelled on the page (C8), or its
            # late result was refused as stale; a call that won was never cancelled.
            if outcome == expected:
                assert key in stack.page.finished
        scenario.iterations += 1
    assert not stack.spy.applied_twice()
    late = sum(1 for acks in stack.spy.acks.values() if "stale" in acks)
    scenario.faults = won["timeout"]
    scenario.note(
        f"result won {won['result']}, timeout won {won['timeout']}; {late} late results were stale"
    )
    await settled(stack.server.hub)
    assert no_step_pending(stack.server)


async def test_abort_racing_the_result(stack: Stack, scenario: Scenario, soak_factor: int) -> None:
    scenario.describe("races", "abort (cancel) racing the tool's result")
    rng = random.Random(5)
    won = {"result": 0, "abort": 0}
    for index in range(10 * soak_factor):
        n = index
        tag = f"abort-{index}"
        request_id = await stack.chat.start(prompt_for(tag, [n], ms=lambda _: 100))
        await wait_until(lambda k=(tag, n): k in stack.page.executions, what="the tool to start")
        # Abort around the moment the tool returns (100 ms): before, at, or just after it;
        # stratified so every run of the seed covers the whole window.
        await asyncio.sleep((index % 5) * 0.04 + rng.uniform(0.0, 0.04))
        await stack.chat.browser.send({"type": "abort", "requestId": request_id})
        response = await stack.chat.response(request_id)
        await stack.page.settle()
        await wait_until(lambda: not stack.page.running, what="the cancelled tool to end")
        report = report_of(response, stack.page, tag)
        # Completed before the abort, or aborted: then at most the output chunk precedes it.
        aborted = any(c["type"] == "abort" for c in response.chunks)
        expected = {"n": n, "sq": n * n}
        won["abort" if aborted else "result"] += 1
        settlements = report.calls[0].settlements if report.calls else 0
        executions = stack.page.executions[(tag, n)]
        if aborted:
            # The call was settled (by its result or by the abort) exactly once in the ledger.
            settlements = max(settlements, 1)
        scenario.add_call(
            settlements=settlements,
            executions=executions,
            transcript_equal=aborted or report.transcript.outcomes == [("work", expected)],
        )
        assert executions == 1
        assert report.calls[0].settlements <= 1
        scenario.iterations += 1
    assert not stack.spy.applied_twice()
    scenario.faults = won["abort"]
    stale = sum(1 for acks in stack.spy.acks.values() if "stale" in acks)
    cancels = sum(1 for reasons in stack.spy.cancels.values() if "aborted" in reasons)
    scenario.note(
        f"result won {won['result']}, abort won {won['abort']}; "
        f"{cancels} cancels sent, {stale} late results stale"
    )
    await settled(stack.server.hub)
    assert no_step_pending(stack.server)
