"""What a PyScript worker page adds to the client rules (test_client.py runs those on it).

The page's main thread follows the worker client's status through PyScript's
worker export (`__export__`), and a worker on a page that is not cross-origin
isolated still connects and runs the tools that do not touch the page, with one
console error that says what is missing. Both flavours; the same Chromium as the
rest of the suite.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page

from tests.conftest import PAGES, PLAYWRIGHT_CONFIG
from tests.support.driver import ToolDriver
from tests.support.static import StaticServer

pytestmark = pytest.mark.browser
SESSION = "worker-tests"
WORKER_PAGES = {"pyodide": "client_worker.html", "micropython": "client_worker_mpy.html"}
NOT_ISOLATED = "clienttools: this page is not cross-origin isolated"


@pytest.fixture
def driver() -> Iterator[ToolDriver]:
    d = ToolDriver().start()
    yield d
    d.stop()


def wait_for(page: Page, expression: str, timeout_ms: float = 30_000) -> None:
    deadline = time.monotonic() + timeout_ms / 1000
    while not page.evaluate(expression):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{expression!r} still false after {timeout_ms:g} ms")
        time.sleep(0.02)


@pytest.mark.parametrize("flavour", list(WORKER_PAGES))
def test_the_page_follows_the_worker_clients_status(
    browser: Browser, static_server: StaticServer, driver: ToolDriver, flavour: str
) -> None:
    context = browser.new_context()
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    try:
        page.goto(f"{static_server.url}/{WORKER_PAGES[flavour]}?ws={driver.url(SESSION)}")
        wait_for(
            page,
            "window.statusLog.at(-1) === 'open'",
            timeout_ms=PLAYWRIGHT_CONFIG.PAGE_LOAD_TIMEOUT_MS,
        )
        assert page.evaluate("crossOriginIsolated") is True
        assert page.text_content("#status") == "connected"
        peers_before = len(driver.peers)
        driver.drop(SESSION)
        driver.wait_registered(SESSION, after=peers_before, timeout=5)
        wait_for(page, "window.statusLog.at(-1) === 'open' && window.statusLog.length >= 3")
        log = page.evaluate("window.statusLog")
        assert log[-2:] == ["reconnecting", "open"], log
        assert driver.invoke(SESSION, "add", {"a": 2, "b": 3})["output"] == 5
    finally:
        context.close()
    assert errors == []


@pytest.mark.parametrize("flavour", ["py", "mpy"])
def test_a_worker_without_cross_origin_isolation_says_what_is_missing(
    browser: Browser, web_build: object, driver: ToolDriver, flavour: str
) -> None:
    from tests.conftest import WEB

    plain = StaticServer(
        {
            "/": PAGES,
            "/pyodide/": WEB / "pyodide",
            "/pyscript/": WEB / "pyscript",
            "/micropython/": WEB / "micropython",
        },
        isolation=False,
    ).start()
    context = browser.new_context()
    page = context.new_page()
    console: list[ConsoleMessage] = []
    page.on("console", lambda message: console.append(message))
    try:
        page.goto(f"{plain.url}/plain_worker.html?flavour={flavour}&ws={driver.url(SESSION)}")
        wait_for(
            page,
            "document.getElementById('status').textContent !== 'loading'",
            timeout_ms=PLAYWRIGHT_CONFIG.PAGE_LOAD_TIMEOUT_MS,
        )
        assert page.text_content("#status") == "open"
        assert page.evaluate("crossOriginIsolated") is False
        # What still works: the connection and a tool that does not touch the page.
        assert driver.invoke(SESSION, "add", {"a": 20, "b": 22})["output"] == 42
        ours = [m for m in console if m.type == "error" and NOT_ISOLATED in m.text]
        assert len(ours) == 1, [m.text for m in console]
        text = ours[0].text
        for needed in ("Cross-Origin-Opener-Policy: same-origin", "require-corp", "Still working"):
            assert needed in text
    finally:
        context.close()
        plain.stop()
