"""Where an invoke's time goes, and the SDK's start-up: the measurements bench/README.md cites.

    python -m bench.profile core      # pyinstrument on the sans-I/O core under CPython
    python -m bench.profile page      # cProfile inside the clienttools page + a CDP CPU profile
    python -m bench.profile page --page micropython  # the MicroPython page: the CDP profile
    python -m bench.profile start     # the SDK's start-up in Chromium: packages, imports, tools
    python -m bench.profile roundtrip # figures 1 and 2 only, the pages loaded once, many rounds

`core` feeds invokes and acks straight into `Session` (no sockets, no loop),
so it shows the protocol work alone. `page` loads the benchmark page in
Chromium, runs pipelined invokes through the load generator and reports (1)
the Python functions by own time under Pyodide (cProfile, which the Pyodide
stdlib has) and (2) the JS/wasm side by self time from the V8 sampling
profiler (CDP `Profiler`), which is where the WebLoop's scheduling and the
JS<->Python proxies show up. `start` loads Pyodide alone in a fresh context
(`pages/pyodide_only.html`), then, timed from the driver: the packages, the
import (each module's own and total time), the tool's registration and the
tools frame, for clienttools and for pydantic + one model (the cold-start
baseline) in turn; medians over `-n` loads of each. Per load also: `sdk`, the
three summed; `gc`, the garbage collector's time inside them; and apart, `ack`,
the first frame received after the tools frame (outside the SDK's share). `roundtrip` loads the
clienttools, bare-Pyodide and raw-JS pages once, then runs `--rounds` rounds
of figures 1 and 2 on each, in rotating order, with the ratios to the bare page
taken within each round: the quick way to see what one change to the hot path
buys.
"""

from __future__ import annotations

import collections
import json
import secrets
import sys
import time
from pathlib import Path
from typing import Any

from bench import bounded

ROOT = Path(__file__).resolve().parent.parent
WEB = ROOT / "build" / "web" / "pyodide"


def _core(n: int) -> None:
    from clienttools.session import Session
    from clienttools.tools import ToolRegistry

    registry = ToolRegistry()

    @registry.tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    session = Session(registry, client_id="profile")
    session.connection_opened(0.0)
    session.frames_to_send()
    frames = []
    for i in range(n):
        request_id = secrets.token_hex(16)
        invoke = {
            "type": "cf_agent_client_tool_invoke", "requestId": request_id,
            "toolCallId": f"call_{request_id[:12]}", "toolName": "add",
            "input": {"a": i, "b": 1}, "attempt": 1,
        }  # fmt: skip
        ack = {"type": "cf_agent_client_tool_result_ack", "requestId": request_id,
               "outcome": "applied"}  # fmt: skip
        frames.append((json.dumps(invoke), json.dumps(ack)))

    def drive() -> float:
        started = time.perf_counter()
        for invoke_text, ack_text in frames:
            session.receive_frame(invoke_text, 1.0)
            for run in session.events():
                session.tool_returned(run.request_id, run.tool.call(run.arguments, None))  # type: ignore[union-attr]
            session.frames_to_send()
            session.next_deadline()
            session.receive_frame(ack_text, 1.0)
            session.events()
            session.next_deadline()
        return (time.perf_counter() - started) / n * 1e6

    budget = bounded.current()
    budget.step(f"{n} invokes without a profiler")
    sys.stdout.write(f"core: {drive():.1f} µs per invoke + ack (CPython, no profiler)\n")
    try:
        from pyinstrument import Profiler
    except ImportError:
        sys.stdout.write("pyinstrument is not installed: pip install pyinstrument\n")
        return
    budget.step(f"{n} invokes under pyinstrument")
    profiler = Profiler(interval=0.0002)
    profiler.start()
    drive()
    profiler.stop()
    sys.stdout.write(profiler.output_text(unicode=True, color=False, show_all=False))


PROFILE_START = """
import cProfile
_bench_profile = cProfile.Profile()
_bench_profile.enable()
"""
PROFILE_STOP = """
import io, pstats
_bench_profile.disable()
_out = io.StringIO()
pstats.Stats(_bench_profile, stream=_out).sort_stats("tottime").print_stats(25)
_out.getvalue()
"""


