"""The agent loop in-process: a user's agent tools, approvals inside the stream, typed output.

Round trips (``--client-tools round-trip``) are in test_server_round_trip.py.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic import BaseModel
from pydantic_ai import Agent, ModelRetry, RunContext
from pydantic_ai.messages import ModelMessage
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel
from pydantic_ai.toolsets import FunctionToolset, ToolsetTool
from pydantic_ai.toolsets.combined import CombinedToolset
from server_harness import ChunkCollector, FakeBrowser, settled, tool_spec

from clienttools_server.agent.runs import combined
from clienttools_server.agent.scripted import scripted_model
from clienttools_server.agent.server_tools import ServerToolset
from clienttools_server.app import RunningServer, running_server
from clienttools_server.config import ServerConfig
from clienttools_server.ledger import MAX_STORED_BYTES, Execution, Step
from tests.support.wait import wait_until


def _agent() -> Agent[None, Any]:
    agent: Agent[None, Any] = Agent(name="bank", instructions="Move money only when asked.")

    @agent.tool_plain(requires_approval=True)
    def transfer(amount: int) -> str:
        """Send money (a human approves each transfer)."""
        return f"sent {amount}"

    @agent.tool_plain
    def balance() -> int:
        """What is in the account."""
        return 100

    return agent


@pytest.fixture
async def bank() -> AsyncIterator[RunningServer]:
    config = ServerConfig(port=0, log_level="warning")
    async with running_server(config, agent=_agent()) as server:
        yield server


@pytest.fixture
async def page(bank: RunningServer, chunk_collector: ChunkCollector) -> AsyncIterator[FakeBrowser]:
    browser = await FakeBrowser.connect(bank.ws_url("b1"), chunk_collector)
    yield browser
    await browser.close()
    assert not browser.violations, browser.violations


async def test_info_says_which_model_and_agent_answer(bank: RunningServer) -> None:
    def get() -> Any:
        with urllib.request.urlopen(f"{bank.http_url}/agents/info", timeout=5) as response:
            return json.load(response)

    assert await asyncio.to_thread(get) == {"model": "scripted", "agent": "bank"}


async def test_agent_tools_run_beside_page_tools(bank: RunningServer, page: FakeBrowser) -> None:
    async def title(tool_input: dict[str, Any]) -> Any:
        return "Bank"

    await page.register([tool_spec("title")], handlers={"title": title})
    response = await page.chat("call balance {}\ncall title {}")
    assert response.text == 'balance -> 100\ntitle -> "Bank"'
    await settled(bank.hub)


async def test_a_page_tool_cannot_take_an_agent_tools_name(page: FakeBrowser) -> None:
    ack = await page.register([tool_spec("balance")])
    assert ack["rejected"] == [{"name": "balance", "reason": "the name is taken by a server tool"}]


async def test_requires_approval_pauses_inside_the_response(
    bank: RunningServer, page: FakeBrowser
) -> None:
    await page.register([])
    request_id = await page.start_chat('call transfer {"amount": 5}')
    request = await page.chunk(request_id, "tool-approval-request")
    await page.send(
        {"type": "cf_agent_tool_approval", "toolCallId": request["toolCallId"], "approved": True}
    )
    response = await page.response(request_id)
    assert response.text == 'transfer -> "sent 5"'
    kinds = response.types
    assert kinds.index("tool-approval-request") < kinds.index("tool-output-available")
    assert response.final["type"] == "end" and response.types.count("finish") == 1
    await settled(bank.hub)


async def test_requires_approval_denied(bank: RunningServer, page: FakeBrowser) -> None:
    await page.register([])
    request_id = await page.start_chat('call transfer {"amount": 500}')
    call_id = (await page.chunk(request_id, "tool-approval-request"))["toolCallId"]
    await page.send(
        {"type": "cf_agent_tool_approval", "toolCallId": call_id, "approved": False, "reason": "no"}
    )
    response = await page.response(request_id)
    assert response.of_type("tool-output-denied") == [
        {"type": "tool-output-denied", "toolCallId": call_id}
    ]
    assert response.text == "transfer failed: denied: no"
    await settled(bank.hub)


async def test_requires_approval_settled_from_outside(
    bank: RunningServer, page: FakeBrowser
) -> None:
    await page.register([])
    request_id = await page.start_chat('call transfer {"amount": 7}')
    await page.chunk(request_id, "tool-approval-request")
    ledger = bank.app.state.ledger

    async def asked() -> bool:
        return bool(await ledger.pending_steps(session="b1", resolution="approval"))

    await wait_until(asked)
    [step] = await ledger.pending_steps(session="b1", resolution="approval")
    assert step.name == "approval:transfer"
    outcome = await bank.hub.resolve(step.execution_id, step.seq, {"approved": True})
    assert outcome.ok, outcome.message
    assert (await page.response(request_id)).text == 'transfer -> "sent 7"'
    await settled(bank.hub)


async def test_structured_output_is_the_answer_and_no_tool_step(
    chunk_collector: ChunkCollector,
) -> None:
    class Answer(BaseModel):
        city: str

    agent: Agent[None, Any] = Agent(name="typed", output_type=Answer)
    config = ServerConfig(port=0, log_level="warning")
    async with running_server(config, agent=agent, model=TestModel()) as server:
        page = await FakeBrowser.connect(server.ws_url("o1"), chunk_collector)
        await page.register([])
        response = await page.chat("where?")
        await page.close()
        assert json.loads(response.text) == {"city": "a"}
        # TestModel calls every tool (server_time here), then the output tool: not shown.
        shown = {c["toolName"] for c in response.of_type("tool-input-available")}
        assert shown == {"server_time"}
        await settled(server.hub)
        [execution] = await server.app.state.ledger.executions()
        steps = await server.app.state.ledger.steps(execution.id)
        assert [(s.kind, s.name) for s in steps] == [
            ("model", "test"),
            ("tool", "server_time"),
            ("model", "test"),
        ]


async def test_the_scripted_model_waits_its_delays() -> None:
    clock = asyncio.get_running_loop().time
    agent: Agent[None, Any] = Agent(scripted_model(first_chunk_delay=0.2, chunk_delay=0.05))
    started = clock()
    async with agent.run_stream("hello") as result:
        deltas = [d async for d in result.stream_text(delta=True)]
    # "I have no tools to call right now.": 8 words, so at least 0.2 + 7 x 0.05 s.
    assert len("".join(deltas).split()) == 8
    assert clock() - started >= 0.2 + 7 * 0.05


def test_a_function_toolset_that_offers_nothing_is_left_out() -> None:
    server = ServerToolset({})
    assert combined([FunctionToolset(), server]) is server
    kept = combined([FunctionToolset(instructions="Answer in French."), FunctionToolset(), server])
    assert isinstance(kept, CombinedToolset) and len(kept.toolsets) == 2


def clock() -> str:
    """The time."""
    return "noon"


class _OffersClock(FunctionToolset[None]):
    """Holds no tools, and offers one: ``clock``, only when asked."""

    async def get_tools(self, ctx: RunContext[None]) -> dict[str, ToolsetTool[None]]:
        return await FunctionToolset([clock]).get_tools(ctx)


async def _chat_with_page_tools(
    agent: Agent[None, Any], names: list[str], chunk_collector: ChunkCollector, **model: Any
) -> Any:
    """One chat "hello" on a server of ``agent``, from a page with tools ``names``."""
    config = ServerConfig(port=0, log_level="warning")
    async with running_server(config, agent=agent, **model) as server:
        browser = await FakeBrowser.connect(server.ws_url("b1"), chunk_collector)
        try:
            await browser.register([tool_spec(name) for name in names])
            response = await browser.chat("hello")
        finally:
            await browser.close()
        await settled(server.hub)
    return response


async def test_function_toolsets_that_offer_something_stay_in_the_run(
    chunk_collector: ChunkCollector,
) -> None:
    """Instructions, and tools a subclass offers from outside its own dict, reach the model."""

    async def tell(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str]:
        tools = sorted(tool.name for tool in info.function_tools)
        yield f"{info.instructions} | {', '.join(tools)}"

    agent: Agent[None, Any] = Agent(
        toolsets=[
            FunctionToolset(instructions="Answer in French."),
            FunctionToolset(),
            _OffersClock(),
        ]
    )
    model = FunctionModel(stream_function=tell)
    response = await _chat_with_page_tools(agent, ["title"], chunk_collector, model=model)
    assert response.text == "Answer in French. | clock, server_time, title"


async def test_a_page_tool_named_like_a_tool_the_agent_offers_later_fails_the_run_clearly(
    chunk_collector: ChunkCollector,
) -> None:
    # Registration refuses the names of the agent's tools it knows; one a toolset
    # offers only when asked is found when the run asks for the tools.
    agent: Agent[None, Any] = Agent(toolsets=[_OffersClock()])
    response = await _chat_with_page_tools(agent, ["clock"], chunk_collector)
    [error] = response.of_type("error")
    assert error["errorText"] == (
        "the agent could not run: a page tool is named 'clock' like a tool of the server"
    )


async def _one_chat(
    agent: Agent[None, Any], answer: Any, text: str, chunk_collector: ChunkCollector
) -> tuple[Any, Execution, list[Step]]:
    """A chat of ``text`` on a server of ``agent`` whose model streams ``answer``:
    the response, and its execution and steps once the server settled."""
    config = ServerConfig(port=0, log_level="warning")
    model = FunctionModel(stream_function=answer)
    async with running_server(config, agent=agent, model=model) as server:
        page = await FakeBrowser.connect(server.ws_url("one"), chunk_collector)
        await page.register([])
        response = await page.chat(text)
        await page.close()
        await settled(server.hub)
        [execution] = await server.app.state.ledger.executions()
        return response, execution, await server.app.state.ledger.steps(execution.id)


async def test_an_answer_retried_by_the_output_validator_is_recorded_before_the_next(
    chunk_collector: ChunkCollector,
) -> None:
    """An answer that asks for nothing is written with what follows it: here the model
    step its validator's retry asks for, which comes after it in the ledger."""

    async def answer(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str]:
        yield "draft" if len(messages) == 1 else "final"

    agent: Agent[None, str] = Agent(name="careful")

    @agent.output_validator
    def no_drafts(output: str) -> str:
        if output == "draft":
            raise ModelRetry("not a draft, please")
        return output

    response, execution, steps = await _one_chat(agent, answer, "write", chunk_collector)
    assert response.final["type"] == "end"
    assert execution.status == "completed"
    assert [(s.seq, s.kind, s.state) for s in steps] == [
        (0, "model", "applied"),
        (1, "model", "applied"),
    ]
    assert ["draft" in json.dumps(s.result()) for s in steps] == [True, False]


async def test_a_last_answer_too_large_to_store_fails_the_run_before_its_finish(
    chunk_collector: ChunkCollector,
) -> None:
    """The answer waits for the run's end only if it can be stored: one that cannot
    ends the response with an error, and no ``finish`` before it."""

    async def answer(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str]:
        yield "x" * MAX_STORED_BYTES

    agent: Agent[None, str] = Agent(name="verbose")
    response, execution, steps = await _one_chat(agent, answer, "write a lot", chunk_collector)
    kinds = [c["type"] for c in response.chunks]
    assert "finish" not in kinds and kinds[-1] == "error", kinds[-3:]
    assert "could not be recorded" in response.chunks[-1]["errorText"]
    assert execution.status == "error"
    assert steps == []
