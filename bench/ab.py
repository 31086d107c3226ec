"""Figures 1 and 2 (browser round trip, pipelined throughput) for two builds, in one run.

A and B are two `build/web` trees (e.g. the current branch's and one built from
another commit into a temporary checkout). Each is served on its own origin and
loaded in the same Chromium, against the same load generator; the pages are
measured in alternating order (A B, then B A, ...) so that load from elsewhere on
the machine hits both alike. Prints each figure per build with its range.

    python -m bench.ab --a /tmp/other/build/web --b build/web --runs 4
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from tests.support.static import StaticServer

from bench.browser import Browser, LoadGen

ROOT = Path(__file__).resolve().parent.parent
PAGES_DIR = ROOT / "bench" / "pages"
PAGES = ("clienttools", "micropython")


def _static(web: Path) -> StaticServer:
    dirs = {"/": PAGES_DIR, "/pyodide/": web / "pyodide"}
    for name in ("pyscript", "micropython"):
        dirs[f"/{name}/"] = web / name
    return StaticServer(dirs, cache_seconds=3600).start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ab", description=__doc__)
    parser.add_argument("--a", type=Path, required=True, help="build/web of build A")
    parser.add_argument("--b", type=Path, required=True, help="build/web of build B")
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--roundtrip-n", type=int, default=1000)
    parser.add_argument("--pipelined-n", type=int, default=3000)
    parser.add_argument("--pages", nargs="+", choices=PAGES, default=list(PAGES))
    args = parser.parse_args(argv)
    figures: dict[tuple[str, str, str], list[float]] = {}
    statics = {"A": _static(args.a), "B": _static(args.b)}
    try:
        with LoadGen() as loadgen:
            # One Chromium (Playwright's sync API runs once per process); each side's pages
            # come from its own origin, so neither shares the other's HTTP cache.
            browser = Browser(statics["A"].url, loadgen)
            try:
                for run in range(args.runs):
                    order = ("A", "B") if run % 2 == 0 else ("B", "A")
                    for page in args.pages:
                        for side in order:
                            browser.static_url = statics[side].url
                            context = browser.new_context()
                            try:
                                session = f"{side}-{page}-{run}"
                                loaded = browser.load(context, page, session)
                                roundtrip = loadgen.call(
                                    "roundtrip", loaded.session, n=args.roundtrip_n
                                )
                                pipelined = loadgen.call(
                                    "pipelined", loaded.session, n=args.pipelined_n
                                )
                            finally:
                                context.close()
                            for key, value in (
                                ("roundtrip_p50_us", roundtrip["p50_us"]),
                                ("roundtrip_p99_us", roundtrip["p99_us"]),
                                ("throughput_per_s", pipelined["per_s"]),
                            ):
                                figures.setdefault((page, key, side), []).append(float(value))
                            print(
                                f"run {run + 1} {page} {side}: p50 {roundtrip['p50_us']:.0f} us, "
                                f"{pipelined['per_s']:.0f}/s",
                                file=sys.stderr,
                            )
            finally:
                browser.close()
    finally:
        for static in statics.values():
            static.stop()
    print(f"A = {args.a}, B = {args.b}, {args.runs} runs, median [min-max]")
    for page in args.pages:
        for key in ("roundtrip_p50_us", "roundtrip_p99_us", "throughput_per_s"):
            cells = []
            for side in ("A", "B"):
                values = figures[(page, key, side)]
                cells.append(
                    f"{side} {statistics.median(values):.0f} [{min(values):.0f}-{max(values):.0f}]"
                )
            a, b = (statistics.median(figures[(page, key, side)]) for side in ("A", "B"))
            print(f"{page:12} {key:17} {'  '.join(cells)}  B/A {b / a:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
