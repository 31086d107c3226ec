"""Where an invoke's time goes: the tools behind the "before/after" notes in bench/README.md.

    python -m bench.profile core      # pyinstrument on the sans-I/O core under CPython
    python -m bench.profile page      # cProfile inside the clienttools page + a CDP CPU profile

`core` feeds invokes and acks straight into `Session` (no sockets, no loop),
so it shows the protocol work alone. `page` loads the benchmark page in
Chromium, runs pipelined invokes through the load generator and reports (1)
the Python functions by own time under Pyodide (cProfile, which the Pyodide
stdlib has) and (2) the JS/wasm side by self time from the V8 sampling
profiler (CDP `Profiler`), which is where the WebLoop's scheduling and the
JS<->Python proxies show up.
"""

from __future__ import annotations

import argparse
import collections
import json
import secrets
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


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

    sys.stdout.write(f"core: {drive():.1f} µs per invoke + ack (CPython, no profiler)\n")
    try:
        from pyinstrument import Profiler
    except ImportError:
        sys.stdout.write("pyinstrument is not installed: pip install pyinstrument\n")
        return
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


def _page(n: int) -> None:
    from tests.support.static import StaticServer

    from bench.browser import Browser, LoadGen

    static = StaticServer(
        {"/": ROOT / "bench" / "pages", "/pyodide/": ROOT / "build" / "web" / "pyodide"}
    ).start()
    try:
        with LoadGen() as loadgen, Browser(static.url, loadgen) as browser:
            context = browser.new_context()
            page = browser.load(context, "clienttools", "profile")
            loadgen.call("pipelined", "profile", n=500, window=100)  # warm up
            plain = loadgen.call("pipelined", "profile", n=n, window=100)
            sys.stdout.write(f"page: {plain['per_s']:.0f} invokes/s without a profiler\n")
            page.page.evaluate("(code) => window.pyodide.runPython(code)", PROFILE_START)
            loadgen.call("pipelined", "profile", n=n, window=100)
            stats = page.page.evaluate("(code) => window.pyodide.runPython(code)", PROFILE_STOP)
            sys.stdout.write("\n--- Python under Pyodide (cProfile, by own time) ---\n")
            sys.stdout.write(str(stats))
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


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__)
    parser.add_argument("what", choices=("core", "page"))
    parser.add_argument("-n", type=int, default=3000, help="invokes to profile")
    args = parser.parse_args()
    if args.what == "core":
        _core(args.n)
    else:
        _page(args.n)


if __name__ == "__main__":
    main()
