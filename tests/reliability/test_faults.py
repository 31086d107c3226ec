"""Cuts at every protocol step of a call, and 50 parallel calls under random cuts.

The page is the real ToolClient behind the fault proxy; the server is the real
one, in process. For every call: it settles exactly once (one tool-output chunk,
at most one `applied` ack), it runs at most once on the page (C7 + outbox), and
the response equals the undisturbed run of the same prompt.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator

import pytest

from clienttools_server.config import ServerConfig
from tests.reliability.harness import (
    ACK,
    INVOKE,
    RESULT,
    ResponseReport,
    Stack,
    Transcript,
    faulted_stack,
    prompt_for,
    report_of,
    transcript_of,
)
from tests.reliability.results import Scenario
from tests.server.server_harness import Response, settled
from tests.support.faultproxy import Action, Rule, cut, cut_after, frame_type
from tests.support.wait import wait_until

pytestmark = pytest.mark.soak

SESSION = "rel"


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    async with faulted_stack(ServerConfig(port=0, log_level="warning"), SESSION) as opened:
        yield opened


def work_ms(n: int) -> int:
    """How long the `work` call for `n` sleeps: 20 to 219 ms, spread over the numbers."""
    return 20 + (n * 37) % 200


async def settle_and_count(
    stack: Stack, scenario: Scenario, response: Response, tag: str, baseline: Transcript
) -> tuple[ResponseReport, bool]:
    """Once the page's outbox is empty: the report of `response`, and whether it equals
    `baseline`; both counted in `scenario`."""
    await stack.page.settle()
    report = report_of(response, stack.page, tag)
    equal = report.transcript == baseline
    scenario.add_transcript(equal)
    for call in report.calls:
        scenario.add_call(settlements=call.settlements, executions=call.executions)
    return report, equal


async def run_round(
    stack: Stack, scenario: Scenario, tag: str, numbers: list[int], baseline: Transcript
) -> None:
    """Ask for `numbers` (already faulted by the caller), then count and check every call."""
    response = await stack.chat.ask(prompt_for(tag, numbers, ms=work_ms))
    report, equal = await settle_and_count(stack, scenario, response, tag, baseline)
    assert report.transcript.final == "end", report.transcript
    assert [c.n for c in report.calls] == numbers
    assert all(c.settlements == 1 and c.executions == 1 for c in report.calls), report.calls
    assert equal, (report.transcript, baseline)


async def baseline_for(stack: Stack, tag: str, numbers: list[int]) -> Transcript:
    """The undisturbed run of the same calls (another tag; the output depends on n only)."""
    return transcript_of(await stack.chat.ask(prompt_for(tag, numbers, ms=work_ms)))


# Each step: the rule that cuts the page's connection at that point of a call.
STEPS: dict[str, tuple[str, str, Action]] = {
    "before_invoke": ("down", INVOKE, cut()),
    "after_invoke": ("down", INVOKE, cut_after()),
    "before_result": ("up", RESULT, cut()),
    "after_result": ("up", RESULT, cut_after()),
    "before_ack": ("down", ACK, cut()),
}


@pytest.mark.parametrize("step", [*STEPS, "during_run"])
async def test_cut_at_every_step_of_a_call(
    stack: Stack, scenario: Scenario, soak_factor: int, step: str
) -> None:
    scenario.describe("cuts", f"cut the page's connection {step.replace('_', ' ')}")
    rounds = 3 * soak_factor
    for index in range(rounds):
        numbers = [index * 10 + 1, index * 10 + 2]
        baseline = await baseline_for(stack, f"base-{step}-{index}", numbers)
        tag = f"{step}-{index}"
        if step == "during_run":
            request_id = await stack.chat.start(
                prompt_for(tag, numbers, ms=lambda n: work_ms(n) + 300)
            )
            await wait_until(
                lambda t=tag: any(key[0] == t for key in stack.page.running), what="a running tool"
            )
            scenario.faults += stack.proxy.cut_all()
            response = await stack.chat.response(request_id)
            report, equal = await settle_and_count(stack, scenario, response, tag, baseline)
            assert all(c.settlements == 1 and c.executions == 1 for c in report.calls)
            assert equal, (report.transcript, baseline)
        else:
            direction, kind, action = STEPS[step]
            rule = stack.proxy.add_rule(Rule(direction, frame_type(kind), action))  # type: ignore[arg-type]
            await run_round(stack, scenario, tag, numbers, baseline)
            assert rule.hits == 1, f"the {step} fault never fired"
            scenario.faults += rule.hits
            stack.proxy.rules.remove(rule)
        scenario.iterations += 1
    assert not stack.spy.applied_twice()
    await settled(stack.server.hub)


async def test_fifty_parallel_calls_with_random_cuts(
    stack: Stack, scenario: Scenario, soak_factor: int
) -> None:
    scenario.describe("chaos", "50 parallel calls, random cuts at random protocol steps")
    rng = random.Random(8)  # seeded: the same faults on every run
    for index in range(2 * soak_factor):
        numbers = list(range(index * 100, index * 100 + 50))

        def ms(n: int) -> int:
            return 200 + (n * 7919) % 1000

        baseline = transcript_of(await stack.chat.ask(prompt_for(f"base-{index}", numbers, ms)))
        tag = f"chaos-{index}"
        request_id = await stack.chat.start(prompt_for(tag, numbers, ms))
        response_task = asyncio.create_task(stack.chat.response(request_id))
        faults = 0
        while not response_task.done() and faults < 8:
            await asyncio.sleep(rng.uniform(0.05, 0.3))
            choice = rng.choice(["cut_now", "refuse", "invoke", "result", "ack"])
            if choice == "cut_now":
                faults += stack.proxy.cut_all()
            elif choice == "refuse":
                # Cut, and refuse reconnects for a while: the page retries with backoff.
                stack.proxy.pause()
                faults += stack.proxy.cut_all()
                await asyncio.sleep(rng.uniform(0.1, 0.5))
                stack.proxy.resume()
            else:
                direction, kind = {
                    "invoke": ("down", INVOKE),
                    "result": ("up", RESULT),
                    "ack": ("down", ACK),
                }[choice]
                action = rng.choice([cut(), cut_after()])
                rule = stack.proxy.add_rule(Rule(direction, frame_type(kind), action))  # type: ignore[arg-type]
                # The next such frame, if one still comes: wait for it or for the end.
                await wait_until(lambda r=rule, t=response_task: r.hits > 0 or t.done(), 30.0)
                faults += rule.hits
                stack.proxy.rules.remove(rule)
        scenario.faults += faults
        report, equal = await settle_and_count(stack, scenario, await response_task, tag, baseline)
        scenario.iterations += 1
        assert len(report.calls) == 50
        assert all(c.settlements == 1 and c.executions == 1 for c in report.calls)
        assert equal, (report.transcript, baseline)
    scenario.note(f"{scenario.faults} faults injected, reconnects: {len(stack.proxy.connections)}")
    assert not stack.spy.applied_twice()
    await settled(stack.server.hub)
