"""The client's protocol core: frames and the time go in; frames, actions and a deadline come out.

`Session` implements every client rule of protocol v1 (C1-C13) and does no I/O:
no sockets, no timers, no tasks, no `asyncio`, no `js`. An adapter (the asyncio
driver in `client.py`, which runs under CPython and Pyodide alike) owns the
socket and the clock, feeds what arrives into the session, sends what the
session queued, carries out its events (run a tool, cancel a run, replace a
dead connection) and reports back how each run ended.

    >>> from clienttools.tools import ToolRegistry
    >>> registry = ToolRegistry()
    >>> @registry.tool
    ... def add(a: int, b: int) -> int:
    ...     return a + b
    >>> session = Session(registry, client_id="page-1")
    >>> session.connection_opened(now=0.0)
    >>> session.frames_to_send()[0].startswith('{"type":"cf_agent_client_tools"')
    True
    >>> session.receive_frame('{"type": "cf_agent_client_tool_invoke", "requestId": "r1",'
    ...     ' "toolCallId": "c1", "toolName": "add", "input": {"a": 1, "b": 2}}', now=0.1)
    >>> [run] = session.events()
    >>> session.tool_returned(run.request_id, run.tool.call(run.arguments, run.context(None)))
    >>> session.frames_to_send()
    ['{"type":"cf_agent_client_tool_result","requestId":"r1","output":3}']

The call lifecycle is the table `CALL_TRANSITIONS`; a step the table does not
list raises `LocalProtocolError`, because only a misused API can cause it.
"""

from __future__ import annotations

import json
import logging
import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

from pydantic import JsonValue, ValidationError

from clienttools import protocol
from clienttools.rules import (
    CALL_TRANSITIONS,
    COMPLETED_CACHE_SIZE,
    DEFAULT_PING_INTERVAL,
    LIVENESS_FACTOR,
    MAX_ERROR_MESSAGE_CHARS,
    OUTBOX_FORMAT_VERSION,
    CallEvent,
    CallState,
    LocalProtocolError,
    backoff,
    cut_message,
    effective_timeout,
    next_call_state,
    timeout_message,
    too_large_message,
    unknown_tool_message,
)
from clienttools.tools import (
    InvalidInput,
    InvalidOutput,
    Tool,
    ToolContext,
    ToolError,
    ToolRegistry,
)

