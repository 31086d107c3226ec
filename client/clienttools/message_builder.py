"""``MessageBuilder``: ``UIMessageChunk`` dicts in, one assistant ``UIMessage`` out; no I/O.

It applies chunks the way the ``ai`` package's ``processUIMessageStream``
does, except that a tool part never moves backwards (``TOOL_TRANSITIONS``,
ranked by ``TOOL_STATE_ORDER``) and parts are never duplicated. Each chunk
type has its handler in the table ``_HANDLERS``.

    >>> builder = MessageBuilder("m1")
    >>> builder.apply({"type": "tool-input-available", "toolCallId": "c1",
    ...                "toolName": "add", "input": {"a": 1}})
    True
    >>> builder.apply({"type": "tool-input-start", "toolCallId": "c1", "toolName": "add"})
    False
    >>> builder.message.tool_parts[0].state, builder.refused
    ('input-available', 1)
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeAlias, TypeVar

from pydantic import MISSING, JsonValue

from clienttools.partial_json import parse_partial_json
from clienttools.uimessage import (
    DataPart,
    FilePart,
    JsonObject,
    OtherPart,
    ReasoningPart,
    SourceDocumentPart,
    SourceUrlPart,
    StepStartPart,
    TextPart,
    ToolApproval,
    ToolPart,
    ToolPartState,
    UIMessage,
    chunk_type,
)

__all__ = ["TOOL_STATE_ORDER", "TOOL_TRANSITIONS", "Chunk", "MessageBuilder"]

logger = logging.getLogger("clienttools.chat")

# The two part kinds whose text streams in start/delta/end chunks.
_P = TypeVar("_P", TextPart, ReasoningPart)


# --------------------------------------------------------------------------
# The tool part state machine, as data.

#: Rank of each state: a tool part's rank never decreases. The three outputs
#: share the last rank and are terminal.
TOOL_STATE_ORDER: Final[Mapping[ToolPartState, int]] = {
    "input-streaming": 0,
    "input-available": 1,
    "approval-requested": 2,
    "approval-responded": 3,
    "output-available": 4,
    "output-error": 4,
    "output-denied": 4,
}

#: ``TOOL_TRANSITIONS[state][event]`` is the state an event moves a tool part
#: to; ``None`` is "no part yet". A missing entry means the event is refused
#: (counted and logged, never applied). Events are chunk types; the local
#: approval answer uses ``tool-approval-response`` too. Every entry raises the
#: rank, except two self-loops: input deltas while the input streams, and a
#: final output replacing a ``preliminary`` one (``MessageBuilder`` checks the
#: flag). A repeated ``tool-input-start`` is refused: restarting the input
#: text would lose what streamed so far.
TOOL_TRANSITIONS: Final[Mapping[ToolPartState | None, Mapping[str, ToolPartState]]] = {
    None: {
        "tool-input-start": "input-streaming",
        "tool-input-available": "input-available",
        "tool-input-error": "output-error",
    },
    "input-streaming": {
        "tool-input-delta": "input-streaming",
        "tool-input-available": "input-available",
        "tool-input-error": "output-error",
        "tool-approval-request": "approval-requested",
        "tool-output-available": "output-available",
        "tool-output-error": "output-error",
        "tool-output-denied": "output-denied",
    },
    "input-available": {
        "tool-input-error": "output-error",
        "tool-approval-request": "approval-requested",
        "tool-output-available": "output-available",
        "tool-output-error": "output-error",
        "tool-output-denied": "output-denied",
    },
    "approval-requested": {
        "tool-input-error": "output-error",
        "tool-approval-response": "approval-responded",
        "tool-output-available": "output-available",
        "tool-output-error": "output-error",
        "tool-output-denied": "output-denied",
    },
    "approval-responded": {
        "tool-input-error": "output-error",
        "tool-output-available": "output-available",
        "tool-output-error": "output-error",
        "tool-output-denied": "output-denied",
    },
    "output-available": {
        "tool-output-available": "output-available",
    },
    "output-error": {},
    "output-denied": {},
}


def _coalesce(value: JsonObject | None, fallback: JsonObject | None) -> JsonObject | None:
    """JavaScript's ``value ?? fallback``: an empty object still wins."""
    return fallback if value is None else value


