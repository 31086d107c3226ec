"""The MicroPython flavour of the client: `<script type="mpy">` pages whose tools are ready at once.

Why this is a module of its own: the Pyodide client (protocol.py, tools.py,
session.py, client.py, browser.py) is built on pydantic models, schemas made
from annotations, `typing`, `dataclasses`, `enum` and CPython's asyncio
(`call_at`, `add_done_callback`, futures), none of which MicroPython 1.27 has
(it keeps no annotations or docstrings either). This module is the same client
rules, C1-C13, over plain dicts, on MicroPython's asyncio and `js`. Everything
that runs on both is imported, not copied: rules.py (limits, codes, the call
lifecycle table, backoff, messages), context.py (ToolContext, ToolError) and
input_schema.py (the input validator with pydantic's messages). The chat
client (C14) stays Pyodide-only.

    from clienttools.mpy import ToolClient, ToolError

    client = ToolClient("ws://127.0.0.1:8000/agents/chat/demo")

    @client.tool(
        description="Add two integers.",
        schema={"type": "object", "properties": {"a": {"type": "integer"},
                "b": {"type": "integer"}}, "required": ["a", "b"]},
    )
    def add(a, b):
        return a + b

    @client.tool(schema={"type": "object", "properties": {"steps": {"type": "integer"}}},
                 context=True, timeout=30)
    async def count_up(steps, ctx):
        for step in range(1, steps + 1):
            await ctx.progress(step, total=steps)
        return steps

    await client.connect()   # returns once the server acknowledged the tools

How it differs from `ToolClient` of the Pyodide flavour: a tool declares its
input schema (`schema=`, validated before the tool runs, strictly: nothing is
coerced) and optionally `output_schema=`; `description=` replaces the docstring;
`context=True` passes the ToolContext as the keyword argument `ctx` (MicroPython
cannot inspect a signature). An `async def` tool runs as a task and can be
cancelled; a sync tool runs inline. A generator function counts as async
(MicroPython cannot tell the two apart), so tools must not be generators.

What MicroPython 1.27 (PyScript build) lacks, found by running it, and what this
code does instead: no `typing`, `__future__`, `dataclasses`, `enum`, `uuid`
(plain classes, tuples, `crypto.randomUUID()`); no docstrings or annotations kept
(declared schemas and descriptions); `[*a, b]` and `{**d}` do not parse
(concatenation); `re` has no `{m,n}` (rules.is_tool_name); plain dicts keep no
order and OrderedDict scans linearly (`_Recent`); no builtin `TimeoutError`; bool
is not an int; `json.dumps` writes NaN as `nan` and has no `allow_nan`
(context.json_problem); asyncio tasks have no done callbacks (each run reports its
own end) and `asyncio.wait_for` fails under the page's top-level await (a
`setTimeout` instead).

`Session` is the sans-I/O core (frames and the time in; frames and events out)
and runs on CPython too (tests/unit/test_mpy_session.py); `ToolClient` is the
adapter on `js.WebSocket`, `setTimeout` and `sessionStorage`.
"""

import asyncio
import json
from collections import OrderedDict

from clienttools.context import ToolContext, ToolError, json_problem
from clienttools.input_schema import compile_schema, is_number
from clienttools.rules import (
    ACK_OUTCOMES,
    CANCEL_REASONS,
    CLOSE_CODE_SILENT,
    COMPLETED_CACHE_SIZE,
    DEFAULT_PING_INTERVAL,
    LIVENESS_FACTOR,
    MAX_ERROR_MESSAGE_CHARS,
    MAX_FRAME_BYTES,
    MAX_REQUEST_ID_CHARS,
    MAX_RESULT_BYTES,
    OUTBOX_FORMAT_VERSION,
    PROTOCOL_VERSION,
    TOOL_NAME_PATTERN,
    CallEvent,
    CallState,
    backoff,
    cut_message,
    drop_missing_inputs,
    effective_timeout,
    invalid_input_message,
    is_tool_name,
    next_call_state,
    timeout_message,
    too_large_message,
    unknown_tool_message,
)

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (MicroPython has none)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

__all__ = [
    "ConnectError",
    "ConnectionFailed",
    "RegistrationTimeout",
    "Session",
    "Tool",
    "ToolClient",
    "ToolContext",
    "ToolError",
    "ToolsRejected",
]

_EMPTY_SCHEMA = {"type": "object", "properties": {}}
#: Chat frames (C14) have no client here; they are dropped without a warning.
_CHAT_TYPES = ("start", "chunk", "end", "error", "no-active", "cf_agent_chat_messages")
_OPEN = 1


def _log(level: str, message: str) -> None:
    # MicroPython's logging is a stub without handlers; the console is where a page logs.
    try:
        import js

        getattr(js.console, level)("clienttools: " + message)
    except ImportError:  # CPython (the unit tests)
        pass


def _dumps(value: object) -> str:
    return json.dumps(value, separators=(",", ":"))


def _utf8_size(text: str) -> int:
    return len(text.encode("utf-8"))


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# --- tools ---------------------------------------------------------------------------------


class Tool:
    """One registered tool: the function, its wire spec, how to call it."""

    def __init__(
        self,
        function: "Callable[..., Any]",
        *,
        name: "str | None" = None,
        description: str = "",
        schema: "dict[str, Any] | None" = None,
        output_schema: "dict[str, Any] | None" = None,
        timeout: "float | None" = None,
        needs_approval: bool = False,
        context: bool = False,
        read_only: bool = False,
    ) -> None:
        name = name or str(getattr(function, "__name__", ""))
        if not is_tool_name(name):
            raise ValueError(f"tool name {name!r} must match {TOOL_NAME_PATTERN}")
        schema = _EMPTY_SCHEMA if schema is None else schema
        if not isinstance(schema, dict) or schema.get("type") != "object":
            raise TypeError(f'the schema of tool {name!r} must be a dict with "type": "object"')
        if output_schema is not None and not isinstance(output_schema, dict):
            raise TypeError(f"the output_schema of tool {name!r} must be a dict")
        if timeout is not None and not (is_number(timeout) and timeout > 0):
            raise ValueError(f"the timeout of tool {name!r} must be a positive number")
        problem = json_problem(schema) or json_problem(output_schema)
        if problem is not None:
            raise TypeError(f"the schemas of tool {name!r} must be JSON: {problem}")
        self.function = function
        # Compiled once: an invoke runs the checker, it does not walk the schema.
        self.check_input = compile_schema(schema)
        self.check_output = None if output_schema is None else compile_schema(output_schema)
        self.name = name
        self.description = description
        self.schema = schema
        self.output_schema = output_schema
        self.timeout = timeout
        self.needs_approval = needs_approval
        self.context = context
        self.read_only = read_only  # WebMCP's readOnlyHint (webmcp.py), not in the wire spec

    def spec(self) -> "dict[str, Any]":
        """The ToolSpec of the tools frame."""
        spec: dict[str, Any] = {
            "name": self.name,
            "description": self.description,
            "inputSchema": self.schema,
        }
        if self.output_schema is not None:
            spec["outputSchema"] = self.output_schema
        if self.needs_approval:
            spec["needsApproval"] = True
        if self.timeout is not None:
            spec["timeoutMs"] = max(1, int(self.timeout * 1000))
        return spec

    def call(self, arguments: "dict[str, Any]", context: "ToolContext | None") -> "Any":
        """Call the function; an async tool returns its coroutine, not yet started."""
        if self.context:
            return self.function(ctx=context, **arguments)
        return self.function(**arguments)

    def __repr__(self) -> str:
        return f"<Tool {self.name!r}>"


