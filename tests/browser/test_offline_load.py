"""The web build is self-contained: the SDK loads with every non-local request blocked.

Every way a page can use the SDK is covered: PyScript's `packages = ["clienttools"]`
and plain Pyodide's `loadPackage("clienttools")`, both through the lock file that the
build writes, with integrity checks on; and the MicroPython flavour, whose interpreter
and modules come from build/web/micropython/.
"""

from __future__ import annotations

import hashlib
import json
import re
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import Browser, Route

import clienttools
from tests.conftest import PLAYWRIGHT_CONFIG, WEB
from tests.support.static import StaticServer

pytestmark = pytest.mark.browser

#: The lists of URLs in build/web/micropython/preload.js, in its order.
PRELOADED = re.compile(r"for \(const url of (\[[^\]]*\])\)")


def load(
    browser: Browser, url: str, requested: list[str] | None = None
) -> tuple[str, list[str], list[str]]:
    """Load the page offline; `requested` gets the paths the page asked for, in its order."""
    context = browser.new_context()
    blocked: list[str] = []
    console: list[str] = []

    def only_loopback(route: Route) -> None:
        if route.request.url.startswith("http://127.0.0.1:"):
            route.continue_()
        else:
            blocked.append(route.request.url)
            route.abort()

    context.route("**/*", only_loopback)
    page = context.new_page()
    page.on("console", lambda message: console.append(message.text))
    if requested is not None:
        page.on("request", lambda request: requested.append(urlsplit(request.url).path))
    try:
        page.goto(url)
        page.wait_for_function(
            "document.getElementById('status').textContent !== 'loading'",
            timeout=PLAYWRIGHT_CONFIG.PAGE_LOAD_TIMEOUT_MS,
        )
        return page.text_content("#status") or "", blocked, console
    finally:
        context.close()


@pytest.mark.parametrize("page_name", ["load_pyscript.html", "load_pyodide.html"])
def test_sdk_loads_offline(browser: Browser, static_server: StaticServer, page_name: str) -> None:
    status, blocked, console = load(browser, f"{static_server.url}/{page_name}")
    assert status.startswith(f"clienttools {clienttools.__version__} ready"), (status, console)
    assert "pydantic 2.14.4" in status
    assert "python 3.14" in status
    if page_name == "load_pyodide.html":  # a NumPy docstring read in the page
        assert status.endswith("docstrings parsed"), status
    assert blocked == [], f"the page tried to reach other hosts: {blocked}"
    # The wheels came from our lock, not from an index.
    assert any(r.endswith("/pyodide/pyodide-lock.json") for r in static_server.requests)
    assert any("/pyodide/clienttools-" in r for r in static_server.requests)


def test_lock_lists_exactly_the_shipped_wheels() -> None:
    lock = json.loads((WEB / "pyodide" / "pyodide-lock.json").read_text())
    wheels = sorted(p.name for p in (WEB / "pyodide").glob("*.whl"))
    assert sorted(p["file_name"] for p in lock["packages"].values()) == wheels
    # docstring-parser reads NumPy and Sphinx docstrings; loadPackage pulls it in with us.
    assert lock["packages"]["clienttools"]["depends"] == ["docstring-parser", "pydantic"]
    assert lock["info"]["python"].startswith("3.14")
    for package in lock["packages"].values():
        digest = hashlib.sha256((WEB / "pyodide" / package["file_name"]).read_bytes()).hexdigest()
        assert package["sha256"] == digest, package["file_name"]


def test_micropython_flavour_loads_offline(browser: Browser, static_server: StaticServer) -> None:
    before = len(static_server.requests)  # the server lives for the session
    seen: list[str] = []
    status, blocked, console = load(browser, f"{static_server.url}/load_micropython.html", seen)
    assert status.startswith("clienttools.mpy ready"), (status, console)
    assert status.endswith("micropython 1.27.0"), status
    assert blocked == [], f"the page tried to reach other hosts: {blocked}"
    # The page loads preload.js (build_web's MPY_PRELOAD) first: each file is still
    # fetched once, PyScript's fetches served from the preloads.
    assets = [
        r for r in static_server.requests[before:] if r.startswith(("/micropython/", "/pyscript/"))
    ]
    assert "/micropython/micropython.wasm" in assets and "/micropython/preload.js" in assets
    assert "/micropython/clienttools/mpy.mpy" in assets
    assert sorted(assets) == sorted(set(assets)), f"fetched twice: {assets}"
    # ... and everything preload.js names was asked for in its order (PyScript's core
    # chunk, the interpreter, the plugins, then the config, the wasm and the modules),
    # one after another, before PyScript itself asked for anything: the page's later
    # fetches were served from these. The order is the page's, not the server's.
    script = (WEB / "micropython" / "preload.js").read_text()
    named = [url for group in PRELOADED.findall(script) for url in json.loads(group)]
    assert named[0].startswith("/pyscript/core-") and "/micropython/clienttools/mpy.mpy" in named
    asked = [r for r in seen if r in named]
    assert asked == named, seen
    first = seen.index(named[0])
    assert seen[first : first + len(named)] == named, seen
