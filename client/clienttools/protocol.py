"""Protocol v1 on the wire: every frame's model, parsing and dumping, no I/O.

Both the browser client and the reference server import this module, so the two
sides cannot drift apart. Field names are snake_case in Python and camelCase on
the wire.

    >>> from clienttools.protocol import PingFrame, PongFrame, dump_frame, parse_server_frame
    >>> frame = parse_server_frame('{"type": "cf_agent_ping", "t": 1}')
    >>> isinstance(frame, PingFrame), frame.t
    (True, 1.0)
    >>> dump_frame(PongFrame(t=frame.t))
    '{"type":"cf_agent_pong","t":1.0}'

The frame models (`InvokeFrame`, `ToolSpec`, ...) are defined in `clienttools.frames`
and are this module's attributes too: that module is imported the first time one of
them is used (or a frame is parsed), not with this one. Making the 22 model classes
is two fifths of the SDK's import in a page, and a page sends its first frame, the
tools frame, without any of them.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

from pydantic import JsonValue, ValidationError

from clienttools.rules import (  # shared with the MicroPython flavour, which has no pydantic
    MAX_FRAME_BYTES,
    MAX_RESULT_BYTES,
    MAX_TOOL_SPEC_BYTES,
    MAX_TOOLS_PER_CONNECTION,
    PROTOCOL_VERSION,
    TOOL_NAME_PATTERN,
)

if TYPE_CHECKING:
    from clienttools.frames import (
        AbortFrame,
        CancelFrame,
        ChatClearFrame,
        ChatMessagesFrame,
        ChatServerFrame,
        ChatSubscribeFrame,
        ChunkFrame,
        ClientFrame,
        ClientToolsFrame,
        EndFrame,
        ErrorFrame,
        InvokeFrame,
        NoActiveFrame,
        PingFrame,
        PongFrame,
        ProtocolErrorFrame,
        RejectedTool,
        ResultAckFrame,
        ResumeFrame,
        SendFrame,
        ServerFrame,
        StartFrame,
        ToolApprovalFrame,
        ToolErrorInfo,
        ToolProgressFrame,
        ToolResultFrame,
        ToolsAckFrame,
        ToolSpec,
        WireModel,
    )

__all__ = [
    "MAX_FRAME_BYTES",
    "MAX_RESULT_BYTES",
    "MAX_TOOLS_PER_CONNECTION",
    "MAX_TOOL_SPEC_BYTES",
    "PROTOCOL_VERSION",
    "TOOL_NAME_PATTERN",
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

# The Literals spell rules.ERROR_CODES, CANCEL_REASONS and ACK_OUTCOMES for pydantic and mypy
# (a Literal cannot be built from a tuple); tests/unit/test_input_schema.py checks they agree.
ErrorCode: TypeAlias = Literal[
    "unknown_tool",
    "invalid_input",
    "invalid_request",
    "tool_error",
    "timeout",
    "cancelled",
    "invalid_output",
    "output_too_large",
    "disconnected",
    "expired",
    "denied",
]
CancelReason: TypeAlias = Literal["timeout", "aborted", "superseded", "shutdown"]
AckOutcome: TypeAlias = Literal["applied", "duplicate", "stale", "invalid"]
ChatTrigger: TypeAlias = Literal["submit-message", "regenerate-message"]

#: The `type` of each frame of `ClientFrame` and of `ServerFrame` (a test checks them
#: against the models): a frame of another type is refused before any model is made.
CLIENT_FRAME_TYPES = frozenset(
    {
        "cf_agent_client_tools",
        "cf_agent_client_tool_result",
        "cf_agent_client_tool_progress",
        "cf_agent_tool_approval",
        "cf_agent_pong",
        "send",
        "resume",
        "abort",
        "cf_agent_chat_subscribe",
        "cf_agent_chat_clear",
    }
)
SERVER_FRAME_TYPES = frozenset(
    {
        "cf_agent_client_tools_ack",
        "cf_agent_client_tool_invoke",
        "cf_agent_client_tool_cancel",
        "cf_agent_client_tool_result_ack",
        "cf_agent_ping",
        "cf_agent_protocol_error",
        "start",
        "chunk",
        "end",
        "error",
        "no-active",
        "cf_agent_chat_messages",
    }
)

#: What `clienttools.frames` defines, handed out here by `__getattr__`: the names of
#: `__all__` this module does not define itself.
_FRAME_NAMES = frozenset(name for name in __all__ if name not in globals())


def __getattr__(name: str) -> Any:
    """A frame model, from `clienttools.frames` (imported on the first one asked for)."""
    if name not in _FRAME_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from clienttools import frames

    globals().update({frame_name: getattr(frames, frame_name) for frame_name in _FRAME_NAMES})
    return getattr(frames, name)


def wire_name(field: str) -> str:
    """A field's camelCase wire name: `request_id` -> `requestId`.

    What pydantic's `to_camel` gives for these lower-case snake names (a test checks
    every field), without its regular expressions: it runs for each field of each
    model as the models are made, and that is start-up time in a page.
    """
    head, *rest = field.split("_")
    return head + "".join(word.capitalize() for word in rest)


#: Each frame type's validator, by `type`: made with its model on the first frame of that
#: type. A frame is validated by its own model, the one its `type` names, which is what the
#: `ClientFrame` and `ServerFrame` unions do (a test holds the two equal, results and
#: errors), without building all of a side's models for the first frame of the side.
_validators: dict[str, Callable[..., Any]] = {}


def _validator(frame_type: str) -> Callable[..., Any]:
    validate = _validators.get(frame_type)
    if validate is None:
        from clienttools import frames

        model = frames.MODELS_BY_TYPE[frame_type]
        model.model_rebuild()
        validate = _validators[frame_type] = model.__pydantic_validator__.validate_python
    return validate


class FrameError(ValueError):
    """A frame that cannot be used: not JSON, not an object, unknown type, bad fields, too big.

    `request_id` is set when the frame was a JSON object with a string
    `requestId`, so the receiver can still answer that request (C13).
    `frame_type` is the frame's `type` when it was a string.
    """

    def __init__(
        self, message: str, *, request_id: str | None = None, frame_type: str | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.request_id = request_id
        self.frame_type = frame_type


def _parse(text: str | bytes, known_types: frozenset[str], max_bytes: int) -> Any:
    if not isinstance(text, str):
        raise FrameError("binary frames are not part of the protocol; send JSON text")
    # A code point is at most 4 bytes of UTF-8: a short frame needs no encoding to size it.
    if len(text) * 4 > max_bytes:
        size = len(text.encode("utf-8", "surrogatepass"))
        if size > max_bytes:
            raise FrameError(f"frame of {size} bytes is over the {max_bytes}-byte limit")
    try:
        raw = _DECODER.decode(text)
    except (ValueError, RecursionError) as exc:
        raise FrameError(f"frame is not valid JSON: {exc}") from None
    if _ESCAPED_SURROGATE.search(text) and not _encodable(raw):
        # An escaped lone surrogate ("\ud800") decodes to a str that UTF-8 cannot
        # encode: accepting it would make the frame impossible to send on or store.
        raise FrameError("frame is not valid JSON: it contains a lone UTF-16 surrogate")
    if not isinstance(raw, dict):
        raise FrameError(f"frame must be a JSON object, got {type(raw).__name__}")
    request_id = raw.get("requestId")
    request_id = request_id if isinstance(request_id, str) and request_id else None
    frame_type = raw.get("type")
    if not isinstance(frame_type, str):
        raise FrameError("frame has no string 'type'", request_id=request_id)
    if frame_type not in known_types:
        raise FrameError(
            f"unknown frame type {frame_type[:64]!r}", request_id=request_id, frame_type=frame_type
        )
    return validate_frame(raw)


def validate_frame(raw: dict[str, Any]) -> Any:
    """The model of a decoded frame whose `type` is known; raises FrameError with the reason."""
    frame_type = raw["type"]
    request_id = raw.get("requestId")
    request_id = request_id if isinstance(request_id, str) and request_id else None
    try:
        return _validator(frame_type)(raw, by_alias=True)
    except ValidationError as exc:
        raise FrameError(
            f"invalid {frame_type!r} frame: {describe_validation_error(exc)}",
            request_id=request_id,
            frame_type=frame_type,
        ) from None
    except RecursionError:
        raise FrameError("frame is nested too deeply", request_id=request_id) from None


_ESCAPED_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")


def _refuse_constant(name: str) -> object:
    # Python's json accepts NaN and Infinity; JSON does not, and neither can we send them.
    raise ValueError(f"{name} is not a JSON value")


# One decoder and one encoder for every frame: `json.loads`/`json.dumps` with options
# build a new one per call, a tenth of an invoke's time.
_DECODER = json.JSONDecoder(parse_constant=_refuse_constant)
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _encodable(value: object) -> bool:
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def describe_validation_error(exc: ValidationError, limit: int = 3, skip: int = 0) -> str:
    """A short, human-readable summary of a pydantic error: where and what.

    `skip` drops leading location parts (the union tag of a discriminated frame).
    """
    parts = []
    for err in exc.errors(include_url=False)[:limit]:
        where = ".".join(str(p) for p in err["loc"][skip:]) or "frame"
        parts.append(f"{where}: {err['msg']}")
    more = exc.error_count() - limit
    if more > 0:
        parts.append(f"and {more} more")
    return "; ".join(parts)


def parse_client_frame(text: str | bytes, max_bytes: int = MAX_FRAME_BYTES) -> ClientFrame:
    """Parse a frame the client sent. Raises FrameError with a readable message."""
    frame: ClientFrame = _parse(text, CLIENT_FRAME_TYPES, max_bytes)
    return frame


def parse_server_frame(text: str | bytes, max_bytes: int = MAX_FRAME_BYTES) -> ServerFrame:
    """Parse a frame the server sent. Raises FrameError with a readable message."""
    frame: ServerFrame = _parse(text, SERVER_FRAME_TYPES, max_bytes)
    return frame


def dump_frame(frame: WireModel) -> str:
    """Serialize a frame to compact JSON text with camelCase keys.

    Absent optional fields are left out, except a result's `output`, which is
    sent even when it is null because null is a valid tool output.
    """
    from clienttools.frames import ToolResultFrame

    data = frame.model_dump(mode="json", by_alias=True, exclude_none=True)
    if isinstance(frame, ToolResultFrame) and frame.error is None:
        data["output"] = frame.output
    return _ENCODER.encode(data)


def dump_json(value: object) -> str:
    """`value` as compact JSON text, as frames carry it; ValueError for NaN and infinities.

    The one JSON encoding of the project: frames, results and anything stored
    beside them use it, so equal values give equal text everywhere.

        >>> dump_json({"a": [1, None], "é": True})
        '{"a":[1,null],"é":true}'
    """
    return _ENCODER.encode(value)


def _finite_float_json(value: float) -> str:
    if math.isfinite(value):
        return float.__repr__(value)
    raise ValueError(f"Out of range float values are not JSON compliant: {value!r}")


#: `dump_json` of a value of exactly one of these types, without the encoder's set-up per
#: call (most of the cost of encoding one number): the same text, by the same functions
#: `json` itself uses for them (a test holds the two equal).
_PLAIN_JSON: dict[type, Callable[[Any], str]] = {
    int: int.__repr__,
    bool: lambda value: "true" if value else "false",
    type(None): lambda value: "null",
    float: _finite_float_json,
    str: json.encoder.encode_basestring,
}


def plain_json(value: object) -> str:
    """`dump_json(value)`, faster for a plain int, float, bool, str or None."""
    encode = _PLAIN_JSON.get(type(value))
    return encode(value) if encode is not None else _ENCODER.encode(value)


def load_json(text: str) -> JsonValue:
    """JSON text as Python data; ValueError for bad JSON and for NaN or Infinity.

    >>> load_json('{"a": [1, null]}')
    {'a': [1, None]}
    """
    value: JsonValue = _DECODER.decode(text)
    return value


def text_size(text: str) -> int:
    """Bytes of `text` as UTF-8."""
    return len(text) if text.isascii() else len(text.encode("utf-8"))


def json_size(value: object) -> int:
    """Bytes of `value` as compact UTF-8 JSON, the size the result limits count."""
    return text_size(_ENCODER.encode(value))


def tools_frame_text(client_id: str, wire_specs: list[dict[str, Any]]) -> str:
    """The text of a `cf_agent_client_tools` frame, from specs already in their wire form.

    Equal to `dump_frame(ClientToolsFrame(client_id=..., tools=specs))` for the same
    specs (`ToolSpec.model_dump(mode="json", by_alias=True, exclude_none=True)`), without
    building the two models: a page sends this frame first, so its cost is start-up time.
    A client id the model refuses goes through the model, which says why.
    """
    if not (isinstance(client_id, str) and 1 <= len(client_id) <= 256):
        from clienttools.frames import ClientToolsFrame, ToolSpec

        specs = [ToolSpec.model_validate(spec, by_alias=True) for spec in wire_specs]
        return dump_frame(ClientToolsFrame(client_id=client_id, tools=specs))
    frame = {
        "type": "cf_agent_client_tools",
        "protocol": PROTOCOL_VERSION,
        "clientId": client_id,
        "tools": wire_specs,
    }
    return _ENCODER.encode(frame)


def result_frame_text(request_id: str, output_json: str) -> str:
    """The text of a result frame with an `output`, from the output's JSON text.

    Equal to `dump_frame(ToolResultFrame(request_id=..., output=...))`, without
    building the model and encoding the output a second time: the hot path of
    every successful invoke.
    """
    return (
        '{"type":"cf_agent_client_tool_result","requestId":'
        f'{_ENCODER.encode(request_id)},"output":{output_json}}}'
    )
