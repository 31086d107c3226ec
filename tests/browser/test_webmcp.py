"""Page tools on `document.modelContext` (WebMCP), in real Chromium with the polyfill.

Both flavours (webmcp.html: Pyodide, webmcp_mpy.html: MicroPython) register the same
tools on a server (a real WebSocket peer) and on document.modelContext, plus a second
client with no server at all. The test is the browser's agent: it lists and calls
the tools through the polyfill's testing API (`navigator.modelContextTesting`) and
`document.modelContext.getTools()`. One page load per flavour serves the module; the
last test closes the clients.
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
from tests.support.static import StaticServer

pytestmark = pytest.mark.browser
SESSION = "webmcp-tests"
#: The console warnings of the module's page.
WARNINGS: list[str] = []
FLAVOUR_PAGES = {"pyodide": "webmcp.html", "micropython": "webmcp_mpy.html"}


@pytest.fixture(scope="module", params=list(FLAVOUR_PAGES))
def flavour(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def driver(flavour: str) -> Iterator[ToolDriver]:
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
    page.on("console", lambda m: WARNINGS.append(m.text) if m.type == "warning" else None)
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
    deadline = time.monotonic() + timeout_ms / 1000
    while not page.evaluate(expression):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{expression!r} still false after {timeout_ms:g} ms")
        time.sleep(0.02)


def state(page: Page) -> dict[str, Any]:
    return json.loads(page.evaluate("window.webmcpState()"))  # type: ignore[no-any-return]


def listed(page: Page) -> dict[str, dict[str, Any]]:
    """The polyfill's testing API's list: name -> {description, inputSchema (parsed)}."""
    tools = page.evaluate("navigator.modelContextTesting.listTools()")
    return {
        t["name"]: {"description": t["description"], "inputSchema": json.loads(t["inputSchema"])}
        for t in tools
    }


def call(page: Page, name: str, arguments: object) -> dict[str, Any]:
    """A call as the browser's agent makes it; the CallToolResult it gets."""
    text = page.evaluate(
        "([name, input]) => navigator.modelContextTesting.executeTool(name, input)",
        [name, json.dumps(arguments)],
    )
    return json.loads(text)  # type: ignore[no-any-return]


def error_of(result: dict[str, Any]) -> dict[str, Any]:
    assert result["isError"] is True, result
    error = result["structuredContent"]["error"]
    assert json.loads(result["content"][0]["text"]) == error  # the same error, readable as text
    return error  # type: ignore[no-any-return]


def test_tools_are_listed_with_their_schemas(page: Page, flavour: str) -> None:
    tools = listed(page)
    assert {"add", "page_info", "refuse", "big_text", "nap", "count_up", "temporary"} <= set(tools)
    assert tools["add"]["description"] == "Add two integers."
    schema = tools["add"]["inputSchema"]
    assert schema["type"] == "object"
    assert schema["required"] == ["a", "b"]
    assert schema["properties"]["a"]["type"] == "integer"
    assert schema["additionalProperties"] is False
    # WebMCP refuses an empty description: a tool without one is described by its name.
    assert tools["no_docstring"]["description"] == "no_docstring"
    # needs_approval: not offered to the browser's agent, unless the client says so.
    assert "delete_everything" not in tools
    assert "standalone_confirm" in tools
    # The client with no server offers its tool too.
    assert tools["standalone_echo"]["description"].startswith("Echo the text")
    annotations = {
        t["name"]: t["annotations"]
        for t in page.evaluate(
            "document.modelContext.getTools().then(ts => ts.map("
            "t => ({name: t.name, annotations: t.annotations})))"
        )
    }
    assert annotations["add"]["readOnlyHint"] is True
    assert annotations["standalone_echo"]["readOnlyHint"] is True
    assert annotations["page_info"]["readOnlyHint"] is False


def test_clients_made_before_the_polyfill_wait_for_it(page: Page, flavour: str) -> None:
    if flavour != "pyodide":
        pytest.skip("webmcp_mpy.html loads the polyfill first; webmcp.html after its clients")
    before = page.evaluate("window.beforePolyfill")
    assert before["available"] is False
    assert before["registered"] == {"client": [], "standalone": []}
    assert before["proxies"]["client"] == [1, 0]  # the listener for the polyfill
    assert "add" in state(page)["registered"]["client"]


def test_a_call_runs_the_python_function(page: Page) -> None:
    before = state(page)["runs"].get("add", 0)
    assert call(page, "add", {"a": 2, "b": 3}) == {
        "content": [{"type": "text", "text": "5"}],
        "isError": False,
    }
    assert state(page)["runs"]["add"] == before + 1
    info = call(page, "page_info", {"selector": "#title"})
    assert info["isError"] is False
    expected = {"title": "clienttools WebMCP test page", "text": "Hello from the page"}
    if "MicroPython" in page.title():
        expected["title"] = "clienttools WebMCP test page (MicroPython)"
    assert info["structuredContent"] == expected
    assert json.loads(info["content"][0]["text"]) == expected
    # A string is its own text; the client with no server answers as well.
    assert call(page, "standalone_echo", {"text": "hi"})["content"] == [
        {"type": "text", "text": "hi"}
    ]


def test_async_tools_and_their_context(page: Page) -> None:
    assert call(page, "nap", {"seconds": 0.05})["content"][0]["text"] == "0.05"
    result = call(page, "count_up", {"steps": 3})["structuredContent"]
    # Progress is checked and kept, and goes nowhere: no server waits for it.
    assert result["attempt"] == 1 and result["last"] == 3
    assert result["requestId"].startswith("webmcp-")
    timed_out = error_of(call(page, "wait_forever", {}))
    assert timed_out["code"] == "timeout"


