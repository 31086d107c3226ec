"""`python -m bench` (`make bench`): run every figure, write results/latest.{json,md}.

    python -m bench                 # the full suite: 5 runs of every figure
    python -m bench --quick         # the smoke version: tiny N, 1 run, every figure
    python -m bench --runs 7 --out /tmp/bench --only browser
    python -m bench --only peer     # RPC against the AI SDK's round trip (bench/peer.py)
    python -m bench --only cluster  # server processes on one PostgreSQL (bench/cluster.py)
    python -m bench --only worker   # tools on the page against in a worker (bench/worker.py)
    python -m bench --only idle     # 10,000 idle pages on one server process (bench/idle.py)

Each run measures all pages (or both server set-ups) back to back, in an order
that rotates from run to run, and ratios are taken within a run: on a shared,
noisy machine the absolute numbers drift between runs, their ratios much less.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from tests.support.postgres import PostgresUnavailable
from tests.support.static import StaticServer

from bench import bounded, cluster, idle, peer, report, resolves
from bench import worker as worker_pages
from bench.browser import Browser, LoadedPage, LoadGen
from bench.serverload import measure as measure_server
from bench.servermemory import measure as measure_server_memory

ROOT = Path(__file__).resolve().parent.parent
PAGES_DIR = Path(__file__).resolve().parent / "pages"
WEB = ROOT / "build" / "web" / "pyodide"
#: The pages of figures 1, 2 and 4, in their first run's order.
INVOKE_PAGES = ("clienttools", "rawjs", "bare", "micropython")
#: Invokes in flight at once while the memory figure runs (a busy page, not a burst).
MEMORY_WINDOW = 100


@dataclass(frozen=True)
class Settings:
    runs: int = 5
    roundtrip_n: int = 2000
    pipelined_n: int = 5000
    memory_n: int = 10_000
    memory_warmup: int = 1000
    fleet_clients: int = 100
    fleet_invokes: int = 100
    # Figure 6 (first run only): chats against one server without --db, and after how
    # many the resident memory is the reference for the growth.
    memory_chats: int = 20_000
    memory_chats_warmup: int = 5_000
    #: Pending steps resolved at once over HTTP (bench/resolves.py), once per suite.
    resolves_n: int = 1000
    #: Figure 3 loads each Pyodide page twice per run, in mirrored order; the smoke
    #: version loads each once (its figures are not comparable anyway).
    mirrored: bool = True


QUICK = Settings(
    runs=1,
    roundtrip_n=50,
    pipelined_n=100,
    memory_n=200,
    memory_warmup=50,
    fleet_clients=5,
    fleet_invokes=5,
    memory_chats=300,
    memory_chats_warmup=100,
    resolves_n=50,
    mirrored=False,
)


def _rotate(items: tuple[str, ...], by: int) -> list[str]:
    by %= len(items)
    return list(items[by:] + items[:by])


def browser_run(
    browser: Browser, settings: Settings, run: int, out: dict[str, dict[str, Any]] | None = None
) -> dict[str, dict[str, Any]]:
    """Figures 1-4 for one run: cold and warm starts, then invokes on the three loaded pages.

    `out` fills as each figure is measured (what a run cut by the time limit has)."""
    out = {} if out is None else out
    loaded: dict[str, LoadedPage] = {}
    contexts = []
    try:
        # Figure 3. Each Pyodide page is loaded twice per run, in mirrored order (A B C B A),
        # so a burst of load from elsewhere on the machine hits both sides alike. The
        # last warm load leaves a loaded page behind for figures 1, 2 and 4: the
        # clienttools page as (a) and the json-only bare page as (c).
        order = _rotate(("clienttools", "pydantic", "rawjs", "micropython"), run)
        if settings.mirrored:
            order += [name for name in reversed(order) if name != "rawjs"]
        starts: dict[str, list[tuple[LoadedPage, LoadedPage]]] = {}
        budget = bounded.current()
        for number, name in enumerate(order, 1):
            budget.step(f"  run {run + 1}: cold and warm start of {name}", number, len(order))
            context = browser.new_context()
            contexts.append(context)
            cold = browser.load(context, name, f"{name}-cold-{run}-{len(contexts)}")
            warm = browser.load(context, name, f"{name}-warm-{run}-{len(contexts)}", page=cold.page)
            starts.setdefault(name, []).append((cold, warm))
            loaded["bare" if name == "pydantic" else name] = warm
        for name, pairs in starts.items():
            cold_ms = [cold.tools_frame_ms for cold, _ in pairs]
            warm_ms = [warm.tools_frame_ms for _, warm in pairs]
            # From the moment Pyodide is up to the tools frame: the same runtime start
            # is left out, so this is the SDK's own share (wheel, import, tools, connect).
            after_runtime = [
                cold.tools_frame_ms - cold.marks["pyodide"]
                for cold, _ in pairs
                if "pyodide" in cold.marks
            ]
            out.setdefault(name, {}).update(
                cold_start_ms=statistics.fmean(cold_ms),
                warm_start_ms=statistics.fmean(warm_ms),
                cold_after_runtime_ms=statistics.fmean(after_runtime) if after_runtime else None,
                cold_marks=[cold.marks for cold, _ in pairs],
                warm_marks=[warm.marks for _, warm in pairs],
            )
        for number, name in enumerate(_rotate(INVOKE_PAGES, run), 1):
            budget.step(f"  run {run + 1}: invokes on {name}", number, len(INVOKE_PAGES))
            page = loaded[name]
            figures = out.setdefault(name, {})
            # Figure 1, then figure 2.
            roundtrip = browser.loadgen.call("roundtrip", page.session, n=settings.roundtrip_n)
            figures.update(
                roundtrip_p50_us=roundtrip["p50_us"], roundtrip_p99_us=roundtrip["p99_us"]
            )
            pipelined = browser.loadgen.call("pipelined", page.session, n=settings.pipelined_n)
            figures["throughput_per_s"] = pipelined["per_s"]
            # Figure 4: warm up (first-call caches, lazily built validators), then measure.
            browser.loadgen.call(
                "pipelined", page.session, n=settings.memory_warmup, window=MEMORY_WINDOW
            )
            before = browser.memory(page)
            browser.loadgen.call(
                "pipelined", page.session, n=settings.memory_n, window=MEMORY_WINDOW
            )
            after = browser.memory(page)
            scale = 10_000 / settings.memory_n
            figures.update(
                memory_growth_bytes=(
                    (after["js_heap"] - before["js_heap"]) + (after["wasm"] - before["wasm"])
                )
                * scale,
                js_heap_growth_bytes=(after["js_heap"] - before["js_heap"]) * scale,
                wasm_growth_bytes=(after["wasm"] - before["wasm"]) * scale,
                py_objects_growth=(after["py_objects"] - before["py_objects"]) * scale,
            )
    finally:
        for context in contexts:
            context.close()
    return out


def server_run(
    settings: Settings, run: int, out: dict[str, dict[str, Any]] | None = None
) -> dict[str, dict[str, Any]]:
    """Figure 5 for one run: ledger on and ledger off, in alternating order; figure 6 once."""
    out = {} if out is None else out
    budget = bounded.current()
    for number, name in enumerate(_rotate(("ledger_on", "ledger_off"), run), 1):
        budget.step(f"  run {run + 1}: {settings.fleet_clients} pages, {name}", number, 2)
        out[name] = measure_server(
            name == "ledger_on", settings.fleet_clients, settings.fleet_invokes
        )
    if run == 0:
        # Figure 6 is about growth over one long stretch, not a ratio: once is enough.
        budget.step(f"  run {run + 1}: server memory over {settings.memory_chats} chats")
        out["server_memory"] = measure_server_memory(
            settings.memory_chats,
            warmup=settings.memory_chats_warmup,
            sample_every=max(settings.memory_chats // 20, 1),
        )
    return out


#: The default --time-limit (s): the full suite takes about an hour on a quiet 2-core machine.
TIME_LIMIT_S, QUICK_TIME_LIMIT_S = 2 * 3600.0, 900.0


def main(argv: list[str] | None = None) -> int:
    parser = bounded.Parser(prog="python -m bench", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke version: tiny N, one run")
    parser.add_argument(
        "--runs", type=bounded.positive_int, help="runs of every figure (default 5; quick 1)"
    )
    parser.add_argument(
        "--out", type=Path, default=ROOT / "bench" / "results", help="where results go"
    )
    parser.add_argument(
        "--only",
        choices=ONLY,
        help="run only the browser figures, the server figures, the HTTP resolves, the peer, "
        "the cluster, the worker pages or the idle pages",
    )
    parser.add_argument(
        "--time-limit",
        type=bounded.positive_float,
        metavar="SECONDS",
        help=f"stop after this long, print what was measured and exit {bounded.EXIT_CUT} "
        f"(default {TIME_LIMIT_S:g}; quick {QUICK_TIME_LIMIT_S:g})",
    )
    args = parser.parse_args(argv)
    settings = QUICK if args.quick else Settings()
    if args.runs is not None:
        settings = replace(settings, runs=args.runs)
    if args.only in (None, "browser") and not (WEB / "pyodide.mjs").is_file():
        parser.error(f"{WEB} is missing: run `make web` (scripts/build_web.py) first")
    limit = args.time_limit or (QUICK_TIME_LIMIT_S if args.quick else TIME_LIMIT_S)
    return bounded.run(parser.prog, limit, lambda budget: _suite(args, settings, budget))


#: What --only picks from.
ONLY = ("browser", "server", "resolves", "peer", "cluster", "worker", "idle")


def _suite(args: argparse.Namespace, settings: Settings, budget: bounded.Budget) -> int:
    started = time.time()
    runs: list[dict[str, dict[str, Any]]] = [{} for _ in range(settings.runs)]
    extra: dict[str, Any] = {}
    budget.partial = lambda: _write(args, settings, started, runs, extra, cut=True)
    if args.only in (None, "browser"):
        dirs = {"/": PAGES_DIR, "/pyodide/": WEB}
        for name in ("pyscript", "micropython"):  # the MicroPython page: PyScript, its flavour
            dirs[f"/{name}/"] = WEB.parent / name
        static = StaticServer(dirs, cache_seconds=3600).start()
        try:
            with LoadGen() as loadgen, Browser(static.url, loadgen) as browser:
                for run in range(settings.runs):
                    budget.step("browser run", run + 1, settings.runs)
                    browser_run(browser, settings, run, runs[run])
        finally:
            static.stop()
    if args.only in (None, "resolves"):
        budget.step(f"{settings.resolves_n} concurrent HTTP resolves")
        resolved = resolves.measure(settings.resolves_n)
        extra["resolves"] = resolved
        if not resolved["exactly_once"]:
            raise bounded.Failed(f"resolves were not applied exactly once: {resolved}")
    if args.only in (None, "server"):
        for run in range(settings.runs):
            budget.step("server run", run + 1, settings.runs)
            server_run(settings, run, runs[run])

    if args.only in (None, "peer"):
        budget.step("peer benchmark: RPC against the round trip")
        extra["peer"] = peer.measure(peer.QUICK if args.quick else peer.PeerSettings())

    if args.only in (None, "cluster"):
        # Its own runs (3; quick 1) unless --runs says otherwise: a run is 2 x 3 set-ups.
        cluster_settings = cluster.QUICK if args.quick else cluster.Settings()
        if args.runs is not None:
            cluster_settings = replace(cluster_settings, runs=args.runs)
        budget.step("server processes on one PostgreSQL (bench/cluster.py)")
        try:
            extra["cluster"] = cluster.measure(cluster_settings)
        except PostgresUnavailable as exc:
            if args.only == "cluster":
                raise bounded.Failed(f"no PostgreSQL for the cluster figures: {exc}") from exc
            budget.say(f"skipping the cluster figures, no PostgreSQL: {exc}")

    if args.only in (None, "worker"):
        # Its own runs (3; quick 1) unless --runs says otherwise: a run loads four pages.
        worker_settings = worker_pages.QUICK if args.quick else worker_pages.Settings()
        if args.runs is not None:
            worker_settings = replace(worker_settings, runs=args.runs)
        budget.step("tools on the page against tools in a PyScript worker (bench/worker.py)")
        extra["worker"] = worker_pages.measure(worker_settings)

    if args.only in (None, "idle"):
        budget.step("idle pages on one server process (bench/idle.py)")
        extra["idle"] = {}
        idle.measure(idle.QUICK if args.quick else idle.Settings(), extra["idle"])

    sys.stdout.write(_write(args, settings, started, runs, extra, cut=False))
    return 0


def _write(
    args: argparse.Namespace,
    settings: Settings,
    started: float,
    runs: list[dict[str, dict[str, Any]]],
    extra: dict[str, Any],
    *,
    cut: bool,
) -> str:
    """Write results/latest.{json,md} from what was measured; the markdown."""
    done = [run for run in runs if run] if cut else runs
    results = report.summarize(done)
    results.update(
        {key: extra[key] for key in ("peer", "cluster", "worker", "idle") if key in extra}
    )
    results["meta"] = {
        "settings": asdict(settings),
        "quick": args.quick,
        "cut_by_time_limit": cut,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "duration_s": round(time.time() - started, 1),
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "python": platform.python_version(),
    }
    results["runs"] = runs
    if "resolves" in extra:
        results["resolves"] = extra["resolves"]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "latest.json").write_text(json.dumps(results, indent=2) + "\n")
    markdown = report.markdown(results)
    if cut:
        markdown += "\n**Cut by the time limit: the figures above are partial.**\n"
    if "resolves" in extra:
        markdown += "\n" + resolves.markdown(extra["resolves"])
    if "peer" in extra:
        markdown += "\n" + peer.markdown(extra["peer"])
    if "cluster" in extra:
        markdown += "\n" + cluster.markdown(extra["cluster"])
    if "worker" in extra:
        markdown += "\n" + worker_pages.markdown(extra["worker"])
    if extra.get("idle"):
        markdown += "\n" + idle.markdown(extra["idle"])
    (args.out / "latest.md").write_text(markdown)
    return markdown


if __name__ == "__main__":
    sys.exit(main())
