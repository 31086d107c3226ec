"""The AI SDK's ``UIMessage`` and ``UIMessageChunk`` shapes as data; no I/O.

- ``UIMessage`` and its parts: pydantic models of the AI SDK's message shape.
  ``message.to_wire()`` gives exactly the JSON the AI SDK would hold
  (camelCase keys, absent fields omitted, JSON ``null`` kept where it is data).
- ``CHUNK_FIELDS`` and ``chunk_type``: the ``ai`` package's
  ``uiMessageChunkSchema`` as a table, so a chunk is checked by a lookup.

    >>> message = UIMessage(id="m1", role="user", parts=[TextPart(text="hi")])
    >>> message.to_wire()
    {'id': 'm1', 'role': 'user', 'parts': [{'type': 'text', 'text': 'hi'}]}
    >>> chunk_type({"type": "text-delta", "id": "t", "delta": "4"})
    'text-delta'
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Final, Literal, TypeAlias

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
    "DataPart",
    "FilePart",
    "JsonObject",
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
    "UIModel",
    "chunk_type",
]

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


# --------------------------------------------------------------------------
# UIMessage and its parts.


class UIModel(BaseModel):
    """Base of the UIMessage models: a model whose dump is the AI SDK's JSON.

    Not a wire frame (those are ``protocol.WireModel``): these are the values a
    ``send`` frame carries and the chat shows.

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


class TextPart(UIModel):
    type: Literal["text"] = "text"
    text: str
    state: Literal["streaming", "done"] | None = None
    citations: list[JsonValue] | None = None
    provider_metadata: JsonObject | None = None


class ReasoningPart(UIModel):
    type: Literal["reasoning"] = "reasoning"
    id: str | None = None
    text: str
    state: Literal["streaming", "done"] | None = None
    provider_metadata: JsonObject | None = None


# The two part kinds whose text streams in start/delta/end chunks.


class StepStartPart(UIModel):
    type: Literal["step-start"] = "step-start"


class ToolApproval(UIModel):
    id: str
    approved: bool | None = None
    descriptor: JsonValue | None = None
    request_reason: str | None = None
    reason: str | None = None
    is_automatic: bool | None = None
    signature: str | None = None
    input_schema_input: JsonValue | MISSING = MISSING

    wire_nullable: ClassVar[frozenset[str]] = frozenset({"inputSchemaInput"})


class ToolPart(UIModel):
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


class FilePart(UIModel):
    type: Literal["file", "reasoning-file"] = "file"
    media_type: str
    url: str
    filename: str | None = None
    provider_reference: dict[str, str] | None = None
    provider_metadata: JsonObject | None = None


class SourceUrlPart(UIModel):
    type: Literal["source-url"] = "source-url"
    source_id: str
    url: str
    title: str | None = None
    provider_metadata: JsonObject | None = None


class SourceDocumentPart(UIModel):
    type: Literal["source-document"] = "source-document"
    source_id: str
    media_type: str
    title: str
    filename: str | None = None
    provider_metadata: JsonObject | None = None


class DataPart(UIModel):
    """An app-defined ``data-<name>`` part."""

    type: str
    id: str | None = None
    data: JsonValue

    wire_nullable: ClassVar[frozenset[str]] = frozenset({"data"})


class OtherPart(UIModel):
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


class UIMessage(UIModel):
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
