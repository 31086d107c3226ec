"""Idle pages at scale: one server process holding N connected pages, at rest and restarted.

    .venv/bin/python -m bench.idle                      # 10,000 pages (loads the machine)
    .venv/bin/python -m bench.idle --pages 500 --window 10
    .venv/bin/python -m bench.idle --quick              # 200 pages, a 5 s window
    .venv/bin/python -m bench --only idle               # the same, inside the suite

One `python -m clienttools_server --db FILE` (SQLite) and, in another process,
a load generator (`python -m bench.idle load SPEC`) whose N pages are asyncio
`websockets` clients speaking the protocol frames as a page does: each
registers two tools (`add`, `hold`) with `cf_agent_client_tools`, answers every
`cf_agent_ping` with a pong, answers invokes, and after an unexpected close
reconnects with the SDK's own backoff (`clienttools.rules.backoff`: full
jitter, first try within 1 s, cap 30 s), registers again and sends every
result not yet acknowledged (C11). The load generator spreads its sockets over
several loopback source addresses (127.0.0.1-4) so ephemeral ports do not run
short, and both processes raise their open-file limit to the hard limit.

1. **Memory per page**: the server's RSS with N pages registered minus its RSS
   before the first page, over N.
2. **CPU at rest**: the server's CPU seconds over a window (`--window`, 30 s)
   in which nothing happens but pings (the server's `cf_agent_ping` every 15 s
   per page; uvicorn's WebSocket-level ping, every 20 s, only until a page first
   answers ours), per second of wall time: 0.05 is 5 % of one core.
3. **Restart**: `--holders` pages each start a chat whose model calls `hold`
   on them, and keep the result unsent (as a page does that computed it when
   the connection broke). Then the server is killed (SIGKILL) and started again
   on the same port and file. Measured: the time until every page is registered
   again, from the kill and from the moment the new process listens; and each
   held result must be applied (its ack `applied`, the step `applied` in the
   ledger) and its run completed: no lost result.

Goals: at most 50 KB per page, at most 5 % of a core at rest, every page back
within 60 s with no lost result.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import queue
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from tests.support.server_process import ServerProcess
from websockets.asyncio.client import ClientConnection, connect

from bench import bounded
from bench.resolves import _ledger_counts
from bench.serverload import _cpu_seconds
from bench.servermemory import rss_bytes
from clienttools.rules import backoff

ROOT = Path(__file__).resolve().parent.parent
#: Loopback source addresses the pages connect from (28k ephemeral ports each).
SOURCES = ("127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4")
#: Handshakes in flight at once in the load generator (its event loop is the limit).
CONNECTING_AT_ONCE = 200
#: File descriptors beyond one per page (the ledger, logs, the interpreter's own).
FD_MARGIN = 200
GOAL_BYTES_PER_PAGE = 50_000
GOAL_CORE_AT_REST = 0.05
GOAL_BACK_S = 60.0
TOOLS = [
    {
        "name": "add",
        "description": "Add two integers.",
        "inputSchema": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
    {
        "name": "hold",
        "description": "A call whose result the page holds across a restart.",
        "inputSchema": {"type": "object", "properties": {"n": {"type": "integer"}}},
        "outputSchema": {
            "type": "object",
            "required": ["n"],
            "properties": {"n": {"type": "integer"}},
        },
    },
]


@dataclass(frozen=True)
class Settings:
    pages: int = 10_000
    #: seconds of rest measured, after `settle_s` with every page registered
    window_s: float = 30.0
    settle_s: float = 5.0
    #: pages that hold an unsent result across the restart
    holders: int = 100
    #: how long the pages get to come back before the figure counts as missed
    back_timeout_s: float = 180.0


QUICK = Settings(pages=200, window_s=5.0, settle_s=1.0, holders=5, back_timeout_s=90.0)


def raise_fd_limit(needed: int) -> int:
    """Raise this process's open-file limit to its hard limit; fail if `needed` is more."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise bounded.Failed(
            f"{needed:,} file descriptors needed, the hard limit is {hard:,} (ulimit -Hn)"
        )
    if soft != resource.RLIM_INFINITY and soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    return int(soft)


# -- the load generator (its own process) ---------------------------------------------