class _Bad(Exception):
    """A frame field that is missing or of the wrong type."""


def _field(raw: "dict[str, Any]", key: str, check: "Callable[[Any], bool]", what: str) -> "Any":
    if key not in raw:
        raise _Bad(f"{key}: Field required")
    value = raw[key]
    if not check(value):
        raise _Bad(f"{key}: Input should be {what}")
    return value


def _optional(raw: "dict[str, Any]", key: str, check: "Callable[[Any], bool]", what: str) -> "Any":
    if raw.get(key) is None:
        return None
    return _field(raw, key, check, what)


def _is_request_id(value: object) -> bool:
    return isinstance(value, str) and 0 < len(value) <= MAX_REQUEST_ID_CHARS


def _describe_js(value: object) -> "str | None":
    """`a JsProxy of a JavaScript HTMLBodyElement`, as the Pyodide flavour says it; else None."""
    if type(value).__name__ != "JsProxy":
        return None
    try:
        return f"a JsProxy of a JavaScript {value.constructor.name}"  # type: ignore[attr-defined]
    except Exception:
        return "a JsProxy"


def _where(error: "dict[str, Any]") -> str:
    place = ".".join(str(p) for p in error["loc"]) or "output"
    return place + ": " + str(error["msg"])


def _error_result(request_id: str, code: str, message: str, data: object = None) -> str:
    error: dict[str, Any] = {"code": code, "message": cut_message(message)}
    if data is not None and json_problem(data) is None:
        error["data"] = data
    text = _dumps({"type": "cf_agent_client_tool_result", "requestId": request_id, "error": error})
    if len(text) > MAX_RESULT_BYTES // 4 and _utf8_size(text) > MAX_RESULT_BYTES:
        error.pop("data", None)
        error["message"] = error["message"] + " (error data too large)"
        text = _dumps(
            {"type": "cf_agent_client_tool_result", "requestId": request_id, "error": error}
        )
    return text


# --- how a call ends: shared by the session and by calls through document.modelContext -----


def input_error(tool: "Tool", arguments: object) -> "tuple[str, str, Any] | None":
    """C2: None when `arguments` pass the tool's schema, else (code, message, data)."""
    errors = tool.check_input(arguments)
    if not errors:
        return None
    drop_missing_inputs(errors)
    return "invalid_input", invalid_input_message(tool.name, errors), errors


def returned_outcome(
    tool: "Tool | None", name: str, value: object, max_result_bytes: int
) -> "tuple[str | None, tuple[str, str, Any] | None]":
    """C5: (the value's JSON text, None), or (None, (code, message, data)) when unusable."""
    problem = json_problem(value)
    if problem is None and tool is not None and tool.check_output is not None:
        errors = tool.check_output(value)
        if errors:
            where = "; ".join(_where(e) for e in errors[:3])
            problem = f"a value that does not match its output schema: {where}"
    if problem is not None:
        js_value = _describe_js(value)
        if js_value is not None:
            detail = (
                f"tool {name!r} returned {js_value}, which cannot be serialized to JSON; "
                "copy out the fields you need"
            )
        else:
            detail = f"tool {name!r} returned {problem}"
        return None, (
            "invalid_output",
            f"the return value of {name!r} is not usable: {detail}",
            None,
        )
    output = _dumps(value)
    size = len(output)  # characters: a lower bound of the UTF-8 size
    if size * 4 > max_result_bytes:  # else even 4 bytes a character fit
        size = _utf8_size(output)
    if size > max_result_bytes:
        return None, ("output_too_large", too_large_message(size, max_result_bytes), {"size": size})
    return output, None


def raised_error(exc: BaseException) -> "tuple[str, Any]":
    """C6: the `tool_error` message and data of an exception; a ToolError brings its own."""
    if isinstance(exc, ToolError):
        return exc.message, exc.data
    return str(exc) or type(exc).__name__, {"exception": type(exc).__name__}


# --- the sans-I/O core ---------------------------------------------------------------------


class _Call:
    """One invoke from arrival until its run has ended."""

    __slots__ = (
        "attempt",
        "deadline",
        "request_id",
        "state",
        "tool_call_id",
        "tool_name",
    )

    def __init__(self, request_id: str, tool_call_id: str, attempt: int) -> None:
        self.request_id = request_id
        self.tool_call_id = tool_call_id
        self.attempt = attempt
        self.state = CallState.RECEIVED
        self.deadline: float | None = None
        self.tool_name = ""

    def step(self, event: "CallEvent") -> "CallState":
        self.state = next_call_state(self.state, event)
        return self.state


