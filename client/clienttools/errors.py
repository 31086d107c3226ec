"""Why `connect()` failed, in both flavours: `ConnectError` and its three kinds.

Runs on CPython, Pyodide and MicroPython 1.27 (the subset of rules.py: no
`typing` at run time, no `urllib`), so `ToolClient` of either flavour raises the
same classes, and `except clienttools.ConnectError` means one thing everywhere.

    ConnectError             connect() failed; .url (its token hidden), .reason
    +-- ConnectionFailed     the socket did not open: refused, unreachable, timed out, HTTP error
    +-- RegistrationTimeout  the socket opened, but no cf_agent_client_tools_ack came in time
    +-- ToolsRejected        the server refused some tools; .rejected holds them (.name, .reason)

    >>> str(ConnectionFailed("ws://h/agents/chat/s?token=secret", "refused"))
    'cannot connect to ws://h/agents/chat/s?token=***: refused'
"""

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (MicroPython has none)
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any


def redact_token(url: str) -> str:
    """`url` with the value of its `token` query parameter hidden, for messages and logs.

    >>> redact_token("ws://h/x?a=1&token=s3cret#top")
    'ws://h/x?a=1&token=***#top'
    """
    if "?" not in url:
        return url
    base, _, rest = url.partition("?")
    query, hash_mark, fragment = rest.partition("#")
    parts = query.split("&")
    hidden = ["token=***" if part.split("=", 1)[0] == "token" else part for part in parts]
    if hidden == parts:
        return url
    return base + "?" + "&".join(hidden) + hash_mark + fragment


class ConnectError(Exception):
    """The client could not connect to `url`; `reason` says why in plain words."""

    def __init__(self, url: str, reason: str) -> None:
        url = redact_token(url)
        super().__init__(f"cannot connect to {url}: {reason}")
        self.url = url
        self.reason = reason


class ConnectionFailed(ConnectError):
    """The WebSocket did not open: refused, unreachable within the timeout, or refused by HTTP."""


class RegistrationTimeout(ConnectError):
    """The WebSocket opened, but the server did not acknowledge the tools in time."""


class ToolsRejected(ConnectError):
    """The server acknowledged the tools frame but refused some tools (each has .name, .reason)."""

    def __init__(self, url: str, rejected: "Sequence[Any]") -> None:
        reasons = "; ".join(f"{tool.name!r}: {tool.reason}" for tool in rejected)
        super().__init__(url, f"the server rejected tools: {reasons}")
        self.rejected = tuple(rejected)
