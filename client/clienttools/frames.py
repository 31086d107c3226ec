"""Every wire frame of protocol v1 as a pydantic model (`clienttools.protocol` has the rest).

`clienttools.protocol` hands these out under its own name (`protocol.InvokeFrame`) and
imports this module the first time one is used: making the model classes is two fifths
of the SDK's import in a page, and a page sends its first frame, the tools frame,
without any of them.

    >>> from clienttools import protocol
    >>> protocol.InvokeFrame is InvokeFrame
    True
"""

# No `from __future__ import annotations` here: with it, pydantic compiles and evaluates
# every field's annotation string when the model class is made, a fifth of the SDK's
# import in a page. The forward reference below is quoted.

from typing import Annotated, Literal, TypeAlias, get_args

from pydantic import BaseModel, ConfigDict, Field, JsonValue, model_validator

from clienttools.protocol import (
    TOOL_NAME_PATTERN,
    AckOutcome,
    CancelReason,
    ChatTrigger,
    ErrorCode,
    wire_name,
)

__all__ = [
    "AbortFrame",
    "CancelFrame",
    "ChatClearFrame",
    "ChatMessagesFrame",
    "ChatServerFrame",
    "ChatSubscribeFrame",
    "ChunkFrame",
    "ClientFrame",
    "ClientToolsFrame",
    "EndFrame",
    "ErrorFrame",
    "InvokeFrame",
    "NoActiveFrame",
    "PingFrame",
    "PongFrame",
    "ProtocolErrorFrame",
    "RejectedTool",
    "ResultAckFrame",
    "ResumeFrame",
    "SendFrame",
    "ServerFrame",
    "StartFrame",
    "ToolApprovalFrame",
    "ToolErrorInfo",
    "ToolProgressFrame",
    "ToolResultFrame",
    "ToolSpec",
    "ToolsAckFrame",
    "WireModel",
]


class WireModel(BaseModel):
    """Base of every wire model: camelCase aliases, strict types, unknown fields ignored.

    Unknown fields are ignored rather than refused so that a newer peer can add
    fields without breaking an older one.
    """

    model_config = ConfigDict(
        alias_generator=wire_name,
        populate_by_name=True,
        strict=True,
        frozen=True,
        extra="ignore",
        # Each model builds its validator on first use, not at import: a page pays
        # only for the frames it meets (most of the SDK's import time otherwise).
        # The frame adapters are deferred too.
        defer_build=True,
    )


RequestId = Annotated[str, Field(min_length=1, max_length=256)]


class ToolSpec(WireModel):
    """What a client says about one of its tools."""

    name: Annotated[str, Field(pattern=TOOL_NAME_PATTERN)]
    description: str = ""
    input_schema: dict[str, JsonValue]
    output_schema: dict[str, JsonValue] | None = None
    needs_approval: bool | None = None
    timeout_ms: Annotated[int, Field(ge=1)] | None = None


class ToolErrorInfo(WireModel):
    """A structured tool error as it travels on the wire."""

    code: ErrorCode
    message: str
    data: JsonValue = None


class RejectedTool(WireModel):
    name: str
    reason: str


# --- client to server: tool frames -------------------------------------------------


class ClientToolsFrame(WireModel):
    type: Literal["cf_agent_client_tools"] = "cf_agent_client_tools"
    protocol: Literal[1] = 1
    client_id: Annotated[str, Field(min_length=1, max_length=256)]
    tools: list[ToolSpec]


class ToolResultFrame(WireModel):
    """The answer to one invoke: exactly one of `output` (any JSON, null included) or `error`."""

    type: Literal["cf_agent_client_tool_result"] = "cf_agent_client_tool_result"
    request_id: RequestId
    output: JsonValue = None
    error: ToolErrorInfo | None = None

    @model_validator(mode="after")
    def _exactly_one_of_output_or_error(self) -> "ToolResultFrame":
        has_output = "output" in self.model_fields_set
        has_error = self.error is not None
        if has_output == has_error:
            raise ValueError("a result carries exactly one of 'output' or 'error'")
        return self


class ToolProgressFrame(WireModel):
    type: Literal["cf_agent_client_tool_progress"] = "cf_agent_client_tool_progress"
    request_id: RequestId
    progress: float
    total: float | None = None
    message: str | None = None


class ToolApprovalFrame(WireModel):
    type: Literal["cf_agent_tool_approval"] = "cf_agent_tool_approval"
    tool_call_id: Annotated[str, Field(min_length=1, max_length=256)]
    approved: bool
    reason: str | None = None


class PongFrame(WireModel):
    type: Literal["cf_agent_pong"] = "cf_agent_pong"
    t: float


# --- client to server: chat frames (AI SDK v7 WebSocketChatTransport) --------------


