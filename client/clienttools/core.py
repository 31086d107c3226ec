"""The client's protocol core, for both flavours: frames and the time in; frames and actions out.

`Session` implements every client rule of protocol v1 (C1-C13) and does no I/O:
no sockets, no timers, no tasks, no `asyncio`, no `js`. An adapter owns the
socket and the clock, feeds what arrives into the session, sends what the
session queued, carries out its events (run a tool, cancel a run, replace a
dead connection) and reports back how each run ended. The two adapters are
`client.ToolClient` (CPython's asyncio, which Pyodide runs too) and
`mpy.ToolClient` (MicroPython's asyncio on `js`).

This module runs on CPython, Pyodide and MicroPython 1.27 alike, in the subset
rules.py keeps to (no pydantic, `typing`, `enum`, `dataclasses` or
`from __future__`): frames are dicts checked by the small validators below,
events are plain classes. A tool is anything with `name`, `timeout`,
`validate_input(input) -> arguments` (raising `InvalidInput`),
`dump_output_json(value) -> str` (raising anything for an unusable value) and
`call(arguments, context)`; the registry is anything with `get(name)` and
`wire_specs()`. tools.py (pydantic) and mpy.py (declared JSON schemas) give both.

    >>> from clienttools.mpy import Tool, ToolTable
    >>> registry = ToolTable()
    >>> registry.add(Tool(lambda a, b: a + b, name="add"))
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

The call lifecycle is the table `rules.CALL_TRANSITIONS`; a step the table does not
list raises `LocalProtocolError`, because only a misused API can cause it.
"""

import json
import math

from clienttools.events import (
    CancelTool,
    ChatFrameReceived,
    Rejection,
    ReplaceConnection,
    RunTool,
    ToolsAcknowledged,
)
from clienttools.outcomes import (
    error_result,
    input_outcome,
    raised_error,
    result_text,
    returned_outcome,
)
from clienttools.portable import dumps, loads, log, utf8_encodable, utf8_size
from clienttools.recent import Recent
from clienttools.rules import (
    ACK_OUTCOMES,
    CANCEL_REASONS,
    COMPLETED_CACHE_SIZE,
    DEFAULT_PING_INTERVAL,
    ERROR_CODES,
    LIVENESS_FACTOR,
    MAX_ERROR_MESSAGE_CHARS,
    MAX_FRAME_BYTES,
    MAX_REQUEST_ID_CHARS,
    MAX_RESULT_BYTES,
    OUTBOX_FORMAT_VERSION,
    PROTOCOL_VERSION,
    CallEvent,
    CallState,
    LocalProtocolError,
    effective_timeout,
    next_call_state,
    timeout_message,
    unknown_tool_message,
)

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (MicroPython has none)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, NoReturn

__all__ = [  # the events (events.py) and how a call ends (outcomes.py) are here too
    "CHAT_FRAME_TYPES",
    "CancelTool",
    "ChatFrameReceived",
    "FrameRefused",
    "Rejection",
    "ReplaceConnection",
    "RunTool",
    "Session",
    "ToolCall",
    "ToolsAcknowledged",
    "error_result",
    "input_outcome",
    "raised_error",
    "returned_outcome",
]

#: The chat layer's frames (C14): handed to `Session.chat_frame`, which drops them here.
CHAT_FRAME_TYPES = ("start", "chunk", "end", "error", "no-active", "cf_agent_chat_messages")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)) and math.isfinite(
        value
    )


def _is_request_id(value: object) -> bool:
    return isinstance(value, str) and 0 < len(value) <= MAX_REQUEST_ID_CHARS


def _is_str(value: object) -> bool:
    return isinstance(value, str)


def _is_ack_outcome(value: object) -> bool:
    return value in ACK_OUTCOMES


# --- frames in: small validators over dicts ---------------------------------------------


class FrameRefused(Exception):
    """A server frame that cannot be used; `message` says why (C13: logged, ignored)."""


def _field(raw: "dict[str, Any]", key: str, check: "Callable[[Any], bool]", what: str) -> "Any":
    if key not in raw:
        raise FrameRefused(f"{key}: Field required")
    value = raw[key]
    if not check(value):
        raise FrameRefused(f"{key}: Input should be {what}")
    return value


def _optional(raw: "dict[str, Any]", key: str, check: "Callable[[Any], bool]", what: str) -> "Any":
    if raw.get(key) is None:
        return None
    return _field(raw, key, check, what)


