"""Chat over the shared socket: UIMessages built from AI SDK v7 chunks (rule C14).

Three layers, outermost last:

- ``UIMessage`` and its parts: pydantic models of the AI SDK's message shape.
  ``message.to_wire()`` gives exactly the JSON the AI SDK would hold
  (camelCase keys, absent fields omitted, JSON ``null`` kept where it is data).
- ``MessageBuilder`` applies ``UIMessageChunk`` dicts to one assistant message
  the way the ``ai`` package's ``processUIMessageStream`` does, except that a
  tool part never moves backwards (``TOOL_TRANSITIONS``) and parts are never
  duplicated. ``ChatState`` wraps it in the request lifecycle of the
  ``WebSocketChatTransport`` frames (``send``/``resume``/``abort`` out,
  ``start``/``chunk``/``end``/``error``/``no-active`` in). Neither does any I/O.
- ``Chat`` is the asyncio facade the ``ToolClient`` owns as ``client.chat``.

Sans-I/O example::

    state = ChatState(chat_id="c1")
    frame = state.begin_request("r1", "What is 2 + 2?")  # send json.dumps(frame)
    state.receive({"type": "chunk", "requestId": "r1", "sequence": 0,
                   "chunk": {"type": "text-start", "id": "t"}})
    state.receive({"type": "chunk", "requestId": "r1", "sequence": 1,
                   "chunk": {"type": "text-delta", "id": "t", "delta": "4"}})
    assert state.status == "streaming"
    state.receive({"type": "end", "requestId": "r1"})
    assert state.status == "ready" and state.messages[-1].text == "4"

Facade example::

    chat = Chat(send=socket_send)          # socket_send(text) -> Awaitable[None]
    reply = await chat.send("What is 2 + 2?")
    async for snapshot in chat.stream("And times 3?"):
        render(snapshot)
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Final, Literal, TypeAlias, TypeVar

from pydantic import (
    MISSING,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    JsonValue,
    SerializerFunctionWrapHandler,
    Tag,
    model_serializer,
    model_validator,
)
from pydantic.alias_generators import to_camel

__all__ = [
    "CHUNK_FIELDS",
    "TOOL_STATE_ORDER",
    "TOOL_TRANSITIONS",
    "Chat",
    "ChatError",
    "ChatResponseError",
    "ChatState",
    "ChatStatus",
    "ChatUsageError",
    "DataPart",
    "FilePart",
    "MessageBuilder",
    "OtherPart",
    "ReasoningPart",
    "SourceDocumentPart",
    "SourceUrlPart",
    "StepStartPart",
    "TextPart",
    "ToolApproval",
    "ToolPart",
    "ToolPartState",
    "UIMessage",
    "UIMessagePart",
    "chunk_type",
    "parse_partial_json",
]

logger = logging.getLogger(__name__)

ChatStatus = Literal["ready", "submitted", "streaming", "error"]
ToolPartState = Literal[
    "input-streaming",
    "input-available",
    "approval-requested",
    "approval-responded",
    "output-available",
    "output-error",
    "output-denied",
]
JsonObject: TypeAlias = dict[str, JsonValue]


class ChatError(Exception):
    """Base class of the errors this module raises."""


class ChatUsageError(ChatError):
    """The caller misused the API (like h11's LocalProtocolError): nothing was sent."""


class ChatResponseError(ChatError):
    """The response ended in an error (an ``error`` frame or ``error`` chunk).

    ``message`` holds the assistant message as far as it got, if any.
    """

    def __init__(self, error_text: str, message: UIMessage | None) -> None:
        super().__init__(error_text)
        self.error_text = error_text
        self.message = message


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


# --------------------------------------------------------------------------
# UIMessage and its parts.


class WireModel(BaseModel):
    """A model whose dump is the AI SDK's JSON.

    JavaScript drops ``undefined`` fields when it serializes; here absent
    optional fields are ``None`` and are left out of the dump. Fields whose
    value is arbitrary JSON (tool ``input``/``output``, ``data``, ``metadata``)
    use pydantic's ``MISSING`` instead, so that a JSON ``null`` (a tool that
    returned ``None``) survives the round trip; they are named in
    ``wire_nullable``. Unknown fields are kept (``extra="allow"``) so a newer
    AI SDK's parts round-trip.
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        extra="allow",
    )

    wire_nullable: ClassVar[frozenset[str]] = frozenset()

    @model_serializer(mode="wrap")
    def _omit_absent(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        return {k: v for k, v in data.items() if v is not None or k in self.wire_nullable}


class TextPart(WireModel):
    type: Literal["text"] = "text"
    text: str
    state: Literal["streaming", "done"] | None = None
    citations: list[JsonValue] | None = None
    provider_metadata: JsonObject | None = None


class ReasoningPart(WireModel):
    type: Literal["reasoning"] = "reasoning"
    id: str | None = None
    text: str
    state: Literal["streaming", "done"] | None = None
    provider_metadata: JsonObject | None = None


# The two part kinds whose text streams in start/delta/end chunks.
_P = TypeVar("_P", TextPart, ReasoningPart)


class StepStartPart(WireModel):
    type: Literal["step-start"] = "step-start"


class ToolApproval(WireModel):
    id: str
    approved: bool | None = None
    descriptor: JsonValue | None = None
    request_reason: str | None = None
    reason: str | None = None
    is_automatic: bool | None = None
    signature: str | None = None
    input_schema_input: JsonValue | MISSING = MISSING

    wire_nullable: ClassVar[frozenset[str]] = frozenset({"inputSchemaInput"})


class ToolPart(WireModel):
    """A tool call: ``type`` is ``tool-<name>``, or ``dynamic-tool`` with ``tool_name``."""

    type: str
    tool_call_id: str
    state: ToolPartState
    tool_name: str | None = None
    title: str | None = None
    tool_metadata: JsonObject | None = None
    input: JsonValue | MISSING = MISSING
    input_encoding: Literal["json", "text"] | None = None
    raw_input: JsonValue | MISSING = MISSING
    output: JsonValue | MISSING = MISSING
    error_text: str | None = None
    provider_executed: bool | None = None
    preliminary: bool | None = None
    call_provider_metadata: JsonObject | None = None
    result_provider_metadata: JsonObject | None = None
    approval: ToolApproval | None = None

    wire_nullable: ClassVar[frozenset[str]] = frozenset({"input", "rawInput", "output"})

    @model_validator(mode="after")
    def _check_type(self) -> ToolPart:
        if self.type == "dynamic-tool":
            if self.tool_name is None:
                raise ValueError("a dynamic-tool part needs toolName")
        elif not self.type.startswith("tool-"):
            raise ValueError(f"not a tool part type: {self.type!r}")
        return self

    @property
    def name(self) -> str:
        """The tool's name, for static and dynamic parts alike."""
        if self.tool_name is not None and self.type == "dynamic-tool":
            return self.tool_name
        return self.type.removeprefix("tool-")

    @property
    def dynamic(self) -> bool:
        return self.type == "dynamic-tool"


class FilePart(WireModel):
    type: Literal["file", "reasoning-file"] = "file"
    media_type: str
    url: str
    filename: str | None = None
    provider_reference: dict[str, str] | None = None
    provider_metadata: JsonObject | None = None


class SourceUrlPart(WireModel):
    type: Literal["source-url"] = "source-url"
    source_id: str
    url: str
    title: str | None = None
    provider_metadata: JsonObject | None = None


class SourceDocumentPart(WireModel):
    type: Literal["source-document"] = "source-document"
    source_id: str
    media_type: str
    title: str
    filename: str | None = None
    provider_metadata: JsonObject | None = None


class DataPart(WireModel):
    """An app-defined ``data-<name>`` part."""

    type: str
    id: str | None = None
    data: JsonValue

    wire_nullable: ClassVar[frozenset[str]] = frozenset({"data"})


class OtherPart(WireModel):
    """Any other part (``custom``, ``steering-message``, future types), kept verbatim."""

    type: str

    @model_serializer(mode="wrap")
    def _omit_absent(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # Everything but ``type`` is an extra copied from the wire: keep nulls.
        result: dict[str, Any] = handler(self)
        return result


def _part_tag(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    if not isinstance(kind, str):
        return "other"
    if kind in ("text", "reasoning", "step-start", "source-url", "source-document"):
        return kind
    if kind in ("file", "reasoning-file"):
        return "file"
    if kind == "dynamic-tool" or kind.startswith("tool-"):
        return "tool"
    if kind.startswith("data-"):
        return "data"
    return "other"


UIMessagePart = Annotated[
    Annotated[TextPart, Tag("text")]
    | Annotated[ReasoningPart, Tag("reasoning")]
    | Annotated[ToolPart, Tag("tool")]
    | Annotated[StepStartPart, Tag("step-start")]
    | Annotated[FilePart, Tag("file")]
    | Annotated[SourceUrlPart, Tag("source-url")]
    | Annotated[SourceDocumentPart, Tag("source-document")]
    | Annotated[DataPart, Tag("data")]
    | Annotated[OtherPart, Tag("other")],
    Discriminator(_part_tag),
]


class UIMessage(WireModel):
    """The AI SDK's ``UIMessage``: what the chat shows and what ``send`` carries."""

    id: str
    role: Literal["system", "user", "assistant"]
    metadata: JsonValue | MISSING = MISSING
    parts: list[UIMessagePart] = Field(default_factory=list)

    wire_nullable: ClassVar[frozenset[str]] = frozenset({"metadata"})

    @property
    def text(self) -> str:
        """All text parts, joined."""
        return "".join(p.text for p in self.parts if isinstance(p, TextPart))

    @property
    def tool_parts(self) -> list[ToolPart]:
        return [p for p in self.parts if isinstance(p, ToolPart)]

    def to_wire(self) -> dict[str, Any]:
        """The message as the AI SDK's JSON (what ``JSON.stringify`` would give)."""
        result: dict[str, Any] = self.model_dump(mode="json")
        return result


# --------------------------------------------------------------------------
# Chunk validation: the ``ai`` package's ``uiMessageChunkSchema`` as a table.

_ANY: Final = object  # any JSON value, including null (zod's ``z.unknown()``)
_FieldType = type | frozenset[str]
_FINISH_REASONS: Final = frozenset(
    {"stop", "length", "content-filter", "tool-calls", "error", "interrupted", "other"}
)
_PM: Final[dict[str, _FieldType]] = {"providerMetadata": dict}
_TOOL_OPTIONAL: Final[dict[str, _FieldType]] = {
    "providerExecuted": bool,
    "providerMetadata": dict,
    "toolMetadata": dict,
    "dynamic": bool,
}

#: ``CHUNK_FIELDS[type] = (required, optional)``: field name -> Python type, or
#: the set of allowed strings. Optional fields may be absent but not null, as
#: in zod. ``data-*`` chunks are checked separately.
CHUNK_FIELDS: Final[Mapping[str, tuple[Mapping[str, _FieldType], Mapping[str, _FieldType]]]] = {
    "text-start": ({"id": str}, _PM),
    "text-delta": ({"id": str, "delta": str}, _PM),
    "text-end": ({"id": str}, {"citations": list, **_PM}),
    "reasoning-start": ({"id": str}, _PM),
    "reasoning-delta": ({"id": str, "delta": str}, _PM),
    "reasoning-end": ({"id": str}, _PM),
    "error": ({"errorText": str}, {}),
    "tool-input-start": (
        {"toolCallId": str, "toolName": str},
        {"inputEncoding": frozenset({"json", "text"}), "title": str, **_TOOL_OPTIONAL},
    ),
    "tool-input-delta": ({"toolCallId": str, "inputTextDelta": str}, {}),
    "tool-input-available": (
        {"toolCallId": str, "toolName": str, "input": _ANY},
        {"title": str, **_TOOL_OPTIONAL},
    ),
    "tool-input-error": (
        {"toolCallId": str, "toolName": str, "input": _ANY, "errorText": str},
        {"title": str, **_TOOL_OPTIONAL},
    ),
    "tool-approval-request": (
        {"approvalId": str, "toolCallId": str},
        {"reason": str, "isAutomatic": bool, "signature": str},
    ),
    "tool-approval-response": (
        {"approvalId": str, "approved": bool},
        {"reason": str, "providerExecuted": bool, **_PM},
    ),
    "tool-output-available": (
        {"toolCallId": str, "output": _ANY},
        {"preliminary": bool, **_TOOL_OPTIONAL},
    ),
    "tool-output-error": ({"toolCallId": str, "errorText": str}, _TOOL_OPTIONAL),
    "tool-output-denied": ({"toolCallId": str}, {}),
    "custom": ({"kind": str}, _PM),
    "source-url": ({"sourceId": str, "url": str}, {"title": str, **_PM}),
    "source-document": (
        {"sourceId": str, "mediaType": str, "title": str},
        {"filename": str, **_PM},
    ),
    "file": ({"url": str, "mediaType": str}, _PM),
    "reasoning-file": ({"url": str, "mediaType": str}, _PM),
    "steering-message": ({"id": str, "parts": list}, {}),
    "start-step": ({}, {}),
    "finish-step": ({}, {}),
    "reset-step": ({}, {}),
    "start": ({}, {"messageId": str}),
    "finish": ({}, {"finishReason": _FINISH_REASONS}),
    "abort": ({}, {"reason": str}),
    "message-metadata": ({"messageMetadata": _ANY}, {}),
}
_DATA_FIELDS: Final = ({"data": _ANY}, {"id": str, "transient": bool})


def _field_ok(value: object, expected: _FieldType) -> bool:
    if isinstance(expected, frozenset):
        return isinstance(value, str) and value in expected
    if expected is object:
        return True
    if expected is bool:
        return isinstance(value, bool)
    return isinstance(value, expected) and not isinstance(value, bool)


def chunk_type(chunk: object) -> str | None:
    """The chunk's ``type`` if it is a valid ``UIMessageChunk``, else ``None``."""
    if not isinstance(chunk, Mapping):
        return None
    kind = chunk.get("type")
    if not isinstance(kind, str):
        return None
    spec = _DATA_FIELDS if kind.startswith("data-") else CHUNK_FIELDS.get(kind)
    if spec is None:
        return None
    required, optional = spec
    for name, expected in required.items():
        if name not in chunk or not _field_ok(chunk[name], expected):
            return None
    for name, expected in optional.items():
        if name in chunk and not _field_ok(chunk[name], expected):
            return None
    return kind


# --------------------------------------------------------------------------
# Partial JSON: a port of the ai package's ``fixJson`` + ``parsePartialJson``,
# so a streaming tool input shows the same partial value as in the AI SDK.


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # JSON.parse rejects NaN/Infinity


def _json_loads(text: str) -> JsonValue:
    value: JsonValue = json.loads(text, parse_constant=_reject_constant)
    return value


def _fix_json(text: str) -> str:
    # One linear scan, kept state for state like the original so the two agree.
    stack = ["ROOT"]
    last_valid = -1
    literal_start = 0
    unicode_digits = 0

    def value_start(char: str, i: int, swap: str) -> None:
        nonlocal last_valid, literal_start
        inner = {'"': "INSIDE_STRING", "{": "INSIDE_OBJECT_START", "[": "INSIDE_ARRAY_START"}
        if char in inner or char in "ftn-0123456789":
            if char != "-":
                last_valid = i
            if char in "ftn":
                literal_start = i
            stack.pop()
            stack.append(swap)
            if char in inner:
                stack.append(inner[char])
            elif char in "ftn":
                stack.append("INSIDE_LITERAL")
            else:
                stack.append("INSIDE_NUMBER")

    def after_object_value(char: str, i: int) -> None:
        nonlocal last_valid
        if char == ",":
            stack.pop()
            stack.append("INSIDE_OBJECT_AFTER_COMMA")
        elif char == "}":
            last_valid = i
            stack.pop()

    def after_array_value(char: str, i: int) -> None:
        nonlocal last_valid
        if char == ",":
            stack.pop()
            stack.append("INSIDE_ARRAY_AFTER_COMMA")
        elif char == "]":
            last_valid = i
            stack.pop()

    for i, char in enumerate(text):
        state = stack[-1]
        if state == "ROOT":
            value_start(char, i, "FINISH")
        elif state in ("INSIDE_OBJECT_START", "INSIDE_OBJECT_AFTER_COMMA"):
            if char == '"':
                stack.pop()
                stack.append("INSIDE_OBJECT_KEY")
            elif char == "}" and state == "INSIDE_OBJECT_START":
                last_valid = i
                stack.pop()
        elif state == "INSIDE_OBJECT_KEY":
            if char == '"':
                stack.pop()
                stack.append("INSIDE_OBJECT_AFTER_KEY")
        elif state == "INSIDE_OBJECT_AFTER_KEY":
            if char == ":":
                stack.pop()
                stack.append("INSIDE_OBJECT_BEFORE_VALUE")
        elif state == "INSIDE_OBJECT_BEFORE_VALUE":
            value_start(char, i, "INSIDE_OBJECT_AFTER_VALUE")
        elif state == "INSIDE_OBJECT_AFTER_VALUE":
            after_object_value(char, i)
        elif state == "INSIDE_STRING":
            if char == '"':
                stack.pop()
                last_valid = i
            elif char == "\\":
                stack.append("INSIDE_STRING_ESCAPE")
            else:
                last_valid = i
        elif state == "INSIDE_ARRAY_START":
            if char == "]":
                last_valid = i
                stack.pop()
            else:
                value_start(char, i, "INSIDE_ARRAY_AFTER_VALUE")
        elif state == "INSIDE_ARRAY_AFTER_VALUE":
            if char == ",":
                stack.pop()
                stack.append("INSIDE_ARRAY_AFTER_COMMA")
            elif char == "]":
                last_valid = i
                stack.pop()
            else:
                last_valid = i
        elif state == "INSIDE_ARRAY_AFTER_COMMA":
            value_start(char, i, "INSIDE_ARRAY_AFTER_VALUE")
        elif state == "INSIDE_STRING_ESCAPE":
            stack.pop()
            if char == "u":
                unicode_digits = 0
                stack.append("INSIDE_STRING_UNICODE_ESCAPE")
            else:
                last_valid = i
        elif state == "INSIDE_STRING_UNICODE_ESCAPE":
            if char in "0123456789abcdefABCDEF":
                unicode_digits += 1
                if unicode_digits == 4:
                    stack.pop()
                    last_valid = i
        elif state == "INSIDE_NUMBER":
            if char in "0123456789":
                last_valid = i
            elif char in "eE-.":
                pass
            elif char == ",":
                stack.pop()
                if stack[-1] == "INSIDE_ARRAY_AFTER_VALUE":
                    after_array_value(char, i)
                if stack[-1] == "INSIDE_OBJECT_AFTER_VALUE":
                    after_object_value(char, i)
            elif char == "}":
                stack.pop()
                if stack[-1] == "INSIDE_OBJECT_AFTER_VALUE":
                    after_object_value(char, i)
            elif char == "]":
                stack.pop()
                if stack[-1] == "INSIDE_ARRAY_AFTER_VALUE":
                    after_array_value(char, i)
            else:
                stack.pop()
        elif state == "INSIDE_LITERAL":
            partial = text[literal_start : i + 1]
            if not any(word.startswith(partial) for word in ("false", "true", "null")):
                stack.pop()
                if stack[-1] == "INSIDE_OBJECT_AFTER_VALUE":
                    after_object_value(char, i)
                elif stack[-1] == "INSIDE_ARRAY_AFTER_VALUE":
                    after_array_value(char, i)
            else:
                last_valid = i

    result = text[: last_valid + 1]
    for state in reversed(stack):
        if state == "INSIDE_STRING":
            result += '"'
        elif state.startswith("INSIDE_OBJECT"):
            result += "}"
        elif state.startswith("INSIDE_ARRAY"):
            result += "]"
        elif state == "INSIDE_LITERAL":
            partial = text[literal_start:]
            for word in ("true", "false", "null"):
                if word.startswith(partial):
                    result += word[len(partial) :]
                    break
    return result


def parse_partial_json(text: str) -> JsonValue | MISSING:
    """The value of a JSON prefix, repaired like the AI SDK does; ``MISSING`` if none."""
    for candidate in (text, None):
        try:
            return _json_loads(_fix_json(text) if candidate is None else candidate)
        except ValueError:
            continue
    return MISSING


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


# --------------------------------------------------------------------------
# ChatState: the request lifecycle around the builder. No I/O.


def _new_id() -> str:
    return uuid.uuid4().hex


@dataclass
class _Response:
    request_id: str
    builder: MessageBuilder
    last_sequence: int | None = None
    pending: dict[int, object] = field(default_factory=dict)
    index: int | None = None  # where the assistant message sits in messages


_DEFAULT_ERROR: Final = "The chat server returned an error."


class ChatState:
    """The sans-I/O chat: frames in (``receive``), frames out (the other methods).

    One response is in flight at a time. ``status`` is ``submitted`` after
    ``begin_request``, ``streaming`` from the first chunk until ``end``,
    ``error`` or ``abort()``, then ``ready`` (or ``error``). A browser tool
    running inside the response does not end it, so the status never drops
    to ``ready`` between ``tool-input-available`` and the tool's output.

    Chunk ``sequence`` numbers belong to the response: after a reconnect,
    ``begin_resume`` asks the server for what follows ``last_sequence``, and
    chunks already applied (a replay that overlaps) are dropped, so nothing is
    duplicated. Chunks that arrive ahead of a gap wait (up to
    ``max_buffered_chunks``) until the gap fills.
    """

    def __init__(
        self,
        *,
        chat_id: str | None = None,
        id_factory: Callable[[], str] = _new_id,
        messages: Iterable[UIMessage] = (),
        max_buffered_chunks: int = 10_000,
    ) -> None:
        self._id_factory = id_factory
        self.chat_id = chat_id if chat_id is not None else id_factory()
        self._messages = list(messages)
        self._status: ChatStatus = "ready"
        self._error: str | None = None
        self._response: _Response | None = None
        self._last_message: UIMessage | None = None
        self._max_buffered = max_buffered_chunks
        # Counters for logs and tests: frames dropped, chunks the builder
        # ignored, tool events the transition table refused.
        self.ignored_frames = 0
        self.ignored_chunks = 0
        self.refused_transitions = 0

    # -- what the UI reads

    @property
    def messages(self) -> list[UIMessage]:
        return list(self._messages)

    @property
    def status(self) -> ChatStatus:
        return self._status

    @property
    def error(self) -> str | None:
        return self._error

    @property
    def active(self) -> bool:
        """Whether a response is in flight (``submitted`` or ``streaming``)."""
        return self._response is not None

    @property
    def request_id(self) -> str | None:
        return None if self._response is None else self._response.request_id

    @property
    def last_sequence(self) -> int | None:
        """Highest contiguous chunk ``sequence`` applied for the current response."""
        return None if self._response is None else self._response.last_sequence

    @property
    def response_message(self) -> UIMessage | None:
        """The assistant message of the current response, else of the last one."""
        if self._response is not None:
            return self._response.builder.message
        return self._last_message

    @property
    def pending_approvals(self) -> list[ToolPart]:
        return [
            part
            for message in self._messages
            for part in message.tool_parts
            if part.state == "approval-requested"
        ]

    # -- frames out

    def begin_request(
        self,
        request_id: str,
        user_message: str | UIMessage,
        *,
        body: Mapping[str, JsonValue] | None = None,
        headers: Mapping[str, str] | None = None,
        metadata: JsonValue = None,
    ) -> dict[str, Any]:
        """Append the user's message and return the ``send`` frame for it."""
        if self._response is not None:
            raise ChatUsageError("a response is in progress; stop it or wait for it first")
        if isinstance(user_message, str):
            user_message = UIMessage(
                id=self._id_factory(), role="user", parts=[TextPart(text=user_message)]
            )
        self._messages.append(user_message)
        self._response = _Response(request_id, MessageBuilder(self._id_factory()))
        self._status = "submitted"
        self._error = None
        frame: dict[str, Any] = {
            "type": "send",
            "requestId": request_id,
            "id": self.chat_id,
            "trigger": "submit-message",
            "messages": [m.to_wire() for m in self._messages],
            "headers": dict(headers or {}),
            "body": dict(body or {}),
        }
        if metadata is not None:
            frame["metadata"] = metadata
        return frame

    def begin_resume(self, request_id: str, last_sequence: int | None = None) -> dict[str, Any]:
        """Return a ``resume`` frame; later frames must carry ``request_id``.

        With a response in flight (the socket dropped mid-stream), it is
        continued from ``last_sequence`` (default: ours) and the status stays
        as it was. Without one, whatever the server is streaming for this
        chat is rebuilt from the start into a new (or same-id) message.
        """
        response = self._response
        if response is None:
            response = self._response = _Response(request_id, MessageBuilder(self._id_factory()))
            self._status = "submitted"
            self._error = None
        else:
            response.request_id = request_id
            ours = response.last_sequence
            # Asking for less than we hold is harmless (the overlap is dropped);
            # asking past what we hold would leave a gap that never fills.
            if last_sequence is None or ours is None or last_sequence > ours:
                last_sequence = ours
        frame: dict[str, Any] = {
            "type": "resume",
            "requestId": request_id,
            "id": self.chat_id,
            "headers": {},
            "body": {},
        }
        if last_sequence is not None:
            frame["lastSequence"] = last_sequence
        return frame

    def abort(self) -> dict[str, Any] | None:
        """Stop the response: status ``ready`` now, its later frames are ignored."""
        response = self._response
        if response is None:
            return None
        self._finish("ready")
        return {"type": "abort", "requestId": response.request_id}

    def fail(self, error_text: str) -> bool:
        """The I/O layer could not send the request: end it with an error."""
        if self._response is None:
            return False
        self._error = error_text
        self._finish("error")
        return True

    def respond_approval(
        self, tool_call_id: str, approved: bool, reason: str | None = None
    ) -> dict[str, Any]:
        """Answer a pending approval: the part moves to ``approval-responded``."""
        part = next((p for p in self.pending_approvals if p.tool_call_id == tool_call_id), None)
        if part is None:
            raise ChatUsageError(f"no approval is pending for tool call {tool_call_id!r}")
        builder = None if self._response is None else self._response.builder
        if builder is None or builder.tool_part(tool_call_id) is not part:
            # The part belongs to an earlier response; the same table rules it.
            builder = MessageBuilder(part.tool_call_id)
            builder.adopt(part)
        builder.respond_approval(tool_call_id, approved, reason)
        frame: dict[str, Any] = {
            "type": "cf_agent_tool_approval",
            "toolCallId": tool_call_id,
            "approved": approved,
        }
        if reason is not None:
            frame["reason"] = reason
        return frame

    # -- frames in

    def receive(self, frame: object) -> bool:
        """Feed one server chat frame; return whether anything visible changed."""
        if not isinstance(frame, Mapping):
            return self._ignore_frame("not an object", frame)
        kind, request_id = frame.get("type"), frame.get("requestId")
        if not isinstance(kind, str) or not isinstance(request_id, str):
            return self._ignore_frame("no type or requestId", frame)
        response = self._response
        if response is None or request_id != response.request_id:
            # Late frames of an aborted or finished request, or of another page.
            return self._ignore_frame("not the current request", frame)
        if kind == "chunk":
            return self._chunk(response, frame)
        if kind == "end":
            self._drain_after_gap(response)
            self._finish("error" if response.builder.error_text is not None else "ready")
            return True
        if kind == "error":
            text = frame.get("errorText")
            self._error = text if isinstance(text, str) else _DEFAULT_ERROR
            self._finish("error")
            return True
        if kind == "no-active":
            self._finish("ready")
            return True
        if kind == "start":
            return False
        return self._ignore_frame("unknown frame type", frame)

    # -- internals

    def _ignore_frame(self, why: str, frame: object) -> bool:
        self.ignored_frames += 1
        logger.debug("chat: ignored frame (%s): %r", why, frame)
        return False

    def _chunk(self, response: _Response, frame: Mapping[str, Any]) -> bool:
        sequence = frame.get("sequence")
        if not isinstance(sequence, int) or isinstance(sequence, bool) or sequence < 0:
            return self._ignore_frame("bad sequence", frame)
        last = -1 if response.last_sequence is None else response.last_sequence
        if sequence <= last:
            return False  # already applied: a resume replay overlapping what we have
        if sequence > last + 1:
            if len(response.pending) < self._max_buffered:
                response.pending[sequence] = frame.get("chunk")
            else:
                self._ignore_frame("too many chunks ahead of a gap", frame)
            return False
        changed = self._apply(response, sequence, frame.get("chunk"))
        while (nxt := sequence + 1) in response.pending:
            sequence = nxt
            changed = self._apply(response, nxt, response.pending.pop(nxt)) or changed
        return changed

    def _drain_after_gap(self, response: _Response) -> None:
        if response.pending:
            logger.warning("chat: response ended with a gap before %s", sorted(response.pending))
            for sequence in sorted(response.pending):
                self._apply(response, sequence, response.pending.pop(sequence))

    def _apply(self, response: _Response, sequence: int, chunk: object) -> bool:
        response.last_sequence = sequence
        builder = response.builder
        error_before = builder.error_text
        counts_before = builder.ignored, builder.refused
        changed = builder.apply(chunk)
        self.ignored_chunks += builder.ignored - counts_before[0]
        self.refused_transitions += builder.refused - counts_before[1]
        if changed:
            self._place(response)
        if builder.error_text != error_before:
            self._error = builder.error_text
            changed = True
        if self._status == "submitted":
            self._status = "streaming"
            changed = True
        return changed

    def _place(self, response: _Response) -> None:
        """Put the assistant message in ``messages`` on its first visible change."""
        message = response.builder.message
        if response.index is not None:
            return
        # A resumed response may already be in the list (same id): replace it.
        for index in range(len(self._messages) - 1, -1, -1):
            if self._messages[index].id == message.id:
                self._messages[index] = message
                response.index = index
                return
        self._messages.append(message)
        response.index = len(self._messages) - 1

    def _finish(self, status: ChatStatus) -> None:
        if self._response is not None:
            self._last_message = self._response.builder.message
        self._response = None
        self._status = status
        if status == "ready":
            self._error = None


# --------------------------------------------------------------------------
# Chat: the asyncio facade.

ChangeCallback: TypeAlias = Callable[["Chat"], None]


class Chat:
    """The chat a ``ToolClient`` exposes as ``client.chat``.

    ``send`` writes one text frame on the shared socket. The client calls
    ``feed`` with every chat frame it receives, and ``connection_lost`` /
    ``connection_restored`` around reconnects (a response that was streaming
    is resumed from ``last_sequence``). Uses asyncio, nothing browser-specific.
    """

    def __init__(
        self,
        send: Callable[[str], Awaitable[None]],
        *,
        chat_id: str | None = None,
        id_factory: Callable[[], str] = _new_id,
        messages: Iterable[UIMessage] = (),
    ) -> None:
        self._send = send
        self._id_factory = id_factory
        self._state = ChatState(chat_id=chat_id, id_factory=id_factory, messages=messages)
        self._listeners: list[ChangeCallback] = []
        self._done: asyncio.Future[None] | None = None
        self._connected = True

    # -- state

    @property
    def state(self) -> ChatState:
        """The sans-I/O core (read it; drive it only through this class)."""
        return self._state

    @property
    def messages(self) -> list[UIMessage]:
        return self._state.messages

    @property
    def status(self) -> ChatStatus:
        return self._state.status

    @property
    def error(self) -> str | None:
        return self._state.error

    @property
    def pending_approvals(self) -> list[ToolPart]:
        return self._state.pending_approvals

    def on_change(self, callback: ChangeCallback) -> Callable[[], None]:
        """Call ``callback(chat)`` after every change; returns the unsubscribe function."""
        self._listeners.append(callback)

        def unsubscribe() -> None:
            if callback in self._listeners:
                self._listeners.remove(callback)

        return unsubscribe

    # -- the public operations

    async def send(self, text: str | UIMessage) -> UIMessage:
        """Send a user message; return the assistant's message once the response ends.

        Raises ``ChatResponseError`` if the response ends in an error. After
        ``stop()`` it returns the message as far as it got.
        """
        done = await self._begin(text)
        await done
        return self._outcome()

    async def stream(self, text: str | UIMessage) -> AsyncIterator[UIMessage]:
        """Send a user message; yield a snapshot of the assistant message on every change."""
        queue: asyncio.Queue[UIMessage | None] = asyncio.Queue()
        last: list[UIMessage | None] = [None]

        def push(chat: Chat) -> None:
            message = chat._state.response_message
            shown = message is not None and any(m is message for m in chat.messages)
            if shown and message != last[0]:
                assert message is not None
                last[0] = message.model_copy(deep=True)
                queue.put_nowait(last[0])
            if not chat._state.active:
                queue.put_nowait(None)

        unsubscribe = self.on_change(push)
        try:
            await self._begin(text)
            while (snapshot := await queue.get()) is not None:
                yield snapshot
        finally:
            unsubscribe()
        self._outcome()  # raises if the response ended in an error

    async def resume(self) -> UIMessage | None:
        """Rejoin the response the server is streaming for this chat; return it once finished.

        For a page that reloaded in the middle of a response: after
        ``connect()``, the response is replayed from its first chunk, then
        followed live. Returns None when nothing was streaming. The chat id
        must be the one used before the reload (``ToolClient`` takes it from
        the session in its URL unless told otherwise).
        """
        if self._state.active:
            raise ChatUsageError("a response is already in progress; wait for it or stop() it")
        frame = self._state.begin_resume(self._id_factory())
        done = self._done = asyncio.get_running_loop().create_future()
        self._changed()
        await self._send(json.dumps(frame))
        await done
        message = self._outcome()
        return message if message.parts else None

    async def stop(self) -> None:
        """Abort the response in flight (status ``ready`` at once)."""
        frame = self._state.abort()
        if frame is None:
            return
        self._changed()
        try:
            await self._send(json.dumps(frame))
        except Exception:  # the socket is down: the server drops it on close anyway
            logger.warning("chat: could not send abort", exc_info=True)

    async def respond(self, tool_call_id: str, approved: bool, reason: str | None = None) -> None:
        """Answer a tool approval request."""
        frame = self._state.respond_approval(tool_call_id, approved, reason)
        self._changed()
        await self._send(json.dumps(frame))

    # -- called by the client's I/O layer

    def feed(self, frame: Mapping[str, Any]) -> None:
        """One chat frame (``start``/``chunk``/``end``/``error``/``no-active``) from the server."""
        if self._state.receive(frame):
            self._changed()

    def connection_lost(self) -> None:
        # Nothing changes for the UI: a response in flight stays "streaming".
        self._connected = False

    async def connection_restored(self) -> None:
        self._connected = True
        if self._state.active:
            frame = self._state.begin_resume(self._id_factory())
            await self._send(json.dumps(frame))

    # -- internals

    async def _begin(self, text: str | UIMessage) -> asyncio.Future[None]:
        frame = self._state.begin_request(self._id_factory(), text)
        done = self._done = asyncio.get_running_loop().create_future()
        self._changed()
        try:
            await self._send(json.dumps(frame))
        except Exception as exc:
            self._state.fail(f"could not send the chat request: {exc}")
            self._changed()
            raise
        return done

    def _outcome(self) -> UIMessage:
        message = self._state.response_message
        if self._state.status == "error":
            raise ChatResponseError(self._state.error or _DEFAULT_ERROR, message)
        assert message is not None  # begin_request always makes a builder
        return message

    def _changed(self) -> None:
        for callback in list(self._listeners):
            try:
                callback(self)
            except Exception:  # a UI callback must not break the frame loop
                logger.exception("chat: on_change callback failed")
        if self._done is not None and not self._state.active and not self._done.done():
            self._done.set_result(None)