def _page(n: int, name: str) -> None:
    from tests.support.static import StaticServer

    from bench.browser import Browser, LoadGen

    web = ROOT / "build" / "web"
    static = StaticServer(
        {
            "/": ROOT / "bench" / "pages",
            "/pyodide/": web / "pyodide",
            "/pyscript/": web / "pyscript",
            "/micropython/": web / "micropython",
        }
    ).start()
    # The MicroPython page has no cProfile: only the V8 profile, where its interpreter
    # is wasm and the proxies between it and JavaScript are JS.
    steps = 4 if name == "clienttools" else 3
    try:
        budget = bounded.current()
        with LoadGen() as loadgen, Browser(static.url, loadgen) as browser:
            budget.step(f"load the {name} page", 1, steps)
            context = browser.new_context()
            page = browser.load(context, name, "profile")
            loadgen.call("pipelined", "profile", n=500, window=100)  # warm up
            budget.step(f"{n} invokes without a profiler", 2, steps)
            plain = loadgen.call("pipelined", "profile", n=n, window=100)
            sys.stdout.write(f"page: {plain['per_s']:.0f} invokes/s without a profiler\n")
            if name == "clienttools":
                budget.step(f"{n} invokes under cProfile", 3, steps)
                page.page.evaluate("(code) => window.pyodide.runPython(code)", PROFILE_START)
                loadgen.call("pipelined", "profile", n=n, window=100)
                stats = page.page.evaluate(
                    "(code) => window.pyodide.runPython(code)", PROFILE_STOP
                )
                sys.stdout.write("\n--- Python under Pyodide (cProfile, by own time) ---\n")
                sys.stdout.write(str(stats))
            budget.step(f"{n} invokes under the V8 sampling profiler", steps, steps)
            page.cdp.send("Profiler.enable")
            page.cdp.send("Profiler.setSamplingInterval", {"interval": 100})
            page.cdp.send("Profiler.start")
            loadgen.call("pipelined", "profile", n=n, window=100)
            profile = page.cdp.send("Profiler.stop")["profile"]
            sys.stdout.write("\n--- JS and wasm (V8 sampling profiler, by self time) ---\n")
            sys.stdout.write(_self_times(profile))
            context.close()
    finally:
        static.stop()


def _self_times(profile: dict[str, Any], top: int = 30) -> str:
    nodes = {node["id"]: node for node in profile["nodes"]}
    counts: collections.Counter[str] = collections.Counter()
    for sample in profile.get("samples", []):
        frame = nodes[sample]["callFrame"]
        name = frame.get("functionName") or "(anonymous)"
        url = frame.get("url", "").rsplit("/", 1)[-1]
        counts[f"{name} {url}".strip()] += 1
    total = sum(counts.values()) or 1
    return "".join(f"{count / total:6.1%}  {name}\n" for name, count in counts.most_common(top))


