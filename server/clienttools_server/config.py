"""Every setting of the reference server in one frozen dataclass; durations in seconds.

The CLI (``clienttools-server``) builds one from its flags; tests build one
directly and pass it to :func:`clienttools_server.app.create_app`.

    >>> config = ServerConfig(port=0, tool_timeout=2.0, disconnect_policy="fail")
    >>> config.tool_timeout, config.ttl, config.finished_retention
    (2.0, 86400.0, 60.0)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeAlias, get_args

from clienttools.protocol import MAX_FRAME_BYTES, MAX_RESULT_BYTES

from .ledger import DEFAULT_LEASE

DisconnectPolicy: TypeAlias = Literal["wait", "fail"]
# How page tools reach the page: "rpc" delegates each call over the socket inside one
# response (the default); "round-trip" offers them to the model as tools without an
# execute, so the response ends at the call and the page's next `send` carries the output.
ClientToolsMode: TypeAlias = Literal["rpc", "round-trip"]
CLIENT_TOOLS_MODES: tuple[ClientToolsMode, ...] = get_args(ClientToolsMode)

# How long a finished execution stays in the ledger when ``retention`` is not set.
# In memory (no --db) nothing outlives the process anyway: a minute covers a page
# that re-sends a result it already sent. On a ledger file, a week: the record of
# what happened outlives the chat.
MEMORY_RETENTION = 60.0
DB_RETENTION = 7 * 86_400.0


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """Settings of one server. Durations are seconds here; milliseconds only on the wire."""

    host: str = "127.0.0.1"
    port: int = 8000
    # Directories served at "/", first match wins (``make demo``: demo/ then build/web/).
    static_dirs: tuple[str, ...] = ()
    # Static files carry COOP/COEP/CORP (app.ISOLATION_HEADERS), so a page that runs
    # its tools in a PyScript worker can reach its window and document (docs/client.md).
    cross_origin_isolation: bool = True
    # The ledger: a SQLite file, or a postgresql:// URL that many processes share;
    # None keeps it in memory (nothing survives a restart).
    db: str | None = None
    # Required as ``?token=`` on the WebSocket URL when set, and accepted as
    # ``Authorization: Bearer`` by the /executions routes.
    token: str | None = None
    # Accepted by the /executions routes only (operators, webhooks); never by the WebSocket.
    # With either token set, every route needs one of them.
    admin_token: str | None = None
    # Signed tokens (clienttools_server.wire.auth.mint_token) are checked with this secret where
    # the tokens above go; with it set, a request without a valid credential is refused.
    secret: str | None = None
    # Allowed ``Origin`` values; empty means the server's own origin only; "*" allows any.
    allow_origins: tuple[str, ...] = ()
    # S3: default per-call idle timeout and the hard cap on any call.
    tool_timeout: float = 60.0
    max_tool_timeout: float = 300.0
    # S4: what a call whose connection closes does.
    disconnect_policy: DisconnectPolicy = "wait"
    # Any pydantic-ai model name ("openai:gpt-4o", "test", ...) or "scripted".
    model: str = "scripted"
    # ``module:attr`` of a user's pydantic-ai Agent to serve (None: a plain agent).
    agent: str | None = None
    client_tools: ClientToolsMode = "rpc"
    # The scripted model's latency per model request: before its first chunk, and
    # between chunks (0 answers at once; a hosted model is more like 0.5 and 0.02).
    first_chunk_delay: float = 0.0
    chunk_delay: float = 0.0
    log_level: str = "info"
    # S8: paused runs expire after this long without progress; checked every expiry_interval
    # (or every ttl / 2, when that is shorter).
    ttl: float = 86_400.0
    expiry_interval: float = 60.0
    # A finished (completed, failed, expired) execution is deleted from the ledger
    # this long after it finished, by the same loop; None picks MEMORY_RETENTION
    # without a db and DB_RETENTION with one (see finished_retention).
    retention: float | None = None
    # S7: a response that ended stays resumable this long for a page that was following it
    # (a resume with lastSequence), so a socket lost just before the end loses no chunk.
    resume_grace: float = 300.0
    # Application pings (C12 clients treat 2.5 silent intervals as a dead socket).
    ping_interval: float = 15.0
    # The HTTP chat transport writes an SSE comment after this long without a chunk (a
    # page tool or an approval that takes long), so that proxies do not cut the response.
    sse_keepalive: float = 15.0
    # A connection that has neither registered tools nor sent a chat frame by then is
    # closed (1008): an idle socket must not hold server resources forever.
    idle_timeout: float = 30.0
    max_frame_bytes: int = MAX_FRAME_BYTES
    max_result_bytes: int = MAX_RESULT_BYTES
    # S9: this many malformed frames within flood_window seconds close the socket with 1008.
    flood_limit: int = 20
    flood_window: float = 10.0
    # Model steps per run, so a model that keeps calling tools cannot loop forever.
    max_steps: int = 16
    # Run ownership: a process owns each run it runs for this long past its last
    # renewal (it renews every lease / 3); once that lapses, another process on
    # the same ledger takes the run over (docs/scaling.md).
    lease: float = DEFAULT_LEASE

    def __post_init__(self) -> None:
        if self.tool_timeout <= 0 or self.max_tool_timeout <= 0:
            raise ValueError("tool timeouts must be positive")
        if self.disconnect_policy not in ("wait", "fail"):
            raise ValueError(f"unknown disconnect policy {self.disconnect_policy!r}")
        if min(self.ttl, self.expiry_interval, self.ping_interval, self.idle_timeout) <= 0:
            raise ValueError(
                "ttl, expiry_interval, ping_interval and idle_timeout must be positive"
            )
        if not self.sse_keepalive > 0:
            raise ValueError("sse_keepalive must be positive")
        if self.client_tools not in CLIENT_TOOLS_MODES:
            raise ValueError(f"unknown client tools mode {self.client_tools!r}")
        if self.first_chunk_delay < 0 or self.chunk_delay < 0:
            raise ValueError("first_chunk_delay and chunk_delay must not be negative")
        if self.resume_grace < 0:
            raise ValueError("resume_grace must not be negative")
        if self.retention is not None and self.retention < 0:
            raise ValueError("retention must not be negative")
        if self.secret is not None and len(self.secret) < 16:
            raise ValueError("the secret must be at least 16 characters")
        if not self.lease > 0:
            raise ValueError("lease must be positive")

    @property
    def finished_retention(self) -> float:
        """Seconds a finished execution stays in the ledger."""
        if self.retention is not None:
            return self.retention
        return MEMORY_RETENTION if self.db is None else DB_RETENTION
