"""Fixtures: the real server (uvicorn in-process on 127.0.0.1, port 0) and fake browsers."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

# The harness sits next to this file; pytest's import mode may not put this
# directory on sys.path, and tests/ is not a package.
sys.path.insert(0, str(Path(__file__).parent))
from server_harness import ChunkCollector, FakeBrowser, settled

from clienttools_server.app import RunningServer, running_server
from clienttools_server.clock import SYSTEM_CLOCK
from clienttools_server.config import ServerConfig

StartServer = Callable[..., Awaitable[RunningServer]]
OpenBrowser = Callable[..., Awaitable[FakeBrowser]]


@pytest.fixture(scope="session")
def chunk_collector() -> Iterator[ChunkCollector]:
    """Collects every chunk of the session; at the end ONE node run validates them all."""
    collector = ChunkCollector()
    yield collector
    if not collector.responses:
        return
    code, output = collector.validate_with_node()
    if code != 0:
        pytest.fail(f"chunks failed the ai package's uiMessageChunkSchema:\n{output}")


@pytest.fixture
async def start_server() -> AsyncIterator[StartServer]:
    async with contextlib.AsyncExitStack() as stack:

        async def start(**overrides: Any) -> RunningServer:
            options: dict[str, Any] = {"port": 0, "log_level": "warning"}
            options.update(overrides)
            model = options.pop("model_object", None)
            clock = options.pop("clock", SYSTEM_CLOCK)
            return await stack.enter_async_context(
                running_server(ServerConfig(**options), model=model, clock=clock)
            )

        yield start


@pytest.fixture
async def server(start_server: StartServer) -> RunningServer:
    return await start_server()


@pytest.fixture
async def open_browser(chunk_collector: ChunkCollector) -> AsyncIterator[OpenBrowser]:
    opened: list[FakeBrowser] = []

    async def open_(
        server: RunningServer,
        session: str = "s1",
        *,
        token: str | None = None,
        origin: str | None = None,
    ) -> FakeBrowser:
        browser = await FakeBrowser.connect(
            server.ws_url(session, token), chunk_collector, origin=origin
        )
        opened.append(browser)
        return browser

    yield open_
    for browser in opened:
        await browser.close()
    violations = [v for b in opened for v in b.violations]
    assert not violations, violations


@pytest.fixture
async def tab(server: RunningServer, open_browser: OpenBrowser) -> FakeBrowser:
    return await open_browser(server)


__all__ = ["settled"]
