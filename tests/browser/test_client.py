"""The real SDK in real Chromium, driven by a real WebSocket peer (rules C1-C13).

Every test runs against both flavours: the Pyodide client (client.html) and the
MicroPython one (client_mpy.html, the same tools with declared schemas), and the
Pyodide client once more under a Content-Security-Policy without 'unsafe-eval'
(client_strict_csp.html), where its socket handlers run in Python, not JavaScript, and
both flavours once more with the client in a PyScript worker (client_worker*.html). One page
load per flavour serves the whole module: each test uses its own tools or request
ids, so they do not disturb each other, and the page's #state shows what the
tools observed (runs, cancellations, JS proxies).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import Browser, Page

from tests.conftest import PLAYWRIGHT_CONFIG
from tests.support.driver import ToolDriver
from tests.support.frames import MALFORMED_FRAMES
from tests.support.static import StaticServer

pytestmark = pytest.mark.browser
SESSION = "client-tests"


FLAVOUR_PAGES = {
    "pyodide": "client.html",
    "pyodide-strict-csp": "client_strict_csp.html",
    "micropython": "client_mpy.html",
    # The same tools in a PyScript worker; the static server sends COOP/COEP, so the
    # worker reaches the page's DOM and sessionStorage through PyScript's proxies.
    "pyodide-worker": "client_worker.html",
    "micropython-worker": "client_worker_mpy.html",
}


@pytest.fixture(scope="module", params=list(FLAVOUR_PAGES))
def flavour(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def driver(flavour: str) -> Iterator[ToolDriver]:  # one per flavour: fresh peers and frames
    d = ToolDriver().start()
    yield d
    d.stop()


@pytest.fixture(scope="module")
def page(
    browser: Browser, static_server: StaticServer, driver: ToolDriver, flavour: str
) -> Iterator[Page]:
    context = browser.new_context()
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(f"{static_server.url}/{FLAVOUR_PAGES[flavour]}?ws={driver.url(SESSION)}")
    wait_for(
        page,
        "document.getElementById('status').textContent !== 'loading'",
        timeout_ms=PLAYWRIGHT_CONFIG.PAGE_LOAD_TIMEOUT_MS,
    )
    assert page.text_content("#status") == "connected", page.text_content("#status")
    yield page
    context.close()
    assert errors == []


def wait_for(page: Page, expression: str, timeout_ms: float = 30_000) -> None:
    """Wait until the JS `expression` is true in the page (30 s: Playwright's default).

    Playwright's `wait_for_function` compiles its predicate with `eval` inside the
    page, which the strict-CSP page refuses; `evaluate` is not the page's eval.
    """
    deadline = time.monotonic() + timeout_ms / 1000
    while not page.evaluate(expression):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{expression!r} still false after {timeout_ms:g} ms")
        time.sleep(0.02)


def state(page: Page) -> dict[str, Any]:
    return json.loads(page.text_content("#state") or "{}")  # type: ignore[no-any-return]


def runs(page: Page, name: str) -> int:
    return int(state(page)["runs"].get(name, 0))


def test_first_frame_registers_every_tool(page: Page, driver: ToolDriver) -> None:
    peer = driver.wait_registered(SESSION)
    first = peer.received[0]
    assert first["type"] == "cf_agent_client_tools"
    assert first["protocol"] == 1
    names = {tool["name"] for tool in first["tools"]}
    assert {"read_text", "write_text", "remember", "recall", "add", "nap", "count_up"} <= names
    add = next(t for t in first["tools"] if t["name"] == "add")
    assert add["description"] == "Add two integers."
    assert add["inputSchema"]["required"] == ["a", "b"]
    assert add["outputSchema"]["type"] == "integer"


def test_tools_read_and_write_the_dom_and_local_storage(page: Page, driver: ToolDriver) -> None:
    assert (
        driver.invoke(SESSION, "read_text", {"selector": "#title"})["output"]
        == "Hello from the page"
    )
    assert driver.invoke(SESSION, "read_text", {"selector": "#name"})["output"] == "Ada"
    assert (
        driver.invoke(SESSION, "write_text", {"selector": "#title", "text": "Changed"})["output"]
        is True
    )
    assert page.text_content("#title") == "Changed"
    assert driver.invoke(SESSION, "remember", {"key": "k", "value": "v1"})["output"] is None
    assert page.evaluate("localStorage.getItem('k')") == "v1"
    assert driver.invoke(SESSION, "recall", {"key": "k"})["output"] == "v1"
    assert driver.invoke(SESSION, "recall", {"key": "never-set"})["output"] is None
    missing = driver.invoke(SESSION, "read_text", {"selector": "#nope"})["error"]
    assert missing["code"] == "tool_error"
    assert missing["data"] == {"selector": "#nope"}


def test_invalid_input_does_not_run_the_tool(page: Page, driver: ToolDriver) -> None:
    before = runs(page, "add")
    error = driver.invoke(SESSION, "add", {"a": "one", "b": 2})["error"]
    assert error["code"] == "invalid_input"
    assert [e["loc"] for e in error["data"]] == [["a"]]
    assert driver.invoke(SESSION, "add", {"a": 1})["error"]["code"] == "invalid_input"
    assert runs(page, "add") == before


def test_unknown_tool(page: Page, driver: ToolDriver) -> None:
    error = driver.invoke(SESSION, "no_such_tool", {})["error"]
    assert error["code"] == "unknown_tool"
    assert "no_such_tool" in error["message"]


def test_exceptions_become_tool_errors(page: Page, driver: ToolDriver) -> None:
    error = driver.invoke(SESSION, "crash", {"message": "boom"})["error"]
    assert error == {"code": "tool_error", "message": "boom", "data": {"exception": "ValueError"}}
    refused = driver.invoke(SESSION, "refuse", {"message": "not now"})["error"]
    assert refused["code"] == "tool_error"
    assert refused["message"] == "not now"
    assert refused["data"]["retry"] is False
    # The page keeps working.
    assert driver.invoke(SESSION, "add", {"a": 2, "b": 3})["output"] == 5


def test_unserializable_and_oversize_outputs(page: Page, driver: ToolDriver) -> None:
    error = driver.invoke(SESSION, "body_element", {})["error"]
    assert error["code"] == "invalid_output"
    assert "JsProxy" in error["message"] or "HTMLBodyElement" in error["message"]
    too_big = driver.invoke(SESSION, "big_text", {"size": 1_100_000})["error"]
    assert too_big["code"] == "output_too_large"
    assert driver.invoke(SESSION, "big_text", {"size": 10})["output"] == "x" * 10


def test_timeout_cancels_the_tool(page: Page, driver: ToolDriver) -> None:
    request_id = driver.start_invoke(SESSION, "wait_forever", {}, timeout_ms=200)
    result = driver.result(SESSION, request_id)
    assert result["error"]["code"] == "timeout"
    wait_for(page, f"document.getElementById('state').textContent.includes('{request_id}')")


def test_cancel_reaches_the_tool_and_no_result_follows(page: Page, driver: ToolDriver) -> None:
    before = runs(page, "wait_forever")
    request_id = driver.start_invoke(SESSION, "wait_forever", {})
    # A task cancelled before it first runs never enters the tool: wait until it has.
    wait_for(
        page,
        "JSON.parse(document.getElementById('state').textContent).runs.wait_forever > "
        + str(before),
    )
    driver.send(
        SESSION,
        {"type": "cf_agent_client_tool_cancel", "requestId": request_id, "reason": "aborted"},
    )
    wait_for(page, f"document.getElementById('state').textContent.includes('{request_id}')")
    # Frames leave in order: once a later call's result is in, any result of this one is too.
    assert driver.invoke(SESSION, "add", {"a": 1, "b": 1})["output"] == 2
    assert [
        f
        for f in driver.frames(SESSION, "cf_agent_client_tool_result")
        if f["requestId"] == request_id
    ] == []
    # Cancels for unknown or finished requests are ignored.
    driver.send(
        SESSION, {"type": "cf_agent_client_tool_cancel", "requestId": "nope", "reason": "aborted"}
    )
    assert driver.invoke(SESSION, "add", {"a": 1, "b": 1})["output"] == 2


def test_exactly_once_per_request_id(page: Page, driver: ToolDriver) -> None:
    before = runs(page, "nap")
    request_id = driver.start_invoke(SESSION, "nap", {"seconds": 0.3})
    driver.start_invoke(SESSION, "nap", {"seconds": 0.3}, request_id=request_id, attempt=2)
    assert driver.result(SESSION, request_id)["output"] == 0.3
    # Invokes are handled in order: once a later one is answered, the duplicate was seen.
    assert driver.invoke(SESSION, "add", {"a": 1, "b": 1})["output"] == 2
    assert runs(page, "nap") == before + 1
    # Re-invoked after completion: the stored result comes back, the tool does not run again.
    driver.start_invoke(SESSION, "nap", {"seconds": 0.3}, request_id=request_id, attempt=3)
    assert driver.result(SESSION, request_id, nth=2)["output"] == 0.3
    assert runs(page, "nap") == before + 1


def test_progress_is_strictly_increasing_and_stops_at_the_result(
    page: Page, driver: ToolDriver
) -> None:
    request_id = driver.start_invoke(SESSION, "count_up", {"steps": 5})
    assert driver.result(SESSION, request_id)["output"] == 5
    assert driver.invoke(SESSION, "add", {"a": 1, "b": 1})["output"] == 2  # later frames are in
    frames = [
        f
        for p in driver.peers
        for f in p.received
        if f.get("requestId") == request_id
        and f["type"] in ("cf_agent_client_tool_progress", "cf_agent_client_tool_result")
    ]
    progress = [f["progress"] for f in frames if f["type"] == "cf_agent_client_tool_progress"]
    assert progress == [1, 2, 3, 4, 5]
    assert frames[-1]["type"] == "cf_agent_client_tool_result"
    assert frames[0]["total"] == 5 and frames[0]["message"] == "step 1"


def test_async_tools_run_concurrently(page: Page, driver: ToolDriver) -> None:
    before = runs(page, "nap")
    ids = [driver.start_invoke(SESSION, "nap", {"seconds": 3}) for _ in range(3)]
    # All three have started while none has finished: run one at a time, two results
    # would be in before the third started.
    wait_for(
        page, f"JSON.parse(document.getElementById('state').textContent).runs.nap === {before + 3}"
    )
    results = driver.frames(SESSION, "cf_agent_client_tool_result")
    assert [f for f in results if f["requestId"] in ids] == []
    for request_id in ids:
        assert driver.result(SESSION, request_id)["output"] == 3


def test_malformed_frames_do_not_break_the_page(page: Page, driver: ToolDriver) -> None:
    for index in range(1000):
        driver.send(SESSION, MALFORMED_FRAMES[index % len(MALFORMED_FRAMES)])
    # A malformed invoke whose requestId is readable gets invalid_request.
    driver.send(
        SESSION, {"type": "cf_agent_client_tool_invoke", "requestId": "bad-1", "toolName": 3}
    )
    assert driver.result(SESSION, "bad-1")["error"]["code"] == "invalid_request"
    assert driver.invoke(SESSION, "add", {"a": 20, "b": 22})["output"] == 42
    assert page.text_content("#status") == "connected"


def test_reconnect_resends_unacknowledged_results(page: Page, driver: ToolDriver) -> None:
    driver.held_acks.add(SESSION)
    try:
        request_id = driver.start_invoke(SESSION, "add", {"a": 4, "b": 5})
        assert driver.result(SESSION, request_id)["output"] == 9
        peers_before = len(driver.peers)
        dropped = time.monotonic()
        driver.drop(SESSION)
        peer = driver.wait_registered(SESSION, after=peers_before, timeout=5)
        assert time.monotonic() - dropped < 1.5
        assert peer.received[0]["type"] == "cf_agent_client_tools"  # C1 again
        resent = driver.result(SESSION, request_id, nth=2)
        assert resent["output"] == 9
    finally:
        driver.held_acks.discard(SESSION)
    # Acknowledge it now; after the next reconnect it is not sent again.
    driver.send(
        SESSION,
        {"type": "cf_agent_client_tool_result_ack", "requestId": request_id, "outcome": "applied"},
    )
    # A promise on a worker page (the worker's export), a number on the others.
    wait_for(page, "Promise.resolve(window.outboxSize()).then((size) => size === 0)")
    peers_before = len(driver.peers)
    driver.drop(SESSION)
    peer = driver.wait_registered(SESSION, after=peers_before, timeout=5)
    # The outbox is re-sent right after the tools frame: a later call's result comes after it.
    assert driver.invoke(SESSION, "add", {"a": 1, "b": 1})["output"] == 2
    assert [f for f in peer.received if f.get("requestId") == request_id] == []


def test_reconnects_leak_no_js_proxies(page: Page, driver: ToolDriver, flavour: str) -> None:
    for _ in range(20):
        peers_before = len(driver.peers)
        driver.drop(SESSION)
        driver.wait_registered(SESSION, after=peers_before, timeout=5)
    assert driver.invoke(SESSION, "add", {"a": 1, "b": 2})["output"] == 3
    page.evaluate("window.publishState()")
    observed = state(page)
    live = observed["proxiesCreated"] - observed["proxiesDestroyed"]
    assert observed["proxiesCreated"] > 20 * 3
    # Only the live socket's handlers remain (onopen goes once the socket opens).
    # Pyodide: the three Python functions its JavaScript handlers call (a frame, a
    # burst, the close); under the strict CSP, onmessage, onclose, onerror and the
    # MessageChannel port's onmessage; MicroPython: onopen, onmessage, onclose, onerror.
    expected = {
        "pyodide": 3,
        "pyodide-strict-csp": 4,
        "micropython": 4,
        "pyodide-worker": 3,
        "micropython-worker": 4,
    }[flavour]
    assert live == expected, observed
    if not flavour.startswith("micropython"):
        assert observed["jsHandlers"] is (flavour != "pyodide-strict-csp"), observed


def test_reload_resends_unacknowledged_results_without_running_again(
    page: Page, driver: ToolDriver
) -> None:
    # Last in the module: it reloads the page. The outbox is in sessionStorage (C11); a
    # worker's too, the page's, through PyScript's proxy.
    driver.held_acks.add(SESSION)
    try:
        request_id = driver.start_invoke(SESSION, "add", {"a": 6, "b": 7})
        assert driver.result(SESSION, request_id)["output"] == 13
        peers_before = len(driver.peers)
        page.reload()
        wait_for(
            page,
            "document.getElementById('status').textContent === 'connected'",
            timeout_ms=PLAYWRIGHT_CONFIG.PAGE_LOAD_TIMEOUT_MS,
        )
        driver.wait_registered(SESSION, after=peers_before, timeout=5)
        assert driver.result(SESSION, request_id, nth=2)["output"] == 13
        # Delivered again after the reload: the stored result, the tool does not run.
        driver.start_invoke(SESSION, "add", {"a": 6, "b": 7}, request_id=request_id, attempt=2)
        assert driver.result(SESSION, request_id, nth=3)["output"] == 13
        assert runs(page, "add") == 0
    finally:
        driver.held_acks.discard(SESSION)
