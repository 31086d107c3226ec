"""The UIMessageChunks of one response, from the events of its pydantic-ai run.

Text, reasoning, tool calls and tool results become the AI SDK's chunks
(``text-*``, ``reasoning-*``, ``tool-input-*``, ``tool-output-*``), each valid
for the ``ai`` package's ``uiMessageChunkSchema``. The writer also hands each
delta and call to the run's journal, so a model step is recorded exactly as it
was streamed and a replay streams the same chunks again.
"""

from __future__ import annotations

from pydantic import JsonValue
from pydantic_ai.messages import (
    AgentStreamEvent,
    FunctionToolResultEvent,
    PartDeltaEvent,
    PartEndEvent,
    PartStartEvent,
    TextPart,
    TextPartDelta,
    ThinkingPart,
    ThinkingPartDelta,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_core import to_jsonable_python

from .history import unknown_tool
from .journal import JsonObject, RunJournal, call_input


class ChunkWriter:
    """Turns one run's events into chunks, in order, through ``emit``."""

    def __init__(self, journal: RunJournal) -> None:
        self.journal = journal
        # The model's chunks go through the journal, which holds those after a tool
        # call until the answer is recorded; tool results go out at once.
        self.emit = journal.hold
        self.emit_now = journal.emit
        self._parts = 0
        # part index -> the chunk id of the open text or reasoning part
        self._open: dict[int, str] = {}

    def _new_id(self, kind: str) -> str:
        part_id = f"{kind}-{self._parts}"
        self._parts += 1
        return part_id

    def model_event(self, event: AgentStreamEvent) -> None:
        if isinstance(event, PartStartEvent):
            part = event.part
            if isinstance(part, TextPart):
                self._open[event.index] = self._new_id("text")
                self.emit({"type": "text-start", "id": self._open[event.index]})
                self._delta("text", event.index, part.content)
            elif isinstance(part, ThinkingPart):
                self._open[event.index] = self._new_id("reasoning")
                self.emit({"type": "reasoning-start", "id": self._open[event.index]})
                self._delta("reasoning", event.index, part.content)
        elif isinstance(event, PartDeltaEvent):
            delta = event.delta
            if isinstance(delta, TextPartDelta):
                self._delta("text", event.index, delta.content_delta)
            elif isinstance(delta, ThinkingPartDelta) and delta.content_delta:
                self._delta("reasoning", event.index, delta.content_delta)
        elif isinstance(event, PartEndEvent):
            part = event.part
            if isinstance(part, TextPart | ThinkingPart):
                part_id = self._open.pop(event.index, None)
                if part_id is not None:
                    kind = "text" if isinstance(part, TextPart) else "reasoning"
                    self.emit({"type": f"{kind}-end", "id": part_id})
            elif isinstance(part, ToolCallPart):
                self.tool_call(part)

    def _delta(self, kind: str, index: int, delta: str) -> None:
        """A ``text`` or ``reasoning`` delta of the open part at ``index``, recorded too."""
        part_id = self._open.get(index)
        if delta and part_id is not None:
            self.emit({"type": f"{kind}-delta", "id": part_id, "delta": delta})
            self.journal.events.append({kind: delta})

    def tool_call(self, part: ToolCallPart) -> None:
        call: JsonObject = {
            "toolCallId": part.tool_call_id,
            "toolName": part.tool_name,
            "input": call_input(part),
        }
        self.journal.events.append({"toolCall": call})
        if part.tool_name in self.journal.output_tools:
            return  # the agent's structured output: recorded for replay, not a tool to show
        if self.journal.held is None:
            self.journal.held = []
        self.emit(
            {
                "type": "tool-input-start",
                "toolCallId": part.tool_call_id,
                "toolName": part.tool_name,
            }
        )
        self.emit({"type": "tool-input-available", **call})

    def tool_event(self, event: AgentStreamEvent) -> None:
        """Emit the chunk of a tool result; any other event has none."""
        if not isinstance(event, FunctionToolResultEvent):
            return
        part = event.part
        if not isinstance(part, ToolReturnPart):
            return
        call_id = part.tool_call_id
        if part.outcome == "success":
            output: JsonValue = to_jsonable_python(part.content)
            self.emit_now(
                {"type": "tool-output-available", "toolCallId": call_id, "output": output}
            )
        elif part.outcome == "denied":
            self.emit_now({"type": "tool-output-denied", "toolCallId": call_id})
        else:
            self.emit_now(
                {"type": "tool-output-error", "toolCallId": call_id, "errorText": _why(part)}
            )


def _why(part: ToolReturnPart) -> str:
    if unknown_tool(part):
        return f"unknown_tool: there is no tool named {part.tool_name!r}"
    content = part.content
    return content if isinstance(content, str) else str(to_jsonable_python(content))