def _merge_objects(base: JsonValue, overrides: JsonValue) -> JsonValue:
    """The ai package's ``mergeObjects``: deep merge of objects, anything else replaces."""
    if not isinstance(base, dict) or not isinstance(overrides, dict):
        return overrides
    result = dict(base)
    for key, value in overrides.items():
        if key in ("__proto__", "constructor", "prototype"):
            continue
        old = result.get(key)
        both = isinstance(value, dict) and isinstance(old, dict)
        result[key] = _merge_objects(old, value) if both else value
    return result


# --------------------------------------------------------------------------
# MessageBuilder: chunks in, one assistant message out.


@dataclass
class _PartialToolCall:
    text: str
    encoding: str | None
    tool_name: str
    dynamic: bool
    title: str | None
    tool_metadata: JsonObject | None


Chunk: TypeAlias = Mapping[str, Any]
_Handler: TypeAlias = Callable[["MessageBuilder", Chunk], bool]


class MessageBuilder:
    """Builds one assistant ``UIMessage`` from ``UIMessageChunk`` dicts.

    Mirrors ``processUIMessageStream`` of the ``ai`` package (7.0.x), with
    these deliberate differences, all for malformed or repeated input where
    the AI SDK throws or duplicates:

    - a tool event that ``TOOL_TRANSITIONS`` does not allow is refused;
    - one tool part per ``toolCallId`` and one text (reasoning) part per text
      id within a step; a repeated start is ignored;
    - chunks that fail the schema, or refer to a part that does not exist,
      are ignored instead of raising;
    - ``reset-step`` is not supported (ignored); a ``start`` with a new
      ``messageId`` renames the message instead of resetting it, as the AI
      SDK's ``Chat`` does for a sent message.

    ``apply`` returns whether the message changed. ``ignored`` and
    ``refused`` count what was not applied.
    """

    def __init__(self, message_id: str) -> None:
        self.message = UIMessage(id=message_id, role="assistant")
        self.finish_reason: str | None = None
        self.error_text: str | None = None
        self.aborted = False
        self.ignored = 0
        self.refused = 0
        self._step = 0
        self._text_keys: set[tuple[int, str]] = set()
        self._reasoning_keys: set[tuple[int, str]] = set()
        self._active_text: dict[str, TextPart] = {}
        self._active_reasoning: dict[str, ReasoningPart] = {}
        self._tools: dict[str, ToolPart] = {}
        self._partial: dict[str, _PartialToolCall] = {}

    def tool_part(self, tool_call_id: str) -> ToolPart | None:
        return self._tools.get(tool_call_id)

    def adopt(self, part: ToolPart) -> None:
        """Track a tool part built elsewhere (an earlier response) without adding it."""
        self._tools[part.tool_call_id] = part

    def apply(self, chunk: object) -> bool:
        kind = chunk_type(chunk)
        if kind is None:
            self._ignore("invalid chunk", chunk)
            return False
        assert isinstance(chunk, Mapping)  # chunk_type checked it
        handler = _data if kind.startswith("data-") else _HANDLERS[kind]
        return handler(self, chunk)

    def respond_approval(self, tool_call_id: str, approved: bool, reason: str | None) -> bool:
        """The user's answer to an approval request, before the server echoes anything."""
        part = self._tools.get(tool_call_id)
        if part is None or part.state != "approval-requested" or part.approval is None:
            return False
        if not self._move(part, "tool-approval-response"):
            return False
        # Like the AI SDK's addToolApprovalResponse: ``reason`` replaces any earlier one.
        part.approval = part.approval.model_copy(update={"approved": approved, "reason": reason})
        return True

    # -- bookkeeping

    def _ignore(self, why: str, chunk: object) -> bool:
        self.ignored += 1
        logger.debug("chat: ignored chunk (%s): %r", why, chunk)
        return False

    def _move(self, part: ToolPart | None, event: str) -> bool:
        """Whether ``TOOL_TRANSITIONS`` lets ``event`` apply to ``part``; moves it if so."""
        state = None if part is None else part.state
        target = TOOL_TRANSITIONS[state].get(event)
        if target is not None and state == target == "output-available":
            assert part is not None
            target = target if part.preliminary else None
        if target is None:
            self.refused += 1
            logger.info("chat: refused %s for a tool part in state %s", event, state)
            return False
        if part is not None:
            part.state = target
        return True

    def _new_tool(
        self, tool_call_id: str, tool_name: str, dynamic: bool, state: ToolPartState
    ) -> ToolPart:
        part = ToolPart(
            type="dynamic-tool" if dynamic else f"tool-{tool_name}",
            tool_name=tool_name if dynamic else None,
            tool_call_id=tool_call_id,
            state=state,
        )
        self._tools[tool_call_id] = part
        self.message.parts.append(part)
        return part

    @staticmethod
    def _update_tool(
        part: ToolPart,
        *,
        tool_name: str,
        input: JsonValue | MISSING,
        output: JsonValue | MISSING = MISSING,
        raw_input: JsonValue | MISSING = MISSING,
        error_text: str | None = None,
        input_encoding: str | None = None,
        preliminary: bool | None = None,
        provider_executed: bool | None = None,
        provider_metadata: JsonObject | None = None,
        title: str | None = None,
        tool_metadata: JsonObject | None = None,
    ) -> None:
        # updateToolPart/updateDynamicToolPart: these fields are overwritten
        # (an absent value clears them), the rest only when given.
        if part.dynamic:
            part.tool_name = tool_name
        else:
            part.type = f"tool-{tool_name}"
        part.input = input
        part.output = output
        part.error_text = error_text
        part.raw_input = raw_input
        part.input_encoding = (
            "json" if input_encoding == "json" else "text" if input_encoding == "text" else None
        )
        part.preliminary = preliminary
        if title is not None:
            part.title = title
        if tool_metadata is not None:
            part.tool_metadata = tool_metadata
        if provider_executed is not None:
            part.provider_executed = provider_executed
        if provider_metadata is not None:
            if part.state in ("output-available", "output-error"):
                part.result_provider_metadata = provider_metadata
            else:
                part.call_provider_metadata = provider_metadata

    def _merge_metadata(self, metadata: JsonValue | MISSING) -> bool:
        if metadata is MISSING or metadata is None:
            return False
        current = self.message.metadata
        merged = (
            metadata if current is MISSING or current is None else _merge_objects(current, metadata)
        )
        self.message.metadata = merged
        return True

    # -- handlers, one per chunk type (see _HANDLERS)

    def _text_start(self, c: Chunk) -> bool:
        part = TextPart(text="", state="streaming", provider_metadata=c.get("providerMetadata"))
        return self._open_streamed(c, "text", part, self._text_keys, self._active_text)

    def _text_delta(self, c: Chunk) -> bool:
        return self._extend_streamed(c, "text", self._active_text)

    def _text_end(self, c: Chunk) -> bool:
        part = self._close_streamed(c, "text", self._active_text)
        if part is not None and c.get("citations") is not None:
            part.citations = c["citations"]
        return part is not None

    def _reasoning_start(self, c: Chunk) -> bool:
        part = ReasoningPart(
            id=c["id"], text="", state="streaming", provider_metadata=c.get("providerMetadata")
        )
        return self._open_streamed(
            c, "reasoning", part, self._reasoning_keys, self._active_reasoning
        )

    def _reasoning_delta(self, c: Chunk) -> bool:
        return self._extend_streamed(c, "reasoning", self._active_reasoning)

    def _reasoning_end(self, c: Chunk) -> bool:
        return self._close_streamed(c, "reasoning", self._active_reasoning) is not None

    # Text and reasoning parts stream the same way: start opens one per id and step,
    # deltas append to it, end closes it.

    def _open_streamed(
        self, c: Chunk, kind: str, part: _P, keys: set[tuple[int, str]], active: dict[str, _P]
    ) -> bool:
        key = (self._step, c["id"])
        if key in keys:
            return self._ignore(f"repeated {kind}-start", c)
        keys.add(key)
        active[c["id"]] = part
        self.message.parts.append(part)
        return True

    def _extend_streamed(self, c: Chunk, kind: str, active: dict[str, _P]) -> bool:
        part = active.get(c["id"])
        if part is None:
            return self._ignore(f"{kind}-delta without an open {kind} part", c)
        part.text += c["delta"]
        part.provider_metadata = _coalesce(c.get("providerMetadata"), part.provider_metadata)
        return True

    def _close_streamed(self, c: Chunk, kind: str, active: dict[str, _P]) -> _P | None:
        part = active.pop(c["id"], None)
        if part is None:
            self._ignore(f"{kind}-end without an open {kind} part", c)
            return None
        part.state = "done"
        part.provider_metadata = _coalesce(c.get("providerMetadata"), part.provider_metadata)
        return part

    def _tool_input_start(self, c: Chunk) -> bool:
        call_id = c["toolCallId"]
        if not self._move(self._tools.get(call_id), "tool-input-start"):
            return False
        dynamic = c.get("dynamic") is True
        self._partial[call_id] = _PartialToolCall(
            text="",
            encoding=c.get("inputEncoding"),
            tool_name=c["toolName"],
            dynamic=dynamic,
            title=c.get("title"),
            tool_metadata=c.get("toolMetadata"),
        )
        part = self._new_tool(call_id, c["toolName"], dynamic, "input-streaming")
        self._update_tool(
            part,
            tool_name=c["toolName"],
            input=MISSING,
            input_encoding=c.get("inputEncoding"),
            provider_executed=c.get("providerExecuted"),
            provider_metadata=c.get("providerMetadata"),
            title=c.get("title"),
            tool_metadata=c.get("toolMetadata"),
        )
        return True

    def _tool_input_delta(self, c: Chunk) -> bool:
        call_id = c["toolCallId"]
        partial = self._partial.get(call_id)
        part = self._tools.get(call_id)
        if partial is None or part is None:
            return self._ignore("tool-input-delta without tool-input-start", c)
        if not self._move(part, "tool-input-delta"):
            return False
        partial.text += c["inputTextDelta"]
        value = partial.text if partial.encoding == "text" else parse_partial_json(partial.text)
        self._update_tool(
            part,
            tool_name=partial.tool_name,
            input=value,
            raw_input=partial.text,
            input_encoding=partial.encoding,
            title=partial.title,
            tool_metadata=partial.tool_metadata,
        )
        return True

    def _tool_input_available(self, c: Chunk) -> bool:
        call_id = c["toolCallId"]
        part = self._tools.get(call_id)
        if not self._move(part, "tool-input-available"):
            return False
        if part is None:
            part = self._new_tool(
                call_id, c["toolName"], c.get("dynamic") is True, "input-available"
            )
        self._partial.pop(call_id, None)
        self._update_tool(
            part,
            tool_name=c["toolName"],
            input=c["input"],
            provider_executed=c.get("providerExecuted"),
            provider_metadata=c.get("providerMetadata"),
            title=c.get("title"),
            tool_metadata=c.get("toolMetadata"),
        )
        return True

    def _tool_input_error(self, c: Chunk) -> bool:
        call_id = c["toolCallId"]
        part = self._tools.get(call_id)
        if not self._move(part, "tool-input-error"):
            return False
        if part is None:
            part = self._new_tool(call_id, c["toolName"], c.get("dynamic") is True, "output-error")
        self._partial.pop(call_id, None)
        self._update_tool(
            part,
            tool_name=c["toolName"],
            input=c["input"],
            error_text=c["errorText"],
            provider_executed=c.get("providerExecuted"),
            provider_metadata=c.get("providerMetadata"),
            tool_metadata=c.get("toolMetadata"),
        )
        return True

    def _tool_approval_request(self, c: Chunk) -> bool:
        part = self._tools.get(c["toolCallId"])
        if part is None:
            return self._ignore("approval request for an unknown tool call", c)
        if not self._move(part, "tool-approval-request"):
            return False
        part.approval = ToolApproval(
            id=c["approvalId"],
            descriptor=c.get("approvalDescriptor"),
            request_reason=c.get("reason"),
            is_automatic=True if c.get("isAutomatic") is True else None,
            signature=c.get("signature"),
            input_schema_input=c.get("inputSchemaInput", MISSING),
        )
        return True

    def _tool_approval_response(self, c: Chunk) -> bool:
        approval_id = c["approvalId"]
        part = next(
            (p for p in self._tools.values() if p.approval and p.approval.id == approval_id),
            None,
        )
        if part is None or part.approval is None:
            return self._ignore("approval response for an unknown approval", c)
        if not self._move(part, "tool-approval-response"):
            return False
        update: dict[str, Any] = {"approved": c["approved"]}
        if c.get("reason") is not None:
            update["reason"] = c["reason"]
        part.approval = part.approval.model_copy(update=update)
        if c.get("providerExecuted") is not None:
            part.provider_executed = c["providerExecuted"]
        if c.get("providerMetadata") is not None:
            part.call_provider_metadata = c["providerMetadata"]
        return True

    def _tool_output_denied(self, c: Chunk) -> bool:
        part = self._tools.get(c["toolCallId"])
        if part is None:
            return self._ignore("tool-output-denied for an unknown tool call", c)
        return self._move(part, "tool-output-denied")

    def _tool_output_available(self, c: Chunk) -> bool:
        part = self._tools.get(c["toolCallId"])
        if part is None:
            return self._ignore("tool-output-available for an unknown tool call", c)
        if not self._move(part, "tool-output-available"):
            return False
        self._update_tool(
            part,
            tool_name=part.name,
            input=part.input,
            output=c["output"],
            preliminary=c.get("preliminary"),
            provider_executed=c.get("providerExecuted"),
            provider_metadata=c.get("providerMetadata"),
            title=part.title,
            tool_metadata=_coalesce(c.get("toolMetadata"), part.tool_metadata),
        )
        return True

    def _tool_output_error(self, c: Chunk) -> bool:
        part = self._tools.get(c["toolCallId"])
        if part is None:
            return self._ignore("tool-output-error for an unknown tool call", c)
        if not self._move(part, "tool-output-error"):
            return False
        self._update_tool(
            part,
            tool_name=part.name,
            input=part.input,
            # The AI SDK keeps the deprecated rawInput for static tools only.
            raw_input=MISSING if part.dynamic else part.raw_input,
            error_text=c["errorText"],
            provider_executed=c.get("providerExecuted"),
            provider_metadata=c.get("providerMetadata"),
            title=part.title,
            tool_metadata=_coalesce(c.get("toolMetadata"), part.tool_metadata),
        )
        return True

    def _verbatim(self, c: Chunk) -> bool:
        if c["type"] == "custom":
            fields = {k: c.get(k) for k in ("type", "kind", "providerMetadata")}
            c = {k: v for k, v in fields.items() if v is not None}
        self.message.parts.append(OtherPart.model_validate(dict(c)))
        return True

    def _file(self, c: Chunk) -> bool:
        self.message.parts.append(
            FilePart(
                type=c["type"],
                media_type=c["mediaType"],
                url=c["url"],
                provider_metadata=c.get("providerMetadata"),
            )
        )
        return True

    def _source_url(self, c: Chunk) -> bool:
        self.message.parts.append(
            SourceUrlPart(
                source_id=c["sourceId"],
                url=c["url"],
                title=c.get("title"),
                provider_metadata=c.get("providerMetadata"),
            )
        )
        return True

    def _source_document(self, c: Chunk) -> bool:
        self.message.parts.append(
            SourceDocumentPart(
                source_id=c["sourceId"],
                media_type=c["mediaType"],
                title=c["title"],
                filename=c.get("filename"),
                provider_metadata=c.get("providerMetadata"),
            )
        )
        return True

    def _start_step(self, c: Chunk) -> bool:
        self._step += 1
        self.message.parts.append(StepStartPart())
        return True

    def _nothing(self, c: Chunk) -> bool:
        return False

    def _unsupported(self, c: Chunk) -> bool:
        return self._ignore("unsupported chunk type", c)

    def _start(self, c: Chunk) -> bool:
        changed = False
        if c.get("messageId") is not None and c["messageId"] != self.message.id:
            self.message.id = c["messageId"]
            changed = True
        return self._merge_metadata(c.get("messageMetadata", MISSING)) or changed

    def _finish(self, c: Chunk) -> bool:
        if c.get("finishReason") is not None:
            self.finish_reason = c["finishReason"]
        return self._merge_metadata(c.get("messageMetadata", MISSING))

    def _message_metadata(self, c: Chunk) -> bool:
        return self._merge_metadata(c["messageMetadata"])

    def _error(self, c: Chunk) -> bool:
        self.error_text = c["errorText"]
        return False

    def _abort(self, c: Chunk) -> bool:
        self.aborted = True
        return False