class _Recent:
    """requestId -> result text, oldest first, with O(1) lookups on MicroPython too.

    MicroPython's plain dicts keep no order, and its OrderedDict is a linear array
    (a lookup scans it): with C7's 1,000 remembered results that made every invoke
    cost milliseconds. So: a dict for lookups and a list of (seq, key) for the order;
    an entry moved to the end is appended again, and stale list entries are skipped
    and compacted away.
    """

    def __init__(self) -> None:
        self._items: dict[str, tuple[int, str]] = {}
        self._order: list[tuple[int, str]] = []
        self._head = 0
        self._seq = 0

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: str) -> bool:
        return key in self._items

    def get(self, key: str) -> "str | None":
        entry = self._items.get(key)
        return None if entry is None else entry[1]

    def put(self, key: str, value: str) -> None:
        """Insert, or replace and move to the end."""
        self._seq += 1
        self._items[key] = (self._seq, value)
        self._order.append((self._seq, key))
        self._compact()

    def pop(self, key: str) -> "str | None":
        entry = self._items.pop(key, None)
        if entry is None:
            return None
        self._compact()
        return entry[1]

    def pop_oldest(self) -> str:
        while True:
            seq, key = self._order[self._head]
            self._head += 1
            entry = self._items.get(key)
            if entry is not None and entry[0] == seq:
                del self._items[key]
                return key

    def items(self) -> "list[tuple[str, str]]":
        live = []
        for seq, key in self._order[self._head :]:
            entry = self._items.get(key)
            if entry is not None and entry[0] == seq:
                live.append((key, entry[1]))
        return live

    def _compact(self) -> None:
        if len(self._order) - self._head > 2 * len(self._items) + 64:
            self._order = [(self._items[key][0], key) for key, _ in self.items()]
            self._head = 0


