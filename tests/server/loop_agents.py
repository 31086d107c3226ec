"""Agents the agent-loop tests serve from a real server process with ``--agent``.

With ``LOOP_AGENT_REQUESTS=PATH`` in the environment each model request
appends a line to PATH, so a test can count requests across a SIGKILL.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import AsyncIterator
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelRequest, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel


def _count_request() -> None:
    path = os.environ.get("LOOP_AGENT_REQUESTS")
    if path:
        with open(path, "a") as handle:
            handle.write("request\n")


def _returns(messages: list[ModelMessage]) -> dict[str, Any]:
    return {
        p.tool_name: p.content
        for m in messages
        if isinstance(m, ModelRequest)
        for p in m.parts
        if isinstance(p, ToolReturnPart)
    }


async def _two_at_once(
    messages: list[ModelMessage], info: AgentInfo
) -> AsyncIterator[str | DeltaToolCalls]:
    """Call ``locate`` and ``weather`` in parallel, then answer from both results."""
    _count_request()
    got = _returns(messages)
    if {"locate", "weather"} <= got.keys():
        yield "You are in "
        yield f"{got['locate']['city']}, "
        yield f"where it is {got['weather']['sky']}."
        return
    yield {0: DeltaToolCall("locate", "{}", tool_call_id=f"call-{secrets.token_hex(4)}")}
    yield {
        1: DeltaToolCall(
            "weather", json.dumps({"when": "now"}), tool_call_id=f"call-{secrets.token_hex(4)}"
        )
    }


async def _one_slow_call(
    messages: list[ModelMessage], info: AgentInfo
) -> AsyncIterator[str | DeltaToolCalls]:
    """Call ``slow`` once, then answer with its result."""
    _count_request()
    got = _returns(messages)
    if "slow" in got:
        yield f"slow said {json.dumps(got['slow'])}"
        return
    yield {0: DeltaToolCall("slow", "{}", tool_call_id=f"call-{secrets.token_hex(4)}")}


parallel = Agent(FunctionModel(stream_function=_two_at_once, model_name="two-at-once"))
slow = Agent(FunctionModel(stream_function=_one_slow_call, model_name="one-slow-call"))


async def _title_and_note(
    messages: list[ModelMessage], info: AgentInfo
) -> AsyncIterator[str | DeltaToolCalls]:
    """Call the example page's ``page_title`` and ``add_note`` in parallel, then answer."""
    got = _returns(messages)
    if {"page_title", "add_note"} <= got.keys():
        yield f"The page is {got['page_title']}; "
        yield f"note {got['add_note']} added."
        return
    yield {0: DeltaToolCall("page_title", "{}", tool_call_id=f"call-{secrets.token_hex(4)}")}
    note = json.dumps({"text": "milk"})
    yield {1: DeltaToolCall("add_note", note, tool_call_id=f"call-{secrets.token_hex(4)}")}


notes = Agent(FunctionModel(stream_function=_title_and_note, model_name="title-and-note"))