_REQUEST_ID = "a string of 1 to 256 characters"


# --- the session ---------------------------------------------------------------------------


def _stored_result_problem(request_id: object, text: object) -> "str | None":
    """Why an outbox entry from storage is not a result frame for `request_id`, or None."""
    if not (_is_request_id(request_id) and isinstance(text, str)):
        return "an entry needs a requestId and the frame's text"
    frame = loads(text)
    if not isinstance(frame, dict) or frame.get("type") != "cf_agent_client_tool_result":
        return "not a result frame"
    if frame.get("requestId") != request_id:
        return "requestId does not match the frame"
    error = frame.get("error")
    if error is None:
        return None if "output" in frame else "a result needs an output or an error"
    if "output" in frame and frame["output"] is not None:
        return "a result has an output or an error, not both"
    if not (
        isinstance(error, dict)
        and error.get("code") in ERROR_CODES
        and isinstance(error.get("message"), str)
    ):
        return "the error needs a known code and a message"
    return None


class ToolCall:
    """One invoke the session knows about, from arrival until its run has ended."""

    __slots__ = (
        "attempt",
        "deadline",
        "last_progress",
        "request_id",
        "state",
        "tool_call_id",
        "tool_name",
    )

    def __init__(
        self,
        request_id: str,
        tool_call_id: str,
        tool_name: str,
        attempt: int,
        state: "CallState" = CallState.RECEIVED,
    ) -> None:
        self.request_id = request_id
        self.tool_call_id = tool_call_id
        self.tool_name = tool_name
        self.attempt = attempt
        self.state = state
        self.deadline: float | None = None
        self.last_progress: float | None = None

    def step(self, event: "CallEvent") -> "CallState":
        self.state = next_call_state(self.state, event)
        return self.state


