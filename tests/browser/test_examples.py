"""The examples in docs/client.md run: each page loads, connects, and the agent calls its tools.

The pages are the files in examples/, served by the reference server as a real
process; the docs must contain them verbatim, so the docs cannot drift from what
is tested. A CPython chat peer on the same session asks the scripted model to
call the page's tools, and the answers come back in one response.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser
from websockets.sync.client import connect

from tests.conftest import PLAYWRIGHT_CONFIG, ROOT
from tests.support.server_process import ServerProcess

pytestmark = pytest.mark.browser
EXAMPLES = ROOT / "examples"


@pytest.fixture(scope="module")
def server(web_build: Path) -> Iterator[ServerProcess]:
    process = ServerProcess(["--static", str(EXAMPLES), "--static", str(web_build)]).start()
    yield process
    process.stop()


def chat(server: ServerProcess, session: str, text: str) -> list[dict[str, Any]]:
    """Send one user message; return the chunks of the response, checking it is one stream."""
    request_id = secrets.token_hex(8)
    message = {
        "id": secrets.token_hex(8),
        "role": "user",
        "parts": [{"type": "text", "text": text}],
    }
    frame: dict[str, Any] = {
        "type": "send",
        "requestId": request_id,
        "id": session,
        "trigger": "submit-message",
        "messages": [message],
        "headers": {},
        "body": {},
        "metadata": None,
    }
    chunks: list[dict[str, Any]] = []
    with connect(server.ws_url(session), open_timeout=10) as ws:
        ws.send(json.dumps(frame))
        while True:
            received = json.loads(ws.recv(timeout=30))
            if received.get("requestId") != request_id:
                continue
            if received["type"] == "chunk":
                assert received["sequence"] == len(chunks)
                chunks.append(received["chunk"])
            elif received["type"] in ("end", "error"):
                assert received["type"] == "end", received
                return chunks


def text_of(chunks: list[dict[str, Any]]) -> str:
    return "".join(c["delta"] for c in chunks if c["type"] == "text-delta")


def fenced_html_blocks(markdown: str) -> list[str]:
    return re.findall(r"```html\n(.*?)```", markdown, flags=re.DOTALL)


def test_docs_show_the_example_files_verbatim() -> None:
    blocks = fenced_html_blocks((ROOT / "docs" / "client.md").read_text())
    for name in ("pyscript.html", "pyodide.html", "micropython.html", "worker.html", "webmcp.html"):
        assert (EXAMPLES / name).read_text() in blocks, (
            f"docs/client.md does not show examples/{name}"
        )


@pytest.mark.parametrize("page_name", ["pyscript.html", "pyodide.html", "micropython.html"])
def test_example_page_answers_the_agent(
    browser: Browser, server: ServerProcess, page_name: str
) -> None:
    context = browser.new_context()
    page = context.new_page()
    try:
        page.goto(f"{server.url}/{page_name}")
        page.wait_for_function(
            "document.getElementById('status').textContent === 'connected'",
            timeout=PLAYWRIGHT_CONFIG.PAGE_LOAD_TIMEOUT_MS,
        )
        chunks = chat(
            server, "example", 'call page_title {}\ncall add_note {"text": "<b>milk</b>"}'
        )
        types = [c["type"] for c in chunks]
        assert types.index("tool-input-available") < types.index("tool-output-available")
        reply = text_of(chunks)
        assert 'page_title -> "My notes"' in reply
        assert "add_note -> 1" in reply
        assert page.text_content("#notes li") == "<b>milk</b>"  # shown as text, not HTML
        refused = text_of(chat(server, "example", 'call add_note {"text": "  "}'))
        assert "add_note failed: tool_error: a note needs some text" in refused
    finally:
        context.close()


def test_worker_example_computes_off_the_main_thread_and_touches_the_dom(
    browser: Browser, server: ServerProcess
) -> None:
    context = browser.new_context()
    page = context.new_page()
    try:
        page.goto(f"{server.url}/worker.html")
        page.wait_for_function(
            "document.getElementById('status').textContent === 'connected'",
            timeout=PLAYWRIGHT_CONFIG.PAGE_LOAD_TIMEOUT_MS,
        )
        # The main thread's longest task while the worker computes (Chromium's longtask
        # entries are tasks over 50 ms).
        page.evaluate(
            """window.longest = 0;
            new PerformanceObserver((list) => {
              for (const entry of list.getEntries())
                window.longest = Math.max(window.longest, entry.duration);
            }).observe({ type: "longtask" });"""
        )
        chunks = chat(
            server,
            "example",
            'call count_primes {"below": 5000000}\ncall add_note {"text": "<b>milk</b>"}',
        )
        reply = text_of(chunks)
        assert "count_primes -> 348513" in reply
        assert "add_note -> 1" in reply
        assert page.text_content("#notes li") == "<b>milk</b>"  # shown as text, not HTML
        assert page.evaluate("window.longest") < 50
        refused = text_of(chat(server, "example", 'call count_primes {"below": 1}'))
        assert "count_primes failed: tool_error: below must be between" in refused
    finally:
        context.close()


def test_worker_example_without_cross_origin_isolation_connects_and_says_what_is_missing(
    browser: Browser, web_build: Path
) -> None:
    # As docs/client.md says: the connection, a tool that does not touch the page and
    # the status export still work, and the console has clienttools' one error.
    process = ServerProcess(
        ["--static", str(EXAMPLES), "--static", str(web_build), "--no-cross-origin-isolation"]
    ).start()
    context = browser.new_context()
    page = context.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    try:
        page.goto(f"{process.url}/worker.html")
        page.wait_for_function(
            "document.getElementById('status').textContent === 'connected'",
            timeout=PLAYWRIGHT_CONFIG.PAGE_LOAD_TIMEOUT_MS,
        )
        assert page.evaluate("crossOriginIsolated") is False
        reply = text_of(chat(process, "example", 'call count_primes {"below": 1000}'))
        assert "count_primes -> 168" in reply
        ours = [e for e in errors if "clienttools: this page is not cross-origin isolated" in e]
        assert len(ours) == 1, errors
        assert [e for e in errors if "Failed to load resource" not in e] == ours, errors
    finally:
        context.close()
        process.stop()


def test_webmcp_example_serves_the_server_and_the_browsers_agent(
    browser: Browser, server: ServerProcess
) -> None:
    context = browser.new_context()
    page = context.new_page()
    try:
        page.goto(f"{server.url}/webmcp.html")
        page.wait_for_function(
            "document.getElementById('status').textContent === 'connected'",
            timeout=PLAYWRIGHT_CONFIG.PAGE_LOAD_TIMEOUT_MS,
        )
        reply = text_of(chat(server, "example", 'call add_note {"text": "from the server"}'))
        assert "add_note -> 1" in reply
        # The browser's agent, as it uses document.modelContext (the polyfill here).
        tools = page.evaluate(
            "document.modelContext.getTools().then(ts => ts.map(t => ({"
            "name: t.name, readOnly: t.annotations.readOnlyHint})))"
        )
        assert tools == [
            {"name": "add_note", "readOnly": False},
            {"name": "page_title", "readOnly": True},
        ]  # clear_notes needs the user's approval: not offered here
        result = page.evaluate(
            """async () => {
                const [tool] = (await document.modelContext.getTools())
                    .filter(t => t.name === "add_note");
                return JSON.parse(await document.modelContext.executeTool(
                    tool, JSON.stringify({text: "from the browser"})));
            }"""
        )
        assert result == {"content": [{"type": "text", "text": "2"}], "isError": False}
        assert page.text_content("#notes li:nth-child(2)") == "from the browser"
    finally:
        context.close()
