"""The model interface the runtime drives, and the deterministic ``scripted`` model.

A model takes the conversation so far and the tools it may call, and streams
text deltas and tool calls. The scripted model needs no network and answers
the same way every time, so end-to-end tests can state exact expectations:

    >>> import asyncio
    >>> model = ScriptedModel()
    >>> async def first_events() -> list[ModelEvent]:
    ...     history = [UserMessage('call echo {"x": 1}')]
    ...     return [event async for event in model.stream(history, [])]
    >>> [(e.tool_name, e.input) for e in asyncio.run(first_events()) if isinstance(e, ToolCall)]
    [('echo', {'x': 1})]
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeAlias

from pydantic import JsonValue

JsonObject: TypeAlias = dict[str, JsonValue]


@dataclass(frozen=True, slots=True)
class ToolDescription:
    """What the model is told about a tool it may call."""

    name: str
    description: str
    input_schema: JsonObject


@dataclass(frozen=True, slots=True)
class TextDelta:
    text: str


@dataclass(frozen=True, slots=True)
class ToolCall:
    tool_call_id: str
    tool_name: str
    input: JsonObject


ModelEvent: TypeAlias = TextDelta | ToolCall


@dataclass(frozen=True, slots=True)
class UserMessage:
    text: str


@dataclass(frozen=True, slots=True)
class AssistantMessage:
    text: str
    tool_calls: tuple[ToolCall, ...] = ()


@dataclass(frozen=True, slots=True)
class ToolResult:
    """The outcome of one tool call as the model reads it: an output, or an error."""

    tool_call_id: str
    tool_name: str
    output: JsonValue = None
    # {"code", "message"}; code "denied" when a human refused the call.
    error: dict[str, str] | None = field(default=None)


Message: TypeAlias = UserMessage | AssistantMessage | ToolResult


class Model(Protocol):
    """An async stream of text deltas and tool calls for one step of a run."""

    @property
    def name(self) -> str: ...

    def stream(
        self, messages: Sequence[Message], tools: Sequence[ToolDescription]
    ) -> AsyncIterator[ModelEvent]: ...


_CALL_LINE = re.compile(r"^\s*call\s+([A-Za-z_][A-Za-z0-9_-]{0,63})(?:\s+(.*\S))?\s*$")
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


class ScriptedModel:
    """A deterministic stand-in for a language model.

    - Each line of the last user message of the form ``call NAME {json}``
      becomes a tool call; several such lines are parallel calls in one step.
    - Once every call has its result, it answers one line per call, in call
      order: ``NAME -> <compact JSON output>`` or ``NAME failed: <code>: <message>``.
    - Any other text gets a reply that lists the tools it can call.

    Text streams in word-sized deltas. ``first_chunk_delay`` and ``chunk_delay``
    (seconds) give each request the latency of a hosted model: the time to its
    first event, and the time between events.
    """

    name = "scripted"

    def __init__(self, *, first_chunk_delay: float = 0.0, chunk_delay: float = 0.0) -> None:
        if first_chunk_delay < 0 or chunk_delay < 0:
            raise ValueError("model delays must not be negative")
        self.first_chunk_delay = first_chunk_delay
        self.chunk_delay = chunk_delay

    async def stream(
        self, messages: Sequence[Message], tools: Sequence[ToolDescription]
    ) -> AsyncIterator[ModelEvent]:
        for index, event in enumerate(self._answer(messages, tools)):
            # Yield to the loop between deltas (sleep(0) at least), as a network model would.
            await asyncio.sleep(self.first_chunk_delay if index == 0 else self.chunk_delay)
            yield event

    def _answer(
        self, messages: Sequence[Message], tools: Sequence[ToolDescription]
    ) -> list[ModelEvent]:
        last_user = max(
            (i for i, message in enumerate(messages) if isinstance(message, UserMessage)),
            default=None,
        )
        if last_user is None:
            return [TextDelta(w) for w in words(self._menu(tools))]
        later = messages[last_user + 1 :]
        calls = [call for m in later if isinstance(m, AssistantMessage) for call in m.tool_calls]
        if calls:
            results = {m.tool_call_id: m for m in later if isinstance(m, ToolResult)}
            return [TextDelta(w) for w in words(self._report(calls, results))]
        user = messages[last_user]
        assert isinstance(user, UserMessage)
        parsed = [parse_call_line(line) for line in user.text.splitlines()]
        wanted = [p for p in parsed if p is not None]
        if wanted:
            return [
                ToolCall(f"call_{secrets.token_hex(8)}", name, tool_input)
                for name, tool_input in wanted
            ]
        return [TextDelta(w) for w in words(self._menu(tools))]

    @staticmethod
    def _menu(tools: Sequence[ToolDescription]) -> str:
        if not tools:
            return "I have no tools to call right now."
        names = ", ".join(sorted(tool.name for tool in tools))
        return f"I can call these tools: {names}. Write `call NAME {{json}}` on a line to call one."

    @staticmethod
    def _report(calls: Sequence[ToolCall], results: dict[str, ToolResult]) -> str:
        lines = []
        for call in calls:
            result = results.get(call.tool_call_id)
            if result is None:
                lines.append(f"{call.tool_name} failed: missing: no result arrived")
            elif result.error is not None:
                code, message = result.error.get("code", "error"), result.error.get("message", "")
                lines.append(f"{call.tool_name} failed: {code}: {message}")
            else:
                lines.append(f"{call.tool_name} -> {compact_json(result.output)}")
        return "\n".join(lines)


def create_model(name: str, *, first_chunk_delay: float = 0.0, chunk_delay: float = 0.0) -> Model:
    """The model a ``--model`` name stands for; the delays apply to the scripted model."""
    if name == "scripted":
        return ScriptedModel(first_chunk_delay=first_chunk_delay, chunk_delay=chunk_delay)
    raise ValueError(f"unknown model {name!r}; available: scripted")


def messages_from_ui(ui_messages: Sequence[JsonValue]) -> list[Message]:
    """Turn AI SDK UIMessages into model messages; parts the model cannot use are skipped."""
    messages: list[Message] = []
    for ui in ui_messages:
        if not isinstance(ui, dict):
            continue
        parts = ui.get("parts")
        parts = parts if isinstance(parts, list) else []
        text = "".join(
            str(p.get("text", "")) for p in parts if isinstance(p, dict) and p.get("type") == "text"
        )
        role = ui.get("role")
        if role == "user":
            messages.append(UserMessage(text))
        elif role == "assistant":
            calls: list[ToolCall] = []
            results: list[ToolResult] = []
            for part in parts:
                found = _tool_part(part)
                if found is not None:
                    calls.append(found[0])
                    results.append(found[1])
            messages.append(AssistantMessage(text, tuple(calls)))
            messages.extend(results)
    return messages


def _tool_part(part: JsonValue) -> tuple[ToolCall, ToolResult] | None:
    if not isinstance(part, dict):
        return None
    kind = part.get("type")
    if not isinstance(kind, str) or not (kind.startswith("tool-") or kind == "dynamic-tool"):
        return None
    name = part.get("toolName") if kind == "dynamic-tool" else kind.removeprefix("tool-")
    call_id, state, tool_input = part.get("toolCallId"), part.get("state"), part.get("input")
    if not isinstance(name, str) or not isinstance(call_id, str):
        return None
    call = ToolCall(call_id, name, tool_input if isinstance(tool_input, dict) else {})
    if state == "output-available":
        return call, ToolResult(call_id, name, output=part.get("output"))
    if state == "output-denied":
        return call, ToolResult(call_id, name, error={"code": "denied", "message": "denied"})
    error_text = part.get("errorText")
    return call, ToolResult(
        call_id, name, error={"code": "error", "message": str(error_text or "no result")}
    )