class Pages:
    """What the load generator's pages share: counts, and when each came back."""

    def __init__(self, count: int, holders: int) -> None:
        self.count = count
        self.holders = holders
        self.registered: set[int] = set()
        self.all_registered = asyncio.Event()
        self.sockets: dict[int, ClientConnection] = {}  # the holders' current sockets
        self.results: dict[str, Any] = {}  # the holders' results by requestId (C7)
        self.unacked: set[str] = set()  # ... of them, not yet acknowledged (C11)
        self.all_held = asyncio.Event()
        self.outcomes: Counter[str] = Counter()
        self.pongs = 0
        self.first_down: float | None = None
        self.back_at: dict[int, float] = {}
        self.acked_at: float | None = None
        self.restarted = False

    def on_registered(self, index: int) -> None:
        self.registered.add(index)
        if self.restarted:
            self.back_at.setdefault(index, time.time())
        if len(self.registered) == self.count:
            self.all_registered.set()

    def on_down(self, index: int) -> None:
        self.registered.discard(index)
        if self.first_down is None:
            self.first_down = time.time()
            self.restarted = True
            self.all_registered.clear()


async def _page(pages: Pages, index: int, url: str, gate: asyncio.Semaphore) -> None:
    """One page, forever: connect, register, answer; reconnect after a close (C11)."""
    source = SOURCES[index % len(SOURCES)]
    tools = json.dumps(
        {
            "type": "cf_agent_client_tools",
            "protocol": 1,
            "clientId": f"idle-{index}",
            "tools": TOOLS,
        }
    )
    delays = backoff()
    connected_once = False
    while True:
        try:
            # A page has a CPU of its own; these N pages share one event loop. Past a
            # few hundred handshakes in flight they starve each other into timeouts and
            # retry forever, so the handshakes in flight at once are capped (first wave
            # and reconnects alike): what is timed is the server, not this loop.
            async with gate:
                ws = await connect(
                    url,
                    local_addr=(source, 0),
                    ping_interval=None,
                    compression=None,
                    proxy=None,  # no proxy lookup per connection: it scans the environment
                    open_timeout=30,
                )
            connected_once = True
            async with ws:
                if index < pages.holders:
                    pages.sockets[index] = ws
                await ws.send(tools)
                delays = backoff()
                async for text in ws:
                    await _on_frame(pages, index, ws, json.loads(text))
        except Exception:  # refused, reset, timed out: as a page does, try again later
            pass
        if connected_once:
            pages.on_down(index)
        await asyncio.sleep(next(delays))


async def _on_frame(pages: Pages, index: int, ws: ClientConnection, frame: dict[str, Any]) -> None:
    kind = frame.get("type")
    if kind == "cf_agent_ping":
        pages.pongs += 1
        await ws.send(json.dumps({"type": "cf_agent_pong", "t": frame.get("t")}))
    elif kind == "cf_agent_client_tools_ack":
        pages.on_registered(index)
        if index < pages.holders:  # C11: every result not yet acknowledged, again
            for request_id in [r for r in pages.unacked if r.startswith(f"{index}:")]:
                await ws.send(_result(request_id.partition(":")[2], pages.results[request_id]))
    elif kind == "cf_agent_client_tool_invoke":
        request_id, tool_input = frame["requestId"], frame.get("input") or {}
        key = f"{index}:{request_id}"
        if frame.get("toolName") == "hold" and not pages.restarted and key not in pages.results:
            # Computed, but the connection breaks before it goes out: held until the restart.
            pages.results[key] = {"n": tool_input.get("n", 0)}
            pages.unacked.add(key)
            if len(pages.results) == pages.holders:
                pages.all_held.set()
            return
        if key in pages.results:  # re-delivered (attempt + 1): the stored result (C7)
            await ws.send(_result(request_id, pages.results[key]))
            return
        output = tool_input.get("a", 0) + tool_input.get("b", 0)
        await ws.send(_result(request_id, output))
    elif kind == "cf_agent_client_tool_result_ack":
        key = f"{index}:{frame.get('requestId')}"
        if key in pages.unacked:
            pages.unacked.discard(key)
            pages.outcomes[frame.get("outcome", "?")] += 1
            if not pages.unacked:
                pages.acked_at = time.time()


def _result(request_id: str, output: Any) -> str:
    return json.dumps({"type": "cf_agent_client_tool_result", "requestId": request_id,
                       "output": output})  # fmt: skip