class SendFrame(WireModel):
    type: Literal["send"] = "send"
    request_id: RequestId
    id: str
    trigger: ChatTrigger = "submit-message"
    message_id: str | None = None
    messages: list[dict[str, JsonValue]]
    headers: dict[str, str] = Field(default_factory=dict)
    body: dict[str, JsonValue] = Field(default_factory=dict)
    metadata: JsonValue = None


class ResumeFrame(WireModel):
    type: Literal["resume"] = "resume"
    request_id: RequestId
    id: str
    last_sequence: Annotated[int, Field(ge=0)] | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    body: dict[str, JsonValue] = Field(default_factory=dict)
    metadata: JsonValue = None


class AbortFrame(WireModel):
    type: Literal["abort"] = "abort"
    request_id: RequestId


# --- client to server: the chat stored on the server ---------------------------------

ChatId = Annotated[str, Field(min_length=1, max_length=256)]


class ChatSubscribeFrame(WireModel):
    type: Literal["cf_agent_chat_subscribe"] = "cf_agent_chat_subscribe"
    id: ChatId


class ChatClearFrame(WireModel):
    type: Literal["cf_agent_chat_clear"] = "cf_agent_chat_clear"
    id: ChatId


# --- server to client: tool frames -------------------------------------------------


class ToolsAckFrame(WireModel):
    type: Literal["cf_agent_client_tools_ack"] = "cf_agent_client_tools_ack"
    accepted: list[str]
    rejected: list[RejectedTool] = Field(default_factory=list)


class InvokeFrame(WireModel):
    type: Literal["cf_agent_client_tool_invoke"] = "cf_agent_client_tool_invoke"
    request_id: RequestId
    tool_call_id: str
    tool_name: str
    input: dict[str, JsonValue]
    timeout_ms: Annotated[int, Field(ge=0)] | None = None
    attempt: Annotated[int, Field(ge=1)] = 1


class CancelFrame(WireModel):
    type: Literal["cf_agent_client_tool_cancel"] = "cf_agent_client_tool_cancel"
    request_id: RequestId
    reason: CancelReason


class ResultAckFrame(WireModel):
    type: Literal["cf_agent_client_tool_result_ack"] = "cf_agent_client_tool_result_ack"
    request_id: RequestId
    outcome: AckOutcome
    message: str | None = None


class PingFrame(WireModel):
    type: Literal["cf_agent_ping"] = "cf_agent_ping"
    t: float


class ProtocolErrorFrame(WireModel):
    type: Literal["cf_agent_protocol_error"] = "cf_agent_protocol_error"
    message: str
    request_id: str | None = None


# --- server to client: chat frames -------------------------------------------------


class StartFrame(WireModel):
    type: Literal["start"] = "start"
    request_id: RequestId


class ChunkFrame(WireModel):
    type: Literal["chunk"] = "chunk"
    request_id: RequestId
    sequence: Annotated[int, Field(ge=0)]
    chunk: dict[str, JsonValue]


class EndFrame(WireModel):
    type: Literal["end"] = "end"
    request_id: RequestId


class ErrorFrame(WireModel):
    type: Literal["error"] = "error"
    request_id: RequestId
    error_text: str | None = None


class NoActiveFrame(WireModel):
    type: Literal["no-active"] = "no-active"
    request_id: RequestId


class ChatMessagesFrame(WireModel):
    """The stored messages of a chat, to a connection that subscribed to it."""

    type: Literal["cf_agent_chat_messages"] = "cf_agent_chat_messages"
    id: str
    messages: list[dict[str, JsonValue]]
    version: Annotated[int, Field(ge=0)]


ClientFrame: TypeAlias = Annotated[
    ClientToolsFrame
    | ToolResultFrame
    | ToolProgressFrame
    | ToolApprovalFrame
    | PongFrame
    | SendFrame
    | ResumeFrame
    | AbortFrame
    | ChatSubscribeFrame
    | ChatClearFrame,
    Field(discriminator="type"),
]
ServerFrame: TypeAlias = Annotated[
    ToolsAckFrame
    | InvokeFrame
    | CancelFrame
    | ResultAckFrame
    | PingFrame
    | ProtocolErrorFrame
    | StartFrame
    | ChunkFrame
    | EndFrame
    | ErrorFrame
    | NoActiveFrame
    | ChatMessagesFrame,
    Field(discriminator="type"),
]
ChatServerFrame: TypeAlias = (
    StartFrame | ChunkFrame | EndFrame | ErrorFrame | NoActiveFrame | ChatMessagesFrame
)

#: Each frame model by its `type`, of both sides (no type is on both).
MODELS_BY_TYPE: dict[str, type[WireModel]] = {
    model.model_fields["type"].default: model
    for union in (ClientFrame, ServerFrame)
    for model in get_args(get_args(union)[0])
}