class Session:
    """The sans-I/O client core for one page: tool calls, outbox, liveness (C1-C13).

    Inputs: connection_opened/connection_lost, receive_frame, tick (the clock),
    tool_returned/tool_raised/tool_cancelled (how runs ended), report_progress,
    registry_changed, send_frame, shutdown. Outputs: frames_to_send(), events(),
    next_deadline(), and the outbox through export_outbox()/outbox_revision.
    Times are float seconds from any monotonic clock, always the same one.
    """

    def __init__(
        self,
        registry: "Any",
        *,
        client_id: str,
        ping_interval: float = DEFAULT_PING_INTERVAL,
        max_result_bytes: int = MAX_RESULT_BYTES,
        max_frame_bytes: int = MAX_FRAME_BYTES,
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
        self._results = Recent()  # C7's memory of completed requests
        self._outbox = Recent()  # results until cf_agent_client_tool_result_ack (C11)
        self._outbox_revision = 0
        self._outbox_added = 0
        # requestId -> (result text, its export_outbox entry): each result is encoded once.
        self._export_cache: dict[str, tuple[str, str]] = {}
        # Set from the first result the full outbox drops until it has room again, so
        # a burst of drops logs one warning, not one per result (a console flood
        # halves pipelined throughput in the browser).
        self._outbox_overflowing = False
        self._to_send: list[str] = []
        self._events: list[Any] = []

    # --- outputs -----------------------------------------------------------------------

    def frames_to_send(self) -> "list[str]":
        """Frames to send, in order; the list is cleared. Empty while disconnected."""
        frames, self._to_send = self._to_send, []
        return frames

    @property
    def has_frames_to_send(self) -> bool:
        """True when frames_to_send() would return frames."""
        return bool(self._to_send)

    def events(self) -> "list[Any]":
        """Things the adapter must do or know, in order; the list is cleared."""
        events, self._events = self._events, []
        return events

    def next_deadline(self) -> "float | None":
        """When `tick` must next be called: the earliest call deadline or liveness limit."""
        live = self.connected and not self._replace_requested
        if not self._calls:  # the common case between invokes: only the liveness limit
            return self._last_received + LIVENESS_FACTOR * self.ping_interval if live else None
        deadlines = [c.deadline for c in self._calls.values() if c.deadline is not None]
        if live:
            deadlines.append(self._last_received + LIVENESS_FACTOR * self.ping_interval)
        return min(deadlines) if deadlines else None

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

    def outbox(self) -> "dict[str, str]":
        """Unacknowledged results: requestId -> result frame text (a copy)."""
        return dict(self._outbox.items())

    def call_state(self, request_id: str) -> "CallState | None":
        """The state of a call whose run has not ended yet, else None."""
        call = self._calls.get(request_id)
        return call.state if call else None

    def running_request_ids(self) -> "list[str]":
        """Calls whose run the adapter still owns (running, or cancelled/timed out, not ended)."""
        return list(self._calls)

    # --- connection --------------------------------------------------------------------

    def connection_opened(self, now: float) -> None:
        """A socket is open: send the tools frame (C1), then every unacknowledged result (C11)."""
        self.connected = True
        self._replace_requested = False
        self._last_received = now
        self._to_send = [self.tools_frame()]
        self._to_send.extend(text for _, text in self._outbox.items())

    def connection_lost(self, now: float) -> None:
        """The socket is gone. Runs go on; their results wait in the outbox."""
        self.connected = False
        self._to_send = []

    def registry_changed(self) -> None:
        """The tool set changed: tell the server (C1) when connected."""
        if self.connected:
            self._to_send.append(self.tools_frame())

    def tools_frame(self) -> str:
        """The text of the `cf_agent_client_tools` frame for the registry as it is now."""
        frame = {
            "type": "cf_agent_client_tools",
            "protocol": PROTOCOL_VERSION,
            "clientId": self.client_id,
            "tools": self.registry.wire_specs(),
        }
        return dumps(frame)

    def send_frame(self, frame: str) -> bool:
        """Queue a frame of the chat layer (send/resume/abort) as JSON text.

        Returns False, and queues nothing, while disconnected.
        """
        if not self.connected:
            return False
        self._to_send.append(frame)
        return True

    # --- frames in (C13: nothing the server sends raises) -------------------------------

    def receive_frame(self, data: "str | bytes", now: float) -> None:
        """Handle one frame from the server. Never raises for anything the server sends (C13)."""
        self._last_received = now
        raw = self._decode(data)
        if raw is None:
            return
        kind = raw["type"]
        handler = _HANDLERS.get(kind)
        try:
            if handler is not None:
                handler(self, raw, now)
            elif kind in CHAT_FRAME_TYPES:
                frame = self.chat_frame(raw)
                if frame is not None:
                    self._events.append(ChatFrameReceived(frame))
            else:
                raise FrameRefused(f"unknown frame type {kind[:64]!r}")
        except FrameRefused as exc:
            message = str(exc)
            if handler is not None:
                message = f"invalid {kind!r} frame: {message}"
            self._refuse(raw, kind, message)

    def _decode(self, data: object) -> "dict[str, Any] | None":
        """The frame as a dict with a string `type`, or None (logged)."""
        if not isinstance(data, str):
            log("warn", "ignored a binary frame: the protocol is JSON text")
            return None
        if len(data) * 4 > self.max_frame_bytes:
            size = utf8_size(data)
            if size > self.max_frame_bytes:
                log(
                    "warn",
                    f"ignored a frame of {size} bytes, over the {self.max_frame_bytes}-byte limit",
                )
                return None
        try:
            raw = loads(data)
        except Exception as exc:  # ValueError, RecursionError; MicroPython may raise others
            log("warn", f"ignored a frame that is not valid JSON: {exc}")
            return None
        if "\\u" in data and not utf8_encodable(raw):
            # An escaped lone surrogate ("\ud800") decodes to a str that UTF-8 cannot
            # encode: accepting it would make the frame impossible to send on or store.
            log("warn", "ignored a frame with a lone UTF-16 surrogate")
            return None
        if not isinstance(raw, dict):
            log("warn", f"ignored a frame that is not a JSON object ({type(raw).__name__})")
            return None
        if not isinstance(raw.get("type"), str):
            self._refuse(raw, None, "frame has no string 'type'")
            return None
        return raw

    def chat_frame(self, raw: "dict[str, Any]") -> "Any":
        """What a chat frame becomes in a ChatFrameReceived event; None drops it.

        This core has no chat client (the MicroPython flavour has none), so it drops
        them; the Pyodide flavour's Session makes its frame models here.
        """
        return None

    def _refuse(self, raw: "dict[str, Any]", kind: "str | None", message: str) -> None:
        """C13: log and ignore, except a malformed invoke with a readable requestId."""
        log("warn", f"ignored a frame from the server: {message[:500]}")
        request_id = raw.get("requestId")
        if kind != "cf_agent_client_tool_invoke" or not isinstance(request_id, str):
            return
        if not request_id:
            return
        if len(request_id) > MAX_REQUEST_ID_CHARS:
            log("warn", "cannot answer the malformed invoke: its requestId is too long")
            return
        if request_id in self._calls or request_id in self._results:
            return  # C7 wins: that request already has a run or a result
        call = ToolCall(request_id, "", "", 1)
        self._finish(call, CallEvent.REJECT, error_result(request_id, "invalid_request", message))

    def _receive_invoke(self, raw: "dict[str, Any]", now: float) -> None:
        get = raw.get
        request_id, tool_call_id, tool_name = get("requestId"), get("toolCallId"), get("toolName")
        arguments, timeout_ms, attempt = get("input"), get("timeoutMs"), get("attempt", 1)
        # The hot path of every invoke: one test for a well-formed frame (type() is exact,
        # so a bool is no int); anything else goes through the field checks, which say why.
        if not (
            type(request_id) is str
            and 0 < len(request_id) <= MAX_REQUEST_ID_CHARS
            and type(tool_call_id) is str
            and type(tool_name) is str
            and type(arguments) is dict
            and (timeout_ms is None or (type(timeout_ms) is int and timeout_ms >= 0))
            and type(attempt) is int
            and attempt >= 1
        ):
            _check_invoke(raw)
        # An unacknowledged result counts even if the cache of acknowledged ones moved past it.
        stored = self._results.get(request_id) or self._outbox.get(request_id)
        if stored is not None:
            # C7: answered before; send the same result again without running the tool.
            if request_id in self._results:
                self._results.put(request_id, stored)
            log("info", f"invoke {request_id!r} was answered before; sending the stored result")
            self._put_in_outbox(request_id, stored)
            return
        if request_id in self._calls:
            log("info", f"invoke {request_id!r} is already running; ignored (attempt {attempt})")
            return
        call = ToolCall(request_id, tool_call_id, tool_name, attempt)
        tool = self.registry.get(tool_name)
        if tool is None:
            message = unknown_tool_message(tool_name)
            self._finish(call, CallEvent.REJECT, error_result(request_id, "unknown_tool", message))
            return
        arguments, error = input_outcome(tool, arguments)
        if arguments is None:
            assert error is not None
            self._finish(call, CallEvent.REJECT, error_result(request_id, *error))
            return
        call.step(CallEvent.ACCEPT)
        timeout = effective_timeout(timeout_ms, tool.timeout)
        call.deadline = None if timeout is None else now + timeout
        self._calls[request_id] = call
        self._events.append(RunTool(request_id, tool_call_id, attempt, tool, arguments))

    def _receive_cancel(self, raw: "dict[str, Any]", now: float) -> None:
        request_id = _field(raw, "requestId", _is_request_id, _REQUEST_ID)
        reason = _field(raw, "reason", lambda v: v in CANCEL_REASONS, " or ".join(CANCEL_REASONS))
        call = self._calls.get(request_id)
        if call is None:
            log("debug", f"cancel for unknown or finished request {request_id!r} ignored")
            return
        before = call.state
        if call.step(CallEvent.CANCEL) is CallState.CANCELLED and before is CallState.RUNNING:
            call.deadline = None
            self._events.append(CancelTool(request_id, reason))

    def _receive_result_ack(self, raw: "dict[str, Any]", now: float) -> None:
        get = raw.get
        request_id, outcome, message = get("requestId"), get("outcome"), get("message")
        # The hot path of every result: one test for a well-formed ack (as for invokes);
        # anything else goes through the field checks, which say what is wrong.
        if not (
            type(request_id) is str
            and 0 < len(request_id) <= MAX_REQUEST_ID_CHARS
            and type(outcome) is str
            and outcome in ACK_OUTCOMES
            and (message is None or type(message) is str)
        ):
            request_id = _field(raw, "requestId", _is_request_id, _REQUEST_ID)
            outcome = _field(raw, "outcome", _is_ack_outcome, " or ".join(ACK_OUTCOMES))
            message = _optional(raw, "message", _is_str, "a valid string")
        if outcome in ("stale", "invalid"):
            detail = f": {message[:500]}" if message else ""
            log("warn", f"server refused the result of {request_id!r} ({outcome}){detail}")
        if self._outbox.pop(request_id) is not None:
            self._outbox_revision += 1
            if len(self._outbox) < self.completed_cache_size:
                self._outbox_overflowing = False

    def _receive_ping(self, raw: "dict[str, Any]", now: float) -> None:
        t = _field(raw, "t", _is_number, "a valid number")
        if self.connected:
            self._to_send.append(dumps({"type": "cf_agent_pong", "t": float(t)}))

    def _receive_tools_ack(self, raw: "dict[str, Any]", now: float) -> None:
        accepted = _field(
            raw,
            "accepted",
            lambda v: isinstance(v, list) and all(isinstance(n, str) for n in v),
            "a list of strings",
        )
        rejected = raw.get("rejected", [])
        if not isinstance(rejected, list) or not all(
            isinstance(r, dict) and _is_str(r.get("name")) and _is_str(r.get("reason"))
            for r in rejected
        ):
            raise FrameRefused("rejected: Input should be a list of {name, reason}")
        refused = tuple(Rejection(r["name"], r["reason"]) for r in rejected)
        self._events.append(ToolsAcknowledged(tuple(accepted), refused))

    def _receive_protocol_error(self, raw: "dict[str, Any]", now: float) -> None:
        message = _field(raw, "message", _is_str, "a valid string")
        request_id = _optional(raw, "requestId", _is_str, "a valid string")
        where = f" for request {request_id!r}" if request_id else ""
        text = message[:MAX_ERROR_MESSAGE_CHARS]
        log("warn", f"server reported a protocol error{where}: {text}")
        if request_id is not None:
            # A refused chat request (H5): the chat that waits for it ends with the error.
            frame = self.chat_frame(
                {"type": "error", "requestId": request_id, "errorText": message}
            )
            if frame is not None:
                self._events.append(ChatFrameReceived(frame))

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
                    call.request_id, error_result(call.request_id, "timeout", message)
                )
        limit = self._last_received + LIVENESS_FACTOR * self.ping_interval
        if self.connected and not self._replace_requested and now >= limit:
            self._replace_requested = True
            silence = now - self._last_received
            self._events.append(ReplaceConnection(f"nothing received for {silence:.1f} s"))

    # --- how runs end ------------------------------------------------------------------

    def _running(self, request_id: str, event: "CallEvent") -> "ToolCall | None":
        """The call whose run ended, or None (and it forgotten) when it ended late."""
        call = self._calls.get(request_id)
        if call is None:
            raise LocalProtocolError(f"no run for request {request_id!r} is in progress")
        if call.state is CallState.RUNNING:
            return call
        call.step(event)  # late: already answered or cancelled
        del self._calls[request_id]
        return None

    def tool_returned(self, request_id: str, value: object) -> None:
        """The run returned `value`: serialize it (C5) and send the result."""
        call = self._running(request_id, CallEvent.RETURN)
        if call is None:
            return
        tool = self.registry.get(call.tool_name)
        output_json, error = returned_outcome(tool, call.tool_name, value, self.max_result_bytes)
        if error is not None:
            self._end_run(call, CallEvent.RETURN_UNUSABLE, error_result(request_id, *error))
        else:
            self._end_run(call, CallEvent.RETURN, result_text(request_id, str(output_json)))

    def tool_raised(self, request_id: str, exc: BaseException) -> None:
        """The run raised: C6 (`tool_error`; ToolError carries its own data)."""
        call = self._running(request_id, CallEvent.RAISE)
        if call is None:
            return
        message, data = raised_error(exc)
        self._end_run(call, CallEvent.RAISE, error_result(request_id, "tool_error", message, data))

    def tool_cancelled(self, request_id: str) -> None:
        """The run ended by cancellation (after CancelTool, or on its own)."""
        call = self._running(request_id, CallEvent.RUN_CANCELLED)
        if call is None:
            return
        data = {"exception": "CancelledError"}
        result = error_result(request_id, "tool_error", "the tool was cancelled", data)
        self._end_run(call, CallEvent.RUN_CANCELLED, result)

    def report_progress(
        self,
        request_id: str,
        progress: float,
        total: "float | None" = None,
        message: "str | None" = None,
    ) -> None:
        """Queue a progress frame (C10): only while running, only strictly increasing."""
        call = self._calls.get(request_id)
        if call is None or call.state is not CallState.RUNNING:
            log("debug", f"progress for {request_id!r} dropped: no longer running")
            return
        if not _is_number(progress) or (total is not None and not _is_number(total)):
            raise ValueError("progress and total must be finite numbers")
        if call.last_progress is not None and progress <= call.last_progress:
            raise ValueError(
                f"progress must increase strictly: {progress} after {call.last_progress}"
            )
        call.last_progress = progress
        if self.connected:
            frame: dict[str, Any] = {
                "type": "cf_agent_client_tool_progress",
                "requestId": request_id,
                "progress": float(progress),
            }
            if total is not None:
                frame["total"] = float(total)
            if message is not None:
                frame["message"] = message
            self._to_send.append(dumps(frame))

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

    # --- results -----------------------------------------------------------------------

    def _end_run(self, call: ToolCall, event: "CallEvent", result: str) -> None:
        del self._calls[call.request_id]
        self._finish(call, event, result)

    def _finish(self, call: ToolCall, event: "CallEvent", result: str) -> None:
        call.step(event)
        self._store_result(call.request_id, result)

    def _store_result(self, request_id: str, result: str) -> None:
        self._results.put_within(request_id, result, self.completed_cache_size)
        self._put_in_outbox(request_id, result)

    def _put_in_outbox(self, request_id: str, result: str) -> None:
        dropped = self._outbox.put_within(request_id, result, self.completed_cache_size)
        # One line per burst, none per drop: a console flood (or only formatting a
        # line per result) halves pipelined throughput in the browser.
        if dropped is not None and not self._outbox_overflowing:
            self._outbox_overflowing = True
            log(
                "warn",
                f"outbox full ({self.completed_cache_size} unacknowledged results): dropping "
                f"the oldest, starting with {dropped!r}, until acks make room",
            )
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
        # The same text as json.dumps of {"version": ..., "results": [entries]}, but each
        # entry is encoded once, not on every write of a long outbox (pipelined invokes).
        old, cache = self._export_cache, {}
        for rid, text in self._outbox.items():
            cached = old.get(rid)
            if cached is None or cached[0] is not text:
                entry = '{"requestId": ' + json.dumps(rid) + ', "frame": ' + json.dumps(text) + "}"
                cached = (text, entry)
            cache[rid] = cached
        self._export_cache = cache
        entries = ", ".join(entry for _, entry in cache.values())
        return '{"version": ' + str(OUTBOX_FORMAT_VERSION) + ', "results": [' + entries + "]}"

    def restore_outbox(self, text: str) -> int:
        """Load what export_outbox produced; bad entries are logged and skipped. Returns a count."""
        try:
            stored = loads(text)
            entries = stored.get("results") if stored.get("version") == OUTBOX_FORMAT_VERSION else 0
            if not isinstance(entries, list):
                raise ValueError("no list of results in a known format version")
        except Exception as exc:  # bad JSON, not an object, ...: the whole store is unusable
            log("warn", f"stored outbox ignored: {exc}")
            return 0
        restored = 0
        for entry in entries:
            try:
                request_id, frame_text = entry["requestId"], entry["frame"]
                problem = _stored_result_problem(request_id, frame_text)
            except Exception as exc:
                problem = str(exc) or type(exc).__name__
            if problem is not None:
                log("warn", f"stored result ignored: {problem}")
                continue
            if request_id not in self._results:
                self._results.put(request_id, frame_text)
                self._put_in_outbox(request_id, frame_text)
                restored += 1
        return restored