def _data(builder: MessageBuilder, c: Chunk) -> bool:
    if c.get("transient") is True:
        return False  # transient data is for listeners, never part of the message
    if c.get("id") is not None:
        for part in builder.message.parts:
            if isinstance(part, DataPart) and part.type == c["type"] and part.id == c["id"]:
                part.data = c["data"]
                return True
    builder.message.parts.append(DataPart.model_validate(dict(c)))
    return True


_HANDLERS: Final[Mapping[str, _Handler]] = {
    "text-start": MessageBuilder._text_start,
    "text-delta": MessageBuilder._text_delta,
    "text-end": MessageBuilder._text_end,
    "reasoning-start": MessageBuilder._reasoning_start,
    "reasoning-delta": MessageBuilder._reasoning_delta,
    "reasoning-end": MessageBuilder._reasoning_end,
    "error": MessageBuilder._error,
    "tool-input-start": MessageBuilder._tool_input_start,
    "tool-input-delta": MessageBuilder._tool_input_delta,
    "tool-input-available": MessageBuilder._tool_input_available,
    "tool-input-error": MessageBuilder._tool_input_error,
    "tool-approval-request": MessageBuilder._tool_approval_request,
    "tool-approval-response": MessageBuilder._tool_approval_response,
    "tool-output-available": MessageBuilder._tool_output_available,
    "tool-output-error": MessageBuilder._tool_output_error,
    "tool-output-denied": MessageBuilder._tool_output_denied,
    "custom": MessageBuilder._verbatim,
    "steering-message": MessageBuilder._verbatim,
    "source-url": MessageBuilder._source_url,
    "source-document": MessageBuilder._source_document,
    "file": MessageBuilder._file,
    "reasoning-file": MessageBuilder._file,
    "start-step": MessageBuilder._start_step,
    "finish-step": MessageBuilder._nothing,
    "reset-step": MessageBuilder._unsupported,
    "start": MessageBuilder._start,
    "finish": MessageBuilder._finish,
    "abort": MessageBuilder._abort,
    "message-metadata": MessageBuilder._message_metadata,
}