class Session:
    """C1-C13 for one page, as session.Session does them, over plain dicts.

    Inputs: connection_opened/connection_lost, receive_frame, tick, tool_returned/
    tool_raised/tool_cancelled, report_progress, registry_changed, shutdown.
    Outputs: frames_to_send(), events() (tuples: ("run", request_id, tool, arguments,
    attempt, tool_call_id), ("cancel", request_id, reason), ("acked", accepted,
    rejected), ("replace", reason)), next_deadline(), export_outbox().
    """

    def __init__(
        self,
        tools: "dict[str, Tool]",
        *,
        client_id: str,
        ping_interval: float = DEFAULT_PING_INTERVAL,
        max_result_bytes: int = MAX_RESULT_BYTES,
        max_frame_bytes: int = MAX_FRAME_BYTES,
        completed_cache_size: int = COMPLETED_CACHE_SIZE,
    ) -> None:
        if ping_interval <= 0:
            raise ValueError("ping_interval must be positive")
        self.tools = tools
        self.client_id = client_id
        self.ping_interval = ping_interval
        self.max_result_bytes = max_result_bytes
        self.max_frame_bytes = max_frame_bytes
        self.completed_cache_size = completed_cache_size
        self.connected = False
        self.outbox_revision = 0
        self.outbox_added = 0  # results put in the outbox, ever: a write is due when it moves
        self._last_received = 0.0
        self._replace_requested = False
        self._calls: dict[str, _Call] = {}
        self._results = _Recent()  # C7's memory of completed requests
        self._outbox = _Recent()  # results until cf_agent_client_tool_result_ack (C11)
        self._outbox_overflowing = False
        self._to_send: list[str] = []
        self._events: list[tuple[Any, ...]] = []

    # --- outputs -------------------------------------------------------------------------

    def frames_to_send(self) -> "list[str]":
        frames, self._to_send = self._to_send, []
        return frames

    def events(self) -> "list[tuple[Any, ...]]":
        events, self._events = self._events, []
        return events

    def next_deadline(self) -> "float | None":
        if not self._calls:  # the common case between invokes: only the liveness limit
            if self.connected and not self._replace_requested:
                return self._last_received + LIVENESS_FACTOR * self.ping_interval
            return None
        deadlines = [c.deadline for c in self._calls.values() if c.deadline is not None]
        if self.connected and not self._replace_requested:
            deadlines.append(self._last_received + LIVENESS_FACTOR * self.ping_interval)
        return min(deadlines) if deadlines else None

    def outbox(self) -> "dict[str, str]":
        """Unacknowledged results: requestId -> result frame text (a copy, oldest first)."""
        return OrderedDict(self._outbox.items())

    def call_state(self, request_id: str) -> "CallState | None":
        call = self._calls.get(request_id)
        return call.state if call else None

    # --- connection ----------------------------------------------------------------------

    def connection_opened(self, now: float) -> None:
        """C1: the tools frame first; then every unacknowledged result (C11)."""
        self.connected = True
        self._replace_requested = False
        self._last_received = now
        self._to_send = [self._tools_frame()]
        self._to_send.extend(text for _, text in self._outbox.items())

    def connection_lost(self, now: float) -> None:
        self.connected = False
        self._to_send = []

    def registry_changed(self) -> None:
        if self.connected:
            self._to_send.append(self._tools_frame())

    def _tools_frame(self) -> str:
        return _dumps(
            {
                "type": "cf_agent_client_tools",
                "protocol": PROTOCOL_VERSION,
                "clientId": self.client_id,
                "tools": [tool.spec() for tool in self.tools.values()],
            }
        )

    # --- frames in (C13: nothing raises) -------------------------------------------------

    def receive_frame(self, data: object, now: float) -> None:
        self._last_received = now
        if not isinstance(data, str):
            _log("warn", "ignored a binary frame: the protocol is JSON text")
            return
        if len(data) * 4 > self.max_frame_bytes and _utf8_size(data) > self.max_frame_bytes:
            _log("warn", f"ignored a frame over the {self.max_frame_bytes}-byte limit")
            return
        try:
            raw = json.loads(data)
        except Exception as exc:  # ValueError; MicroPython may raise others on odd input
            _log("warn", f"ignored a frame that is not valid JSON: {exc}")
            return
        if not isinstance(raw, dict):
            _log("warn", f"ignored a frame that is not a JSON object ({type(raw).__name__})")
            return
        request_id = raw.get("requestId")
        request_id = request_id if isinstance(request_id, str) and request_id else None
        kind = raw.get("type")
        if not isinstance(kind, str):
            _log("warn", "ignored a frame with no string 'type'")
            return
        handler = _HANDLERS.get(kind)
        if handler is None:
            if kind not in _CHAT_TYPES:
                _log("warn", f"ignored a frame of unknown type {kind[:64]!r}")
            return
        try:
            handler(self, raw, now)
        except _Bad as exc:
            message = f"invalid {kind!r} frame: {exc}"
            _log("warn", f"ignored a frame from the server: {message[:500]}")
            if kind == "cf_agent_client_tool_invoke" and request_id is not None:
                self._refuse_invoke(request_id, message)

    def _refuse_invoke(self, request_id: str, message: str) -> None:
        if len(request_id) > MAX_REQUEST_ID_CHARS:
            _log("warn", "cannot answer the malformed invoke: its requestId is too long")
            return
        if request_id in self._calls or request_id in self._results:
            return  # C7 wins: that request already has a run or a result
        call = _Call(request_id, "", 1)
        self._finish(call, CallEvent.REJECT, _error_result(request_id, "invalid_request", message))

    def _receive_invoke(self, raw: "dict[str, Any]", now: float) -> None:
        request_id = _field(raw, "requestId", _is_request_id, "a string of 1 to 256 characters")
        tool_call_id = _field(raw, "toolCallId", lambda v: isinstance(v, str), "a valid string")
        tool_name = _field(raw, "toolName", lambda v: isinstance(v, str), "a valid string")
        arguments = _field(raw, "input", lambda v: isinstance(v, dict), "a valid dictionary")
        timeout_ms = _optional(raw, "timeoutMs", lambda v: _is_int(v) and v >= 0, "an integer >= 0")
        attempt = raw.get("attempt", 1)
        if not (_is_int(attempt) and attempt >= 1):
            raise _Bad("attempt: Input should be an integer >= 1")
        stored = self._results.get(request_id) or self._outbox.get(request_id)
        if stored is not None:
            # C7: answered before; the same result again, without running the tool.
            if request_id in self._results:
                self._results.put(request_id, stored)
            self._put_in_outbox(request_id, stored)
            return
        if request_id in self._calls:
            return  # C7: running; a re-delivery is ignored
        call = _Call(request_id, tool_call_id, attempt)
        call.tool_name = tool_name
        tool = self.tools.get(tool_name)
        if tool is None:
            result = _error_result(request_id, "unknown_tool", unknown_tool_message(tool_name))
            self._finish(call, CallEvent.REJECT, result)
            return
        error = input_error(tool, arguments)
        if error is not None:
            self._finish(call, CallEvent.REJECT, _error_result(request_id, *error))
            return
        call.step(CallEvent.ACCEPT)
        timeout = effective_timeout(timeout_ms, tool.timeout)
        call.deadline = None if timeout is None else now + timeout
        self._calls[request_id] = call
        self._events.append(("run", request_id, tool, arguments, attempt, tool_call_id))

    def _receive_cancel(self, raw: "dict[str, Any]", now: float) -> None:
        request_id = _field(raw, "requestId", _is_request_id, "a string of 1 to 256 characters")
        reason = _field(raw, "reason", lambda v: v in CANCEL_REASONS, " or ".join(CANCEL_REASONS))
        call = self._calls.get(request_id)
        if call is None:
            return  # C8: unknown or finished
        before = call.state
        if call.step(CallEvent.CANCEL) is CallState.CANCELLED and before is CallState.RUNNING:
            call.deadline = None
            self._events.append(("cancel", request_id, reason))

    def _receive_result_ack(self, raw: "dict[str, Any]", now: float) -> None:
        request_id = _field(raw, "requestId", _is_request_id, "a string of 1 to 256 characters")
        outcome = _field(raw, "outcome", lambda v: v in ACK_OUTCOMES, " or ".join(ACK_OUTCOMES))
        message = _optional(raw, "message", lambda v: isinstance(v, str), "a valid string")
        if outcome in ("stale", "invalid"):
            detail = f": {message[:500]}" if message else ""
            _log("warn", f"server refused the result of {request_id!r} ({outcome}){detail}")
        if self._outbox.pop(request_id) is not None:
            self.outbox_revision += 1
            if len(self._outbox) < self.completed_cache_size:
                self._outbox_overflowing = False

    def _receive_ping(self, raw: "dict[str, Any]", now: float) -> None:
        t = _field(raw, "t", is_number, "a valid number")
        if self.connected:
            self._to_send.append(_dumps({"type": "cf_agent_pong", "t": float(t)}))

    def _receive_tools_ack(self, raw: "dict[str, Any]", now: float) -> None:
        accepted = _field(
            raw,
            "accepted",
            lambda v: isinstance(v, list) and all(isinstance(n, str) for n in v),
            "a list of strings",
        )
        rejected = raw.get("rejected", [])
        if not isinstance(rejected, list) or not all(
            isinstance(r, dict)
            and isinstance(r.get("name"), str)
            and isinstance(r.get("reason"), str)
            for r in rejected
        ):
            raise _Bad("rejected: Input should be a list of {name, reason}")
        pairs = tuple((r["name"], r["reason"]) for r in rejected)
        self._events.append(("acked", tuple(accepted), pairs))

    def _receive_protocol_error(self, raw: "dict[str, Any]", now: float) -> None:
        message = _field(raw, "message", lambda v: isinstance(v, str), "a valid string")
        request_id = raw.get("requestId")
        where = f" for request {request_id!r}" if isinstance(request_id, str) else ""
        _log(
            "warn", f"server reported a protocol error{where}: {message[:MAX_ERROR_MESSAGE_CHARS]}"
        )

    # --- the clock -----------------------------------------------------------------------

    def tick(self, now: float) -> None:
        """C9 (call deadlines) and C12 (liveness)."""
        for call in list(self._calls.values()):
            if call.deadline is not None and now >= call.deadline:
                call.step(CallEvent.EXPIRE)
                call.deadline = None
                self._events.append(("cancel", call.request_id, "timeout"))
                message = timeout_message(call.tool_name)
                self._store_result(
                    call.request_id, _error_result(call.request_id, "timeout", message)
                )
        limit = self._last_received + LIVENESS_FACTOR * self.ping_interval
        if self.connected and not self._replace_requested and now >= limit:
            self._replace_requested = True
            silence = now - self._last_received
            self._events.append(("replace", f"nothing received for {silence:.1f} s"))

    # --- how runs end --------------------------------------------------------------------

    def _late(self, request_id: str, event: "CallEvent") -> bool:
        """True (and the call forgotten) when the run ended after a cancel or a timeout."""
        call = self._calls.get(request_id)
        if call is None:
            raise ValueError(f"no run for request {request_id!r} is in progress")
        if call.state is CallState.RUNNING:
            return False
        call.step(event)
        del self._calls[request_id]
        return True

    def tool_returned(self, request_id: str, value: object) -> None:
        """C5: the value as JSON, checked against the output schema, within the size limit."""
        if self._late(request_id, CallEvent.RETURN):
            return
        call = self._calls[request_id]
        output, error = returned_outcome(
            self.tools.get(call.tool_name), call.tool_name, value, self.max_result_bytes
        )
        if error is not None:
            self._end_run(call, CallEvent.RETURN_UNUSABLE, _error_result(request_id, *error))
            return
        text = (
            '{"type":"cf_agent_client_tool_result","requestId":'
            + _dumps(request_id)
            + ',"output":'
            + str(output)
            + "}"
        )
        self._end_run(call, CallEvent.RETURN, text)

    def tool_raised(self, request_id: str, exc: BaseException) -> None:
        """C6: `tool_error`; a ToolError carries its own message and data."""
        if self._late(request_id, CallEvent.RAISE):
            return
        call = self._calls[request_id]
        message, data = raised_error(exc)
        self._end_run(call, CallEvent.RAISE, _error_result(request_id, "tool_error", message, data))

    def tool_cancelled(self, request_id: str) -> None:
        if self._late(request_id, CallEvent.RUN_CANCELLED):
            return
        call = self._calls[request_id]
        result = _error_result(
            request_id, "tool_error", "the tool was cancelled", {"exception": "CancelledError"}
        )
        self._end_run(call, CallEvent.RUN_CANCELLED, result)

    def report_progress(
        self,
        request_id: str,
        progress: float,
        total: "float | None" = None,
        message: "str | None" = None,
    ) -> None:
        """C10: only while running (ToolContext checked that it increases)."""
        call = self._calls.get(request_id)
        if call is None or call.state is not CallState.RUNNING:
            return
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
            self._to_send.append(_dumps(frame))

    def shutdown(self) -> None:
        """The app closes the client: cancel every run, no result (the server re-delivers)."""
        for call in self._calls.values():
            if call.state is CallState.RUNNING:
                call.step(CallEvent.CANCEL)
                call.deadline = None
                self._events.append(("cancel", call.request_id, "shutdown"))

    # --- results -------------------------------------------------------------------------

    def _end_run(self, call: "_Call", event: "CallEvent", result: str) -> None:
        del self._calls[call.request_id]
        self._finish(call, event, result)

    def _finish(self, call: "_Call", event: "CallEvent", result: str) -> None:
        call.step(event)
        self._store_result(call.request_id, result)

    def _store_result(self, request_id: str, result: str) -> None:
        self._results.put(request_id, result)
        while len(self._results) > self.completed_cache_size:
            self._results.pop_oldest()
        self._put_in_outbox(request_id, result)

    def _put_in_outbox(self, request_id: str, result: str) -> None:
        self._outbox.put(request_id, result)
        while len(self._outbox) > self.completed_cache_size:
            dropped = self._outbox.pop_oldest()
            if not self._outbox_overflowing:  # one console line per burst, not one per drop
                self._outbox_overflowing = True
                _log(
                    "warn",
                    f"outbox full ({self.completed_cache_size} unacknowledged results): dropping "
                    f"the oldest, starting with {dropped!r}, until acks make room",
                )
        self.outbox_revision += 1
        self.outbox_added += 1
        if self.connected:
            self._to_send.append(result)

    # --- persistence (the Pyodide flavour's format) --------------------------------------

    def export_outbox(self) -> str:
        entries = [{"requestId": rid, "frame": text} for rid, text in self._outbox.items()]
        return _dumps({"version": OUTBOX_FORMAT_VERSION, "results": entries})

    def restore_outbox(self, text: str) -> int:
        try:
            stored = json.loads(text)
            entries = (
                stored.get("results") if stored.get("version") == OUTBOX_FORMAT_VERSION else None
            )
            if not isinstance(entries, list):
                raise ValueError("no list of results in a known format version")
        except Exception as exc:
            _log("warn", f"stored outbox ignored: {exc}")
            return 0
        restored = 0
        for entry in entries:
            try:
                request_id, frame_text = entry["requestId"], entry["frame"]
                frame = json.loads(frame_text)
                if frame.get("type") != "cf_agent_client_tool_result":
                    raise ValueError("not a result frame")
                if frame.get("requestId") != request_id or not _is_request_id(request_id):
                    raise ValueError("requestId does not match the frame")
            except Exception as exc:
                _log("warn", f"stored result ignored: {exc}")
                continue
            if request_id not in self._results:
                self._results.put(request_id, frame_text)
                self._put_in_outbox(request_id, frame_text)
                restored += 1
        return restored


