"""examples/http_chat.html in Chromium: the `ai` package's AbstractChat (the esbuild bundle)
over DefaultChatTransport, and the same session's tools in Python (PyScript).

Served by the reference server as a real process. One turn is one POST whose
response carries the page tool's call and output before the answer; a response
whose fetch is stopped keeps running and ``chat.resumeStream()`` gets all of it;
the page's Stop button aborts the run itself (its tool is cancelled, nothing is
left to resume). Every response body is checked by the `ai` package in Node.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, Request

from tests.browser.test_examples import EXAMPLES, fenced_html_blocks
from tests.conftest import PLAYWRIGHT_CONFIG, ROOT
from tests.support.server_process import ServerProcess

pytestmark = pytest.mark.browser

API = "/agents/chat/shopping"
# Records every status the page shows: the chat's status must not flicker while tools run.
WATCH_STATUS = """() => {
  window.shownStatuses = [];
  new MutationObserver(() => {
    window.shownStatuses.push(document.getElementById('chat-status').textContent);
  }).observe(document.getElementById('chat-status'), {childList: true, characterData: true,
                                                      subtree: true});
}"""


@pytest.fixture(scope="module")
def server(web_build: Path) -> Iterator[ServerProcess]:
    process = ServerProcess(["--static", str(EXAMPLES), "--static", str(web_build)]).start()
    yield process
    process.stop()


@pytest.fixture
def page(browser: Browser, server: ServerProcess) -> Iterator[Page]:
    context = browser.new_context()
    page = context.new_page()
    try:
        page.goto(f"{server.url}/http_chat.html")
        page.wait_for_function(
            "document.getElementById('status').textContent === 'connected'",
            timeout=PLAYWRIGHT_CONFIG.PAGE_LOAD_TIMEOUT_MS,
        )
        yield page
    finally:
        context.close()


def chunks_of(body: bytes) -> list[dict[str, Any]]:
    blocks = body.decode().split("\n\n")
    assert blocks[-2:] == ["data: [DONE]", ""], blocks[-3:]
    return [json.loads(b.removeprefix("data: ")) for b in blocks[:-2] if b != ": keep-alive"]


def validate_with_node(responses: list[list[dict[str, Any]]], tmp_path: Path) -> None:
    batch = [{"id": str(i), "complete": True, "chunks": c} for i, c in enumerate(responses)]
    path = tmp_path / "responses.json"
    path.write_text(json.dumps(batch))
    done = subprocess.run(
        ["node", str(ROOT / "tests" / "node" / "chunk_schema.mjs"), str(path)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def last_tool_state(page: Page) -> str | None:
    state: str | None = page.evaluate(
        """() => {
          const message = chat.messages.at(-1);
          if (!message || message.role !== 'assistant') return null;
          const part = message.parts.find((p) => p.type.startsWith('tool-'));
          return part ? part.state : null;
        }"""
    )
    return state


def test_a_use_chat_page_over_http_with_python_tools(
    page: Page, server: ServerProcess, tmp_path: Path
) -> None:
    requests: list[Request] = []
    page.on("requestfinished", lambda r: requests.append(r) if API in r.url else None)
    failed: list[str] = []
    page.on("requestfailed", lambda r: failed.append(r.url) if API in r.url else None)
    page.evaluate(WATCH_STATUS)

    # One turn: one POST, one response, the tool's output before the answer.
    page.fill("#prompt", 'call add_item {"name": "milk"}')
    page.click("#send")
    page.wait_for_function("chat.status === 'ready' && chat.messages.length === 2")
    assert page.text_content("#items li") == "milk"
    messages = page.evaluate("chat.messages")
    parts = messages[1]["parts"]
    [tool] = [p for p in parts if p["type"] == "tool-add_item"]
    assert (tool["state"], tool["output"]) == ("output-available", 1)
    text = next(p for p in parts if p["type"] == "text")
    assert parts.index(tool) < parts.index(text)
    assert parts[-1]["text"] == "add_item -> 1"
    shown = page.evaluate("window.shownStatuses")
    changes = [s for i, s in enumerate(shown) if i == 0 or shown[i - 1] != s]
    assert changes == ["submitted", "streaming", "ready"], shown
    posts = [r for r in requests if r.method == "POST"]
    assert len(posts) == 1
    first = posts[0].response()
    assert first is not None
    assert first.headers["x-vercel-ai-ui-message-stream"] == "v1"
    responses = [chunks_of(first.body())]

    # The fetch stopped while the tool runs: the run goes on; resumeStream() gets it all.
    page.evaluate("""() => { chat.sendMessage({text: 'call check_pantry {"item": "eggs"}'}); }""")
    page.wait_for_function("chat.messages.length === 4")
    page.wait_for_function(
        """chat.messages.at(-1).parts.some(
             (p) => p.type === 'tool-check_pantry' && p.state === 'input-available')"""
    )
    page.evaluate("() => { chat.stop(); }")
    page.wait_for_function("chat.status === 'ready'")
    assert last_tool_state(page) == "input-available"
    page.wait_for_timeout(100)
    assert [url for url in failed if url.endswith(API)], failed  # the fetch was aborted
    page.evaluate("() => { chat.resumeStream(); }")
    page.wait_for_function(
        "chat.status === 'ready' && chat.messages.at(-1).parts.at(-1).type === 'text'"
    )
    messages = page.evaluate("chat.messages")
    assert len(messages) == 4  # the resumed response rebuilt the same message
    answer = messages[3]["parts"]
    [pantry] = [p for p in answer if p["type"] == "tool-check_pantry"]
    assert pantry["output"] == {"item": "eggs", "inPantry": False}
    assert answer[-1]["text"] == 'check_pantry -> {"inPantry":false,"item":"eggs"}'
    gets = [r for r in requests if r.method == "GET" and r.url.endswith("/stream")]
    resumed = gets[-1].response()
    assert resumed is not None and resumed.status == 200
    responses.append(chunks_of(resumed.body()))
    assert responses[-1][0]["type"] == "start"  # from the response's first chunk

    # Stop for real: the abort route stops the run and cancels the page's tool.
    page.evaluate("""() => { chat.sendMessage({text: 'call check_pantry {"item": "flour"}'}); }""")
    page.wait_for_function("chat.messages.length === 6")
    page.wait_for_function(
        """chat.messages.at(-1).parts.some(
             (p) => p.type === 'tool-check_pantry' && p.state === 'input-available')"""
    )
    with page.expect_response(lambda r: r.url.endswith("/abort")) as aborted:
        page.click("#stop")
    assert aborted.value.json() == {"aborted": True}
    status = page.evaluate(f"fetch('{API}/shopping-list/stream').then((r) => r.status)")
    assert status == 204
    executions = page.evaluate("fetch('/executions?session=shopping').then((r) => r.json())")
    newest = executions["executions"][0]
    assert newest["status"] == "error" and newest["pending"] == [], newest
    assert page.text_content("#status") == "connected"  # the tools' page is unharmed
    validate_with_node(responses, tmp_path)


def test_docs_show_the_page_verbatim() -> None:
    blocks = fenced_html_blocks((ROOT / "docs" / "agents.md").read_text())
    assert (EXAMPLES / "http_chat.html").read_text() in blocks
