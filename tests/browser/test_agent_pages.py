"""The pydantic-ai loop with a PyScript page in Chromium: TestModel, and two calls in parallel.

The page is examples/pyscript.html, served by a real server process; a CPython
chat peer on its session sends one message, and the page's tools are called
inside the one response that answers it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page

from tests.browser.test_examples import EXAMPLES, chat, text_of
from tests.conftest import PLAYWRIGHT_CONFIG
from tests.support.server_process import ServerProcess

pytestmark = pytest.mark.browser


def _served(web_build: Path, *args: str) -> ServerProcess:
    return ServerProcess(["--static", str(EXAMPLES), "--static", str(web_build), *args]).start()


@pytest.fixture
def open_page(browser: Browser) -> Iterator[object]:
    contexts = []

    def open_(server: ServerProcess) -> Page:
        context = browser.new_context()
        contexts.append(context)
        page = context.new_page()
        page.goto(f"{server.url}/pyscript.html")
        page.wait_for_function(
            "document.getElementById('status').textContent === 'connected'",
            timeout=PLAYWRIGHT_CONFIG.PAGE_LOAD_TIMEOUT_MS,
        )
        return page

    yield open_
    for context in contexts:
        context.close()


def test_test_model_calls_the_pyscript_pages_tools(web_build: Path, open_page: object) -> None:
    server = _served(web_build, "--model", "test")
    try:
        open_page(server)  # type: ignore[operator]
        chunks = chat(server, "example", "hello")
    finally:
        server.stop()
    types = [c["type"] for c in chunks]
    called = {c["toolName"] for c in chunks if c["type"] == "tool-input-available"}
    assert {"page_title", "add_note"} <= called
    assert types.index("tool-input-available") < types.index("tool-output-available")
    assert types.index("tool-output-available") < max(
        i for i, t in enumerate(types) if t == "text-delta"
    )


def test_two_calls_in_parallel_on_the_pyscript_page(web_build: Path, open_page: object) -> None:
    server = _served(web_build, "--agent", "tests.server.loop_agents:notes")
    try:
        page = open_page(server)  # type: ignore[operator]
        chunks = chat(server, "example", "add milk")
        assert page.text_content("#notes li") == "milk"
    finally:
        server.stop()
    types = [c["type"] for c in chunks]
    inputs = [i for i, t in enumerate(types) if t == "tool-input-available"]
    outputs = [i for i, t in enumerate(types) if t == "tool-output-available"]
    assert len(inputs) == 2 and len(outputs) == 2 and max(inputs) < min(outputs)
    assert text_of(chunks) == "The page is My notes; note 1 added."