def _check_invoke(raw: "dict[str, Any]") -> "NoReturn":
    """Raise FrameRefused with what is wrong in an invoke (the hot path found something)."""
    _field(raw, "requestId", _is_request_id, _REQUEST_ID)
    _field(raw, "toolCallId", _is_str, "a valid string")
    _field(raw, "toolName", _is_str, "a valid string")
    _field(raw, "input", lambda v: isinstance(v, dict), "a valid dictionary")
    _optional(raw, "timeoutMs", lambda v: _is_int(v) and v >= 0, "an integer >= 0")
    attempt = raw.get("attempt", 1)
    if not (_is_int(attempt) and attempt >= 1):
        raise FrameRefused("attempt: Input should be an integer >= 1")
    raise FrameRefused("a field of an unexpected type")  # e.g. a str subclass: refused too


# Frame type -> handler; a type not here is a chat frame (chat_frame) or unknown (logged).
_HANDLERS: "dict[str, Callable[[Session, dict[str, Any], float], None]]" = {
    "cf_agent_client_tool_invoke": Session._receive_invoke,
    "cf_agent_client_tool_cancel": Session._receive_cancel,
    "cf_agent_client_tool_result_ack": Session._receive_result_ack,
    "cf_agent_ping": Session._receive_ping,
    "cf_agent_client_tools_ack": Session._receive_tools_ack,
    "cf_agent_protocol_error": Session._receive_protocol_error,
}