__all__ = [  # the lifecycle table, limits and backoff live in rules.py, shared with mpy.py
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

if TYPE_CHECKING:
    from pydantic import TypeAdapter

logger = logging.getLogger("clienttools")

# Made on first use (an error with data), not at import: building it took ~70 ms of the
# import, and even unbuilt it imported pydantic's TypeAdapter module.
_json_value: list[TypeAdapter[JsonValue]] = []


def _json_value_adapter() -> TypeAdapter[JsonValue]:
    if not _json_value:
        from pydantic import TypeAdapter

        _json_value.append(TypeAdapter(JsonValue))
    return _json_value[0]


_EMPTY_OUTBOX = json.dumps({"version": OUTBOX_FORMAT_VERSION, "results": []})


@dataclass
class ToolCall:
    """One invoke the session knows about, from arrival until its run has ended."""

    request_id: str
    tool_call_id: str
    tool_name: str
    attempt: int
    state: CallState = CallState.RECEIVED
    deadline: float | None = None
    last_progress: float | None = None

    def step(self, event: CallEvent) -> CallState:
        self.state = next_call_state(self.state, event)
        return self.state


# --- what the session asks the adapter to do -------------------------------------------


@dataclass(frozen=True)
class RunTool:
    """Run `tool` with validated `arguments`; then report tool_returned/raised/cancelled.

    `tool.call(arguments, context)` returns the value of a sync tool, or a
    coroutine for an async one, which the adapter runs as a cancellable task.
    """

    request_id: str
    tool_call_id: str
    attempt: int
    tool: Tool
    arguments: dict[str, Any]

    def context(
        self, report_progress: Callable[[float, float | None, str | None], None] | None
    ) -> ToolContext:
        """The ToolContext for this run; `report_progress` should call `Session.report_progress`."""

        def ignore_progress(progress: float, total: float | None, message: str | None) -> None:
            pass

        return ToolContext(
            request_id=self.request_id,
            tool_call_id=self.tool_call_id,
            tool_name=self.tool.name,
            attempt=self.attempt,
            report_progress=report_progress or ignore_progress,
        )


@dataclass(frozen=True)
class CancelTool:
    """Cancel the run of `request_id` (the tool sees CancelledError), then report tool_cancelled."""

    request_id: str
    reason: str  # a protocol.CancelReason, or "shutdown" when the app closed the client


@dataclass(frozen=True)
class ToolsAcknowledged:
    """The server answered the tools frame (C1)."""

    accepted: tuple[str, ...]
    rejected: tuple[protocol.RejectedTool, ...]


@dataclass(frozen=True)
class ChatFrameReceived:
    """A chat frame (start, chunk, end, error, no-active, the stored messages), parsed."""

    frame: protocol.ChatServerFrame


@dataclass(frozen=True)
class ReplaceConnection:
    """C12: nothing arrived for too long. Drop the socket and reconnect (C11)."""

    reason: str


Event: TypeAlias = RunTool | CancelTool | ToolsAcknowledged | ChatFrameReceived | ReplaceConnection


# --- the session -----------------------------------------------------------------------


class Session:
    """The sans-I/O client core for one page: tool calls, outbox, liveness (C1-C13).

    Inputs: connection_opened/connection_lost, receive_frame, tick (the clock),
    tool_returned/tool_raised/tool_cancelled (how runs ended), report_progress,
    registry_changed, shutdown. Outputs: frames_to_send(), events(),
    next_deadline(), and the outbox through export_outbox()/outbox_revision.
    Times are float seconds from any monotonic clock, always the same one.
    """

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
        if ping_interval <= 0:
            raise ValueError("ping_interval must be positive")
        if completed_cache_size < 1:
            raise ValueError("completed_cache_size must be at least 1")
        self.registry = registry
        self.client_id = client_id
        self.ping_interval = ping_interval
        self.max_result_bytes = max_result_bytes
        self.max_frame_bytes = max_frame_bytes
        self.completed_cache_size = completed_cache_size
        self.connected = False
        self._last_received = 0.0
        self._replace_requested = False
        self._calls: dict[str, ToolCall] = {}
        # requestId -> result frame text; C7's memory of completed requests.
        self._results: OrderedDict[str, str] = OrderedDict()
        # requestId -> result frame text, until cf_agent_client_tool_result_ack (C11).
        self._outbox: OrderedDict[str, str] = OrderedDict()
        self._outbox_revision = 0
        self._outbox_added = 0
        # requestId -> (result text, its export_outbox entry): each result is encoded once.
        self._export_cache: dict[str, tuple[str, str]] = {}
        # Set from the first result the full outbox drops until it has room again, so
        # a burst of drops logs one warning, not one per result (a console flood
        # halves pipelined throughput in the browser).
        self._outbox_overflowing = False
        self._to_send: list[str] = []
        self._events: list[Event] = []

    # --- outputs -----------------------------------------------------------------------

    def frames_to_send(self) -> list[str]:
        """Frames to send, in order; the list is cleared. Empty while disconnected."""
        frames, self._to_send = self._to_send, []
        return frames

    @property
    def has_frames_to_send(self) -> bool:
        """True when frames_to_send() would return frames."""
        return bool(self._to_send)

    def events(self) -> list[Event]:
        """Things the adapter must do or know, in order; the list is cleared."""
        events, self._events = self._events, []
        return events

    def next_deadline(self) -> float | None:
        """When `tick` must next be called: the earliest call deadline or liveness limit."""
        if not self._calls:  # the common case between invokes: only the liveness limit
            if self.connected and not self._replace_requested:
                return self._last_received + LIVENESS_FACTOR * self.ping_interval
            return None
        deadlines = [c.deadline for c in self._calls.values() if c.deadline is not None]
        if self.connected and not self._replace_requested:
            deadlines.append(self._last_received + LIVENESS_FACTOR * self.ping_interval)
        return min(deadlines, default=None)

    @property
    def outbox_revision(self) -> int:
        """Changes whenever the outbox does; the adapter persists it when this moves."""
        return self._outbox_revision

    @property
    def outbox_added(self) -> int:
        """Counts results put in the outbox (acks do not count): stored before they are sent."""
        return self._outbox_added

    @property
    def outbox_size(self) -> int:
        """How many results wait for their ack."""
        return len(self._outbox)

    def outbox(self) -> dict[str, str]:
        """Unacknowledged results: requestId -> result frame text (a copy)."""
        return dict(self._outbox)

    def call_state(self, request_id: str) -> CallState | None:
        """The state of a call whose run has not ended yet, else None."""
        call = self._calls.get(request_id)
        return call.state if call else None

    def running_request_ids(self) -> list[str]:
        """Calls whose run the adapter still owns (running, or cancelled/timed out, not ended)."""
        return list(self._calls)

    # --- connection --------------------------------------------------------------------

    def connection_opened(self, now: float) -> None:
        """A socket is open: send the tools frame (C1), then every unacknowledged result (C11)."""
        self.connected = True
        self._replace_requested = False
        self._last_received = now
        self._to_send = [self._tools_frame()]
        self._to_send.extend(self._outbox.values())

    def connection_lost(self, now: float) -> None:
        """The socket is gone. Runs go on; their results wait in the outbox."""
        self.connected = False
        self._to_send = []

    def registry_changed(self) -> None:
        """The tool set changed: tell the server (C1) when connected."""
        if self.connected:
            self._to_send.append(self._tools_frame())

    def _tools_frame(self) -> str:
        return protocol.tools_frame_text(self.client_id, self.registry.wire_specs())

    def send_frame(self, frame: protocol.WireModel | str) -> bool:
        """Queue a frame of the chat layer (send/resume/abort), as a model or as JSON text.

        Returns False, and queues nothing, while disconnected.
        """
        if not self.connected:
            return False
        self._to_send.append(frame if isinstance(frame, str) else protocol.dump_frame(frame))
        return True

    # --- frames in ---------------------------------------------------------------------

    def receive_frame(self, data: str | bytes, now: float) -> None:
        """Handle one frame from the server. Never raises for anything the server sends (C13)."""
        self._last_received = now
        try:
            frame = protocol.parse_server_frame(data, self.max_frame_bytes)
        except protocol.FrameError as exc:
            self._refuse_frame(exc)
            return
        if isinstance(frame, protocol.InvokeFrame):
            self._receive_invoke(frame, now)
        elif isinstance(frame, protocol.CancelFrame):
            self._receive_cancel(frame)
        elif isinstance(frame, protocol.ResultAckFrame):
            self._receive_result_ack(frame)
        elif isinstance(frame, protocol.PingFrame):
            if self.connected:
                self._to_send.append(protocol.dump_frame(protocol.PongFrame(t=frame.t)))
        elif isinstance(frame, protocol.ToolsAckFrame):
            self._events.append(ToolsAcknowledged(tuple(frame.accepted), tuple(frame.rejected)))
        elif isinstance(frame, protocol.ProtocolErrorFrame):
            logger.warning(
                "server reported a protocol error%s: %s",
                f" for request {frame.request_id!r}" if frame.request_id else "",
                frame.message[:MAX_ERROR_MESSAGE_CHARS],
            )
            if frame.request_id is not None:
                # A refused chat request (H5): the chat that waits for it ends with the error.
                self._events.append(
                    ChatFrameReceived(
                        protocol.ErrorFrame(request_id=frame.request_id, error_text=frame.message)
                    )
                )
        else:
            self._events.append(ChatFrameReceived(frame))

    def _refuse_frame(self, exc: protocol.FrameError) -> None:
        """C13: log and ignore, except a malformed invoke with a readable requestId."""
        logger.warning("ignored a frame from the server: %s", exc.message[:500])
        request_id = exc.request_id
        if exc.frame_type != "cf_agent_client_tool_invoke" or request_id is None:
            return
        if len(request_id) > 256:
            logger.warning("cannot answer the malformed invoke: its requestId is too long")
            return
        if request_id in self._calls or request_id in self._results:
            # C7 wins: that request already has a run or a result.
            return
        call = ToolCall(request_id, tool_call_id="", tool_name="", attempt=1)
        self._finish(
            call, CallEvent.REJECT, _error_result(request_id, "invalid_request", exc.message)
        )

    def _receive_invoke(self, frame: protocol.InvokeFrame, now: float) -> None:
        request_id = frame.request_id
        # An unacknowledged result counts even if the cache of acknowledged ones moved past it.
        stored = self._results.get(request_id) or self._outbox.get(request_id)
        if stored is not None:
            # C7: answered before; send the same result again without running the tool.
            if request_id in self._results:
                self._results.move_to_end(request_id)
            logger.info("invoke %r was answered before; sending the stored result", request_id)
            self._put_in_outbox(request_id, stored)
            return
        if request_id in self._calls:
            logger.info(
                "invoke %r is already running; ignored (attempt %d)", request_id, frame.attempt
            )
            return
        call = ToolCall(request_id, frame.tool_call_id, frame.tool_name, frame.attempt)
        tool = self.registry.get(frame.tool_name)
        if tool is None:
            message = unknown_tool_message(frame.tool_name)
            self._finish(call, CallEvent.REJECT, _error_result(request_id, "unknown_tool", message))
            return
        try:
            arguments = tool.validate_input(frame.input)
        except InvalidInput as exc:
            result = _error_result(request_id, "invalid_input", str(exc), _json_or_none(exc.errors))
            self._finish(call, CallEvent.REJECT, result)
            return
        except Exception as exc:  # a validator of the app's own types failed oddly: still C2
            logger.exception("validating the input of %r failed", frame.tool_name)
            result = _error_result(request_id, "invalid_input", f"{type(exc).__name__}: {exc}")
            self._finish(call, CallEvent.REJECT, result)
            return
        call.step(CallEvent.ACCEPT)
        timeout = effective_timeout(frame.timeout_ms, tool.timeout)
        call.deadline = None if timeout is None else now + timeout
        self._calls[request_id] = call
        self._events.append(RunTool(request_id, frame.tool_call_id, frame.attempt, tool, arguments))

    def _receive_cancel(self, frame: protocol.CancelFrame) -> None:
        call = self._calls.get(frame.request_id)
        if call is None:
            logger.debug("cancel for unknown or finished request %r ignored", frame.request_id)
            return
        before = call.state
        if call.step(CallEvent.CANCEL) is CallState.CANCELLED and before is CallState.RUNNING:
            call.deadline = None
            self._events.append(CancelTool(call.request_id, frame.reason))

    def _receive_result_ack(self, frame: protocol.ResultAckFrame) -> None:
        if frame.outcome in ("stale", "invalid"):
            logger.warning(
                "server refused the result of %r (%s)%s",
                frame.request_id,
                frame.outcome,
                f": {frame.message[:500]}" if frame.message else "",
            )
        if self._outbox.pop(frame.request_id, None) is not None:
            self._outbox_revision += 1
            if len(self._outbox) < self.completed_cache_size:
                self._outbox_overflowing = False

    # --- the clock ---------------------------------------------------------------------

    def tick(self, now: float) -> None:
        """Act on every deadline at or before `now`: call timeouts (C9), liveness (C12)."""
        for call in list(self._calls.values()):
            if call.deadline is not None and now >= call.deadline:
                call.step(CallEvent.EXPIRE)
                call.deadline = None
                self._events.append(CancelTool(call.request_id, "timeout"))
                message = timeout_message(call.tool_name)
                self._store_result(
                    call.request_id, _error_result(call.request_id, "timeout", message)
                )
        limit = self._last_received + LIVENESS_FACTOR * self.ping_interval
        if self.connected and not self._replace_requested and now >= limit:
            self._replace_requested = True
            silence = now - self._last_received
            self._events.append(ReplaceConnection(f"nothing received for {silence:.1f} s"))

    # --- how runs end ------------------------------------------------------------------

    def tool_returned(self, request_id: str, value: Any) -> None:
        """The run returned `value`: serialize it (C5) and send the result."""
        call = self._running_call(request_id)
        if call.state is not CallState.RUNNING:
            call.step(CallEvent.RETURN)  # late: already answered or cancelled
            del self._calls[request_id]
            return
        tool = self.registry.get(call.tool_name)
        output_json, error = returned_outcome(tool, call.tool_name, value, self.max_result_bytes)
        if error is not None:
            code, message, data = error
            result = _error_result(request_id, code, message, data)
            self._end_run(call, CallEvent.RETURN_UNUSABLE, result)
            return
        assert output_json is not None
        self._end_run(call, CallEvent.RETURN, protocol.result_frame_text(request_id, output_json))

    def tool_raised(self, request_id: str, exc: BaseException) -> None:
        """The run raised: C6 (`tool_error`; ToolError carries its own data)."""
        call = self._running_call(request_id)
        if call.state is not CallState.RUNNING:
            call.step(CallEvent.RAISE)
            del self._calls[request_id]
            return
        message, data = raised_error(exc)
        self._end_run(call, CallEvent.RAISE, _error_result(request_id, "tool_error", message, data))

    def tool_cancelled(self, request_id: str) -> None:
        """The run ended by cancellation (after CancelTool, or on its own)."""
        call = self._running_call(request_id)
        if call.state is not CallState.RUNNING:
            call.step(CallEvent.RUN_CANCELLED)
            del self._calls[request_id]
            return
        message = "the tool was cancelled"
        data: JsonValue = {"exception": "CancelledError"}
        result = _error_result(request_id, "tool_error", message, data)
        self._end_run(call, CallEvent.RUN_CANCELLED, result)

    def report_progress(
        self,
        request_id: str,
        progress: float,
        total: float | None = None,
        message: str | None = None,
    ) -> None:
        """Queue a progress frame (C10): only while running, only strictly increasing."""
        call = self._calls.get(request_id)
        if call is None or call.state is not CallState.RUNNING:
            logger.debug("progress for %r dropped: no longer running", request_id)
            return
        if not math.isfinite(progress) or (total is not None and not math.isfinite(total)):
            raise ValueError("progress and total must be finite numbers")
        if call.last_progress is not None and progress <= call.last_progress:
            raise ValueError(
                f"progress must increase strictly: {progress} after {call.last_progress}"
            )
        call.last_progress = progress
        if self.connected:
            frame = protocol.ToolProgressFrame(
                request_id=request_id, progress=float(progress), total=total, message=message
            )
            self._to_send.append(protocol.dump_frame(frame))

    def shutdown(self) -> None:
        """The app is closing the client: cancel every run and forget it (no result).

        The server keeps such a call pending and re-delivers it, so a run cut
        short by a close may run again on the next connection; that is better
        than answering with an error the tool never raised.
        """
        for call in self._calls.values():
            if call.state is CallState.RUNNING:
                call.step(CallEvent.CANCEL)
                call.deadline = None
                self._events.append(CancelTool(call.request_id, "shutdown"))

    def _running_call(self, request_id: str) -> ToolCall:
        call = self._calls.get(request_id)
        if call is None:
            raise LocalProtocolError(f"no run for request {request_id!r} is in progress")
        return call

    # --- results -----------------------------------------------------------------------

    def _end_run(self, call: ToolCall, event: CallEvent, result: str) -> None:
        del self._calls[call.request_id]
        self._finish(call, event, result)

    def _finish(self, call: ToolCall, event: CallEvent, result: str) -> None:
        call.step(event)
        self._store_result(call.request_id, result)

    def _store_result(self, request_id: str, result: str) -> None:
        self._results[request_id] = result
        self._results.move_to_end(request_id)
        while len(self._results) > self.completed_cache_size:
            self._results.popitem(last=False)
        self._put_in_outbox(request_id, result)

    def _put_in_outbox(self, request_id: str, result: str) -> None:
        self._outbox[request_id] = result
        self._outbox.move_to_end(request_id)
        while len(self._outbox) > self.completed_cache_size:
            dropped, _ = self._outbox.popitem(last=False)
            if not self._outbox_overflowing:
                self._outbox_overflowing = True
                logger.warning(
                    "outbox full (%d unacknowledged results): dropping the oldest, "
                    "starting with %r, until acks make room",
                    self.completed_cache_size,
                    dropped,
                )
            else:
                logger.debug("outbox full: dropped the unacknowledged result of %r", dropped)
        self._outbox_revision += 1
        self._outbox_added += 1
        if self.connected:
            self._to_send.append(result)

    # --- persistence -------------------------------------------------------------------

    def export_outbox(self) -> str:
        """The unacknowledged results as JSON text, for storage across a page reload.

        These are also the completed-results entries that matter after a reload:
        a re-delivered invoke for one of them gets the stored result (C7).
        """
        if not self._outbox:
            self._export_cache = {}
            return _EMPTY_OUTBOX
        # The same text as json.dumps of {"version": ..., "results": [entries]}, but each
        # entry is encoded once, not on every write of a long outbox (pipelined invokes).
        old, cache = self._export_cache, {}
        for rid, text in self._outbox.items():
            cached = old.get(rid)
            if cached is None or cached[0] is not text:
                entry = f'{{"requestId": {json.dumps(rid)}, "frame": {json.dumps(text)}}}'
                cached = (text, entry)
            cache[rid] = cached
        self._export_cache = cache
        entries = ", ".join(entry for _, entry in cache.values())
        return f'{{"version": {OUTBOX_FORMAT_VERSION}, "results": [{entries}]}}'

    def restore_outbox(self, text: str) -> int:
        """Load what export_outbox produced; bad entries are logged and skipped. Returns a count."""
        try:
            stored = json.loads(text)
            entries = stored["results"] if stored.get("version") == OUTBOX_FORMAT_VERSION else None
            if not isinstance(entries, list):
                raise ValueError("no list of results in a known format version")
        except (ValueError, TypeError, AttributeError, KeyError, RecursionError) as exc:
            logger.warning("stored outbox ignored: %s", exc)
            return 0
        restored = 0
        for entry in entries:
            try:
                frame = protocol.parse_client_frame(entry["frame"], self.max_frame_bytes)
                if not isinstance(frame, protocol.ToolResultFrame):
                    raise ValueError(f"a {frame.type!r} frame is not a result")
                if frame.request_id != entry["requestId"]:
                    raise ValueError("requestId does not match the frame")
            except (protocol.FrameError, ValueError, TypeError, KeyError) as exc:
                logger.warning("stored result ignored: %s", exc)
                continue
            if frame.request_id not in self._results:
                self._results[frame.request_id] = entry["frame"]
                self._put_in_outbox(frame.request_id, entry["frame"])
                restored += 1
        return restored


def returned_outcome(
    tool: Tool | None, tool_name: str, value: Any, max_result_bytes: int
) -> tuple[str | None, tuple[protocol.ErrorCode, str, JsonValue] | None]:
    """C5 for a value a run returned: (its JSON text, None), or (None, (code, message, data)).

    A result frame and a call through `document.modelContext` (webmcp.py) both come
    from here, so the browser's agent gets the errors the server would.
    """
    try:
        if tool is None:
            raise InvalidOutput(f"tool {tool_name!r} was removed while it ran")
        output_json = tool.dump_output_json(value)
    except Exception as exc:  # InvalidOutput, NaN, app serializers raising anything: C5
        message = f"the return value of {tool_name!r} is not usable: {exc}"
        return None, ("invalid_output", message, None)
    size = protocol.text_size(output_json)
    if size > max_result_bytes:
        message = too_large_message(size, max_result_bytes)
        return None, ("output_too_large", message, {"size": size})
    return output_json, None


def raised_error(exc: BaseException) -> tuple[str, JsonValue]:
    """C6: the `tool_error` message and data of an exception a run raised."""
    if isinstance(exc, ToolError):
        return exc.message, _json_or_none(exc.data)
    return str(exc) or type(exc).__name__, {"exception": type(exc).__name__}


def _json_or_none(value: object) -> JsonValue:
    """`value` if it is plain JSON, else None (logged): error data must never break a result."""
    try:
        data = _json_value_adapter().validate_python(value)
        protocol.json_size(data)
    except (ValidationError, ValueError, TypeError, RecursionError):
        logger.warning("error data of type %s is not JSON; sent without it", type(value).__name__)
        return None
    return data


def _error_result(
    request_id: str, code: protocol.ErrorCode, message: str, data: JsonValue = None
) -> str:
    message = cut_message(message)
    error = protocol.ToolErrorInfo(code=code, message=message, data=data)
    text = protocol.dump_frame(protocol.ToolResultFrame(request_id=request_id, error=error))
    if len(text) > protocol.MAX_RESULT_BYTES:
        # Oversized error data: keep the code and message, which are what the model reads.
        error = protocol.ToolErrorInfo(code=code, message=message + " (error data too large)")
        text = protocol.dump_frame(protocol.ToolResultFrame(request_id=request_id, error=error))
    return text
