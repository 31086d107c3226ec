"""Where a PyScript worker can keep the outbox: one write's time in each store.

A Pyodide worker writes one outbox text 300 times per store, each write complete
before the next: the page's sessionStorage through PyScript's proxy (synchronous,
a call to the page), IndexedDB puts awaited (three durabilities) and the origin
private file system's synchronous access handle (with and without flush). The
client uses the first (clienttools/worker.py); this is why.

    python -m bench.worker_store           # 3 page loads in one Chromium
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from playwright.sync_api import sync_playwright
from tests.support.static import StaticServer

from bench.browser import PAGE_LOAD_TIMEOUT_S, launch_options

PAGES_DIR = Path(__file__).resolve().parent / "pages"
WEB = Path(__file__).resolve().parent.parent / "build" / "web"


def measure(loads: int = 3) -> dict[str, list[list[float]]]:
    """Store -> per page load, that load's write times in ms."""
    static = StaticServer(
        {"/": PAGES_DIR, "/pyodide/": WEB / "pyodide", "/pyscript/": WEB / "pyscript"}
    ).start()
    results: dict[str, list[list[float]]] = {}
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(**launch_options())
            for _ in range(loads):
                context = browser.new_context()
                page = context.new_page()
                page.goto(f"{static.url}/worker_store.html")
                page.wait_for_function(
                    "document.getElementById('out').textContent.startsWith('{')",
                    timeout=PAGE_LOAD_TIMEOUT_S * 1000,
                )
                for store, samples in json.loads(page.text_content("#out") or "{}").items():
                    results.setdefault(store, []).append(samples)
                context.close()
            browser.close()
    finally:
        static.stop()
    return results


def _percentile(samples: list[float], percent: float) -> float:
    ordered = sorted(samples)
    return ordered[round(percent / 100 * (len(ordered) - 1))]


def markdown(results: dict[str, list[list[float]]]) -> str:
    lines = [
        "| store | write p50 (ms), per load | p90 (ms), per load |",
        "|---|---|---|",
    ]
    for store, loads in results.items():
        p50 = ", ".join(f"{_percentile(s, 50):.2f}" for s in loads)
        p90 = ", ".join(f"{_percentile(s, 90):.2f}" for s in loads)
        lines.append(f"| {store} | {p50} | {p90} |")
    medians = {s: statistics.median(_percentile(x, 50) for x in v) for s, v in results.items()}
    lines += [
        "",
        f"median p50 per store: {json.dumps({k: round(v, 2) for k, v in medians.items()})}",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(markdown(measure()))
