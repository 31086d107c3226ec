"""Tools on the page against tools in a PyScript worker: responsiveness, round trip, throughput.

Four pages in one Chromium, all `bench/pages/worker.html` with the same tools:
Pyodide and MicroPython, each on the page's main thread and in a PyScript
worker. Per page, in one run: a page tool that computes for 1 s (the page's
longest main-thread task, from `PerformanceObserver` longtask entries, and the
longest gap between `requestAnimationFrame` callbacks meanwhile), then the
round trip (sequential invokes of `add`) and the pipelined throughput, driven by
the load generator process as in bench/browser.py. Ratios are worker / main of
the same flavour within one run.

    python -m bench --only worker            # 3 runs
    python -m bench --only worker --quick    # one short run
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.static import StaticServer

from bench.browser import PAGE_LOAD_TIMEOUT_S, Browser, LoadGen

PAGES_DIR = Path(__file__).resolve().parent / "pages"
WEB = Path(__file__).resolve().parent.parent / "build" / "web"
#: Page name -> (flavour, in a worker).
PAGES = {
    "pyodide-main": ("py", False),
    "pyodide-worker": ("py", True),
    "micropython-main": ("mpy", False),
    "micropython-worker": ("mpy", True),
}


@dataclass(frozen=True)
class Settings:
    runs: int = 3
    roundtrip_n: int = 1000
    pipelined_n: int = 2000
    compute_s: float = 1.0


QUICK = Settings(runs=1, roundtrip_n=50, pipelined_n=100)


def measure(settings: Settings) -> dict[str, Any]:
    """Every page's figures per run, and their medians and worker/main ratios."""
    static = StaticServer(
        {
            "/": PAGES_DIR,
            "/pyodide/": WEB / "pyodide",
            "/pyscript/": WEB / "pyscript",
            "/micropython/": WEB / "micropython",
        },
        cache_seconds=3600,
    ).start()
    runs: list[dict[str, dict[str, float]]] = []
    try:
        with LoadGen() as loadgen, Browser(static.url, loadgen) as browser:
            for run in range(settings.runs):
                names = list(PAGES)
                names = names[run % len(names) :] + names[: run % len(names)]
                runs.append(
                    {name: _page(browser, name, f"{name}-{run}", settings) for name in names}
                )
    finally:
        static.stop()
    return {"settings": settings.__dict__, "runs": runs, "summary": _summary(runs)}


def _page(browser: Browser, name: str, session: str, settings: Settings) -> dict[str, float]:
    flavour, in_worker = PAGES[name]
    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(
            f"{browser.static_url}/worker.html?ws={browser.loadgen.url(session)}"
            f"&flavour={flavour}&worker={int(in_worker)}",
            timeout=PAGE_LOAD_TIMEOUT_S * 1000,
        )
        page.wait_for_function(
            "window.__bench.status === 'connected'", timeout=PAGE_LOAD_TIMEOUT_S * 1000
        )
        loadgen = browser.loadgen
        loadgen.call("wait", session, timeout=PAGE_LOAD_TIMEOUT_S)
        loadgen.call("roundtrip", session, n=20)  # warm: first-call caches, lazy validators
        page.evaluate("window.__responsiveness.start()")
        computed = loadgen.call(
            "call", session, tool="compute", input={"seconds": settings.compute_s}
        )
        seen = page.evaluate("window.__responsiveness.stop()")
        if "output" not in computed["result"]:
            raise RuntimeError(f"compute on {name} failed: {computed['result']}")
        roundtrip = loadgen.call("roundtrip", session, n=settings.roundtrip_n)
        pipelined = loadgen.call("pipelined", session, n=settings.pipelined_n)
        return {
            "compute_call_s": float(computed["elapsed_s"]),
            "longest_task_ms": float(seen["longestTaskMs"]),
            "max_frame_gap_ms": float(seen["maxFrameGapMs"]),
            "frames": float(seen["frames"]),
            "roundtrip_p50_us": float(roundtrip["p50_us"]),
            "roundtrip_p99_us": float(roundtrip["p99_us"]),
            "throughput_per_s": float(pipelined["per_s"]),
        }
    finally:
        context.close()


def _summary(runs: list[dict[str, dict[str, float]]]) -> dict[str, Any]:
    pages: dict[str, dict[str, list[float]]] = {}
    for run in runs:
        for name, figures in run.items():
            for key, value in figures.items():
                pages.setdefault(name, {}).setdefault(key, []).append(value)
    ratios: dict[str, dict[str, list[float]]] = {}
    for flavour in ("pyodide", "micropython"):
        for run in runs:
            main, worker = run[f"{flavour}-main"], run[f"{flavour}-worker"]
            entry = ratios.setdefault(flavour, {"roundtrip_p50": [], "throughput": []})
            entry["roundtrip_p50"].append(worker["roundtrip_p50_us"] / main["roundtrip_p50_us"])
            entry["throughput"].append(worker["throughput_per_s"] / main["throughput_per_s"])
    return {"pages": pages, "ratios": ratios}


def _span(values: list[float], digits: int = 0) -> str:
    median = statistics.median(values)
    if len(values) == 1:
        return f"{median:.{digits}f}"
    return f"{median:.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def markdown(result: dict[str, Any]) -> str:
    """The figures as tables: medians of the runs, the range in brackets."""
    pages = result["summary"]["pages"]
    lines = [
        "## Tools on the page against tools in a PyScript worker (bench/worker.py)",
        "",
        f"{len(result['runs'])} runs; median (min-max). A page tool computes for "
        f"{result['settings']['compute_s']:g} s; meanwhile the page's main thread:",
        "",
        "| page | longest main-thread task (ms) | longest gap between frames (ms) | "
        "round trip p50 (us) | p99 (us) | throughput (invokes/s) |",
        "|---|---|---|---|---|---|",
    ]
    for name in PAGES:
        f = pages[name]
        lines.append(
            f"| {name} | {_span(f['longest_task_ms'])} | {_span(f['max_frame_gap_ms'])} | "
            f"{_span(f['roundtrip_p50_us'])} | {_span(f['roundtrip_p99_us'])} | "
            f"{_span(f['throughput_per_s'])} |"
        )
    lines += ["", "| worker / main, same run | round trip p50 | throughput |", "|---|---|---|"]
    for flavour, entry in result["summary"]["ratios"].items():
        p50, throughput = _span(entry["roundtrip_p50"], 2), _span(entry["throughput"], 2)
        lines.append(f"| {flavour} | {p50}x | {throughput}x |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    import sys

    quick = "--quick" in sys.argv
    sys.stdout.write(markdown(measure(QUICK if quick else Settings())))