# Frame type -> handler; a type not here is a chat frame (dropped) or unknown (logged).
_HANDLERS: "dict[str, Callable[[Session, dict[str, Any], float], None]]" = {
    "cf_agent_client_tool_invoke": Session._receive_invoke,
    "cf_agent_client_tool_cancel": Session._receive_cancel,
    "cf_agent_client_tool_result_ack": Session._receive_result_ack,
    "cf_agent_ping": Session._receive_ping,
    "cf_agent_client_tools_ack": Session._receive_tools_ack,
    "cf_agent_protocol_error": Session._receive_protocol_error,
}


# --- errors of connect() (transport.py's, which needs pydantic and urllib) ------------------


class ConnectError(Exception):
    """connect() failed; `reason` says why in plain words."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"cannot connect to {url.split('?')[0]}: {reason}")
        self.url = url.split("?")[0]
        self.reason = reason


class ConnectionFailed(ConnectError):
    """The WebSocket did not open: refused, unreachable within the timeout."""


class RegistrationTimeout(ConnectError):
    """The WebSocket opened, but the server did not acknowledge the tools in time."""


class ToolsRejected(ConnectError):
    """The server acknowledged the tools frame but refused some tools."""

    def __init__(self, url: str, rejected: "tuple[tuple[str, str], ...]") -> None:
        reasons = "; ".join(f"{name!r}: {reason}" for name, reason in rejected)
        super().__init__(url, f"the server rejected tools: {reasons}")
        self.rejected = rejected


# --- the browser adapter -------------------------------------------------------------------


def _worker_storage(js: "Any") -> "Any":
    # Imported only in a worker: a page's main thread never loads the module.
    from clienttools.worker import outbox_storage

    return outbox_storage(js)


class _Connection:
    """One js.WebSocket, its handlers, and what happened to it."""

    def __init__(self, ws: "Any") -> None:
        self.ws = ws
        self.proxies: list[Any] = []
        self.opened = asyncio.Event()
        self.registered = asyncio.Event()
        self.ended = asyncio.Event()
        self.outcome: tuple[Any, ...] | str | None = None
        self.close_code: int | None = None
        self.over = False


class ToolClient:
    """Hosts MicroPython tools for a server-side agent over one WebSocket (protocol v1).

    Arguments as the Pyodide flavour's ToolClient: url, token, connect_timeout,
    ping_interval, reconnect, client_id, max_result_bytes; `storage` is where the
    outbox waits across reloads (default `sessionStorage`, in a PyScript worker the
    page's through PyScript's proxy: clienttools.worker; anything with
    getItem/setItem); `webmcp` and `webmcp_approval` as there too: the tools on
    `document.modelContext` as well (webmcp.py), and with no `url`, there only.
    """

    def __init__(
        self,
        url: "str | None" = None,
        *,
        token: "str | None" = None,
        connect_timeout: float = 10.0,
        ping_interval: float = DEFAULT_PING_INTERVAL,
        reconnect: bool = True,
        client_id: "str | None" = None,
        max_result_bytes: int = MAX_RESULT_BYTES,
        storage: "Any" = None,
        webmcp: bool = False,
        webmcp_approval: bool = False,
    ) -> None:
        import js

        if connect_timeout <= 0:
            raise ValueError("connect_timeout must be positive")
        if url is None and not webmcp:
            raise ValueError("a ToolClient needs the server's url (or webmcp=True, and no server)")
        url = url or ""
        self._js = js
        self.url = url
        sep = "&" if "?" in url else "?"
        self._open_url = url if token is None else f"{url}{sep}token={js.encodeURIComponent(token)}"
        self.connect_timeout = connect_timeout
        self.reconnect = reconnect
        self.client_id = client_id or str(js.crypto.randomUUID()).replace("-", "")
        self._tools: dict[str, Tool] = OrderedDict()  # the tools frame lists them in order
        self.session = Session(
            self._tools,
            client_id=self.client_id,
            ping_interval=ping_interval,
            max_result_bytes=max_result_bytes,
        )
        worker = hasattr(js, "WorkerGlobalScope")  # in a PyScript worker: clienttools.worker
        if storage is None:
            storage = _worker_storage(js) if worker else js.sessionStorage
        self._storage = storage
        # Looked up once: in a worker the storage is the page's, and a lookup is a call there.
        self._set_item = storage.setItem
        self._storage_key = f"clienttools:outbox:{url}"
        self._status = "idle"
        self._status_callbacks: list[Callable[[str], None]] = []
        self._connection: _Connection | None = None
        self._supervisor: Any = None
        self._runs: dict[str, Any] = {}
        self._started: set[str] = set()
        self._closing = False
        self._closed = asyncio.Event()
        self._outbox_restored = False
        self._saved_revision = 0
        self._saved_added = 0
        self._save_scheduled = False
        self._timer_id: Any = None
        self._timer_at: float | None = None
        self._pumping = False
        self.proxies_created = 0
        self.proxies_destroyed = 0
        # Two long-lived callbacks (the timer and the batched outbox save) for the
        # client's whole life: not per socket, so not counted with the socket's.
        self._timer_proxy = self._proxy_of(self._on_timer)
        self._save_proxy = self._proxy_of(self._on_save_timer)
        self._hide_proxy = self._proxy_of(self._on_page_hide)
        if not worker:  # a worker ends with its page: nothing to flush then
            js.window.addEventListener("pagehide", self._hide_proxy)
            js.document.addEventListener("visibilitychange", self._hide_proxy)
        self.webmcp: Any = None  # the tools on document.modelContext (webmcp.py)
        if webmcp:
            from clienttools.webmcp import ModelContextMirror, mpy_runner

            self.webmcp = ModelContextMirror(
                lambda: [(tool.spec(), tool.read_only) for tool in self._tools.values()],
                mpy_runner(self._tools, max_result_bytes),
                approval=webmcp_approval,
            )

    @staticmethod
    def _proxy_of(fn: "Callable[..., Any]") -> "Any":
        from jsffi import create_proxy

        return create_proxy(fn)

    def _now(self) -> float:
        return float(self._js.performance.now()) / 1000

    # --- tools ---------------------------------------------------------------------------

    def tool(
        self,
        fn: "Callable[..., Any] | None" = None,
        *,
        schema: "dict[str, Any] | None" = None,
        name: "str | None" = None,
        description: str = "",
        output_schema: "dict[str, Any] | None" = None,
        timeout: "float | None" = None,
        needs_approval: bool = False,
        context: bool = False,
        read_only: bool = False,
    ) -> "Any":
        """Register a tool: `@client.tool` (no arguments) or `@client.tool(schema={...}, ...)`."""

        def register(function: "Callable[..., Any]") -> "Callable[..., Any]":
            tool = Tool(
                function,
                name=name,
                description=description,
                schema=schema,
                output_schema=output_schema,
                timeout=timeout,
                needs_approval=needs_approval,
                context=context,
                read_only=read_only,
            )
            if tool.name in self._tools:
                raise ValueError(f"a tool named {tool.name!r} is already registered")
            self._tools[tool.name] = tool
            self._tools_changed()
            return function

        return register if fn is None else register(fn)

    def remove_tool(self, name: str) -> None:
        del self._tools[name]
        self._tools_changed()

    def _tools_changed(self) -> None:
        self.session.registry_changed()
        self._pump()
        if self.webmcp is not None:
            self.webmcp.sync()

    @property
    def tools(self) -> "dict[str, Tool]":
        return OrderedDict(self._tools)

    # --- state ---------------------------------------------------------------------------

    @property
    def status(self) -> str:
        """idle -> connecting -> open (-> reconnecting -> open ...) -> closed."""
        return self._status

    @property
    def connected(self) -> bool:
        return self._status == "open"

    def on_status(self, callback: "Callable[[str], None]") -> "Callable[[], None]":
        self._status_callbacks.append(callback)

        def unsubscribe() -> None:
            if callback in self._status_callbacks:
                self._status_callbacks.remove(callback)

        return unsubscribe

    def _set_status(self, status: str) -> None:
        if status == self._status:
            return
        self._status = status
        _log("info", f"{self.url}: {status}")
        if status == "closed":
            self._closed.set()
        for callback in list(self._status_callbacks):
            try:
                callback(status)
            except Exception as exc:
                _log("error", f"status callback failed: {exc!r}")

    # --- connect and close ---------------------------------------------------------------

    async def connect(self) -> None:
        """Open the connection; return once the server acknowledged the tools (C1)."""
        if self._status in ("connecting", "open", "reconnecting"):
            raise RuntimeError(f"ToolClient.connect() called while {self._status}")
        if not self.url:
            raise RuntimeError("this ToolClient has no url: it serves document.modelContext only")
        self._closing = False
        self._closed = asyncio.Event()
        self._restore_outbox()
        self._set_status("connecting")
        try:
            await self._open(first=True)
        except BaseException:
            await self._stop()
            raise
        self._supervisor = asyncio.create_task(self._supervise())

    async def close(self) -> None:
        """Close for good: no reconnect; running async tools are cancelled.

        With `webmcp=True`, every registration on `document.modelContext` is aborted.
        """
        if self.webmcp is not None:
            self.webmcp.close()
        if self._status in ("idle", "closed"):
            return
        await self._stop()

    async def wait_closed(self) -> None:
        if self._status in ("idle", "closed"):
            return
        await self._closed.wait()

    async def _open(self, first: bool) -> None:
        started = self._now()
        connection = self._attach()
        if not await self._wait(connection.opened, self.connect_timeout):
            self._detach(connection)
            raise ConnectionFailed(
                self._open_url, f"no answer within {self.connect_timeout} s"
            ) from None
        if connection.over:
            self._detach(connection)
            code = connection.close_code
            detail = f" (close code {code})" if code not in (None, 1006) else ""
            raise ConnectionFailed(self._open_url, f"the server refused or is unreachable{detail}")
        self.session.connection_opened(self._now())
        self._pump()
        remaining = max(0.001, self.connect_timeout - (self._now() - started))
        if not await self._wait(connection.registered, remaining):
            self._detach(connection)
            raise RegistrationTimeout(
                self._open_url,
                f"connected, but the server did not acknowledge the tools within "
                f"{self.connect_timeout} s (is this a clienttools endpoint?)",
            ) from None
        outcome = connection.outcome
        if not isinstance(outcome, tuple):
            self._detach(connection)
            raise ConnectionFailed(self._open_url, str(outcome))
        rejected = outcome[1]
        if rejected:
            if first:
                self._detach(connection)
                raise ToolsRejected(self._open_url, rejected)
            for tool_name, reason in rejected:
                _log("warn", f"server rejected tool {tool_name!r}: {reason}")
        self._set_status("open")

    async def _wait(self, event: "asyncio.Event", seconds: float) -> bool:
        """Wait for `event` at most `seconds`; False on timeout.

        Not asyncio.wait_for: under the page's top-level await (MicroPython's
        TopLevelCoro) it fails when the timeout cancels the waiter.
        """
        if event.is_set():
            return True
        timed_out = []

        def expire(*args: "Any") -> None:
            if not event.is_set():
                timed_out.append(True)
                event.set()

        proxy = self._proxy_of(expire)
        timer = self._js.setTimeout(proxy, max(1, int(seconds * 1000)))
        await event.wait()
        self._js.clearTimeout(timer)
        return not timed_out

    def _attach(self) -> "_Connection":
        ws = self._js.WebSocket.new(self._open_url)
        ws.binaryType = "arraybuffer"
        connection = _Connection(ws)
        self._connection = connection

        def on_open(event: "Any") -> None:
            connection.opened.set()

        def on_message(event: "Any") -> None:
            self._on_frame(connection, event.data)

        def on_close(event: "Any") -> None:
            try:
                connection.close_code = int(event.code)
            except Exception:
                connection.close_code = None
            self._end(connection, "the server closed the connection before acknowledging the tools")
            connection.opened.set()

        def on_error(event: "Any") -> None:
            pass  # a close event always follows

        for attribute, handler in (
            ("onopen", on_open),
            ("onmessage", on_message),
            ("onclose", on_close),
            ("onerror", on_error),
        ):
            proxy = self._proxy_of(handler)
            connection.proxies.append(proxy)
            self.proxies_created += 1
            setattr(ws, attribute, proxy)
        return connection

    def _on_frame(self, connection: "_Connection", data: "Any") -> None:
        # Runs inside the socket's onmessage: an exception here would be a page error.
        if connection is not self._connection:
            return
        try:
            self.session.receive_frame(data if isinstance(data, str) else b"", self._now())
            self._pump()
        except Exception as exc:
            _log("error", f"handling a frame failed: {exc!r}")

    def _end(self, connection: "_Connection", why: str) -> None:
        """Mark a connection as over (idempotent); the supervisor takes it from there."""
        if connection.over:
            return
        connection.over = True
        if connection.outcome is None:
            connection.outcome = why
        connection.registered.set()
        connection.ended.set()
        if self._connection is connection:
            self.session.connection_lost(self._now())

    def _detach(self, connection: "_Connection", code: int = 1000, reason: str = "") -> None:
        """Close the socket and drop its handlers, so nothing of it stays alive."""
        self._end(connection, "the client dropped the connection")
        if self._connection is connection:
            self._connection = None
        ws = connection.ws
        for attribute in ("onopen", "onmessage", "onclose", "onerror"):
            setattr(ws, attribute, None)
        try:
            if ws.readyState <= _OPEN:
                ws.close(code, reason)
        except Exception as exc:
            _log("info", f"closing the socket failed: {exc!r}")
        self.proxies_destroyed += len(connection.proxies)
        connection.proxies = []  # released: JS holds them no more, nor do we

    async def _supervise(self) -> None:
        """C11: after an unexpected end, reconnect with backoff and full jitter."""
        while True:
            connection = self._connection
            if connection is None:
                return
            await connection.ended.wait()
            code = CLOSE_CODE_SILENT if connection.close_code == CLOSE_CODE_SILENT else 1000
            self._detach(connection, code)
            if self._closing:
                return
            if not self.reconnect:
                _log("warn", "connection lost; reconnect is off, so the client closes")
                await self._stop()
                return
            self._set_status("reconnecting")
            for delay in backoff():
                await asyncio.sleep(delay)
                if self._closing:
                    return
                try:
                    await self._open(first=False)
                    break
                except ConnectError as exc:
                    _log("info", f"reconnect failed: {exc}")

    async def _stop(self) -> None:
        self._closing = True
        supervisor, self._supervisor = self._supervisor, None
        if supervisor is not None and supervisor is not asyncio.current_task():
            supervisor.cancel()
        connection = self._connection
        if connection is not None:
            self._detach(connection)
        self.session.shutdown()
        self._pump()
        for _ in range(100):  # cancelled async tools end at their next await
            if not self._runs:
                break
            await asyncio.sleep(0.02)
        if self._timer_id is not None:
            self._js.clearTimeout(self._timer_id)
            self._timer_id, self._timer_at = None, None
        self._save_outbox()
        self._set_status("closed")

    # --- carrying out what the session asks ----------------------------------------------

    def _pump(self) -> None:
        """Carry out the session's events, save the outbox, send its frames, re-arm the timer."""
        if self._pumping:
            return
        self._pumping = True
        try:
            events = self.session.events()
            while events:
                for event in events:
                    self._carry_out(event)
                events = self.session.events()
        finally:
            self._pumping = False
        self._save_outbox_soon()  # a result is stored before it leaves (C11)
        frames = self.session.frames_to_send()
        connection = self._connection
        if frames and connection is not None:
            for text in frames:
                try:
                    connection.ws.send(text)
                except Exception as exc:
                    _log("info", f"send failed ({exc!r}); the connection is going away")
                    self._end(connection, f"sending failed: {exc!r}")
                    break
        self._rearm_timer()

    def _carry_out(self, event: "tuple[Any, ...]") -> None:
        kind = event[0]
        if kind == "run":
            self._start_run(*event[1:])
        elif kind == "cancel":
            self._cancel_run(event[1])
        elif kind == "acked":
            connection = self._connection
            if connection is not None and connection.outcome is None:
                connection.outcome = (event[1], event[2])
                connection.registered.set()
            else:
                for tool_name, reason in event[2]:
                    _log("warn", f"server rejected tool {tool_name!r}: {reason}")
        elif kind == "replace":
            connection = self._connection
            if connection is not None:
                _log("warn", f"replacing a silent connection: {event[1]}")
                connection.close_code = CLOSE_CODE_SILENT
                self._end(connection, event[1])

    def _start_run(
        self, request_id: str, tool: "Tool", arguments: "dict[str, Any]", attempt: int, call_id: str
    ) -> None:
        context = None
        if tool.context:

            def report(progress: float, total: "float | None", message: "str | None") -> None:
                self.session.report_progress(request_id, progress, total, message)
                self._pump()

            context = ToolContext(
                request_id=request_id,
                tool_call_id=call_id,
                tool_name=tool.name,
                attempt=attempt,
                report_progress=report,
            )
        try:
            result = tool.call(arguments, context)
        except Exception as exc:  # a sync tool raised
            self.session.tool_raised(request_id, exc)
            return
        if hasattr(result, "send") and hasattr(result, "throw"):  # a coroutine (or generator)
            self._runs[request_id] = asyncio.create_task(self._run(request_id, result))
        else:
            self.session.tool_returned(request_id, result)

    async def _run(self, request_id: str, coroutine: "Any") -> None:
        # MicroPython's tasks have no done callbacks: the task reports its own end.
        self._started.add(request_id)
        try:
            value = await coroutine
        except asyncio.CancelledError:
            self._run_ended(request_id)
            self.session.tool_cancelled(request_id)
        except Exception as exc:
            self._run_ended(request_id)
            self.session.tool_raised(request_id, exc)
        else:
            self._run_ended(request_id)
            self.session.tool_returned(request_id, value)
        self._pump()

    def _run_ended(self, request_id: str) -> None:
        self._runs.pop(request_id, None)
        self._started.discard(request_id)

    def _cancel_run(self, request_id: str) -> None:
        task = self._runs.get(request_id)
        if task is None:
            return
        task.cancel()
        if request_id not in self._started:
            # Cancelled before its first step: the task never runs, so it cannot report.
            self._run_ended(request_id)
            self.session.tool_cancelled(request_id)

    # --- the timer (one setTimeout, at the session's next deadline) ----------------------

    def _rearm_timer(self) -> None:
        deadline = self.session.next_deadline()
        # Every frame moves the liveness deadline later; an earlier timer just fires early.
        if deadline is not None and self._timer_at is not None and self._timer_at <= deadline:
            return
        if deadline == self._timer_at:
            return
        if self._timer_id is not None:
            self._js.clearTimeout(self._timer_id)
            self._timer_id = None
        self._timer_at = deadline
        if deadline is not None:
            delay_ms = max(0, int((deadline - self._now()) * 1000) + 1)
            self._timer_id = self._js.setTimeout(self._timer_proxy, delay_ms)

    def _on_timer(self, *args: "Any") -> None:
        deadline = self._timer_at
        self._timer_id, self._timer_at = None, None
        try:
            now = self._now()
            self.session.tick(now if deadline is None else max(now, deadline))
            self._pump()
        except Exception as exc:
            _log("error", f"the timer failed: {exc!r}")

    # --- the outbox store (sessionStorage) -----------------------------------------------

    def _restore_outbox(self) -> None:
        if self._outbox_restored:
            return
        self._outbox_restored = True
        try:
            text = self._storage.getItem(self._storage_key)
        except Exception as exc:
            _log("error", f"loading the stored outbox failed: {exc!r}")
            return
        if isinstance(text, str) and text:
            restored = self.session.restore_outbox(text)
            if restored:
                _log("info", f"restored {restored} unacknowledged results")
        self._saved_revision = self.session.outbox_revision
        self._saved_added = self.session.outbox_added

    def _save_outbox_soon(self) -> None:
        """Write new results at once (before they are sent); leave removals for the timer.

        As outbox.OutboxWriter does for the Pyodide flavour: one write per invoke in a
        sequential exchange (the ack's removal goes with the next result), one write
        for the first result of a burst.
        """
        session = self.session
        if session.outbox_revision == self._saved_revision:
            return
        added = session.outbox_added - self._saved_added
        if added and len(session._outbox) <= added:
            self._save_outbox()  # every result waiting is new: at once
        elif not self._save_scheduled:
            self._save_scheduled = True
            self._js.setTimeout(self._save_proxy, 20)

    def _on_save_timer(self, *args: "Any") -> None:
        self._save_scheduled = False
        self._save_outbox()

    def _on_page_hide(self, event: "Any") -> None:
        if str(event.type) == "pagehide" or str(self._js.document.visibilityState) == "hidden":
            self._save_outbox()

    def _save_outbox(self) -> None:
        revision = self.session.outbox_revision
        if revision == self._saved_revision:
            return
        self._saved_revision = revision
        self._saved_added = self.session.outbox_added
        try:
            self._set_item(self._storage_key, self.session.export_outbox())
        except Exception as exc:  # e.g. the storage quota: results still go out while connected
            _log("error", f"saving the outbox failed: {exc!r}")