# Runs in the page: times every module's import (total, and own = total minus the
# imports it made), by wrapping the function the import statement calls.
IMPORT_TIMER = """
import importlib._bootstrap as _bootstrap, time as _time
_import_times = {}
_import_stack = [0.0]
_find_and_load = _bootstrap._find_and_load
def _timed_find_and_load(name, import_):
    started = _time.perf_counter()
    _import_stack.append(0.0)
    try:
        return _find_and_load(name, import_)
    finally:
        total = _time.perf_counter() - started
        inner = _import_stack.pop()
        _import_stack[-1] += total
        _import_times[name] = (total * 1e3, (total - inner) * 1e3)
_bootstrap._find_and_load = _timed_find_and_load
# Time spent in the garbage collector, which runs where allocations happen to trigger
# it: a pass over pydantic's heap is ~10 ms, so which phase it lands in moves figures.
import gc as _gc
_gc_ms = [0.0, 0.0]
def _gc_timer(phase, info):
    if phase == "start":
        _gc_ms[1] = _time.perf_counter()
    else:
        _gc_ms[0] += (_time.perf_counter() - _gc_ms[1]) * 1e3
_gc.callbacks.append(_gc_timer)
"""
# What both start-up profiles time: import the SDK (t0 -> t1), register one tool (-> t2),
# make the tools frame (-> t3). Apart, not in the SDK's share
# (it comes after the tools frame): the first frame received, the server's ack (-> t4),
# which makes the frame models and their validator; then stop timing imports.
_SDK_START = """import clienttools
t1 = _time.perf_counter()
client = clienttools.ToolClient("ws://127.0.0.1:1/agents/chat/profile")
@client.tool
def add(a: int, b: int) -> int:
    \"\"\"Add two integers.\"\"\"
    return a + b
t2 = _time.perf_counter()
import clienttools.browser
client.session.connection_opened(0.0)
frame = client.session.frames_to_send()[0]
t3 = _time.perf_counter()
gc3 = _gc_ms[0]
client.session.receive_frame('{"type":"cf_agent_client_tools_ack","accepted":["add"]}', 0.0)
t4 = _time.perf_counter()
_bootstrap._find_and_load = _find_and_load
_gc.callbacks.remove(_gc_timer)
"""
START_CODE = {
    "clienttools": """
_gc_ms[0] = 0.0
t0 = _time.perf_counter()
"""
    + _SDK_START
    + """{"import": (t1 - t0) * 1e3, "register": (t2 - t1) * 1e3, "frame": (t3 - t2) * 1e3,
 "ack": (t4 - t3) * 1e3, "gc": gc3, "modules": _import_times}
""",
    "pydantic": """
t0 = _time.perf_counter()
import pydantic
class Add(pydantic.BaseModel):
    a: int
    b: int
Add(a=1, b=2)
t1 = _time.perf_counter()
_bootstrap._find_and_load = _find_and_load
_gc.callbacks.remove(_gc_timer)
{"import": (t1 - t0) * 1e3, "register": 0.0, "frame": 0.0, "ack": 0.0, "gc": _gc_ms[0],
 "modules": _import_times}
""",
}
# The SDK's share alone: what clienttools adds once pydantic and one model are there (as
# on the baseline page), under cProfile, by own and by total time.
MARGINAL_CODE = (
    """
import pydantic
class Add(pydantic.BaseModel):
    a: int
    b: int
Add(a=1, b=2)
import cProfile, io, pstats
_profile = cProfile.Profile()
_gc_ms[0] = 0.0
t0 = _time.perf_counter()
if _PROFILE:
    _profile.enable()
"""
    + _SDK_START
    + """_out = io.StringIO()
if _PROFILE:
    _profile.disable()
    _stats = pstats.Stats(_profile, stream=_out)
    _stats.sort_stats("tottime").print_stats(45)
    _stats.sort_stats("cumulative").print_stats(60)
{"import": (t1 - t0) * 1e3, "register": (t2 - t1) * 1e3, "frame": (t3 - t2) * 1e3,
 "ack": (t4 - t3) * 1e3, "gc": gc3, "modules": _import_times,
 "profile": _out.getvalue()}
"""
)
LOAD_AND_RUN = """async ([packages, timer, code]) => {
  const t0 = performance.now();
  await window.pyodide.loadPackage(packages);
  const t1 = performance.now();
  window.pyodide.runPython(timer);
  const result = window.pyodide.runPython(code).toJs({dict_converter: Object.fromEntries});
  return {packages: t1 - t0, ...result};
}"""


def _start(
    n: int, dump: Path | None, marginal: bool, cprofile: bool, baseline: Path | None
) -> None:
    from playwright.sync_api import sync_playwright
    from tests.support.static import StaticServer

    from bench.browser import launch_options

    budget = bounded.current()
    mounts = {"/": ROOT / "bench" / "pages", "/pyodide/": WEB}
    if baseline is not None:
        mounts["/baseline/"] = baseline
    static = StaticServer(mounts).start()
    runs: dict[str, list[dict[str, Any]]] = (
        {"marginal": []} if marginal else {"clienttools": [], "pydantic": []}
    )
    if baseline is not None:
        runs = {f"{name} (baseline)": [] for name in runs} | runs
    budget.partial = lambda: _start_report(runs, dump)
    total = n * len(runs)
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(**launch_options())
            for i in range(n):
                names = list(runs) if i % 2 == 0 else list(reversed(runs))
                for key in names:
                    budget.step(f"cold load of {key}", sum(map(len, runs.values())) + 1, total)
                    name, _, other = key.partition(" (")
                    index = "/baseline/" if other else "/pyodide/"
                    context = browser.new_context()
                    page = context.new_page()
                    page.goto(f"{static.url}/pyodide_only.html?index={index}", wait_until="commit")
                    page.wait_for_function(
                        "window.__bench && window.__bench.status !== 'loading'",
                        timeout=budget.timeout(90) * 1000,
                    )
                    package = "clienttools" if name == "marginal" else name
                    code = (
                        f"_PROFILE = {cprofile}\n{MARGINAL_CODE}"
                        if name == "marginal"
                        else START_CODE[name]
                    )
                    result = page.evaluate(LOAD_AND_RUN, [package, IMPORT_TIMER, code])
                    result["sdk"] = result["import"] + result["register"] + result["frame"]
                    runs[key].append(result)
                    context.close()
                    budget.say(
                        f"  {key}: packages {result['packages']:.0f} ms, sdk {result['sdk']:.0f} ms"
                    )
            browser.close()
    finally:
        static.stop()
    sys.stdout.write(_start_report(runs, dump))


