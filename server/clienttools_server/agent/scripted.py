"""The ``scripted`` model: a deterministic pydantic-ai model that needs no network.

It is a :class:`~pydantic_ai.models.function.FunctionModel`, so the agent loop
drives it exactly as it drives a real model, and end-to-end tests can state
exact expectations:

- Each line of the last user message of the form ``call NAME {json}`` becomes
  a tool call; several such lines are parallel calls in one step.
- Once every call has its result, it answers one line per call, in call
  order: ``NAME -> <compact JSON output>`` or ``NAME failed: <code>: <message>``.
- Any other text gets a reply that lists the tools it can call.

Text streams in word-sized deltas; ``first_chunk_delay`` and ``chunk_delay``
(seconds) pace them like a network model would.

    >>> from pydantic_ai import Agent
    >>> Agent(scripted_model()).run_sync("hello").output
    'I have no tools to call right now.'
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
from collections.abc import AsyncIterator, Sequence
from typing import TypeAlias

from pydantic import JsonValue
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    ModelResponsePart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel
from pydantic_core import to_jsonable_python

from clienttools.protocol import TOOL_NAME_PATTERN

from .history import unknown_tool

JsonObject: TypeAlias = dict[str, JsonValue]

SCRIPTED = "scripted"

_CALL_LINE = re.compile(
    r"^\s*call\s+(" + TOOL_NAME_PATTERN.removeprefix("^").removesuffix("$") + r")(?:\s+(.*\S))?\s*$"
)
_WORD = re.compile(r"\s*\S+\s*|\s+")


def words(text: str) -> list[str]:
    """Split text into word-sized deltas whose concatenation is the text."""
    return _WORD.findall(text)


def parse_call_line(line: str) -> tuple[str, JsonObject] | None:
    """``call NAME {json}`` as (name, input); None when the line is anything else."""
    match = _CALL_LINE.match(line)
    if match is None:
        return None
    raw = match.group(2)
    if raw is None:
        return match.group(1), {}
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    return match.group(1), value


def compact_json(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def scripted_model(*, first_chunk_delay: float = 0.0, chunk_delay: float = 0.0) -> FunctionModel:
    """The scripted model; the delays (seconds) come before the first and every later delta."""

    async def stream(
        messages: list[ModelMessage], info: AgentInfo
    ) -> AsyncIterator[str | DeltaToolCalls]:
        for index, event in enumerate(answer(messages, info)):
            delay = first_chunk_delay if index == 0 else chunk_delay
            # Yield to the loop between deltas, as a network model would.
            await asyncio.sleep(delay)
            yield event

    def whole(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        parts: list[ModelResponsePart] = []
        text = ""
        for event in answer(messages, info):
            if isinstance(event, str):
                text += event
            else:
                parts.extend(
                    ToolCallPart(d.name or "", d.json_args, d.tool_call_id or "")
                    for d in event.values()
                )
        return ModelResponse(parts=[TextPart(text), *parts] if text else parts)

    return FunctionModel(whole, stream_function=stream, model_name=SCRIPTED)


def answer(messages: Sequence[ModelMessage], info: AgentInfo) -> list[str | DeltaToolCalls]:
    """The deltas of the scripted answer to ``messages``."""
    tools = [t.name for t in info.function_tools]
    last_user = max(
        (
            i
            for i, m in enumerate(messages)
            if isinstance(m, ModelRequest) and any(isinstance(p, UserPromptPart) for p in m.parts)
        ),
        default=None,
    )
    if last_user is None:
        return list(words(_menu(tools)))
    later = messages[last_user + 1 :]
    calls = [
        p
        for m in later
        if isinstance(m, ModelResponse)
        for p in m.parts
        if isinstance(p, ToolCallPart)
    ]
    if calls:
        results = {
            p.tool_call_id: p
            for m in later
            if isinstance(m, ModelRequest)
            for p in m.parts
            if isinstance(p, ToolReturnPart)
        }
        return list(words(_report(calls, results)))
    text = "".join(
        p.content
        for p in messages[last_user].parts
        if isinstance(p, UserPromptPart) and isinstance(p.content, str)
    )
    wanted = [found for line in text.splitlines() if (found := parse_call_line(line)) is not None]
    if wanted:
        return [
            {
                index: DeltaToolCall(
                    name, compact_json(tool_input), tool_call_id=f"call_{secrets.token_hex(8)}"
                )
            }
            for index, (name, tool_input) in enumerate(wanted)
        ]
    return list(words(_menu(tools)))


def _menu(tools: Sequence[str]) -> str:
    if not tools:
        return "I have no tools to call right now."
    names = ", ".join(sorted(tools))
    return f"I can call these tools: {names}. Write `call NAME {{json}}` on a line to call one."


def result_line(call: ToolCallPart, result: ToolReturnPart | None) -> str:
    """How the scripted model reports one call: ``NAME -> output`` or ``NAME failed: why``."""
    name = call.tool_name
    if result is None:
        return f"{name} failed: missing: no result arrived"
    if result.outcome == "success":
        return f"{name} -> {compact_json(to_jsonable_python(result.content))}"
    if result.outcome == "denied":
        return f"{name} failed: denied: {result.content}"
    if unknown_tool(result):
        return f"{name} failed: unknown_tool: there is no tool named {name!r}"
    return f"{name} failed: {_text(result.content)}"


def _text(content: object) -> str:
    return content if isinstance(content, str) else compact_json(to_jsonable_python(content))


def _report(calls: Sequence[ToolCallPart], results: dict[str, ToolReturnPart]) -> str:
    return "\n".join(result_line(call, results.get(call.tool_call_id)) for call in calls)
