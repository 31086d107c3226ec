"""Figures 1-4: three pages in one Chromium, driven through the load generator process.

This process (the Playwright driver) only loads pages and reads memory; the
invokes and their clocks live in `bench.loadgen`, a separate process that it
commands over a pipe.

    with LoadGen() as loadgen, Browser(static_url, loadgen) as browser:
        page = browser.open("clienttools", "ct-1")        # loaded and connected
        loadgen.call("roundtrip", "ct-1", n=2000)
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from playwright.sync_api import BrowserContext, CDPSession, Page, sync_playwright

ROOT = Path(__file__).resolve().parent.parent
PAGE_LOAD_TIMEOUT_S = 90.0

#: Page name -> (file, query): the pages compared, plus the cold-start baseline.
PAGES = {
    "rawjs": ("rawjs.html", ""),
    "bare": ("bare.html", ""),
    "pydantic": ("bare.html", "&pydantic=1"),
    "clienttools": ("clienttools.html", ""),
    "micropython": ("micropython.html", ""),
}
PYTHON_PAGES = frozenset({"bare", "pydantic", "clienttools"})


def launch_options() -> dict[str, Any]:
    """playwright.config.py's launch options: Debian's Chromium, never a downloaded one."""
    spec = importlib.util.spec_from_file_location(
        "playwright_config", ROOT / "playwright.config.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    options: dict[str, Any] = module.launch_options()
    return options


class LoadGen:
    """The `python -m bench.loadgen` subprocess and its command pipe."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bench.loadgen"],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        ready = self._read()
        self.port = int(ready["port"])

    def url(self, session: str) -> str:
        return f"ws://127.0.0.1:{self.port}/agents/chat/{session}"

    def call(self, op: str, session: str, **arguments: Any) -> dict[str, Any]:
        """Run one measurement in the load generator; raise if it failed."""
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"op": op, "session": session, **arguments}) + "\n")
        reply = self._read()
        if not reply.get("ok"):
            raise RuntimeError(f"loadgen {op} on {session} failed: {reply.get('error')}")
        if reply.get("errors"):
            raise RuntimeError(f"loadgen {op} on {session}: {reply['errors']} wrong results")
        return reply

    def _read(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the load generator exited ({self.process.poll()})")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def __enter__(self) -> LoadGen:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self.process.stdin is not None and self.process.poll() is None:
            try:
                self.process.stdin.write('{"op": "quit"}\n')
                self.process.stdin.close()
            except OSError:
                pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@dataclass
class LoadedPage:
    name: str
    session: str
    page: Page
    cdp: CDPSession
    # Milliseconds from navigation start to the first cf_agent_client_tools frame.
    tools_frame_ms: float
    marks: dict[str, float]


class Browser:
    """One Chromium for the whole benchmark; each page load gets a context we choose."""

    def __init__(self, static_url: str, loadgen: LoadGen) -> None:
        self.static_url = static_url
        self.loadgen = loadgen
        self._playwright = sync_playwright().start()
        self._browser = self._playwright.chromium.launch(**launch_options())

    def new_context(self) -> BrowserContext:
        """A fresh context: its own, empty HTTP cache, so its first load is a cold start."""
        return self._browser.new_context()

    def load(
        self, context: BrowserContext, name: str, session: str, page: Page | None = None
    ) -> LoadedPage:
        """Navigate (a new page, or `page` again) and wait until it registered with the loadgen."""
        page = page or context.new_page()
        file, query = PAGES[name]
        page.goto(
            f"{self.static_url}/{file}?ws={self.loadgen.url(session)}{query}",
            wait_until="commit",
            timeout=PAGE_LOAD_TIMEOUT_S * 1000,
        )
        page.wait_for_function(
            "window.__bench && (window.__bench.status !== 'loading' "
            "&& window.__bench.toolsFrameAt !== null || window.__bench.status === 'failed')",
            timeout=PAGE_LOAD_TIMEOUT_S * 1000,
            polling=20,
        )
        state = page.evaluate("({...window.__bench})")
        if state.get("status") == "failed":
            raise RuntimeError(f"page {name} failed to start: {state.get('error')}")
        self.loadgen.call("wait", session, timeout=PAGE_LOAD_TIMEOUT_S)
        return LoadedPage(
            name,
            session,
            page,
            context.new_cdp_session(page),
            float(state["toolsFrameAt"]),
            dict(state.get("marks") or {}),
        )

    def memory(self, loaded: LoadedPage) -> dict[str, float]:
        """JS heap in use and wasm linear memory, in bytes, after a full garbage collection."""
        if loaded.name in PYTHON_PAGES:
            # Python's cycles hold JS proxies; collect them before V8 looks.
            loaded.page.evaluate("window.pyodide.runPython('import gc; gc.collect()')")
        loaded.cdp.send("HeapProfiler.collectGarbage")
        heap = loaded.cdp.send("Runtime.getHeapUsage")
        wasm = float(loaded.page.evaluate("window.__bench.wasmBytes()"))
        objects = 0.0
        if loaded.name in PYTHON_PAGES:
            # Objects the cycle collector tracks: a leak of dicts, futures or tasks shows
            # here long before the wasm memory (which grows in big steps) moves.
            objects = float(
                loaded.page.evaluate("window.pyodide.runPython('import gc; len(gc.get_objects())')")
            )
        return {"js_heap": float(heap["usedSize"]), "wasm": wasm, "py_objects": objects}

    def close(self) -> None:
        self._browser.close()
        self._playwright.stop()

    def __enter__(self) -> Browser:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
