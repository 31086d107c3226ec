"""A throwaway PostgreSQL server for the tests: initdb in a temporary directory, a Unix socket.

PostgreSQL refuses to run as root, and the tests may run as root: then the
server runs as an unprivileged system user (``postgres`` when Debian's package
made it, else one we create), through ``runuser``. ``fsync=off``: these
databases are thrown away, and the tests kill server processes, never this one.

    server = PostgresServer.start()        # raises PostgresUnavailable with the reason
    url = server.fresh_url()               # a new empty schema, first on its search_path
    server.stop(); server.start_again()    # the database going away, and coming back
    server.close()                         # stop it and delete its files
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pwd
import shutil
import subprocess
import tempfile
import urllib.parse
from pathlib import Path
from typing import Any

import psycopg

PORT = 5432
# Used when no "postgres" user exists (Debian's package creates that one).
FALLBACK_USER = "clienttools-pg"


class PostgresUnavailable(RuntimeError):
    """PostgreSQL could not be found or started here; the message says why."""


def find_bindir() -> Path:
    """The directory of initdb, pg_ctl and postgres: the newest Debian version, or PATH."""
    for candidate in sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
        reverse=True,
    ):
        if (candidate / "initdb").exists():
            return candidate
    found = shutil.which("initdb")
    if found is None:
        raise PostgresUnavailable(
            "PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/initdb, no initdb on "
            "PATH); `make test` installs Debian's postgresql package"
        )
    return Path(found).parent


def _unprivileged_user() -> str | None:
    """The user to run PostgreSQL as, or None to run it as ourselves (not root)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", FALLBACK_USER):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    created = subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", FALLBACK_USER],
        capture_output=True,
        text=True,
        check=False,
    )
    if created.returncode != 0:
        raise PostgresUnavailable(
            f"running as root and could not create a user for PostgreSQL: {created.stderr}"
        )
    return FALLBACK_USER


class PostgresServer:
    def __init__(self, bindir: Path, root: Path, user: str | None) -> None:
        self.bindir = bindir
        self.root = root
        self.data = root / "data"
        self.socket_dir = root
        self.log = root / "postgres.log"
        self.user = user
        self._schemas = itertools.count()

    @classmethod
    def start(cls) -> PostgresServer:
        bindir = find_bindir()
        user = _unprivileged_user()
        # Not under pytest's tmp dir: that is root's, mode 0700, so closed to the user.
        root = Path(tempfile.mkdtemp(prefix="clienttools-pg-"))
        if user is not None:
            entry = pwd.getpwnam(user)
            os.chown(root, entry.pw_uid, entry.pw_gid)
        server = cls(bindir, root, user)
        try:
            server._run(
                "initdb", "-D", str(server.data), "--auth=trust", "--username=postgres",
                "--encoding=UTF8", "--locale=C", "--no-sync", "--no-instructions",
            )  # fmt: skip
            server.start_again()
        except BaseException:
            server.close()
            raise
        return server

    def _run(self, program: str, *args: str) -> None:
        command = [str(self.bindir / program), *args]
        if self.user is not None:
            command = ["runuser", "-u", self.user, "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=120)
        if done.returncode != 0:
            log = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            raise PostgresUnavailable(
                f"{program} failed ({done.returncode}): {done.stderr.strip()}\n{log}".strip()
            )

    def start_again(self) -> None:
        """Start the server on its data directory (after :meth:`stop`) and wait until it serves."""
        options = (
            f"-c listen_addresses='' -k {self.socket_dir} -p {PORT} "
            "-c fsync=off -c full_page_writes=off -c max_connections=200"
        )
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "start")

    def stop(self) -> None:
        """Stop the server (fast: open connections are cut), keeping its data."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def url(self, search_path: str | None = None) -> str:
        query = {"host": str(self.socket_dir), "port": str(PORT)}
        if search_path is not None:
            query["options"] = f"-csearch_path={search_path}"
        return "postgresql://postgres@/postgres?" + urllib.parse.urlencode(query)

    def fresh_url(self) -> str:
        """The URL of a new, empty schema: one ledger's own tables, apart from every other's."""
        name = f"ledger_{os.getpid()}_{next(self._schemas)}"
        with psycopg.connect(self.url(), autocommit=True) as connection:
            connection.execute(f'CREATE SCHEMA "{name}"')
        return self.url(name)

    def close(self) -> None:
        if (self.data / "postmaster.pid").exists():
            with contextlib.suppress(PostgresUnavailable):
                self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


def foreign_key_tables(connection: psycopg.Connection[Any]) -> list[str]:
    """The tables of the connection's current schema that hold a foreign key, by name."""
    rows = connection.execute(
        "SELECT c.relname FROM pg_constraint AS k JOIN pg_class AS c ON c.oid = k.conrelid "
        "WHERE k.contype = 'f' AND k.connamespace = current_schema()::regnamespace "
        "ORDER BY c.relname"
    ).fetchall()
    return [str(row[0]) for row in rows]
