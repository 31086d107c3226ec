"""Fixtures shared by every layer: paths, the web build, one Chromium and one PostgreSQL.

Browser tests use pytest-playwright's session-scoped `browser`, launched with the
settings in playwright.config.py (Debian's Chromium, never a downloaded one).
`make test` runs the suite in one pytest-xdist process per core (at most 4), each
test file whole in one process (`--dist loadfile`); each process has its own
Chromium and PostgreSQL.
"""

from __future__ import annotations

import asyncio
import fcntl
import runpy
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.support.postgres import PostgresServer, PostgresUnavailable
from tests.support.static import StaticServer

ROOT = Path(__file__).resolve().parent.parent
WEB = ROOT / "build" / "web"
PAGES = ROOT / "tests" / "browser" / "pages"


# playwright.config.py is not an importable module name (the dot), so run it as a file.
PLAYWRIGHT_CONFIG: Any = SimpleNamespace(**runpy.run_path(str(ROOT / "playwright.config.py")))


@pytest.fixture(scope="session")
def browser_type_launch_args() -> dict[str, object]:
    return PLAYWRIGHT_CONFIG.launch_options()  # type: ignore[no-any-return]


@pytest.fixture(scope="session")
def web_build() -> Path:
    """build/web, built (incrementally) if a test run starts without `make web`.

    One build at a time: each pytest-xdist process asks for it."""
    WEB.parent.mkdir(parents=True, exist_ok=True)
    with open(WEB.parent / ".build-web.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        subprocess.run([sys.executable, str(ROOT / "scripts" / "build_web.py")], check=True)
    return WEB


@pytest.fixture(scope="session")
def static_server(web_build: Path) -> Iterator[StaticServer]:
    server = StaticServer(
        {
            "/": PAGES,
            "/pyodide/": web_build / "pyodide",
            "/pyscript/": web_build / "pyscript",
            "/micropython/": web_build / "micropython",
            "/webmcp/": web_build / "webmcp",
        }
    ).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """One PostgreSQL for the whole session; the tests that need it skip, saying why, without it."""
    try:
        server = PostgresServer.start()
    except PostgresUnavailable as exc:
        pytest.skip(f"no PostgreSQL for these tests: {exc}")
    yield server
    server.close()


def pytest_addoption(parser: pytest.Parser) -> None:
    # Here, not in tests/reliability/conftest.py: pytest reads options from the top conftest only.
    parser.addoption(
        "--soak",
        action="store_true",
        default=False,
        help="run the reliability scenarios (tests/reliability) with many more iterations",
    )


def _uses_the_browser(item: pytest.Item) -> bool:
    return "browser" in getattr(item, "fixturenames", ())


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Every test that uses the browser runs last in its process (a stable sort: each
    # module's browser tests stay together, in file order).
    items.sort(key=_uses_the_browser)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    """Run a test that does not use the browser with no event loop marked running.

    Playwright's sync API marks its own loop as the thread's running loop after
    every call (`asyncio._set_running_loop`), for as long as the session's browser
    lives; an asyncio test, or an `asyncio.run`, after it could not start a loop. The
    loop does not run meanwhile (it is parked in Playwright's greenlet), so it is
    unmarked for the test and marked again after it. With one process that order
    alone (browser tests last) would do; pytest-xdist hands each process whole files,
    browser files too, before the last asyncio ones.
    """
    parked = None if _uses_the_browser(item) else asyncio._get_running_loop()
    if parked is None:
        return (yield)
    asyncio._set_running_loop(None)
    try:
        return (yield)
    finally:
        asyncio._set_running_loop(parked)
