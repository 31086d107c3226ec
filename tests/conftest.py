"""Fixtures shared by every layer: paths, the web build, one Chromium and one PostgreSQL.

Browser tests use pytest-playwright's session-scoped `browser`, launched with the
settings in playwright.config.py (Debian's Chromium, never a downloaded one).
"""

from __future__ import annotations

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
    """build/web, built (incrementally) if a test run starts without `make web`."""
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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Playwright's sync API keeps an event loop running in the main thread for as
    # long as the session-scoped browser lives; an asyncio test after it cannot
    # start its own loop. So every test that uses the browser runs last (a stable
    # sort: each module's browser tests stay together, in file order).
    items.sort(key=lambda item: "browser" in getattr(item, "fixturenames", ()))
