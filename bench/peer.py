"""The peer benchmark: RPC delegation against the AI SDK's client-tool round trip.

The same work on two pages in one Chromium, turn by turn, interleaved:

- (a) `peer_clienttools.html`: clienttools, its `Chat`, the tools in Python. The server
  runs `--client-tools rpc`: each call is an invoke on the page's socket, inside one
  response.
- (b) `peer_aichat.html`: the `ai` package's own chat (`AbstractChat` with an in-memory
  `ChatState`, its `WebSocketChatTransport`), the tools in JavaScript through
  `onToolCall` + `addToolOutput` + `sendAutomaticallyWhen:
  lastAssistantMessageIsCompleteWithToolCalls`. The server runs `--client-tools
  round-trip`: the response ends at the call, and the chat's continuation request
  carries the outputs.

Two server processes with the same flags but `--client-tools`, the scripted model with a
hosted model's latency on both, and a fault proxy in front of each that delays every
frame, both ways, by a random 0-30 ms. A turn is one user message whose answer needs
one tool call, or three parallel calls; each page measures it with the same code
(bench/pages/peer_probe.js) from its own chat's status and tool parts.

    python -m bench.peer                 # 200 turns per pattern (100 of each work)
    python -m bench.peer --turns 5       # a few
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from playwright.sync_api import Page, sync_playwright
from tests.support.faultproxy import Rule, ThreadedFaultProxy, any_frame, jitter
from tests.support.server_process import ServerProcess
from tests.support.static import StaticServer

from bench import bounded
from bench.browser import launch_options

ROOT = Path(__file__).resolve().parent.parent
PAGES_DIR = Path(__file__).resolve().parent / "pages"
WEB = ROOT / "build" / "web"
PAGE_LOAD_TIMEOUT_S = 120.0
# A page measures its own turn and gives up after 60 s; this is only a backstop.
TURN_TIMEOUT_S = 90.0

#: Pattern -> (page, the server's --client-tools, session).
PATTERNS = {
    "rpc": ("peer_clienttools.html", "rpc", "peer-a"),
    "round-trip": ("peer_aichat.html", "round-trip", "peer-b"),
}
WORKS = ("one tool", "three tools")


@dataclass(frozen=True)
class PeerSettings:
    # Turns per pattern, split evenly between the two works.
    turns: int = 200
    # A hosted model: about half a second to the first chunk of each request, then
    # about 50 chunks a second (one chunk is a word, or a tool call).
    first_chunk_delay: float = 0.5
    chunk_delay: float = 0.02
    # Per frame, each direction, uniform in [0, jitter].
    jitter: float = 0.030


QUICK = PeerSettings(turns=2)


def work(kind: str, i: int) -> tuple[str, str]:
    """The user's message for turn ``i`` and the answer the scripted model gives to it."""

    def compact(value: object) -> str:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)

    if kind == "one tool":
        return f'call add {{"a": {i}, "b": 1}}', f"add -> {i + 1}"
    text = f"turn {i}"
    key = f"k{i}"
    message = "\n".join(
        [
            f'call add {{"a": {i}, "b": 2}}',
            f"call upper {compact({'text': text})}",
            f"call lookup {compact({'key': key})}",
        ]
    )
    answer = "\n".join(
        [
            f"add -> {i + 2}",
            f"upper -> {compact(text.upper())}",
            f"lookup -> {compact({'key': key, 'length': len(key)})}",
        ]
    )
    return message, answer


