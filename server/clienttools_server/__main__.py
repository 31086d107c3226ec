"""The ``clienttools-server`` command (also ``python -m clienttools_server``).

clienttools-server --port 8000 --static demo --static build/web --db ledger.sqlite3
clienttools-server token --secret "$SECRET" --principal alice --ttl 3600   # a signed token

From Python, ``serve(config_from_args([...]), clock=...)`` runs the same server
on a clock of one's own (a test's).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import math
import sys
from collections.abc import Sequence
from typing import NoReturn

import uvicorn

from .agent.agents import AgentLoadError
from .agent.model_choice import ModelChoiceError
from .app import create_app, uvicorn_config
from .clock import SYSTEM_CLOCK, Clock
from .config import CLIENT_TOOLS_MODES, DB_RETENTION, MEMORY_RETENTION, ServerConfig
from .startup import StartupError, open_checked
from .token_command import secret_type, token_command


class _Parser(argparse.ArgumentParser):
    """argparse, with a bad flag reported in one line (not the whole usage) and status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, not {text!r}") from None
    if not math.isfinite(value):  # float() takes "nan" and "inf"; no timer can
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds, not {text!r}")
    return value


def _positive(text: str) -> float:
    value = _seconds(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, not {text}")
    return value


def _not_negative(text: str) -> float:
    value = _seconds(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more seconds, not {text}")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a TCP port number, not {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be 0 to 65535 (0 picks a free one), not {text}")
    return value


def _check_values(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """What one flag's type cannot judge alone; p.error exits with one line."""
    if args.db == "":
        p.error("argument --db: needs a SQLite file path or a postgresql://... URL")
    for flag, token in (("--token", args.token), ("--admin-token", args.admin_token)):
        if token == "":
            p.error(f"argument {flag}: an empty token would let anyone in; leave the flag out")
    for origin in args.allow_origin:
        scheme, sep, rest = origin.partition("://")
        if origin != "*" and (not sep or not scheme or not rest or "/" in rest):
            p.error(
                f"argument --allow-origin: {origin!r} is not an origin; give scheme://host[:port] "
                "as the browser sends it (no path, no trailing slash), or '*'"
            )


def parser() -> argparse.ArgumentParser:
    defaults = ServerConfig()
    p = _Parser(
        prog="clienttools-server",
        description=(
            "Reference server for clienttools: AI SDK v7 WebSocket chat at "
            "/agents/chat/{session}, with tools that run in the browser page. "
            "Durations are in seconds."
        ),
        epilog="'clienttools-server token --help': print a signed token for --secret.",
    )
    p.add_argument(
        "--host", default=defaults.host, help="interface to listen on (default: %(default)s)"
    )
    p.add_argument(
        "--port",
        type=_port,
        default=defaults.port,
        help="TCP port; 0 picks a free one (default: %(default)s)",
    )
    p.add_argument(
        "--static",
        action="append",
        default=[],
        metavar="DIR",
        help="serve files of DIR at / (repeatable; the first directory that has a file wins)",
    )
    p.add_argument(
        "--no-cross-origin-isolation",
        dest="cross_origin_isolation",
        action="store_false",
        help="serve static files without the headers that make a page cross-origin isolated "
        "(Cross-Origin-Opener-Policy: same-origin, Cross-Origin-Embedder-Policy: "
        "require-corp, Cross-Origin-Resource-Policy: same-origin), for pages that embed "
        "content of other origins; tools in a PyScript worker then cannot reach the page "
        "(default: send them)",
    )
    p.add_argument(
        "--db",
        metavar="PATH|URL",
        help="the ledger that makes runs survive a restart: a SQLite file, or a "
        "postgresql://... URL that several server processes can share (default: in memory)",
    )
    p.add_argument(
        "--token",
        help="require ?token=TOKEN on every WebSocket URL and 'Authorization: Bearer TOKEN' "
        "on the HTTP routes (/executions, /chats, the HTTP chat transport) (default: no token)",
    )
    p.add_argument(
        "--admin-token",
        metavar="TOKEN",
        help="also accept 'Authorization: Bearer TOKEN' on the HTTP routes, so "
        "operators need not hold the pages' token; never valid on the WebSocket "
        "(default: none)",
    )
    p.add_argument(
        "--secret",
        type=secret_type,
        help="check signed tokens (made by 'clienttools-server token') where the tokens above "
        "go: each names a principal, and a session belongs to the first principal that uses "
        "it; with it, a request without a valid credential is refused (default: none)",
    )
    p.add_argument(
        "--allow-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="allow WebSocket handshakes from ORIGIN, e.g. https://example.com (repeatable; "
        "'*' allows any; default: only the server's own origin)",
    )
    p.add_argument(
        "--tool-timeout",
        type=_positive,
        default=defaults.tool_timeout,
        metavar="SECONDS",
        help="default time a browser tool may run without progress, when its spec sets no "
        "timeoutMs (default: %(default)s)",
    )
    p.add_argument(
        "--max-tool-timeout",
        type=_positive,
        default=defaults.max_tool_timeout,
        metavar="SECONDS",
        help="hard cap on any browser tool call, progress or not; never below --tool-timeout "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--disconnect-policy",
        choices=("wait", "fail"),
        default=defaults.disconnect_policy,
        help="when a page disconnects mid-call: 'wait' re-delivers the call to the next "
        "connection that registers the tool, 'fail' fails it as 'disconnected' "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--model",
        default=defaults.model,
        help="the model that answers: any pydantic-ai model name (openai:gpt-4o, "
        "anthropic:claude-sonnet-4-5, google-gla:gemini-2.5-flash, groq:..., test), its key "
        "from the provider's usual environment variable; 'scripted' is deterministic and "
        "offline (default: %(default)s; with --agent, the agent's own model)",
    )
    p.add_argument(
        "--agent",
        metavar="MODULE:ATTR",
        help="serve this pydantic-ai Agent (e.g. examples.agent:agent), with each session's "
        "page tools added per run (default: a plain agent)",
    )
    p.add_argument(
        "--client-tools",
        choices=CLIENT_TOOLS_MODES,
        default=defaults.client_tools,
        help="how page tools run: 'rpc' calls them over the page's socket inside one "
        "response; 'round-trip' ends the response at the call (finishReason 'tool-calls') "
        "and the page's next send, carrying the output, continues (default: %(default)s)",
    )
    p.add_argument(
        "--first-chunk-delay",
        type=_not_negative,
        default=defaults.first_chunk_delay,
        metavar="SECONDS",
        help="scripted model: wait this long before the first chunk of each model request "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--chunk-delay",
        type=_not_negative,
        default=defaults.chunk_delay,
        metavar="SECONDS",
        help="scripted model: wait this long between chunks (default: %(default)s)",
    )
    p.add_argument(
        "--ttl",
        type=_positive,
        default=defaults.ttl,
        metavar="SECONDS",
        help="a paused run expires after this long without progress (default: %(default)s)",
    )
    p.add_argument(
        "--retention",
        type=_positive,
        default=None,
        metavar="SECONDS",
        help="delete a finished run, and a chat, from the ledger this long after it finished "
        "or last changed (default: "
        f"{MEMORY_RETENTION:g} without --db, {DB_RETENTION:g} (a week) with it)",
    )
    p.add_argument(
        "--lease",
        type=_positive,
        default=defaults.lease,
        metavar="SECONDS",
        help="a process owns each run it runs this long past its last renewal (renewed every "
        "third of it); then another process on the same --db takes the run over "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--idle-timeout",
        type=_positive,
        default=defaults.idle_timeout,
        metavar="SECONDS",
        help="close a connection that has neither registered tools nor sent a chat frame "
        "after this long (default: %(default)s)",
    )
    p.add_argument(
        "--sse-keepalive",
        type=_positive,
        default=defaults.sse_keepalive,
        metavar="SECONDS",
        help="write a comment into an HTTP chat response after this long without a chunk, "
        "so that proxies keep it open (default: %(default)s)",
    )
    p.add_argument(
        "--log-level",
        default=defaults.log_level,
        choices=("critical", "error", "warning", "info", "debug", "trace"),
        help="log verbosity (default: %(default)s)",
    )
    return p


def config_from_args(argv: Sequence[str] | None = None) -> ServerConfig:
    p = parser()
    args = p.parse_args(argv)
    _check_values(p, args)
    return ServerConfig(
        host=args.host,
        port=args.port,
        static_dirs=tuple(args.static),
        cross_origin_isolation=args.cross_origin_isolation,
        db=args.db,
        token=args.token,
        admin_token=args.admin_token,
        secret=args.secret,
        allow_origins=tuple(args.allow_origin),
        tool_timeout=args.tool_timeout,
        max_tool_timeout=max(args.max_tool_timeout, args.tool_timeout),
        disconnect_policy=args.disconnect_policy,
        model=args.model,
        agent=args.agent,
        client_tools=args.client_tools,
        first_chunk_delay=args.first_chunk_delay,
        chunk_delay=args.chunk_delay,
        log_level=args.log_level,
        ttl=args.ttl,
        retention=args.retention,
        idle_timeout=args.idle_timeout,
        sse_keepalive=args.sse_keepalive,
        lease=args.lease,
    )


def serve(config: ServerConfig, clock: Clock = SYSTEM_CLOCK) -> None:
    """Log as ``config`` says and serve until interrupted."""
    level = logging.DEBUG if config.log_level == "trace" else config.log_level.upper()
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(_serve(config, clock))
    except (ModelChoiceError, AgentLoadError, StartupError) as exc:
        # One line that says what to do, not a traceback.
        print(f"clienttools-server: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


async def _serve(config: ServerConfig, clock: Clock) -> None:
    # One event loop for the checks and the server: the ledger the checks opened
    # (a PostgreSQL pool belongs to its loop) is the one the app serves with.
    ledger = await open_checked(config)
    try:
        app = create_app(config, clock=clock, ledger=ledger)
    except BaseException:
        await ledger.close()
        raise
    served = uvicorn_config(app, config)
    served.load()
    _freeze_heap()
    await uvicorn.Server(served).serve()


def _freeze_heap() -> None:
    """Leave what start-up built (modules, the app, the agent) out of every later collection.

    A full collection walks every tracked object, and a server's heap is mostly
    its modules (about 105,000 objects here): frozen, a full collection walks
    only what the chats hold. Done in the command only: an app that embeds the
    server owns its own process's collector.
    """
    gc.collect()
    gc.freeze()


def main(argv: Sequence[str] | None = None) -> None:
    arguments = sys.argv[1:] if argv is None else list(argv)
    if arguments[:1] == ["token"]:
        raise SystemExit(token_command(arguments[1:]))
    serve(config_from_args(arguments))


if __name__ == "__main__":
    main()