def _send_chat(index: int) -> str:
    message = {
        "id": f"u-hold-{index}",
        "role": "user",
        "parts": [{"type": "text", "text": f'call hold {{"n": {index}}}'}],
    }
    frame: dict[str, Any] = {
        "type": "send",
        "requestId": f"hold-{index}",
        "id": f"hold-chat-{index}",
    }
    frame |= {"trigger": "submit-message", "messages": [message], "headers": {}, "body": {}}
    return json.dumps(frame)


def _event(**fields: Any) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


async def load(base_url: str, count: int, holders: int) -> None:
    """The load generator: N pages; events on stdout, commands on stdin."""
    pages = Pages(count, holders)
    gate = asyncio.Semaphore(CONNECTING_AT_ONCE)
    started = time.time()
    tasks = [
        asyncio.create_task(_page(pages, i, f"{base_url}/idle-{i}", gate)) for i in range(count)
    ]
    last = 0
    while not pages.all_registered.is_set():
        await asyncio.sleep(0.5)
        if len(pages.registered) - last >= count // 10 or pages.all_registered.is_set():
            last = len(pages.registered)
            _event(event="progress", registered=last)
    _event(event="registered", pages=count, s=time.time() - started, **_self())
    while True:
        line = await asyncio.to_thread(sys.stdin.readline)
        command = json.loads(line) if line.strip() else {"op": "quit"}
        if command["op"] == "hold":
            await _hold(pages)
            _event(event="held", count=holders)
        elif command["op"] == "back":
            await _back(pages, float(command["timeout"]))
        elif command["op"] == "stats":
            _event(event="stats", pongs=pages.pongs, **_self())
        else:
            break
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _hold(pages: Pages) -> None:
    """Each holder page starts a chat on its own socket; wait until every invoke is held."""
    for index in range(pages.holders):
        await pages.sockets[index].send(_send_chat(index))
    await asyncio.wait_for(pages.all_held.wait(), 120)