def _percentile(values: list[float], percent: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * percent // 100))
    return ordered[int(rank) - 1]


def summarize(turns: list[dict[str, Any]]) -> dict[str, Any]:
    """Figures of one pattern (or one pattern and work) over its turns: counts, not rates."""
    ms = [t["ms"] for t in turns]
    outcomes = Counter(t["outcome"] for t in turns)
    return {
        "turns": len(turns),
        "p50_ms": _percentile(ms, 50) if ms else None,
        "p99_ms": _percentile(ms, 99) if ms else None,
        "requests_per_turn": statistics.fmean(t["requests"] for t in turns) if turns else None,
        "requests": dict(sorted(Counter(t["requests"] for t in turns).items())),
        "ready_flips": sum(t["readyFlips"] for t in turns),
        "turns_with_flips": sum(1 for t in turns if t["readyFlips"] > 0),
        "ready_ms_per_turn": statistics.fmean(t["readyMs"] for t in turns) if turns else None,
        "backward_moves": sum(t["backwards"] for t in turns),
        "answered": outcomes["answered"],
        "no_answer": outcomes["no-answer"] + outcomes["error"],
        "no_answer_dead_end": sum(
            1
            for t in turns
            if t["outcome"] == "no-answer" and t["finishReasons"][-1:] == ["tool-calls"]
        ),
        "errors": outcomes["error"],
        "unclassified": outcomes["unclassified"],
        "unclassified_details": sorted(
            {t["detail"] for t in turns if t["outcome"] == "unclassified"}
        ),
    }


class PeerRig:
    """Both servers, their proxies, the static pages and one Chromium with both pages loaded."""

    def __init__(self, settings: PeerSettings, log_dir: Path | None = None) -> None:
        self.settings = settings
        self.log_dir = log_dir
        self.static: StaticServer | None = None
        self.servers: dict[str, ServerProcess] = {}
        self.proxies: dict[str, ThreadedFaultProxy] = {}
        self.pages: dict[str, Page] = {}
        self._playwright: Any = None
        self._browser: Any = None

    def __enter__(self) -> PeerRig:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self) -> None:
        s = self.settings
        self.static = StaticServer(
            {"/": PAGES_DIR, "/pyodide/": WEB / "pyodide", "/ai/": WEB / "ai"}, cache_seconds=3600
        ).start()
        for pattern, (_, mode, _) in PATTERNS.items():
            log = None if self.log_dir is None else self.log_dir / f"peer-server-{mode}.log"
            self.servers[pattern] = ServerProcess(
                [
                    "--client-tools", mode,
                    "--first-chunk-delay", str(s.first_chunk_delay),
                    "--chunk-delay", str(s.chunk_delay),
                    "--allow-origin", self.static.url,
                ],
                log=log,
            ).start()  # fmt: skip
            proxy = ThreadedFaultProxy("127.0.0.1", self.servers[pattern].port).start()
            for direction in ("up", "down"):
                proxy.add_rule(Rule(direction, any_frame, jitter(s.jitter), times=None))
            self.proxies[pattern] = proxy
        self._playwright = sync_playwright().start()
        self._browser = self._playwright.chromium.launch(**launch_options())
        for pattern, (file, _, session) in PATTERNS.items():
            page = self._browser.new_context().new_page()
            ws = self.proxies[pattern].url(f"/agents/chat/{session}")
            page.goto(
                f"{self.static.url}/{file}?ws={ws}",
                wait_until="commit",
                timeout=PAGE_LOAD_TIMEOUT_S * 1000,
            )
            page.wait_for_function(
                "window.__peer && window.__peer.status !== 'loading'",
                timeout=PAGE_LOAD_TIMEOUT_S * 1000,
                polling=50,
            )
            state = page.evaluate("({status: window.__peer.status, error: window.__peer.error})")
            if state["status"] != "ready":
                raise RuntimeError(f"page {file} failed to start: {state['error']}")
            self.pages[pattern] = page

    def turn(self, pattern: str, text: str, expected: str) -> dict[str, Any]:
        page = self.pages[pattern]
        record: dict[str, Any] = page.evaluate(
            "([text, expected]) => window.__peer.turn(text, expected)", [text, expected]
        )
        return record

    def close(self) -> None:
        if self._browser is not None:
            self._browser.close()
            self._browser = None
        if self._playwright is not None:
            self._playwright.stop()
            self._playwright = None
        for proxy in self.proxies.values():
            proxy.stop()
        self.proxies.clear()
        for server in self.servers.values():
            server.stop()
        self.servers.clear()
        if self.static is not None:
            self.static.stop()
            self.static = None

    def proxy_errors(self) -> list[str]:
        return [e for proxy in self.proxies.values() for e in proxy.errors]


