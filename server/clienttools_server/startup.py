"""What the command checks before it serves, so a bad setting is one line, not a traceback.

uvicorn reports a failure of the app's start-up (its lifespan: the ledger) or
of its listening socket as a traceback, after it has already logged that it
started. :func:`check_startup` tries each of those first, on its own, and
turns a failure into a :class:`StartupError` whose message says what to do;
the command prints it and exits with status 2, as argparse does for a bad flag.

    >>> import asyncio
    >>> try:
    ...     asyncio.run(check_startup(ServerConfig(static_dirs=("/no/such/dir",))))
    ... except StartupError as exc:
    ...     print(exc)
    --static /no/such/dir: no such directory
"""

from __future__ import annotations

import errno
import os
import socket
import sqlite3

from .app import POSTGRES_SCHEMES, open_ledger
from .config import ServerConfig
from .ledger import DEFAULT_LEASE, Ledger


class StartupError(Exception):
    """The server cannot start as configured; the message, one line, says what to do."""


async def check_startup(config: ServerConfig) -> None:
    """Raise StartupError if ``config``'s directories, address or ledger cannot be used."""
    ledger = await open_checked(config)
    await ledger.close()


async def open_checked(config: ServerConfig) -> Ledger:
    """:func:`check_startup`, keeping the ledger it opened: the one the command serves with.

    Opened once: its schema created or migrated here, not a second time in the app's
    lifespan, which takes this ledger over (and closes it at shutdown).
    """
    check_static_dirs(config.static_dirs)
    check_listen(config.host, config.port)
    return await open_checked_ledger(config.db, lease=config.lease)


def check_static_dirs(directories: tuple[str, ...]) -> None:
    for directory in directories:
        if not os.path.isdir(directory):
            what = "not a directory" if os.path.exists(directory) else "no such directory"
            raise StartupError(f"--static {directory}: {what}")


def check_listen(host: str, port: int) -> None:
    """Bind (and let go of) every address ``host`` names, as uvicorn is about to.

    Port 0 is never in use: the check only proves the address is this machine's.
    """
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise StartupError(
            f"--host {host}: not a name or address of this machine ({exc.strerror})"
        ) from None
    unavailable: OSError | None = None
    bound = False
    for family, kind, proto, _, address in addresses:
        with socket.socket(family, kind, proto) as probe:
            # As asyncio's create_server does on POSIX: TIME_WAIT is not "in use", and
            # an IPv6 socket leaves the IPv4 addresses to their own socket.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                probe.bind(address)
            except OSError as exc:
                if exc.errno != errno.EADDRNOTAVAIL:
                    raise StartupError(_bind_failure(host, port, exc)) from None
                # asyncio skips an address of a family the machine has not enabled.
                unavailable = exc
                continue
            bound = True
    if not bound and unavailable is not None:
        raise StartupError(_bind_failure(host, port, unavailable))


def _bind_failure(host: str, port: int, exc: OSError) -> str:
    if exc.errno == errno.EADDRINUSE:
        return (
            f"--port {port}: already in use on {host}; stop what listens there or pick "
            "another port (0 picks a free one)"
        )
    if exc.errno == errno.EACCES:
        return f"--port {port}: this user may not listen on it; pick a port above 1023"
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"--host {host}: not an address of this machine; use one of its own, or 0.0.0.0"
    return f"cannot listen on {host}:{port}: {exc.strerror or exc}"


async def check_ledger(db: str | None) -> None:
    """Open the ledger ``--db`` names (creating or migrating its schema), then close it."""
    ledger = await open_checked_ledger(db)
    await ledger.close()


async def open_checked_ledger(db: str | None, *, lease: float = DEFAULT_LEASE) -> Ledger:
    """The ledger ``--db`` names, open (its schema created or migrated); StartupError if not."""
    if db is None:
        return await open_ledger(None, lease=lease)  # in memory: nothing that can fail
    if db.startswith(POSTGRES_SCHEMES):
        await _reach_postgres(db)
    try:
        return await open_ledger(db, lease=lease)
    except sqlite3.Error as exc:
        raise StartupError(_sqlite_failure(db, exc)) from None
    except RuntimeError as exc:  # a schema newer than this code, or a database gone since
        raise StartupError(f"--db {_shown(db)}: {exc}") from None


async def _reach_postgres(url: str) -> None:
    """Connect once without the ledger's pool: its failure names the cause (refused,
    unknown user, no such database) where the pool only reports a timeout."""
    try:
        import psycopg
    except ImportError:
        raise StartupError(
            "--db postgresql://... needs psycopg: pip install 'clienttools-server[postgres]'"
        ) from None
    try:
        connection = await psycopg.AsyncConnection.connect(url, connect_timeout=5)
    except psycopg.ProgrammingError as exc:  # libpq could not parse it
        reason = " ".join(str(exc).split())
        raise StartupError(f"--db {_shown(url)}: not a PostgreSQL URL: {reason}") from None
    except psycopg.Error as exc:
        reason = " ".join(str(exc).split())  # libpq's message spans several lines
        raise StartupError(
            f"--db {_shown(url)}: cannot connect to PostgreSQL: {reason}; check that it runs "
            "there and that the URL's user, password and database are right"
        ) from None
    await connection.close()


def _sqlite_failure(path: str, exc: sqlite3.Error) -> str:
    reason = str(exc)
    if "unable to open" in reason:
        return (
            f"--db {path}: cannot open the SQLite file ({reason}); check that its directory "
            "exists and that this user may write there"
        )
    if "not a database" in reason:
        return f"--db {path}: not a SQLite ledger ({reason}); name a new file or a ledger's"
    return f"--db {path}: the SQLite ledger cannot be used: {reason}"


def _shown(url: str) -> str:
    """``url`` without its password, fit for a message."""
    scheme, sep, rest = url.partition("://")
    credentials, at, host = rest.rpartition("@")
    if not sep or not at or ":" not in credentials:
        return url
    return f"{scheme}://{credentials.split(':', 1)[0]}:***@{host}"