def _start_report(runs: dict[str, list[dict[str, Any]]], dump: Path | None) -> str:
    """The medians over the loads done so far (and every load to `dump`)."""
    import statistics

    if dump is not None:
        dump.write_text(json.dumps(runs, indent=1))
    out: list[str] = []
    for name, results in runs.items():
        if not results:
            out.append(f"\n--- {name}: no load finished ---\n")
            continue
        out.append(f"\n--- {name}: median of {len(results)} cold loads (ms) ---\n")
        for part in ("packages", "import", "register", "frame", "sdk", "gc", "ack"):
            values = [r.get(part, 0.0) for r in results]
            median = statistics.median(values)
            out.append(f"{part:>9}: {median:7.1f}  [{min(values):.1f}..{max(values):.1f}]\n")
        totals: dict[str, list[float]] = collections.defaultdict(list)
        owns: dict[str, list[float]] = collections.defaultdict(list)
        for r in results:
            for module, (total, own) in r["modules"].items():
                totals[module].append(total)
                owns[module].append(own)
        out.append("modules by own time (median ms): own  total\n")
        ranked = sorted(owns, key=lambda m: -statistics.median(owns[m]))
        for module in ranked[:40]:
            own, total = statistics.median(owns[module]), statistics.median(totals[module])
            out.append(f"  {own:7.1f} {total:7.1f}  {module}\n")
        out.append(f"  ({len(owns)} modules imported)\n")
        if "profile" in results[-1]:
            out.append(results[-1]["profile"])
    return "".join(out)


def _roundtrip(rounds: int, n: int, pipelined_n: int, baseline: Path | None) -> None:

    from tests.support.static import StaticServer

    from bench.browser import PAGES, Browser, LoadGen

    names: tuple[str, ...] = ("clienttools", "bare", "rawjs")
    mounts = {"/": ROOT / "bench" / "pages", "/pyodide/": ROOT / "build" / "web" / "pyodide"}
    if baseline is not None:
        mounts["/baseline/"] = baseline
        PAGES["baseline"] = ("clienttools.html", "&index=/baseline/")
        names += ("baseline",)
    static = StaticServer(mounts).start()
    figures: dict[str, dict[str, list[float]]] = {
        name: collections.defaultdict(list) for name in names
    }
    ratios: dict[str, list[float]] = collections.defaultdict(list)
    out = sys.stdout
    budget = bounded.current()
    budget.partial = lambda: _roundtrip_report(names, figures, ratios)
    try:
        with LoadGen() as loadgen, Browser(static.url, loadgen) as browser:
            context = browser.new_context()
            pages = {}
            for number, name in enumerate(names, 1):
                budget.step(f"load and warm up the {name} page", number, len(names))
                pages[name] = browser.load(context, name, f"rt-{name}")
                # warm up: first-call caches, lazily built validators
                loadgen.call("roundtrip", pages[name].session, n=200)
            for round_ in range(rounds):
                budget.step("round", round_ + 1, rounds)
                row: dict[str, dict[str, float]] = {}
                by = round_ % len(names)
                for name in names[by:] + names[:by]:
                    session = pages[name].session
                    rt = loadgen.call("roundtrip", session, n=n)
                    pl = loadgen.call("pipelined", session, n=pipelined_n)
                    row[name] = {"p50": rt["p50_us"], "p99": rt["p99_us"], "per_s": pl["per_s"]}
                    for key, value in row[name].items():
                        figures[name][key].append(value)
                for key in ("p50", "p99", "per_s"):
                    ratios[key].append(row["clienttools"][key] / row["bare"][key])
                    if baseline is not None:
                        ratios[f"baseline {key}"].append(row["baseline"][key] / row["bare"][key])
                out.write(
                    f"round {round_ + 1}: "
                    + "  ".join(
                        f"{name} p50 {row[name]['p50']:.0f} p99 {row[name]['p99']:.0f} "
                        f"{row[name]['per_s']:.0f}/s"
                        for name in names
                    )
                    + f"  | ct/bare p50 {ratios['p50'][-1]:.2f} p99 {ratios['p99'][-1]:.2f} "
                    f"tput {ratios['per_s'][-1]:.2f}"
                    + (
                        f" | baseline/bare p50 {ratios['baseline p50'][-1]:.2f}"
                        if baseline is not None
                        else ""
                    )
                    + "\n"
                )
                out.flush()
            context.close()
    finally:
        static.stop()
    out.write(_roundtrip_report(names, figures, ratios))