def measure(settings: PeerSettings, log_dir: Path | None = None) -> dict[str, Any]:
    """Run the turns, interleaved (the pattern that goes first alternates), and summarize."""
    turns: dict[str, list[dict[str, Any]]] = {p: [] for p in PATTERNS}
    started = time.time()
    rounds = max(1, settings.turns // len(WORKS))
    budget = bounded.current()
    budget.step("start both servers, their proxies and both pages")
    with PeerRig(settings, log_dir) as rig:
        for i in range(rounds):
            if i % 10 == 0:
                budget.step("round", i + 1, rounds)
            else:
                budget.check()
            for w, kind in enumerate(WORKS):
                text, expected = work(kind, i)
                order = list(PATTERNS)
                if (i + w) % 2:
                    order.reverse()
                for pattern in order:
                    record = rig.turn(pattern, text, expected)
                    record.update(work=kind, index=i)
                    turns[pattern].append(record)
        proxy_errors = rig.proxy_errors()
    figures: dict[str, Any] = {}
    for pattern, records in turns.items():
        figures[pattern] = {
            "all": summarize(records),
            **{kind: summarize([r for r in records if r["work"] == kind]) for kind in WORKS},
        }
    rpc, peer = figures["rpc"]["all"], figures["round-trip"]["all"]
    ratios = {
        "p50": peer["p50_ms"] / rpc["p50_ms"],
        "p99": peer["p99_ms"] / rpc["p99_ms"],
        "requests_per_turn": peer["requests_per_turn"] / rpc["requests_per_turn"],
    }
    return {
        "settings": asdict(settings),
        "figures": figures,
        "ratios_round_trip_over_rpc": ratios,
        "proxy_errors": proxy_errors,
        "duration_s": round(time.time() - started, 1),
        "turns": turns,
    }


#: (label, key, format, shown per work too)
FIGURE_ROWS = (
    ("turn time p50 (ms)", "p50_ms", "{:,.0f}", True),
    ("turn time p99 (ms)", "p99_ms", "{:,.0f}", True),
    ("requests per turn", "requests_per_turn", "{:.2f}", False),
    ("status went to `ready` inside a turn (times)", "ready_flips", "{:d}", False),
    ("turns with such a flicker", "turns_with_flips", "{:d}", False),
    ("time in `ready` inside a turn, mean (ms)", "ready_ms_per_turn", "{:.1f}", True),
    ("tool part state moved backwards (times)", "backward_moves", "{:d}", False),
    ("turns that ended without the answer", "no_answer", "{:d}", False),
    ("... of them at finishReason tool-calls", "no_answer_dead_end", "{:d}", False),
    ("turns answered", "answered", "{:d}", False),
    ("unclassified turns (reported apart)", "unclassified", "{:d}", False),
)
RATIO_KEYS = frozenset({"p50_ms", "p99_ms", "requests_per_turn"})


def markdown(result: dict[str, Any]) -> str:
    s = result["settings"]
    figures = result["figures"]
    lines = [
        f"Peer benchmark: {s['turns']} turns per pattern, half one tool, half three in "
        f"parallel; scripted model {s['first_chunk_delay']} s to the first chunk, "
        f"{s['chunk_delay']} s per chunk; 0-{s['jitter'] * 1000:.0f} ms jitter per frame "
        f"each way; {result['duration_s']} s.",
        "",
        "| figure | work | rpc (clienttools) | round trip (ai chat) | round trip / rpc |",
        "|---|---|---|---|---|",
    ]
    for label, key, fmt, by_work in FIGURE_ROWS:
        for kind in ("all", *WORKS) if by_work else ("all",):
            a, b = figures["rpc"][kind].get(key), figures["round-trip"][kind].get(key)
            if a is None or b is None:
                continue
            ratio = f"{b / a:.2f}" if key in RATIO_KEYS and a else ""
            lines.append(f"| {label} | {kind} | {fmt.format(a)} | {fmt.format(b)} | {ratio} |")
    details = sorted({d for p in figures.values() for d in p["all"]["unclassified_details"] if d})
    if details:
        lines += ["", "Unclassified: " + "; ".join(details)]
    if result["proxy_errors"]:
        lines += ["", "Fault proxy errors: " + "; ".join(result["proxy_errors"][:5])]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = bounded.Parser(prog="python -m bench.peer", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--turns", type=bounded.positive_int, default=PeerSettings.turns, help="turns per pattern"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_time_limit(default=1800)
    args = parser.parse_args(argv)
    if not (WEB / "pyodide" / "pyodide.mjs").is_file():
        parser.error(f"{WEB / 'pyodide'} is missing: run `make web` first")

    def body(budget: bounded.Budget) -> int:
        result = measure(PeerSettings(turns=args.turns), log_dir=args.out)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "peer.json").write_text(json.dumps(result, indent=2) + "\n")
        text = markdown(result)
        (args.out / "peer.md").write_text(text)
        sys.stdout.write(text)
        return 0

    return bounded.run(parser.prog, args.time_limit, body)


if __name__ == "__main__":
    sys.exit(main())
