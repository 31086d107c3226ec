"""How a call ends, in both flavours: C2's input check, C5's output, C6's raised errors.

A result frame (core.py's Session) and a call through `document.modelContext`
(webmcp.py) both come from here, so the browser's agent gets the errors the
server would. A tool is anything with `name`, `validate_input` (raising
InvalidInput) and `dump_output_json` (raising anything for an unusable value):
tools.py's (pydantic) and mpy.py's (declared schemas). Runs on CPython, Pyodide
and MicroPython 1.27.

    >>> raised_error(KeyError("k"))
    ("'k'", {'exception': 'KeyError'})
    >>> import json
    >>> json.loads(error_result("r1", "timeout", "too slow"))["error"]
    {'code': 'timeout', 'message': 'too slow'}
"""

from clienttools.context import InvalidInput, InvalidOutput, ToolError, json_problem
from clienttools.portable import dumps, log, log_exception, utf8_size
from clienttools.rules import MAX_RESULT_BYTES, cut_message, too_large_message

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (MicroPython has none)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["error_result", "input_outcome", "raised_error", "result_text", "returned_outcome"]


def input_outcome(
    tool: "Any", raw: "dict[str, Any]"
) -> "tuple[dict[str, Any] | None, tuple[str, str, Any] | None]":
    """C2: (the tool's keyword arguments, None), or (None, (code, message, data))."""
    try:
        return tool.validate_input(raw), None
    except InvalidInput as exc:
        return None, ("invalid_input", str(exc), exc.errors)
    except Exception as exc:  # a validator of the app's own types failed oddly: still C2
        log_exception(f"validating the input of {tool.name!r} failed: {exc!r}")
        return None, ("invalid_input", f"{type(exc).__name__}: {exc}", None)


def returned_outcome(
    tool: "Any", tool_name: str, value: object, max_result_bytes: int
) -> "tuple[str | None, tuple[str, str, Any] | None]":
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
    size = len(output_json)  # characters: a lower bound of the UTF-8 size
    if size * 4 > max_result_bytes:  # else even 4 bytes a character fit
        size = utf8_size(output_json)
    if size > max_result_bytes:
        return None, ("output_too_large", too_large_message(size, max_result_bytes), {"size": size})
    return output_json, None


def raised_error(exc: BaseException) -> "tuple[str, Any]":
    """C6: the `tool_error` message and data of an exception a run raised."""
    if isinstance(exc, ToolError):
        return exc.message, exc.data
    return str(exc) or type(exc).__name__, {"exception": type(exc).__name__}


def error_result(request_id: str, code: str, message: str, data: object = None) -> str:
    """The text of a result frame with an `error`; data that is not JSON is left out."""
    error: dict[str, Any] = {"code": code, "message": cut_message(message)}
    if data is not None:
        problem = json_problem(data)
        if problem is None:
            error["data"] = data
        else:
            log("warn", f"error data is not JSON ({problem}); sent without it")
    text = dumps({"type": "cf_agent_client_tool_result", "requestId": request_id, "error": error})
    if len(text) > MAX_RESULT_BYTES // 4 and utf8_size(text) > MAX_RESULT_BYTES:
        # Oversized error data: keep the code and message, which are what the model reads.
        error.pop("data", None)
        error["message"] = error["message"] + " (error data too large)"
        text = dumps(
            {"type": "cf_agent_client_tool_result", "requestId": request_id, "error": error}
        )
    return text


def result_text(request_id: str, output_json: str) -> str:
    # The hot path of every successful invoke: the output is encoded once, by the tool.
    return (
        '{"type":"cf_agent_client_tool_result","requestId":'
        + dumps(request_id)
        + ',"output":'
        + output_json
        + "}"
    )
