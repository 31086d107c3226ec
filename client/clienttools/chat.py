"""Chat over the shared socket: the request lifecycle of rule C14, sans-I/O.

The chat is three layers, each in its own module:

- ``uimessage``: ``UIMessage`` and its parts, and the chunk schema, as data.
- ``message_builder``: ``MessageBuilder`` applies ``UIMessageChunk`` dicts to
  one assistant message (the tool-part states are the table
  ``TOOL_TRANSITIONS``).
- here, ``ChatState``: the builder inside the request lifecycle of the
  ``WebSocketChatTransport`` frames: ``send``/``resume``/``abort`` and the
  approval answer out, ``start``/``chunk``/``end``/``error``/``no-active`` in,
  always as ``protocol`` models. No I/O, no ``asyncio``.

The asyncio facade, ``Chat``, lives in ``chatclient`` next to ``ToolClient``.

    >>> from clienttools import protocol
    >>> state = ChatState(chat_id="c1")
    >>> frame = state.begin_request("r1", "What is 2 + 2?")  # send protocol.dump_frame(frame)
    >>> _ = state.receive(protocol.ChunkFrame(request_id="r1", sequence=0,
    ...     chunk={"type": "text-start", "id": "t"}))
    >>> _ = state.receive(protocol.ChunkFrame(request_id="r1", sequence=1,
    ...     chunk={"type": "text-delta", "id": "t", "delta": "4"}))
    >>> state.status
    'streaming'
    >>> _ = state.receive(protocol.EndFrame(request_id="r1"))
    >>> state.status, state.messages[-1].text
    ('ready', '4')
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final, Literal

from pydantic import JsonValue

from clienttools import protocol
from clienttools.message_builder import TOOL_STATE_ORDER, TOOL_TRANSITIONS, MessageBuilder
from clienttools.partial_json import parse_partial_json
from clienttools.rules import LocalProtocolError
from clienttools.uimessage import (
    CHUNK_FIELDS,
    DataPart,
    FilePart,
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
    UIMessagePart,
    chunk_type,
)

# The message shapes and the builder are re-exported: `clienttools.chat` is where
# an app finds everything the chat shows.
__all__ = [
    "CHUNK_FIELDS",
    "DEFAULT_ERROR",
    "TOOL_STATE_ORDER",
    "TOOL_TRANSITIONS",
    "ChatError",
    "ChatResponseError",
    "ChatState",
    "ChatStatus",
    "DataPart",
    "FilePart",
    "LocalProtocolError",
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
    "new_id",
    "parse_partial_json",
]

logger = logging.getLogger("clienttools.chat")

ChatStatus = Literal["ready", "submitted", "streaming", "error"]


class ChatError(Exception):
    """Base class of the errors the chat raises about a response."""


class ChatResponseError(ChatError):
    """The response ended in an error (an ``error`` frame or ``error`` chunk).

    ``message`` holds the assistant message as far as it got, if any.
    """

    def __init__(self, error_text: str, message: UIMessage | None) -> None:
        super().__init__(error_text)
        self.error_text = error_text
        self.message = message


def new_id() -> str:
    """A fresh id for a request or a message."""
    return uuid.uuid4().hex


@dataclass
class _Response:
    request_id: str
    builder: MessageBuilder
    last_sequence: int | None = None
    pending: dict[int, Mapping[str, JsonValue]] = field(default_factory=dict)
    index: int | None = None  # where the assistant message sits in messages
    # Rejoined by a resume with nothing of ours in flight (a reload): no message of
    # this tab's own is missing from the stored list, so it is shown at once.
    rejoined: bool = False


DEFAULT_ERROR: Final = "The chat server returned an error."
_IN_PROGRESS: Final = "a response is in progress; stop it or wait for it first"


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
        id_factory: Callable[[], str] = new_id,
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
        # The version of the stored messages last applied (0: none yet), and a newer
        # stored list that came while our own response was in flight (applied at its end).
        self._version = 0
        self._stored: protocol.ChatMessagesFrame | None = None
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
    def version(self) -> int:
        """The version of the server's stored messages applied last (0: none yet)."""
        return self._version

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
    ) -> protocol.SendFrame:
        """Append the user's message and return the ``send`` frame for it."""
        if self._response is not None:
            raise LocalProtocolError(_IN_PROGRESS)
        if isinstance(user_message, str):
            user_message = UIMessage(
                id=self._id_factory(), role="user", parts=[TextPart(text=user_message)]
            )
        self._messages.append(user_message)
        self._response = _Response(request_id, MessageBuilder(self._id_factory()))
        self._status = "submitted"
        self._error = None
        return protocol.SendFrame(
            request_id=request_id,
            id=self.chat_id,
            trigger="submit-message",
            messages=[m.to_wire() for m in self._messages],
            headers=dict(headers or {}),
            body=dict(body or {}),
            metadata=metadata,
        )

    def begin_resume(
        self, request_id: str, last_sequence: int | None = None
    ) -> protocol.ResumeFrame:
        """Return a ``resume`` frame; later frames must carry ``request_id``.

        With a response in flight (the socket dropped mid-stream), it is
        continued from ``last_sequence`` (default: ours) and the status stays
        as it was. Without one, whatever the server is streaming for this
        chat is rebuilt from the start into a new (or same-id) message.
        """
        response = self._response
        if response is None:
            response = self._response = _Response(
                request_id, MessageBuilder(self._id_factory()), rejoined=True
            )
            self._status = "submitted"
            self._error = None
        else:
            response.request_id = request_id
            ours = response.last_sequence
            # Asking for less than we hold is harmless (the overlap is dropped);
            # asking past what we hold would leave a gap that never fills.
            if last_sequence is None or ours is None or last_sequence > ours:
                last_sequence = ours
        return protocol.ResumeFrame(
            request_id=request_id, id=self.chat_id, last_sequence=last_sequence
        )

    def abort(self) -> protocol.AbortFrame | None:
        """Stop the response: status ``ready`` now, its later frames are ignored."""
        response = self._response
        if response is None:
            return None
        self._finish("ready")
        return protocol.AbortFrame(request_id=response.request_id)

    def clear(self) -> protocol.ChatClearFrame:
        """Forget every message; return the frame that clears the chat on the server.

        The server deletes what it stored and every tab subscribed to the chat
        gets the empty list (H4). The chat id, ``status`` and ``error`` stay as
        they are. Not while a response is in flight: ``abort()`` it or wait for
        it first.
        """
        if self._response is not None:
            raise LocalProtocolError(_IN_PROGRESS)
        self._messages.clear()
        self._last_message = None
        return protocol.ChatClearFrame(id=self.chat_id)

    def subscribe(self) -> protocol.ChatSubscribeFrame:
        """The frame asking the server for the stored messages, now and after every change."""
        return protocol.ChatSubscribeFrame(id=self.chat_id)

    def fail(self, error_text: str) -> bool:
        """The I/O layer could not send the request: end it with an error."""
        if self._response is None:
            return False
        self._error = error_text
        self._finish("error")
        return True

    def respond_approval(
        self, tool_call_id: str, approved: bool, reason: str | None = None
    ) -> protocol.ToolApprovalFrame:
        """Answer a pending approval: the part moves to ``approval-responded``."""
        part = next((p for p in self.pending_approvals if p.tool_call_id == tool_call_id), None)
        if part is None:
            raise LocalProtocolError(f"no approval is pending for tool call {tool_call_id!r}")
        builder = None if self._response is None else self._response.builder
        if builder is None or builder.tool_part(tool_call_id) is not part:
            # The part belongs to an earlier response; the same table rules it.
            builder = MessageBuilder(part.tool_call_id)
            builder.adopt(part)
        builder.respond_approval(tool_call_id, approved, reason)
        return protocol.ToolApprovalFrame(
            tool_call_id=tool_call_id, approved=approved, reason=reason
        )

    # -- frames in

    def receive(self, frame: protocol.ChatServerFrame) -> bool:
        """Feed one server chat frame; return whether anything visible changed.

        The frame comes parsed and checked (``Session`` did it): only which
        request it belongs to is left to decide here.
        """
        if isinstance(frame, protocol.ChatMessagesFrame):
            return self._receive_stored(frame)
        response = self._response
        if response is None or frame.request_id != response.request_id:
            # Late frames of an aborted or finished request, or of another page.
            return self._ignore_frame("not the current request", frame)
        if isinstance(frame, protocol.ChunkFrame):
            return self._chunk(response, frame)
        if isinstance(frame, protocol.EndFrame):
            self._drain_after_gap(response)
            self._finish("error" if response.builder.error_text is not None else "ready")
            self._apply_stored()
            return True
        if isinstance(frame, protocol.ErrorFrame):
            self._error = DEFAULT_ERROR if frame.error_text is None else frame.error_text
            self._finish("error")
            self._apply_stored()
            return True
        if isinstance(frame, protocol.NoActiveFrame):
            self._finish("ready")
            self._apply_stored()
            return True
        return False  # start: nothing to show until the first chunk

    # -- internals

    def _receive_stored(self, frame: protocol.ChatMessagesFrame) -> bool:
        """The server's stored messages (H3): they replace ours, newest version only.

        While our own response is in flight they wait for its end: the stored
        list may be older than what is streaming, and the server stores the
        response's final state before it sends ``end``. A response rejoined after
        a reload is the exception: the stored history is shown at once, with the
        streaming message kept as it streams.
        """
        if frame.id != self.chat_id:
            return self._ignore_frame("another chat", frame)
        # Version 0 with no messages: no such chat. After a stored version that is a
        # deletion (DELETE /chats/{id}, the retention), and the chat's next use starts
        # again at 1; before any, a chat never stored, which leaves ours as they are.
        deleted = frame.version == 0 and not frame.messages and self._version > 0
        if not deleted and frame.version <= self._version:
            return self._ignore_frame("an older version", frame)
        if self._stored is not None and frame.version <= self._stored.version:
            return self._ignore_frame("an older version", frame)
        self._stored = frame
        if self._response is not None and not self._response.rejoined:
            return False
        return self._apply_stored()

    def _apply_stored(self) -> bool:
        frame, self._stored = self._stored, None
        if frame is None:
            return False
        try:
            messages = [UIMessage.model_validate(m) for m in frame.messages]
        except ValueError:
            return self._ignore_frame("stored messages that are not UIMessages", frame)
        self._version = frame.version
        response = self._response
        if response is not None and response.index is not None:
            # What streams wins over its stored copy (same id), which may be older.
            streaming = response.builder.message
            ids = [m.id for m in messages]
            if streaming.id in ids:
                response.index = ids.index(streaming.id)
                messages[response.index] = streaming
            else:
                response.index = len(messages)
                messages.append(streaming)
        if messages == self._messages:
            return False
        self._messages = messages
        return True

    def _ignore_frame(self, why: str, frame: object) -> bool:
        self.ignored_frames += 1
        logger.debug("chat: ignored frame (%s): %r", why, frame)
        return False

    def _chunk(self, response: _Response, frame: protocol.ChunkFrame) -> bool:
        sequence = frame.sequence
        last = -1 if response.last_sequence is None else response.last_sequence
        if sequence <= last:
            return False  # already applied: a resume replay overlapping what we have
        if sequence > last + 1:
            if len(response.pending) < self._max_buffered:
                response.pending[sequence] = frame.chunk
            else:
                self._ignore_frame("too many chunks ahead of a gap", frame)
            return False
        changed = self._apply(response, sequence, frame.chunk)
        while (nxt := sequence + 1) in response.pending:
            sequence = nxt
            changed = self._apply(response, nxt, response.pending.pop(nxt)) or changed
        return changed

    def _drain_after_gap(self, response: _Response) -> None:
        if response.pending:
            logger.warning("chat: response ended with a gap before %s", sorted(response.pending))
            for sequence in sorted(response.pending):
                self._apply(response, sequence, response.pending.pop(sequence))

    def _apply(self, response: _Response, sequence: int, chunk: Mapping[str, JsonValue]) -> bool:
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
