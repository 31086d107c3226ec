"""The command with a setting it cannot use: one line on stderr that says what to do, exit 2.

Each kind of failure starts the real command (``python -m clienttools_server``)
in its own process, as an operator would, and reads what it printed; the
variants of one kind go through the same code in this process (a process
costs seconds of imports).
"""

from __future__ import annotations

import asyncio
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from clienttools_server.__main__ import config_from_args
from clienttools_server.app import create_app
from clienttools_server.config import ServerConfig
from clienttools_server.ledger import LedgerClosed
from clienttools_server.startup import (
    StartupError,
    check_ledger,
    check_listen,
    check_startup,
    open_checked,
)
from tests.support.postgres import PostgresServer

ROOT = Path(__file__).resolve().parents[2]


def await_check(config: ServerConfig) -> None:
    asyncio.run(check_startup(config))


def start(*args: str) -> str:
    """Run the command until it exits; the one line it printed on stderr."""
    done = subprocess.run(
        [sys.executable, "-m", "clienttools_server", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("clienttools-server: "), lines[0]
    assert done.stdout == ""
    return lines[0]


@pytest.fixture
def listening() -> Iterator[int]:
    """A port something else listens on."""
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        yield other.getsockname()[1]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--port", "99999"], "argument --port: must be 0 to 65535"),
        (["--port", "-1"], "argument --port: must be 0 to 65535"),
        (["--port", "http"], "argument --port: must be a TCP port number, not 'http'"),
        (["--tool-timeout", "-2"], "argument --tool-timeout: must be a positive number"),
        (["--ttl", "nan"], "argument --ttl: must be a finite number of seconds"),
        (["--chunk-delay", "inf"], "argument --chunk-delay: must be a finite number"),
        (["--lease", "soon"], "argument --lease: must be a number of seconds, not 'soon'"),
        (["--disconnect-policy", "later"], "argument --disconnect-policy: invalid choice"),
        (["--db="], "argument --db: needs a SQLite file path or a postgresql://... URL"),
        (["--token="], "argument --token: an empty token would let anyone in"),
        (["--allow-origin", "example.com"], "'example.com' is not an origin"),
        (["--allow-origin", "https://example.com/"], "'https://example.com/' is not an origin"),
        (["--nonsense"], "unrecognized arguments: --nonsense"),
    ],
)
def test_a_bad_flag_value_is_one_line(
    args: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        config_from_args(args)
    assert exited.value.code == 2
    out, err = capsys.readouterr()
    [line] = err.splitlines()
    assert out == "" and line.startswith("clienttools-server: "), err
    assert says in line and line.endswith("(see clienttools-server --help)"), line


@pytest.mark.process
def test_the_command_with_a_bad_flag_value_prints_one_line() -> None:
    assert start("--port", "99999") == (
        "clienttools-server: argument --port: must be 0 to 65535 (0 picks a free one), "
        "not 99999 (see clienttools-server --help)"
    )


@pytest.mark.process
def test_a_port_in_use_is_one_line(listening: int) -> None:
    line = start("--port", str(listening))
    assert line == (
        f"clienttools-server: --port {listening}: already in use on 127.0.0.1; stop what "
        "listens there or pick another port (0 picks a free one)"
    )


@pytest.mark.process
def test_a_host_that_is_not_this_machine_is_one_line() -> None:
    line = start("--port", "0", "--host", "192.0.2.1")  # TEST-NET-1: nobody's address
    assert "--host 192.0.2.1: not an address of this machine" in line
    with pytest.raises(StartupError, match=r"^--host no-such-host\.invalid: not a name or addr"):
        check_listen("no-such-host.invalid", 0)


@pytest.mark.process
def test_a_missing_static_directory_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    assert start("--port", "0", "--static", str(tmp_path / "gone")) == (
        f"clienttools-server: --static {tmp_path / 'gone'}: no such directory"
    )
    with pytest.raises(StartupError) as refused:
        await_check(ServerConfig(port=0, static_dirs=(str(tmp_path / "file"),)))
    assert str(refused.value) == f"--static {tmp_path / 'file'}: not a directory"


@pytest.mark.process
def test_a_sqlite_file_that_cannot_be_opened_is_one_line(tmp_path: Path) -> None:
    where = tmp_path / "no-such-dir" / "ledger.sqlite3"
    line = start("--port", "0", "--db", str(where))
    assert line == (
        f"clienttools-server: --db {where}: cannot open the SQLite file (unable to open "
        "database file); check that its directory exists and that this user may write there"
    )
    with pytest.raises(StartupError, match="cannot open the SQLite file"):
        await_check(ServerConfig(port=0, db=str(tmp_path)))  # a directory


@pytest.mark.process
def test_a_file_that_is_not_a_ledger_is_one_line(tmp_path: Path) -> None:
    junk = tmp_path / "notes.txt"
    junk.write_text("not a database, not at all, and long enough to have a header" * 10)
    line = start("--port", "0", "--db", str(junk))
    assert f"--db {junk}: not a SQLite ledger (file is not a database)" in line
    newer = tmp_path / "newer.sqlite3"
    with sqlite3.connect(newer) as db:
        db.execute("PRAGMA user_version = 999")
    with pytest.raises(StartupError) as refused:
        await_check(ServerConfig(port=0, db=str(newer)))
    assert str(refused.value).startswith(
        f"--db {newer}: ledger schema version 999 is not supported (this code knows version "
    )


@pytest.mark.process
def test_a_postgresql_url_that_cannot_connect_is_one_line() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    line = start("--port", "0", "--db", f"postgresql://someone:hunter2@127.0.0.1:{port}/x")
    assert line.startswith(
        f"clienttools-server: --db postgresql://someone:***@127.0.0.1:{port}/x: cannot connect "
        "to PostgreSQL: connection failed:"
    ), line
    assert "Connection refused" in line and "hunter2" not in line
    assert line.endswith("check that it runs there and that the URL's user, password and "
                         "database are right")  # fmt: skip
    with pytest.raises(StartupError, match=r"^--db postgresql://someone@\[::1/x: not a Postgr"):
        asyncio.run(check_ledger("postgresql://someone@[::1/x"))


@pytest.mark.process
def test_a_postgresql_database_that_does_not_exist_is_one_line(postgres: PostgresServer) -> None:
    url = postgres.url().replace("/postgres?", "/no_such_database?")
    line = start("--port", "0", "--db", url)
    assert 'database "no_such_database" does not exist' in line, line


async def test_the_checks_pass_for_ledgers_that_open(
    tmp_path: Path, postgres: PostgresServer
) -> None:
    """Each check also lets a good setting through: it may not refuse what would work."""
    good = ServerConfig(port=0, static_dirs=(str(tmp_path),), db=str(tmp_path / "l.sqlite3"))
    await check_startup(good)
    with sqlite3.connect(tmp_path / "l.sqlite3") as db:  # the schema is there now
        assert db.execute("PRAGMA user_version").fetchone()[0] > 0
    await check_startup(good)  # and an existing ledger opens again
    await check_startup(ServerConfig(port=0))  # in memory
    await check_startup(ServerConfig(port=0, db=postgres.fresh_url()))
    with pytest.raises(StartupError, match=r"^--static "):
        await check_startup(ServerConfig(port=0, static_dirs=(str(tmp_path / "gone"),)))


async def test_the_app_serves_with_the_ledger_the_checks_opened(tmp_path: Path) -> None:
    """The command opens its ledger once: the checks' ledger is the app's, closed at shutdown."""
    config = ServerConfig(port=0, db=str(tmp_path / "l.sqlite3"))
    ledger = await open_checked(config)
    app = create_app(config, ledger=ledger)
    async with app.router.lifespan_context(app):
        assert app.state.ledger is ledger
        execution = await ledger.start_execution("s", "{}", 1.0)
        assert await app.state.hub.ledger.get_execution(execution.id) is not None
    with pytest.raises(LedgerClosed):
        await ledger.get_execution(execution.id)
    with pytest.raises(StartupError, match=r"^--static "):
        await open_checked(ServerConfig(port=0, static_dirs=(str(tmp_path / "gone"),)))
