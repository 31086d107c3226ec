"""The Pyodide flavour's `Session`: the shared protocol core (core.py), with the frame models.

Every client rule (C1-C13) lives in `clienttools.core`, which both flavours run.
What this module adds is what only the pydantic flavour has: chat frames become
the frame models of protocol.py (`ChatFrameReceived.frame`), the chat layer may
queue a frame as a model, and the tools frame is checked by `ClientToolsFrame`
when its client id is one the model refuses.

    >>> from clienttools.tools import ToolRegistry
    >>> session = Session(ToolRegistry(), client_id="page-1")
    >>> session.connection_opened(now=0.0)
    >>> session.receive_frame('{"type": "start", "requestId": "q1"}', now=0.1)
    >>> [chat] = session.events()
    >>> type(chat.frame).__name__, chat.frame.request_id
    ('StartFrame', 'q1')
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeAlias

from clienttools import core, protocol
from clienttools.core import (
    CancelTool,
    ChatFrameReceived,
    Rejection,
    ReplaceConnection,
    RunTool,
    ToolCall,
    ToolsAcknowledged,
    raised_error,
    returned_outcome,
)
from clienttools.rules import (
    CALL_TRANSITIONS,
    COMPLETED_CACHE_SIZE,
    DEFAULT_PING_INTERVAL,
    LIVENESS_FACTOR,
    OUTBOX_FORMAT_VERSION,
    CallEvent,
    CallState,
    LocalProtocolError,
    backoff,
    next_call_state,
)

if TYPE_CHECKING:
    from clienttools.tools import ToolRegistry

__all__ = [  # the lifecycle table, limits and backoff live in rules.py, the rules in core.py
    "CALL_TRANSITIONS",
    "COMPLETED_CACHE_SIZE",
    "DEFAULT_PING_INTERVAL",
    "LIVENESS_FACTOR",
    "OUTBOX_FORMAT_VERSION",
    "CallEvent",
    "CallState",
    "CancelTool",
    "ChatFrameReceived",
    "Event",
    "LocalProtocolError",
    "Rejection",
    "ReplaceConnection",
    "RunTool",
    "Session",
    "ToolCall",
    "ToolsAcknowledged",
    "backoff",
    "next_call_state",
    "raised_error",
    "returned_outcome",
]

Event: TypeAlias = RunTool | CancelTool | ToolsAcknowledged | ChatFrameReceived | ReplaceConnection


class Session(core.Session):
    """The protocol core over a `ToolRegistry`, with chat frames as protocol.py's models."""

    registry: ToolRegistry

    def __init__(
        self,
        registry: ToolRegistry,
        *,
        client_id: str,
        ping_interval: float = DEFAULT_PING_INTERVAL,
        max_result_bytes: int = protocol.MAX_RESULT_BYTES,
        max_frame_bytes: int = protocol.MAX_FRAME_BYTES,
        completed_cache_size: int = COMPLETED_CACHE_SIZE,
    ) -> None:
        super().__init__(
            registry,
            client_id=client_id,
            ping_interval=ping_interval,
            max_result_bytes=max_result_bytes,
            max_frame_bytes=max_frame_bytes,
            completed_cache_size=completed_cache_size,
        )

    def events(self) -> list[Event]:
        """Things the adapter must do or know, in order; the list is cleared."""
        return super().events()

    def tools_frame(self) -> str:
        """The tools frame; a client id the frame model refuses raises its ValidationError."""
        return protocol.tools_frame_text(self.client_id, self.registry.wire_specs())

    def send_frame(self, frame: protocol.WireModel | str) -> bool:
        """Queue a frame of the chat layer (send/resume/abort), as a model or as JSON text.

        Returns False, and queues nothing, while disconnected.
        """
        return super().send_frame(frame if isinstance(frame, str) else protocol.dump_frame(frame))

    def chat_frame(self, raw: dict[str, Any]) -> protocol.ChatServerFrame:
        """The chat frame's model; a frame the model refuses is refused (C13)."""
        try:
            frame: protocol.ChatServerFrame = protocol.validate_frame(raw)
        except protocol.FrameError as exc:
            raise core.FrameRefused(exc.message) from None
        return frame
