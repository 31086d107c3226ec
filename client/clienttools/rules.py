"""What both client flavours share: the protocol's limits and codes, the call lifecycle, backoff.

The Pyodide flavour (session.py, tools.py, protocol.py) and the MicroPython
flavour (mpy.py) import these from here, so the two cannot drift apart. This
module runs on CPython, Pyodide and MicroPython 1.27 alike, which is why it
imports neither pydantic nor `typing`, `enum`, `dataclasses` or
`from __future__` (MicroPython has none of them; annotations it parses and
ignores, so the quoted ones here cost nothing there).

    >>> next_call_state(CallState.RUNNING, CallEvent.CANCEL) is CallState.CANCELLED
    True
    >>> delays = backoff()
    >>> 0 <= next(delays) < 1.0
    True
"""

import random

try:
    from enum import Enum
except ImportError:  # MicroPython: no enum, so the members below stay plain strings
    Enum = object  # type: ignore[assignment,misc]

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (MicroPython has none)
if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping, Sequence
    from typing import Any

# --- the wire's limits (PROTOCOL.md: Transport, ToolSpec, S10) ---------------------------

PROTOCOL_VERSION = 1
MAX_FRAME_BYTES = 1_048_576
MAX_RESULT_BYTES = 1_000_000
MAX_TOOLS_PER_CONNECTION = 128
MAX_TOOL_SPEC_BYTES = 65_536
TOOL_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$"
MAX_REQUEST_ID_CHARS = 256

_NAME_START = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_"
_NAME_REST = _NAME_START + "0123456789-"


def is_tool_name(name: object) -> bool:
    """True when `name` matches TOOL_NAME_PATTERN (MicroPython's `re` has no `{m,n}`).

    >>> is_tool_name("read_text"), is_tool_name("9lives"), is_tool_name("x" * 65)
    (True, False, False)
    """
    if not isinstance(name, str) or not 0 < len(name) <= 64 or name[0] not in _NAME_START:
        return False
    return all(char in _NAME_REST for char in name)


#: Every ToolError code; protocol.ErrorCode spells the same list as a Literal (a test checks).
ERROR_CODES = (
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
)
CANCEL_REASONS = ("timeout", "aborted", "superseded", "shutdown")
ACK_OUTCOMES = ("applied", "duplicate", "stale", "invalid")

# --- the client's own limits (C7, C11, C12) ----------------------------------------------

DEFAULT_PING_INTERVAL = 15.0
#: C12: a connection on which nothing arrived for this many ping intervals is dead.
LIVENESS_FACTOR = 2.5
#: Close code for a connection dropped because nothing arrived on it (C12).
CLOSE_CODE_SILENT = 4000
#: C7 asks to remember at least the last 1,000 completed requests.
COMPLETED_CACHE_SIZE = 1000
#: Exception text and ToolError messages longer than this are cut, so an error
#: result always fits in a frame.
MAX_ERROR_MESSAGE_CHARS = 4000
OUTBOX_FORMAT_VERSION = 1
#: Validation errors named in an invalid_input message; more only make it long.
ERRORS_IN_MESSAGE = 5


class LocalProtocolError(Exception):
    """The caller misused a client core; nothing was sent, and the peer cannot cause this.

    Like h11's split: the adapter reported the end of a run the session never
    started, or the app sent a second chat request while one is in flight. A
    malformed or unexpected frame from the peer is logged and ignored instead
    (C13), and a chat response that ends in an error is `ChatResponseError`.
    """


# --- the call lifecycle, as data ----------------------------------------------------------


class CallState(Enum):
    RECEIVED = "received"  # invoke parsed, not yet checked
    RUNNING = "running"  # the adapter is running the tool
    COMPLETED = "completed"  # result with `output` produced
    FAILED = "failed"  # result with `error` produced (never ran, raised, or bad output)
    CANCELLED = "cancelled"  # the server cancelled it; no result
    TIMED_OUT = "timed_out"  # past its deadline; `timeout` result produced


class CallEvent(Enum):
    ACCEPT = "accept"  # input valid: the run starts
    REJECT = "reject"  # unknown tool, invalid input or malformed invoke: the run never starts
    RETURN = "return"  # the tool returned a usable value
    RETURN_UNUSABLE = "return_unusable"  # the value could not be serialized or is too large
    RAISE = "raise"  # the tool raised
    RUN_CANCELLED = "run_cancelled"  # the run ended by cancellation
    CANCEL = "cancel"  # the server sent cf_agent_client_tool_cancel
    EXPIRE = "expire"  # the deadline passed


def _late(final: "CallState") -> "dict[CallEvent, CallState]":
    # A run that was cancelled or timed out is still alive until the adapter reports
    # how it ended; that late outcome is dropped (no second result), hence the self-loops.
    ends = (CallEvent.RETURN, CallEvent.RETURN_UNUSABLE, CallEvent.RAISE, CallEvent.RUN_CANCELLED)
    late = {event: final for event in ends}
    # CANCELLED: C8, a repeated cancel is ignored. TIMED_OUT: the server timed out too.
    late[CallEvent.CANCEL] = final
    return late