def test_invalid_input_is_a_readable_error_and_the_tool_does_not_run(page: Page) -> None:
    before = state(page)["runs"].get("add", 0)
    error = error_of(call(page, "add", {"a": "one", "b": 2}))
    assert error["code"] == "invalid_input"
    assert "invalid input for tool 'add'" in error["message"]
    assert [e["loc"] for e in error["data"]] == [["a"]]
    assert error_of(call(page, "add", {"a": 1}))["code"] == "invalid_input"
    assert error_of(call(page, "add", [1, 2]))["code"] == "invalid_input"
    assert state(page)["runs"].get("add", 0) == before


def test_raised_errors_are_readable(page: Page) -> None:
    refused = error_of(call(page, "refuse", {"message": "not now"}))
    assert refused == {"code": "tool_error", "message": "not now", "data": {"retry": False}}
    crashed = error_of(call(page, "crash", {"message": "boom"}))
    assert crashed == {"code": "tool_error", "message": "boom", "data": {"exception": "ValueError"}}


def test_an_oversize_result_is_a_readable_error(page: Page) -> None:
    error = error_of(call(page, "big_text", {"size": 1_100_000}))
    assert error["code"] == "output_too_large"
    assert error["data"] == {"size": 1_100_002}
    assert "over the 1000000-byte limit" in error["message"]
    assert call(page, "big_text", {"size": 10})["content"][0]["text"] == "x" * 10


def test_the_server_and_the_browsers_agent_call_the_same_function_at_once(
    page: Page, driver: ToolDriver
) -> None:
    before = state(page)["runs"].get("nap", 0)
    request_id = driver.start_invoke(SESSION, "nap", {"seconds": 0.5})
    wait_for(page, f"JSON.parse(window.webmcpState()).runs.nap === {before + 1}")
    # While the server's call sleeps, the browser's agent calls the same tool.
    page.evaluate(
        "window.agentCall = navigator.modelContextTesting.executeTool("
        "'nap', JSON.stringify({seconds: 0.3}))"
    )
    assert json.loads(page.evaluate("window.agentCall"))["content"][0]["text"] == "0.3"
    assert driver.result(SESSION, request_id)["output"] == 0.5
    assert state(page)["runs"]["nap"] == before + 2  # once each
    # And the server's calls see the same validation.
    assert driver.invoke(SESSION, "add", {"a": "x", "b": 1})["error"]["code"] == "invalid_input"


def test_a_removed_tool_disappears(page: Page, driver: ToolDriver) -> None:
    assert call(page, "temporary", {})["content"][0]["text"] == "here"
    page.evaluate("window.removeTool('temporary')")
    wait_for(
        page,
        "!navigator.modelContextTesting.listTools().some(t => t.name === 'temporary')",
    )
    assert "temporary" not in state(page)["registered"]["client"]
    assert "add" in listed(page)
    # The server was told as well.
    tools_frames = driver.frames(SESSION, "cf_agent_client_tools")
    assert "temporary" not in {t["name"] for t in tools_frames[-1]["tools"]}


def test_in_a_worker_webmcp_fails_at_once_and_says_why(page: Page, flavour: str) -> None:
    if flavour != "pyodide":
        pytest.skip("the worker runs Pyodide; both flavours share main_thread_document")
    message = page.evaluate(
        """() => new Promise((resolve, reject) => {
            const worker = new Worker("/webmcp_worker.mjs", {type: "module"});
            worker.onmessage = (event) => { worker.terminate(); resolve(event.data); };
            worker.onerror = (event) => reject(new Error(event.message));
        })"""
    )
    assert message.startswith("WebMCPUnavailable: "), message
    assert "not in a worker" in message


def test_the_loader_fetches_the_polyfill_only_without_a_native_context(
    browser: Browser, static_server: StaticServer, page: Page
) -> None:
    # `page` (either flavour) had no native context: the loader fetched the polyfill.
    assert "/webmcp/polyfill/index.js" in static_server.requests
    context = browser.new_context()
    native_page = context.new_page()
    try:
        before = len(static_server.requests)
        native_page.goto(f"{static_server.url}/webmcp_native.html")
        wait_for(native_page, "document.getElementById('status').textContent === 'ready'")
        assert native_page.evaluate("document.modelContext.native") is True
        assert native_page.evaluate("navigator.modelContextTesting === undefined") is True
        fetched = static_server.requests[before:]
        assert "/webmcp/polyfill.mjs?native-test" in fetched
        assert [path for path in fetched if "/webmcp/polyfill/" in path] == []
    finally:
        context.close()


def test_a_refused_registration_is_a_warning_and_the_first_one_stays(page: Page) -> None:
    WARNINGS.clear()
    page.evaluate("window.addDuplicate()")
    expected = "clienttools: tool 'add' was not registered on document.modelContext"
    deadline = time.monotonic() + 10
    while not any(expected in w for w in WARNINGS) and time.monotonic() < deadline:
        page.wait_for_timeout(20)
    assert any("Tool already registered: add" in w for w in WARNINGS), WARNINGS
    assert "add" not in state(page)["registered"]["standalone"]
    assert call(page, "add", {"a": 2, "b": 2})["content"][0]["text"] == "4"
    assert listed(page)["add"]["description"] == "Add two integers."


def test_close_aborts_every_registration_and_destroys_every_proxy(page: Page) -> None:
    # Last in the module: it closes the clients.
    page.evaluate("window.closeClients()")
    wait_for(page, "navigator.modelContextTesting.listTools().length === 0")
    observed = state(page)
    assert observed["registered"] == {"client": [], "standalone": []}
    for created, destroyed in observed["proxies"].values():
        assert created > 0
        assert created == destroyed, observed
