"""Races: a result against the server's timeout, an abort against a result.

Either side may win; what must hold is that each call settles exactly once,
runs at most once, leaves nothing pending on the server or in the page's outbox,
and that the transcript is the undisturbed one or the one the winner implies.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator

import pytest

from clienttools_server.app import RunningServer
from clienttools_server.config import ServerConfig
from clienttools_server.ledger import Step
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


async def tool_step(server: RunningServer, tag: str, n: int) -> Step:
    """The one ledger step of the `work` call (tag, n): who settled it is recorded there."""
    ledger = server.app.state.ledger
    found = []
    for execution in await ledger.executions():
        for step in await ledger.steps(execution.id):
            if step.kind != "tool" or step.name != "work":
                continue
            tool_input = json.loads(step.input_json)
            if tool_input.get("tag") == tag and tool_input.get("n") == n:
                found.append(step)
    assert len(found) == 1, f"{len(found)} ledger steps for {(tag, n)}"
    return found[0]


def error_code(step: Step) -> object:
    error = step.error()
    return None if error is None else error.get("code")


async def no_step_pending(server: RunningServer) -> bool:
    ledger = server.app.state.ledger
    return all(
        [
            step.state != "pending"
            for execution in await ledger.executions()
            for step in await ledger.steps(execution.id)
        ]
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
        # Around the timeout: 0.15 to 0.35 s, plus the trips of the invoke and the result;
        # stratified (one call per 25 ms slice), so every round has calls that finish well
        # before the timeout, calls that cannot, and calls on the edge.
        delays = {n: int((0.15 + (i + rng.random()) * 0.025) * 1000) for i, n in enumerate(numbers)}
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
            # The ledger agrees with what the response showed: applied with the output, or
            # settled with the timeout error; never pending.
            step = await tool_step(stack.server, tag, call.n)
            if outcome == expected:
                assert step.state == "applied" and step.result() == expected, step
            else:
                assert step.state == "error" and error_code(step) == "timeout", step
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
    # A race that one side always wins tested nothing: both must have won.
    assert won["result"] >= 1 and won["timeout"] >= 1, won
    late = sum(1 for acks in stack.spy.acks.values() if "stale" in acks)
    scenario.faults = won["timeout"]
    scenario.note(
        f"result won {won['result']}, timeout won {won['timeout']}; {late} late results were stale"
    )
    await settled(stack.server.hub)
    assert await no_step_pending(stack.server)


async def test_abort_racing_the_result(stack: Stack, scenario: Scenario, soak_factor: int) -> None:
    scenario.describe("races", "abort (cancel) racing the tool's result")
    rng = random.Random(5)
    # Who settled the call, as the ledger records it; and whether the response was aborted.
    won = {"result": 0, "abort": 0}
    aborted_after_output = 0
    for index in range(10 * soak_factor):
        n = index
        tag = f"abort-{index}"
        request_id = await stack.chat.start(prompt_for(tag, [n], ms=lambda _: 100))
        await wait_until(lambda k=(tag, n): k in stack.page.executions, what="the tool to start")
        # Abort from well before the moment the tool returns (100 ms) to well after it:
        # ten 25 ms slices, one per iteration, so every run of the seed covers the window
        # and each side wins by a wide margin in some iterations.
        await asyncio.sleep(((index % 10) + rng.random()) * 0.025)
        await stack.chat.browser.send({"type": "abort", "requestId": request_id})
        response = await stack.chat.response(request_id)
        await stack.page.settle()
        await wait_until(lambda: not stack.page.running, what="the cancelled tool to end")
        report = report_of(response, stack.page, tag)
        expected = {"n": n, "sq": n * n}
        aborted = any(c["type"] == "abort" for c in response.chunks)
        executions = stack.page.executions[(tag, n)]
        outputs = report.calls[0].settlements if report.calls else 0
        step = await tool_step(stack.server, tag, n)
        if step.state == "applied":
            won["result"] += 1
            assert step.result() == expected, step
        elif step.state == "error" and error_code(step) == "cancelled":
            won["abort"] += 1
        # A call settles once if the response shows its output once, or, when the abort
        # came first and no output was streamed, if the ledger shows the abort settled it.
        # A step still pending, or settled any other way, is a lost call.
        if outputs:
            settlements = outputs
        else:
            settled_by_abort = aborted and step.state == "error" and error_code(step) == "cancelled"
            applied_unseen = aborted and step.state == "applied"
            settlements = int(settled_by_abort or applied_unseen)
        # The undisturbed transcript (the output, then the end), or an abort: then the
        # call shows the output the ledger applied, or nothing, and the abort is last.
        if aborted:
            seen = "missing" if outputs == 0 else report.transcript.outcomes[0][1]
            transcript_equal = (
                response.chunks[-1]["type"] == "abort"
                and report.transcript.outcomes == [("work", seen)]
                and (seen == "missing" or (seen == expected and step.state == "applied"))
            )
            aborted_after_output += int(outputs > 0)
        else:
            transcript_equal = (
                report.transcript.final == "end"
                and report.transcript.outcomes == [("work", expected)]
                and step.state == "applied"
            )
        scenario.add_call(
            settlements=settlements, executions=executions, transcript_equal=transcript_equal
        )
        assert executions == 1
        assert report.calls[0].settlements <= 1
        assert settlements == 1, (step, response.types)
        assert transcript_equal, (step, response.types)
        scenario.iterations += 1
    assert not stack.spy.applied_twice()
    # A race that one side always wins tested nothing: both must have won.
    assert won["result"] >= 1 and won["abort"] >= 1, won
    scenario.faults = won["abort"]
    stale = sum(1 for acks in stack.spy.acks.values() if "stale" in acks)
    cancels = sum(1 for reasons in stack.spy.cancels.values() if "aborted" in reasons)
    scenario.note(
        f"result won {won['result']}, abort won {won['abort']} (as the ledger settled each "
        f"call); {aborted_after_output} responses aborted after the output; "
        f"{cancels} cancels sent, {stale} late results stale"
    )
    await settled(stack.server.hub)
    assert await no_step_pending(stack.server)