# COMPLETED and FAILED are final: the run is over when they are entered.
CALL_TRANSITIONS: "dict[CallState, dict[CallEvent, CallState]]" = {
    CallState.RECEIVED: {
        CallEvent.ACCEPT: CallState.RUNNING,
        CallEvent.REJECT: CallState.FAILED,
    },
    CallState.RUNNING: {
        CallEvent.RETURN: CallState.COMPLETED,
        CallEvent.RETURN_UNUSABLE: CallState.FAILED,
        CallEvent.RAISE: CallState.FAILED,
        # Cancelled by someone other than the session (the tool cancelled itself):
        # reported as a tool_error, like any other exception.
        CallEvent.RUN_CANCELLED: CallState.FAILED,
        CallEvent.CANCEL: CallState.CANCELLED,
        CallEvent.EXPIRE: CallState.TIMED_OUT,
    },
    CallState.CANCELLED: _late(CallState.CANCELLED),
    CallState.TIMED_OUT: _late(CallState.TIMED_OUT),
    CallState.COMPLETED: {},
    CallState.FAILED: {},
}


def next_call_state(state: "CallState", event: "CallEvent") -> "CallState":
    """Look up the state `event` leads to from `state`; raise LocalProtocolError if none."""
    try:
        return CALL_TRANSITIONS[state][event]
    except KeyError:
        raise LocalProtocolError(
            f"a call in state {getattr(state, 'value', state)!r} cannot take event "
            f"{getattr(event, 'value', event)!r}"
        ) from None


# --- timing -------------------------------------------------------------------------------


def backoff(
    initial: float = 1.0,
    factor: float = 2.0,
    cap: float = 30.0,
    rng: "random.Random | None" = None,
) -> "Iterator[float]":
    """Reconnect delays: exponential growth with full jitter (C11).

    The n-th delay is uniform in [0, min(cap, initial * factor**n)), so the
    first try comes within `initial` seconds and no delay exceeds `cap`.
    Full jitter spreads the reconnects of many pages after a server restart.
    `rng` is anything with a `random()` method (MicroPython's `random` module has
    no `Random` class; the module itself is used there).

        >>> delays = backoff(rng=random.Random(1))
        >>> all(0 <= next(delays) < 30 for _ in range(100))
        True
    """
    draw = (rng or random).random
    ceiling = min(initial, cap)
    while True:
        yield draw() * ceiling
        ceiling = min(cap, ceiling * factor)


def effective_timeout(timeout_ms: "int | None", tool_timeout: "float | None") -> "float | None":
    """C9: the smaller of the invoke's `timeoutMs` and the tool's own `timeout`, in seconds.

    `timeoutMs: 0` means "no limit from the server", not "already expired".
    """
    limits = [t for t in (timeout_ms / 1000 if timeout_ms else None, tool_timeout) if t]
    return min(limits) if limits else None


# --- messages -----------------------------------------------------------------------------


def invalid_input_message(tool_name: str, errors: "Sequence[Mapping[str, object]]") -> str:
    """The invalid_input message of both flavours: where and what, for the first few errors.

    >>> invalid_input_message("add", [{"loc": ["a"], "msg": "Field required"}])
    "invalid input for tool 'add': a: Field required"
    """
    parts = []
    for err in errors[:ERRORS_IN_MESSAGE]:
        loc = err.get("loc")
        where = ".".join(str(p) for p in loc) if isinstance(loc, list) and loc else "input"
        parts.append(f"{where}: {err.get('msg')}")
    if len(errors) > ERRORS_IN_MESSAGE:
        parts.append(f"and {len(errors) - ERRORS_IN_MESSAGE} more")
    return f"invalid input for tool {tool_name!r}: {'; '.join(parts)}"


def drop_missing_inputs(errors: "Sequence[dict[str, Any]]") -> None:
    """Drop `input` from each `missing` error (the whole argument object, no help to a model).

    >>> errors = [{"type": "missing", "loc": ["a"], "input": {}}]
    >>> drop_missing_inputs(errors); errors
    [{'type': 'missing', 'loc': ['a']}]
    """
    for err in errors:
        if err.get("type") == "missing":
            err.pop("input", None)


def cut_message(message: str) -> str:
    """An error message no longer than MAX_ERROR_MESSAGE_CHARS (plus an ellipsis)."""
    if len(message) > MAX_ERROR_MESSAGE_CHARS:
        return message[:MAX_ERROR_MESSAGE_CHARS] + "..."
    return message


def unknown_tool_message(tool_name: str) -> str:
    return f"no tool named {tool_name[:100]!r} on this client"


def timeout_message(tool_name: str) -> str:
    return f"tool {tool_name!r} ran past its time limit and was cancelled"


def too_large_message(size: int, limit: int) -> str:
    return f"the result is {size} bytes, over the {limit}-byte limit"
