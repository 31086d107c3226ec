"""Browser settings for the test suite and the demo driver: one place, read by tests/conftest.py.

Chromium comes from Debian (`apt-get install chromium`), never from `playwright install`,
which downloads a browser build and fails on a machine without network.
"""

from __future__ import annotations

import os

EXECUTABLE_PATH = os.environ.get("CLIENTTOOLS_CHROMIUM", "/usr/bin/chromium")
LAUNCH_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
# Pyodide + pydantic cold start takes 5-7 s here; leave room for a loaded machine.
PAGE_LOAD_TIMEOUT_MS = 60_000
ACTION_TIMEOUT_MS = 15_000
BASE_HOST = "127.0.0.1"


def launch_options() -> dict[str, object]:
    """Keyword arguments for `playwright.chromium.launch()`."""
    return {"executable_path": EXECUTABLE_PATH, "args": LAUNCH_ARGS, "headless": True}
