"""Conversations stored on the server, in the real page: the demo (PyScript) in Chromium.

One server process on a SQLite ledger serves the demo. A chat is sent, the
page reloaded while the answer streams (a page tool in the middle of its
work) and again after it: each time the conversation the page shows equals
the one before, tool parts included, and equals the server's stored one. A
second tab opened later shows the same conversation and sees the next turn
(sent from the first tab) arrive.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.request import urlopen

import pytest
from playwright.sync_api import Browser, BrowserContext, Page

from tests.conftest import PLAYWRIGHT_CONFIG, ROOT
from tests.support.server_process import ServerProcess

pytestmark = pytest.mark.browser

SESSION = "conv-browser"
LOAD_MS = PLAYWRIGHT_CONFIG.PAGE_LOAD_TIMEOUT_MS
WAIT_MS = 60_000


@pytest.fixture(scope="module")
def server(web_build: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("conversations")
    process = ServerProcess(
        ["--db", str(tmp / "ledger.sqlite3"), "--static", str(ROOT / "demo"),
         "--static", str(web_build)],
        log=tmp / "server.log",
    )  # fmt: skip
    process.start()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def context(browser: Browser) -> Iterator[BrowserContext]:
    context = browser.new_context()
    yield context
    context.close()


def _open(context: BrowserContext, server: ServerProcess) -> Page:
    page = context.new_page()
    page.goto(f"{server.url}/?session={SESSION}", timeout=LOAD_MS)
    _ready(page)
    return page


def _ready(page: Page) -> None:
    page.wait_for_function("document.body.dataset.app === 'ready'", timeout=LOAD_MS)


def _messages(page: Page) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = json.loads(page.evaluate("window.demoMessages()"))
    return messages


def _stored(server: ServerProcess) -> list[dict[str, Any]]:
    with urlopen(f"{server.url}/chats/{SESSION}", timeout=10) as reply:
        messages: list[dict[str, Any]] = json.loads(reply.read())["messages"]
        return messages


def _idle_with(page: Page, count: int, text: str) -> None:
    """Wait until the chat is ready and its last (assistant) message holds ``text``."""
    page.wait_for_function(
        """([count, text]) => {
            if (document.getElementById('chat-status').dataset.state !== 'ready') return false;
            const messages = JSON.parse(window.demoMessages());
            if (messages.length !== count) return false;
            const last = messages[messages.length - 1];
            return last.role === 'assistant' && last.parts.some(
                (p) => p.type === 'text' && p.text.includes(text));
        }""",
        arg=[count, text],
        timeout=WAIT_MS,
    )


def _send(page: Page, prompt: str) -> None:
    page.wait_for_function("!document.getElementById('send').disabled", timeout=WAIT_MS)
    page.fill("#prompt", prompt)
    page.click("#send")


def test_reloads_and_a_second_tab_show_the_stored_conversation(
    context: BrowserContext, server: ServerProcess
) -> None:
    page = _open(context, server)
    _send(page, "call get_timezone {}")
    _idle_with(page, 2, "get_timezone ->")
    first_turn = _messages(page)
    assert first_turn == _stored(server)

    # Reload while a page tool runs in the middle of the answer.
    _send(page, 'call long_task {"steps": 20, "step_ms": 150}')
    page.wait_for_selector(".card[data-tool='long_task'][data-progress]", timeout=WAIT_MS)
    page.reload(timeout=LOAD_MS)
    _ready(page)
    _idle_with(page, 4, "long_task ->")
    after_mid_reload = _messages(page)
    assert after_mid_reload[:2] == first_turn
    assert [m["role"] for m in after_mid_reload] == ["user", "assistant", "user", "assistant"]
    assert len({m["id"] for m in after_mid_reload}) == 4  # no duplicate of the streamed one
    [tool] = [p for p in after_mid_reload[3]["parts"] if p["type"] == "tool-long_task"]
    assert tool["state"] == "output-available" and tool["output"]["steps"] == 20
    assert after_mid_reload == _stored(server)

    # Reload after the answer: the same conversation, tool parts included.
    page.reload(timeout=LOAD_MS)
    _ready(page)
    page.wait_for_function("JSON.parse(window.demoMessages()).length === 4", timeout=WAIT_MS)
    assert _messages(page) == after_mid_reload
    assert page.locator(".card[data-tool='long_task']").count() == 1

    # A second tab opened later shows it, then sees the next turn arrive.
    second = _open(context, server)
    second.wait_for_function("JSON.parse(window.demoMessages()).length === 4", timeout=WAIT_MS)
    assert _messages(second) == after_mid_reload
    _send(page, "call server_time {}")
    _idle_with(page, 6, "server_time ->")
    _idle_with(second, 6, "server_time ->")
    assert _messages(second) == _messages(page) == _stored(server)
