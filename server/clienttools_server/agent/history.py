"""AI SDK UIMessages as pydantic-ai message history, and the digest replay compares.

The page sends the whole conversation as UIMessages with every request; the
agent run starts from them. Parts a model cannot use (files, sources, data
parts) are skipped. A tool part becomes the model's tool call and its result:
``output-available`` an output, ``output-denied`` a denied call, anything else
a failed one (``errorText``, or ``no result``).

    >>> [type(m).__name__ for m in history_from_ui([
    ...     {"role": "user", "parts": [{"type": "text", "text": "hi"}]},
    ...     {"role": "assistant", "parts": [{"type": "text", "text": "hello"}]},
    ... ])]
    ['ModelRequest', 'ModelResponse']
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from pydantic import JsonValue
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelRequestPart,
    ModelResponse,
    ModelResponsePart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_core import to_jsonable_python

from ..canonical import canonical_json


def history_from_ui(ui_messages: Sequence[JsonValue]) -> list[ModelMessage]:
    """Turn AI SDK UIMessages into pydantic-ai messages."""
    messages: list[ModelMessage] = []
    for ui in ui_messages:
        if not isinstance(ui, dict):
            continue
        raw_parts = ui.get("parts")
        parts = [p for p in raw_parts if isinstance(p, dict)] if isinstance(raw_parts, list) else []
        text = "".join(str(p.get("text", "")) for p in parts if p.get("type") == "text")
        role = ui.get("role")
        if role == "user":
            messages.append(ModelRequest(parts=[UserPromptPart(text)]))
        elif role == "assistant":
            calls: list[ModelResponsePart] = [TextPart(text)] if text else []
            results: list[ModelRequestPart] = []
            for part in parts:
                found = _tool_part(part)
                if found is not None:
                    calls.append(found[0])
                    results.append(found[1])
            if calls:
                messages.append(ModelResponse(parts=calls))
            if results:
                messages.append(ModelRequest(parts=results))
    return messages


def _tool_part(part: dict[str, JsonValue]) -> tuple[ToolCallPart, ToolReturnPart] | None:
    kind = part.get("type")
    if not isinstance(kind, str) or not (kind.startswith("tool-") or kind == "dynamic-tool"):
        return None
    name = part.get("toolName") if kind == "dynamic-tool" else kind.removeprefix("tool-")
    call_id, state, tool_input = part.get("toolCallId"), part.get("state"), part.get("input")
    if not isinstance(name, str) or not isinstance(call_id, str):
        return None
    call = ToolCallPart(name, tool_input if isinstance(tool_input, dict) else {}, call_id)
    if state == "output-available":
        return call, ToolReturnPart(name, part.get("output"), call_id)
    if state == "output-denied":
        return call, ToolReturnPart(name, "the user denied this call", call_id, outcome="denied")
    error_text = part.get("errorText")
    return call, ToolReturnPart(name, str(error_text or "no result"), call_id, outcome="failed")


def tagged(messages: Sequence[ModelMessage]) -> list[JsonValue]:
    """What of a history a model step depends on, as JSON (no timestamps, no instructions)."""
    out: list[JsonValue] = []
    for message in messages:
        if isinstance(message, ModelResponse):
            text = "".join(p.content for p in message.parts if isinstance(p, TextPart))
            calls: list[JsonValue] = [
                {
                    "tool_call_id": p.tool_call_id,
                    "tool_name": p.tool_name,
                    "input": p.args_as_dict(),
                }
                for p in message.parts
                if isinstance(p, ToolCallPart)
            ]
            out.append({"kind": "AssistantMessage", "text": text, "tool_calls": calls})
            continue
        for part in message.parts:
            if isinstance(part, UserPromptPart):
                content = part.content if isinstance(part.content, str) else repr(part.content)
                out.append({"kind": "UserMessage", "text": content})
            elif isinstance(part, ToolReturnPart):
                # An unknown tool's text lists the tools registered at the time: not
                # stable across a restart.
                result: JsonValue = (
                    "unknown_tool" if unknown_tool(part) else to_jsonable_python(part.content)
                )
                out.append(
                    {
                        "kind": "ToolResult",
                        "tool_call_id": part.tool_call_id,
                        "tool_name": part.tool_name,
                        "outcome": part.outcome,
                        "output": result,
                    }
                )
    return out


def unknown_tool(part: ToolReturnPart) -> bool:
    """Is this pydantic-ai's own answer to a call of a tool that does not exist?"""
    return part.retry is not None and part.retry.cause == "unknown_tool"


def digest(messages: Sequence[ModelMessage]) -> str:
    """A short stable hash of :func:`tagged`: part of each recorded model step's input."""
    return hashlib.sha256(canonical_json(tagged(messages)).encode()).hexdigest()[:32]
