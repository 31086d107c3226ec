"""A call through `document.modelContext` against the same call over the WebSocket, same run.

    python -m bench.webmcp                  # 5 rounds of 500 calls each way
    python -m bench.webmcp --rounds 3 --n 200

One Pyodide page (bench/pages/webmcp.html) with `ToolClient(url, webmcp=True)` and
one sync tool, `add`. Each round makes `n` sequential calls each way, back to back,
the order alternating from round to round:

- WebSocket: the load generator (bench/loadgen.py, its own process, as in the
  suite's round-trip figure) sends an invoke and waits for its result frame;
  timed there, as a server sees it;
- modelContext: the page awaits the polyfill's
  `navigator.modelContextTesting.executeTool("add", json)`, one call after the
  other; timed in the page, as the browser's agent sees it (the polyfill's own
  steps included). `performance.now()` is coarsened to 0.1 ms on this page, so
  its p50 is quantized; the mean is the block's time over `n`.

It prints both per round and the ratio of their means (the figure that counts on
a shared machine), then that ratio's median and range over the rounds.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from playwright.sync_api import sync_playwright
from tests.support.static import StaticServer

from bench.browser import LoadGen, launch_options

ROOT = Path(__file__).resolve().parent.parent
WEB = ROOT / "build" / "web"
SESSION = "bench-webmcp"
PAGE_LOAD_TIMEOUT_S = 90.0

#: n sequential calls by the browser's agent: each call's milliseconds, and the block's.
AGENT_CALLS = """async (n) => {
  const times = [];
  const begun = performance.now();
  for (let i = 0; i < n; i++) {
    const started = performance.now();
    const text = await navigator.modelContextTesting.executeTool(
      "add", JSON.stringify({ a: i, b: 1 }));
    times.push(performance.now() - started);
    if (JSON.parse(text).content[0].text !== String(i + 1)) throw new Error(text);
  }
  return { times, total: performance.now() - begun };
}"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--n", type=int, default=500)
    args = parser.parse_args()
    static = StaticServer(
        {
            "/": Path(__file__).resolve().parent / "pages",
            "/pyodide/": WEB / "pyodide",
            "/webmcp/": WEB / "webmcp",
        }
    ).start()
    ratios = []
    try:
        with LoadGen() as loadgen, sync_playwright() as playwright:
            browser = playwright.chromium.launch(**launch_options())
            page = browser.new_page()
            page.goto(f"{static.url}/webmcp.html?ws={loadgen.url(SESSION)}")
            deadline = time.monotonic() + PAGE_LOAD_TIMEOUT_S
            while page.text_content("#status") == "loading" and time.monotonic() < deadline:
                time.sleep(0.05)
            assert page.text_content("#status") == "connected", page.text_content("#status")
            loadgen.call("wait", SESSION, timeout=60)
            loadgen.call("roundtrip", SESSION, n=100)  # warm both paths up
            page.evaluate(AGENT_CALLS, 100)
            for round_ in range(args.rounds):
                if round_ % 2 == 0:
                    ws = loadgen.call("roundtrip", SESSION, n=args.n)
                    mc = page.evaluate(AGENT_CALLS, args.n)
                else:
                    mc = page.evaluate(AGENT_CALLS, args.n)
                    ws = loadgen.call("roundtrip", SESSION, n=args.n)
                mc_mean_us = mc["total"] / args.n * 1000
                mc_p50_us = statistics.median(mc["times"]) * 1000
                ratio = mc_mean_us / ws["mean_us"]
                ratios.append(ratio)
                print(
                    f"round {round_ + 1}: websocket mean {ws['mean_us']:.0f} us "
                    f"p50 {ws['p50_us']:.0f} us | modelContext mean {mc_mean_us:.0f} us "
                    f"p50 {mc_p50_us:.0f} us | ratio of means {ratio:.3f}",
                    flush=True,
                )
            browser.close()
    finally:
        static.stop()
    print(
        f"modelContext / websocket, mean per call: median {statistics.median(ratios):.3f}, "
        f"range {min(ratios):.3f}-{max(ratios):.3f} over {len(ratios)} rounds of {args.n}"
    )


if __name__ == "__main__":
    main()