def _roundtrip_report(
    names: tuple[str, ...],
    figures: dict[str, dict[str, list[float]]],
    ratios: dict[str, list[float]],
) -> str:
    """Medians and ranges over the rounds done so far."""
    import statistics

    if not ratios:
        return "no round finished\n"
    lines = [
        f"{name:>12}: "
        + "  ".join(
            f"{key} {statistics.median(values):.0f} [{min(values):.0f}..{max(values):.0f}]"
            for key, values in figures[name].items()
        )
        for name in names
    ]
    lines.append(
        "clienttools / bare (within each round): "
        + "  ".join(
            f"{key} {statistics.median(values):.2f} [{min(values):.2f}..{max(values):.2f}]"
            for key, values in ratios.items()
        )
    )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = bounded.Parser(prog="python -m bench.profile", description=__doc__.split("\n\n")[0])
    parser.add_time_limit(default=900)
    modes = parser.add_subparsers(dest="what", required=True, metavar="MODE",
                                  parser_class=bounded.Parser)  # fmt: skip
    core = modes.add_parser("core", help="pyinstrument on the sans-I/O core under CPython")
    core.add_argument("-n", type=bounded.positive_int, default=3000, help="invokes to profile")
    page = modes.add_parser("page", help="cProfile inside the page + a CDP CPU profile")
    page.add_argument("-n", type=bounded.positive_int, default=3000, help="invokes to profile")
    page.add_argument(
        "--page",
        dest="page_name",
        choices=("clienttools", "micropython"),
        default="clienttools",
        help="the Pyodide page (cProfile and V8) or the MicroPython one (V8 only)",
    )
    start = modes.add_parser("start", help="the SDK's start-up in Chromium, per cold load")
    # --rounds: what a user tries first; a round of `start` is one cold load of each page.
    start.add_argument("-n", "--loads", "--rounds", dest="loads", type=bounded.positive_int,
                       default=5, help="cold loads of each page (default %(default)s)")  # fmt: skip
    start.add_argument("--json", type=Path, help="write every load's figures here")
    start.add_argument(
        "--marginal",
        action="store_true",
        help="only what clienttools adds after pydantic + one model, in one page",
    )
    start.add_argument("--cprofile", action="store_true", help="with --marginal: cProfile it")
    roundtrip = modes.add_parser("roundtrip", help="figures 1 and 2 only, many rounds")
    roundtrip.add_argument("--rounds", type=bounded.positive_int, default=5,
                           help="rounds of figures 1-2 (default %(default)s)")  # fmt: skip
    for sub in (start, roundtrip):
        sub.add_argument(
            "--baseline",
            type=Path,
            help="another build/web/pyodide (say, main's), measured beside this one",
        )
    for sub in (core, page, start, roundtrip):
        # The limit is also accepted after the mode, where a user is likely to put it.
        sub.add_time_limit(default=None)
    args = parser.parse_args(argv)
    if (
        getattr(args, "baseline", None) is not None
        and not (args.baseline / "pyodide.mjs").is_file()
    ):
        parser.error(f"--baseline {args.baseline}: no pyodide.mjs there")
    if args.what in ("page", "start", "roundtrip") and not (WEB / "pyodide.mjs").is_file():
        parser.error(f"{WEB} is missing: run `make web` first")

    def body(budget: bounded.Budget) -> int:
        if args.what == "core":
            _core(args.n)
        elif args.what == "roundtrip":
            _roundtrip(args.rounds, 2000, 5000, args.baseline)
        elif args.what == "start":
            _start(args.loads, args.json, args.marginal, args.cprofile, args.baseline)
        else:
            _page(args.n, args.page_name)
        return 0

    return bounded.run(parser.prog, args.time_limit, body)


if __name__ == "__main__":
    sys.exit(main())