async def _back(pages: Pages, timeout: float) -> None:
    """After the restart: wait for every page and every held result's ack, then report."""
    last = -1
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout):
            while not (pages.all_registered.is_set() and pages.acked_at is not None):
                await asyncio.sleep(0.5)
                if len(pages.back_at) - last >= max(1, pages.count // 10) or last < 0:
                    last = len(pages.back_at)
                    _event(event="progress", registered=last, held=len(pages.unacked))
    back = sorted(pages.back_at.values())
    _event(
        event="back",
        pages_back=len(pages.registered),
        first_down=pages.first_down,
        last_back=back[-1] if back else None,
        p50_back=back[len(back) // 2] if back else None,
        acked_at=pages.acked_at,
        outcomes=dict(pages.outcomes),
        unacked=len(pages.unacked),
        **_self(),
    )


def _self() -> dict[str, float]:
    """The load generator's own RSS and CPU seconds."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {"load_rss_bytes": rss_bytes(os.getpid()), "load_cpu_s": usage.ru_utime + usage.ru_stime}


# -- the driver -----------------------------------------------------------------------


class LoadProcess:
    """`python -m bench.idle load` and its event lines (read on a thread, with timeouts)."""

    def __init__(self, base_url: str, settings: Settings, log: Path) -> None:
        spec = json.dumps({"url": base_url, "pages": settings.pages, "holders": settings.holders})
        self.log = log
        # A file, not a pipe: the sockets' logging of 10,000 failed handshakes would fill a
        # pipe nobody reads until the end, and block the load generator's event loop.
        with log.open("ab") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "bench.idle", "load", spec],
                cwd=ROOT,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )
        self.events: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with contextlib.suppress(ValueError):
                self.events.put(json.loads(line))
        self.events.put(None)

    def wait_for(self, event: str, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        budget = bounded.current()
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"the load generator sent no {event!r} in {timeout:.0f} s")
            try:
                got = self.events.get(timeout=min(left, 1.0))
            except queue.Empty:
                budget.check()
                continue
            if got is None:
                stderr = self.log.read_text(errors="replace")
                raise bounded.Failed(f"the load generator exited: {stderr.strip()[-1500:]}")
            if got.get("event") == "progress":
                held = f", {got['held']} held results unacknowledged" if "held" in got else ""
                budget.say(f"  {got['registered']:,} pages registered{held}")
            elif got.get("event") == event:
                return got

    def command(self, op: str, **fields: Any) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"op": op, **fields}) + "\n")
        self.process.stdin.flush()

    def close(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.command("quit")
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def measure(settings: Settings, partial: dict[str, Any] | None = None) -> dict[str, Any]:
    """The three figures for one server process; `partial` fills as they are measured."""
    out: dict[str, Any] = {} if partial is None else partial
    out["settings"] = asdict(settings)
    budget = bounded.current()
    raise_fd_limit(settings.pages + FD_MARGIN)  # the server inherits it
    with tempfile.TemporaryDirectory(prefix="clienttools-bench-idle-") as tmp:
        db = Path(tmp) / "ledger.sqlite3"
        server = ServerProcess(["--db", str(db)], log=Path(tmp) / "server.log")
        budget.step("start the server")
        server.start()
        load: LoadProcess | None = None
        try:
            assert server.process is not None
            pid = server.process.pid
            time.sleep(1.0)  # let its start-up settle before the reference RSS
            rss_before = rss_bytes(pid)
            base_url = f"ws://127.0.0.1:{server.port}/agents/chat"
            budget.step(f"connect and register {settings.pages:,} pages")
            load = LoadProcess(base_url, settings, Path(tmp) / "load.log")
            registered = load.wait_for("registered", budget.timeout(600))
            out["connect_s"] = registered["s"]
            budget.step(f"settle {settings.settle_s:g} s, then {settings.window_s:g} s at rest")
            time.sleep(settings.settle_s)
            rss_registered = rss_bytes(pid)
            cpu_before, wall_before = _cpu_seconds(pid), time.monotonic()
            _rest(settings.window_s)
            cpu_after, wall = _cpu_seconds(pid), time.monotonic() - wall_before
            assert cpu_before is not None and cpu_after is not None
            rss_rested = rss_bytes(pid)
            load.command("stats")
            stats = load.wait_for("stats", budget.timeout(60))
            out |= {
                "server_rss_before_bytes": rss_before,
                "server_rss_registered_bytes": rss_registered,
                "server_rss_after_rest_bytes": rss_rested,
                "bytes_per_page": (rss_registered - rss_before) / settings.pages,
                "rest_window_s": wall,
                "server_cpu_at_rest_s": cpu_after - cpu_before,
                "core_at_rest": (cpu_after - cpu_before) / wall,
                "load_rss_bytes": stats["load_rss_bytes"],
                "load_bytes_per_page": stats["load_rss_bytes"] / settings.pages,
                "pongs_during_run": stats["pongs"],
            }
            budget.say(
                f"  {out['bytes_per_page'] / 1000:.1f} KB per page, "
                f"{out['core_at_rest'] * 100:.2f} % of a core at rest"
            )
            budget.step(f"{settings.holders} pages hold a result; kill and restart the server")
            load.command("hold")
            load.wait_for("held", budget.timeout(180))
            killed = time.time()
            server.kill()
            server.start(timeout=budget.timeout(60))
            listening = time.time()
            load.command("back", timeout=settings.back_timeout_s)
            back = load.wait_for("back", budget.timeout(settings.back_timeout_s + 60))
            counts = _wait_completed(db, settings.holders, budget.timeout(60))
            assert server.process is not None
            last_back = back["last_back"]
            out |= {
                "pages_back": back["pages_back"],
                "restart_s": listening - killed,
                "all_back_after_kill_s": None if last_back is None else last_back - killed,
                "all_back_after_listening_s": None if last_back is None else last_back - listening,
                "half_back_after_listening_s": None
                if back["p50_back"] is None
                else back["p50_back"] - listening,
                "held_results": settings.holders,
                "held_outcomes": back["outcomes"],
                "held_unacked": back["unacked"],
                "ledger_hold_steps": {k: v for k, v in counts.items() if k != "completed"},
                "runs_completed": counts["completed"],
                "server_rss_back_bytes": rss_bytes(server.process.pid),
            }
            out["no_lost_result"] = (
                back["outcomes"].get("applied", 0) == settings.holders
                and counts.get("applied", 0) == settings.holders
                and counts["completed"] == settings.holders
            )
            out["all_back"] = back["pages_back"] == settings.pages
        finally:
            if load is not None:
                load.close()
            server.stop()
    return out


def _rest(seconds: float) -> None:
    """Sleep through the window at rest, checking the time limit every second."""
    budget = bounded.current()
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        time.sleep(min(1.0, left))
        budget.check()


def _wait_completed(db: Path, runs: int, timeout: float) -> dict[str, int]:
    deadline = time.monotonic() + timeout
    while True:
        counts = _ledger_counts(db)
        if counts["completed"] >= runs or time.monotonic() > deadline:
            return counts
        time.sleep(0.2)


def markdown(result: dict[str, Any]) -> str:
    s = result["settings"]
    n = s["pages"]

    def verdict(ok: bool | None) -> str:
        return "?" if ok is None else "met" if ok else "MISSED"

    per_page = result.get("bytes_per_page")
    core = result.get("core_at_rest")
    back = result.get("all_back_after_listening_s")
    lines = [
        f"## Idle pages on one server process (bench/idle.py): {n:,} pages",
        "",
        "| figure | value | goal |",
        "|---|---|---|",
    ]
    if per_page is not None:
        lines.append(
            f"| server memory per page (RSS delta / N) | {per_page / 1000:.1f} KB "
            f"| ≤ {GOAL_BYTES_PER_PAGE / 1000:g} KB {verdict(per_page <= GOAL_BYTES_PER_PAGE)} |"
        )
    if core is not None:
        lines.append(
            f"| server CPU at rest, {result['rest_window_s']:.0f} s of pings only "
            f"| {core * 100:.2f} % of a core | ≤ {GOAL_CORE_AT_REST * 100:g} % "
            f"{verdict(core <= GOAL_CORE_AT_REST)} |"
        )
        lines.append(
            f"| load generator memory per page | {result['load_bytes_per_page'] / 1000:.1f} KB | |"
        )
    if "pages_back" in result:
        ok = back is not None and back <= GOAL_BACK_S and result["all_back"]
        back_text = "n/a" if back is None else f"{back:.1f} s"
        lines += [
            f"| pages back after a restart (kill -9, start, same --db) "
            f"| {result['pages_back']:,} of {n:,}, the last {back_text} after the new "
            f"process listened (half by {result['half_back_after_listening_s'] or 0:.1f} s; "
            f"restart took {result['restart_s']:.1f} s) | all within {GOAL_BACK_S:g} s "
            f"{verdict(ok)} |",
            f"| results held across the restart | {result['held_results']} held, acks "
            f"{result['held_outcomes']}, ledger {result['ledger_hold_steps']}, "
            f"{result['runs_completed']} runs completed | none lost "
            f"{verdict(result['no_lost_result'])} |",
        ]
    if len(lines) == 4:
        lines.append("| (nothing measured) | | |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["load"]:
        spec = json.loads(args[1])
        raise_fd_limit(int(spec["pages"]) + FD_MARGIN)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(load(spec["url"], int(spec["pages"]), int(spec["holders"])))
        return 0
    parser = bounded.Parser(prog="python -m bench.idle", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="200 pages, a 5 s window")
    parser.add_argument("--pages", type=bounded.positive_int, help="pages (default 10,000)")
    parser.add_argument(
        "--window", type=bounded.positive_float, help="seconds at rest measured (default 30)"
    )
    parser.add_argument(
        "--holders", type=bounded.positive_int, help="pages holding a result (default 100)"
    )
    parser.add_argument("--json", type=Path, help="write the figures here too")
    parser.add_time_limit(default=900)
    parsed = parser.parse_args(args)
    settings = QUICK if parsed.quick else Settings()
    if parsed.pages is not None:
        settings = replace(settings, pages=parsed.pages)
    if parsed.window is not None:
        settings = replace(settings, window_s=parsed.window)
    if parsed.holders is not None:
        settings = replace(settings, holders=parsed.holders)
    if settings.holders > settings.pages:
        parser.error(f"--holders {settings.holders} is more than the {settings.pages} pages")

    def body(budget: bounded.Budget) -> int:
        result: dict[str, Any] = {}
        budget.partial = lambda: markdown(result) if "settings" in result else ""
        measure(settings, result)
        if parsed.json is not None:
            parsed.json.write_text(json.dumps(result, indent=2) + "\n")
        sys.stdout.write(markdown(result))
        return 0

    return bounded.run(parser.prog, parsed.time_limit, body)


if __name__ == "__main__":
    sys.exit(main())
