"""Server processes on one PostgreSQL: a browser call across processes, and throughput with 1-3.

    .venv/bin/python -m bench.cluster                 # 3 runs; bench/results/cluster.{json,md}
    .venv/bin/python -m bench.cluster --quick         # the smoke version: tiny N, 1 run
    .venv/bin/python -m bench --only cluster          # the same, inside the whole suite

Every chat's user text is ``call add {...}`` lines, which the scripted model
turns into browser calls, so each call takes the whole path (run, ledger,
model step, invoke, result, ack, model step, text, ``end``). The pages and the
chats are separate sockets, in a load generator of their own
(``python -m bench.cluster load``, a subprocess); the servers are
``python -m clienttools_server --db postgresql://...``, each on its own port,
on one PostgreSQL started for the run (tests/support/postgres.py: Unix
socket, ``fsync=off``), each figure on a fresh schema.

1. **Across against within** (2 processes, A and B): one page and one chat
   socket, chats one after another, one call each. "Within": the page and
   the chat on A. "Across": the chat on A, the page on B, so the invoke, the
   result and the wake-up travel between the processes through PostgreSQL.
   Latency is the chat's (send to ``end``), p50/p99; CPU per call is that of
   both server processes, and PostgreSQL's own (the postmaster and its
   children) apart.
2. **Throughput** with 1, 2 and 3 processes: many clients at once, each a page
   and a chat socket placed at random over the processes (what a balancer
   with no sticky sessions does), chats one after another, two parallel calls
   each: chats/s and browser calls/s, and how busy each process was (CPU
   seconds per second of wall time: 1.0 is one core), PostgreSQL and the load
   generator too, so the report says what limits it. Beside them, 3 processes
   with each session's page and chat on one process (a sticky balancer): what
   routing between processes costs at full load.

Within each run the set-ups alternate in order; ratios are taken within a run,
and the report gives median [min..max] over runs.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from tests.support.postgres import PostgresServer
from tests.support.server_process import ServerProcess
from websockets.asyncio.client import ClientConnection, connect

from bench import bounded
from bench.ledgers import _children, _database_cpu, _postmaster_pid
from bench.serverload import _cpu_seconds

ROOT = Path(__file__).resolve().parent.parent
LOAD_TIMEOUT_S = 900.0
#: What the load generator prints when its timed part begins and ends.
TIMED_BEGIN, TIMED_END = "timed: begin", "timed: end"
TOOL = {
    "name": "add",
    "description": "Add two integers.",
    "inputSchema": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    },
}


@dataclass(frozen=True)
class Settings:
    runs: int = 3
    #: figure 1: chats one after another, one call each, after untimed warm-up chats
    latency_chats: int = 200
    latency_warmup: int = 20
    #: figure 2: clients at once, chats each, calls per chat
    clients: int = 40
    chats_per_client: int = 10
    calls_per_chat: int = 2
    seed: int = 14


QUICK = Settings(runs=1, latency_chats=20, latency_warmup=5, clients=6, chats_per_client=3)


# -- the load generator (its own process) ---------------------------------------------


async def _page(url: str, client_id: str, registered: asyncio.Event) -> None:
    """A page: registers `add`, then answers every invoke, until cancelled."""
    async with connect(url, max_size=None, compression=None) as ws:
        frame = {"type": "cf_agent_client_tools", "protocol": 1, "clientId": client_id}
        await ws.send(json.dumps({**frame, "tools": [TOOL]}))
        async for text in ws:
            message = json.loads(text)
            kind = message.get("type")
            if kind == "cf_agent_client_tools_ack":
                registered.set()
            elif kind == "cf_agent_client_tool_invoke":
                tool_input = message["input"]
                result = {
                    "type": "cf_agent_client_tool_result",
                    "requestId": message["requestId"],
                    "output": tool_input["a"] + tool_input["b"],
                }
                await ws.send(json.dumps(result))


async def _chat(ws: ClientConnection, chat_id: str, first: int, calls: int) -> bool:
    """One chat of `calls` parallel calls; True once every output came back before `end`."""
    request_id = secrets.token_hex(8)
    text = "\n".join(f'call add {{"a": {first + k}, "b": 1}}' for k in range(calls))
    message = {"id": f"u-{request_id}", "role": "user", "parts": [{"type": "text", "text": text}]}
    frame: dict[str, Any] = {"type": "send", "requestId": request_id, "id": chat_id}
    frame |= {"trigger": "submit-message", "messages": [message], "headers": {}, "body": {}}
    await ws.send(json.dumps(frame))
    outputs: set[int] = set()
    while True:
        reply = json.loads(await ws.recv())
        if reply.get("requestId") != request_id:
            continue
        kind = reply.get("type")
        if kind == "chunk" and reply["chunk"].get("type") == "tool-output-available":
            outputs.add(reply["chunk"]["output"])
        elif kind in ("end", "error", "cf_agent_protocol_error"):
            return kind == "end" and outputs == {first + k + 1 for k in range(calls)}


class _Gate:
    """The timed chats start once every client is warm."""

    def __init__(self, clients: int) -> None:
        self.waiting = clients
        self.warm = asyncio.Event()
        self.start = asyncio.Event()

    def arrived(self) -> None:
        self.waiting -= 1
        if self.waiting == 0:
            self.warm.set()


async def _client(
    index: int, page_url: str, chat_url: str, chats: int, calls: int, warmup: int, gate: _Gate
) -> list[float]:
    """One page and one chat socket of a session; the chats' latencies (s), timed after start."""
    registered = asyncio.Event()
    # A chat id belongs to the session that first used it: each load's chats are its own.
    tag = secrets.token_hex(4)
    page = asyncio.create_task(_page(page_url, f"load-{index}", registered))
    try:
        await asyncio.wait_for(registered.wait(), 60.0)
        async with connect(chat_url, max_size=None, compression=None) as ws:
            # Untimed: the registration reaches the chat's process (it may be another).
            for attempt in range(100):
                if await _chat(ws, f"warm-{tag}-{index}-{attempt}", 0, 1):
                    break
                await asyncio.sleep(0.05)
            else:
                raise RuntimeError(f"client {index}: the page's tool never reached the chat")
            for i in range(warmup):
                if not await _chat(ws, f"warm-{tag}-{index}-{i}", i * calls, calls):
                    raise RuntimeError(f"client {index}: warm-up chat {i} without its outputs")
            gate.arrived()
            await gate.start.wait()
            latencies = []
            for i in range(chats):
                began = time.perf_counter()
                if not await _chat(ws, f"chat-{tag}-{index}-{i}", i * calls, calls):
                    raise RuntimeError(f"client {index}: chat {i} ended without its outputs")
                latencies.append(time.perf_counter() - began)
            return latencies
    finally:
        page.cancel()
        await asyncio.gather(page, return_exceptions=True)


def _percentile(ordered: Sequence[float], fraction: float) -> float:
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


async def load(
    pairs: Sequence[tuple[str, str]], chats: int, calls: int, warmup: int = 0
) -> dict[str, Any]:
    """Every (page URL, chat URL) pair at once, `chats` chats each; timed from the last warm-up."""
    gate = _Gate(len(pairs))
    tasks = [
        asyncio.create_task(_client(i, page, chat, chats, calls, warmup, gate))
        for i, (page, chat) in enumerate(pairs)
    ]
    # The timed part begins once every client is warm (or one failed: gather raises it).
    warm = asyncio.ensure_future(gate.warm.wait())
    await asyncio.wait([warm, *tasks], return_when=asyncio.FIRST_COMPLETED)
    warm.cancel()
    # The driver reads every process's CPU at these two marks, around the timed part only.
    _mark(TIMED_BEGIN)
    began = time.perf_counter()
    cpu_began = time.process_time()
    gate.start.set()
    per_client = await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - began
    load_cpu = time.process_time() - cpu_began
    _mark(TIMED_END)
    latencies = sorted(x for client in per_client for x in client)
    total = len(pairs) * chats
    return {
        "chats": total,
        "calls": total * calls,
        "elapsed_s": elapsed,
        "chats_per_s": total / elapsed,
        "calls_per_s": total * calls / elapsed,
        "chat_p50_ms": _percentile(latencies, 0.5) * 1000,
        "chat_p99_ms": _percentile(latencies, 0.99) * 1000,
        "chat_mean_ms": statistics.fmean(latencies) * 1000,
        "load_cpu_s": load_cpu,
    }


def _mark(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


# -- the driver -----------------------------------------------------------------------


class Servers:
    """N server processes on one fresh schema; CPU seconds of each and of PostgreSQL."""

    def __init__(self, postgres: PostgresServer, count: int, directory: Path) -> None:
        self.postgres = postgres
        url = postgres.fresh_url()
        self.processes = [
            ServerProcess(["--db", url], log=directory / f"server-{count}-{i}.log")
            for i in range(count)
        ]

    def __enter__(self) -> Servers:
        try:
            for server in self.processes:
                server.start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for server in self.processes:
            server.stop()

    def url(self, index: int, session: str) -> str:
        return self.processes[index].ws_url(session)

    def cpu(self) -> Sample:
        """CPU seconds of each server process, of PostgreSQL's, of the whole machine, and
        the seconds the server processes and PostgreSQL's waited for a CPU."""
        servers, waited = [], 0.0
        for server in self.processes:
            assert server.process is not None
            seconds = _cpu_seconds(server.process.pid)
            servers.append(seconds if seconds is not None else float("nan"))
            waited += _runqueue_seconds(server.process.pid)
        postmaster = _postmaster_pid(self.postgres)
        database = _database_cpu(postmaster)
        everyone = [postmaster, *_children(postmaster)]
        database_waited = sum(_runqueue_seconds(pid) for pid in everyone)
        return Sample(servers, database, _machine_cpu_seconds(), waited, database_waited)


@dataclass(frozen=True)
class Sample:
    servers: list[float]
    database: float
    machine: float
    servers_waited: float
    database_waited: float


def _runqueue_seconds(pid: int) -> float:
    """Seconds the process was runnable but waiting for a CPU (/proc/PID/schedstat), 0 if gone."""
    try:
        fields = Path(f"/proc/{pid}/schedstat").read_text().split()
    except OSError:
        return 0.0
    return int(fields[1]) / 1e9


def _machine_cpu_seconds() -> float:
    """CPU seconds every core of the machine spent busy (not idle, not waiting) since boot."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    # guest time is counted in user already (proc(5)): leave fields 8 and 9 out.
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def run_load(
    servers: Servers, pairs: list[tuple[str, str]], chats: int, calls: int, warmup: int = 0
) -> dict[str, Any]:
    """The load generator against `servers`; its figures plus each process's CPU.

    The CPU of the servers and of PostgreSQL is read at the load generator's marks,
    so it covers the timed chats only: no connect, registration or warm-up in it.
    """
    spec = json.dumps({"pairs": pairs, "chats": chats, "calls": calls, "warmup": warmup})
    load = subprocess.Popen(
        [sys.executable, "-m", "bench.cluster", "load", spec],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    marks: dict[str, Sample] = {}
    lines: list[str] = []
    limit = bounded.current().timeout(LOAD_TIMEOUT_S)
    watchdog = threading.Timer(limit, load.kill)  # a hung load ends the run
    watchdog.start()
    try:
        assert load.stdout is not None
        for line in load.stdout:
            line = line.strip()
            if line in (TIMED_BEGIN, TIMED_END):
                marks[line] = servers.cpu()
            else:
                lines.append(line)
        load.wait(timeout=limit)
    finally:
        watchdog.cancel()
        if load.poll() is None:
            load.kill()
            load.wait()
    stderr = load.stderr.read() if load.stderr is not None else ""
    if load.stderr is not None:
        load.stderr.close()
    if load.stdout is not None:
        load.stdout.close()
    if load.returncode != 0 or len(marks) != 2:
        raise RuntimeError(f"the load generator failed: {stderr.strip()[-3000:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    before, after = marks[TIMED_BEGIN], marks[TIMED_END]
    servers_before, database_before, machine_before = (
        before.servers,
        before.database,
        before.machine,
    )
    servers_after, database_after, machine_after = after.servers, after.database, after.machine
    calls_total = result["calls"]
    server_cpu = [a - b for a, b in zip(servers_after, servers_before, strict=True)]
    database_cpu = database_after - database_before
    result["server_cpu_s"] = server_cpu
    result["database_cpu_s"] = database_cpu
    result["server_cpu_per_call_ms"] = sum(server_cpu) / calls_total * 1000
    result["database_cpu_per_call_ms"] = database_cpu / calls_total * 1000
    # Busy: CPU seconds per wall second of the timed part (1.0 = one core).
    wall = result["elapsed_s"]
    result["server_busy"] = [seconds / wall for seconds in server_cpu]
    result["database_busy"] = database_cpu / wall
    result["load_busy"] = result["load_cpu_s"] / wall
    # The whole machine, and what of it was not this benchmark (other jobs on it).
    result["machine_busy"] = (machine_after - machine_before) / wall
    ours = sum(server_cpu) + database_cpu + result["load_cpu_s"]
    result["others_busy"] = max(0.0, result["machine_busy"] - ours / wall)
    # Runnable but not running: the share of the wall time the machine kept them waiting.
    result["servers_waiting"] = (after.servers_waited - before.servers_waited) / wall
    result["database_waiting"] = (after.database_waited - before.database_waited) / wall
    return result


def latency_run(
    postgres: PostgresServer, settings: Settings, run: int, directory: Path
) -> dict[str, dict[str, Any]]:
    """Figure 1: within one process and across two, on the same two processes, in turn."""
    out: dict[str, dict[str, Any]] = {}
    with Servers(postgres, 2, directory) as servers:
        order = ["within", "across"] if run % 2 == 0 else ["across", "within"]
        for number, placement in enumerate(order, 1):
            bounded.current().step(f"run {run + 1}: a call {placement} processes", number, 2)
            session = f"lat-{placement}-{run}"
            page = servers.url(0 if placement == "within" else 1, session)
            pairs = [(page, servers.url(0, session))]
            out[placement] = run_load(
                servers, pairs, settings.latency_chats, 1, settings.latency_warmup
            )
            _progress(f"run {run + 1}: {placement}: {_brief(out[placement])}")
    return out


#: Figure 2's set-ups: (name, processes, placement of a session's page and chat).
SETUPS = (
    ("1_processes", 1, "random"),
    ("2_processes", 2, "random"),
    ("3_processes", 3, "random"),
    ("3_sticky", 3, "sticky"),
)


def throughput_run(
    postgres: PostgresServer, settings: Settings, run: int, directory: Path
) -> dict[str, dict[str, Any]]:
    """Figure 2: 1, 2 and 3 processes, pages and chats placed at random; and 3 with
    every session's page and chat on one process (a sticky balancer), for comparison."""
    out: dict[str, dict[str, Any]] = {}
    setups = SETUPS[run % len(SETUPS) :] + SETUPS[: run % len(SETUPS)]
    for number, (name, count, placement) in enumerate(setups, 1):
        bounded.current().step(f"run {run + 1}: throughput, {name}", number, len(setups))
        rng = random.Random(settings.seed + run)
        with Servers(postgres, count, directory) as servers:
            pairs = []
            for i in range(settings.clients):
                session = f"tp-{name}-{run}-{i}"
                if placement == "sticky":
                    page = chat = i % count
                else:
                    page, chat = rng.randrange(count), rng.randrange(count)
                pairs.append((servers.url(page, session), servers.url(chat, session)))
            out[name] = run_load(servers, pairs, settings.chats_per_client, settings.calls_per_chat)
            across = sum(p.split("/agents")[0] != c.split("/agents")[0] for p, c in pairs)
            out[name]["sessions_across"] = across / len(pairs)
            _progress(f"run {run + 1}: {name}: {_brief(out[name])}")
    return out


def _brief(result: dict[str, Any]) -> str:
    busy = ", ".join(f"{b:.2f}" for b in result["server_busy"])
    return (
        f"{result['chats_per_s']:.1f} chats/s, p50 {result['chat_p50_ms']:.1f} ms, "
        f"p99 {result['chat_p99_ms']:.1f} ms, server CPU/call "
        f"{result['server_cpu_per_call_ms']:.2f} ms, busy [{busy}] "
        f"pg {result['database_busy']:.2f} load {result['load_busy']:.2f} "
        f"others {result['others_busy']:.2f} waiting {result['servers_waiting']:.2f}"
    )


def _summary(values: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _fmt(stats: dict[str, float], digits: int = 2) -> str:
    return f"{stats['median']:,.{digits}f} [{stats['min']:,.{digits}f}..{stats['max']:,.{digits}f}]"


LATENCY_FIGURES = (
    ("chat_p50_ms", "chat p50 (ms)"),
    ("chat_p99_ms", "chat p99 (ms)"),
    ("server_cpu_per_call_ms", "server CPU per call, both processes (ms)"),
    ("database_cpu_per_call_ms", "PostgreSQL CPU per call (ms)"),
)


def summarize(runs: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    latency: dict[str, Any] = {}
    for key, label in LATENCY_FIGURES:
        within = [r["within"][key] for r in runs]
        across = [r["across"][key] for r in runs]
        ratios = [a / w for a, w in zip(across, within, strict=True) if w]
        latency[key] = {
            "label": label,
            "within": _summary(within),
            "across": _summary(across),
            "ratio": _summary(ratios) if ratios else None,
        }
    throughput: dict[str, Any] = {}
    for name, _, _ in SETUPS:
        results = [r[name] for r in runs]
        base = [r["1_processes"]["chats_per_s"] for r in runs]
        throughput[name] = {
            "chats_per_s": _summary([r["chats_per_s"] for r in results]),
            "calls_per_s": _summary([r["calls_per_s"] for r in results]),
            "chat_p50_ms": _summary([r["chat_p50_ms"] for r in results]),
            "chat_p99_ms": _summary([r["chat_p99_ms"] for r in results]),
            "against_1": _summary(
                [r["chats_per_s"] / b for r, b in zip(results, base, strict=True)]
            ),
            "server_cpu_per_call_ms": _summary([r["server_cpu_per_call_ms"] for r in results]),
            "database_cpu_per_call_ms": _summary([r["database_cpu_per_call_ms"] for r in results]),
            "busiest_server": _summary([max(r["server_busy"]) for r in results]),
            "servers_busy": _summary([sum(r["server_busy"]) for r in results]),
            "database_busy": _summary([r["database_busy"] for r in results]),
            "load_busy": _summary([r["load_busy"] for r in results]),
            "machine_busy": _summary([r["machine_busy"] for r in results]),
            "others_busy": _summary([r["others_busy"] for r in results]),
            "servers_waiting": _summary([r["servers_waiting"] for r in results]),
            "database_waiting": _summary([r["database_waiting"] for r in results]),
            "sessions_across": _summary([r["sessions_across"] for r in results]),
        }
    return {"latency": latency, "throughput": throughput}


def markdown(results: dict[str, Any]) -> str:
    meta = results["meta"]
    settings = meta["settings"]
    lines = [
        "## Server processes on one PostgreSQL (bench/cluster.py)",
        "",
        f"{meta['started']}, {meta['runs']} run(s), {meta['duration_s']} s, "
        f"{meta['cpus']} CPUs, load average at the end {meta['load_average_end']}.",
        "",
        f"1. A browser call across two processes against within one "
        f"({settings['latency_chats']} chats one after another, one call each):",
        "",
        "| figure | within one process | across (chat on A, page on B) | ratio |",
        "|---|---|---|---|",
    ]
    for figure in results["summary"]["latency"].values():
        ratio = _fmt(figure["ratio"]) if figure["ratio"] else "n/a"
        lines.append(
            f"| {figure['label']} | {_fmt(figure['within'])} | {_fmt(figure['across'])} | {ratio} |"
        )
    lines += [
        "",
        f"2. Throughput: {settings['clients']} clients at once (a page and a chat socket "
        f"each, placed at random; sticky: both on one process), "
        f"{settings['chats_per_client']} chats each, {settings['calls_per_chat']} calls a "
        "chat. Busy = CPU seconds per wall second (1.00 = one core):",
        "",
        "| processes | chats/s | browser calls/s | against 1 | chat p50 (ms) | chat p99 (ms) "
        "| server CPU per call (ms) | PostgreSQL CPU per call (ms) | busiest process "
        "| all processes | PostgreSQL | load generator | other jobs on the machine "
        "| processes waiting for a CPU | PostgreSQL waiting for a CPU | sessions across |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, count, placement in SETUPS:
        t = results["summary"]["throughput"][name]
        where = "" if placement == "random" else f", {placement}"
        lines.append(
            f"| {count}{where} | {_fmt(t['chats_per_s'], 1)} | {_fmt(t['calls_per_s'], 1)} "
            f"| {_fmt(t['against_1'])} | {_fmt(t['chat_p50_ms'], 1)} | {_fmt(t['chat_p99_ms'], 1)} "
            f"| {_fmt(t['server_cpu_per_call_ms'])} | {_fmt(t['database_cpu_per_call_ms'])} "
            f"| {_fmt(t['busiest_server'])} | {_fmt(t['servers_busy'])} "
            f"| {_fmt(t['database_busy'])} | {_fmt(t['load_busy'])} "
            f"| {_fmt(t['others_busy'])} | {_fmt(t['servers_waiting'])} "
            f"| {_fmt(t['database_waiting'])} | {_fmt(t['sessions_across'])} |"
        )
    return "\n".join(lines) + "\n"


def measure(
    settings: Settings, runs: list[dict[str, dict[str, Any]]] | None = None
) -> dict[str, Any]:
    """Every run of both figures on one PostgreSQL; raw runs, summary and meta.

    `runs` fills with each run as it completes (what a cut run has measured)."""
    started = time.time()
    runs = [] if runs is None else runs
    budget = bounded.current()
    budget.step("start PostgreSQL")
    postgres = PostgresServer.start()
    try:
        with tempfile.TemporaryDirectory(prefix="clienttools-bench-cluster-") as tmp:
            for run in range(settings.runs):
                budget.step("run", run + 1, settings.runs)
                results = latency_run(postgres, settings, run, Path(tmp))
                results |= throughput_run(postgres, settings, run, Path(tmp))
                runs.append(results)
    finally:
        postgres.close()
    return _results(settings, runs, started)


def _results(
    settings: Settings, runs: list[dict[str, dict[str, Any]]], started: float
) -> dict[str, Any]:
    return {
        "summary": summarize(runs),
        "runs": runs,
        "meta": {
            "settings": asdict(settings),
            "runs": len(runs),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
            "duration_s": round(time.time() - started, 1),
            "cpus": os.cpu_count(),
            "load_average_end": [round(x, 2) for x in os.getloadavg()],
        },
    }


def _progress(message: str) -> None:
    bounded.current().say(message)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["load"]:
        spec = json.loads(args[1])
        pairs = [(page, chat) for page, chat in spec["pairs"]]
        result = asyncio.run(load(pairs, spec["chats"], spec["calls"], spec["warmup"]))
        sys.stdout.write(json.dumps(result) + "\n")
        return 0
    parser = bounded.Parser(prog="python -m bench.cluster", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smoke version: tiny N, one run")
    parser.add_argument(
        "--runs", type=bounded.positive_int, help="runs of both figures (default 3; quick 1)"
    )
    parser.add_argument(
        "--out", type=Path, default=ROOT / "bench" / "results", help="where results go"
    )
    parser.add_time_limit(default=3600)
    parsed = parser.parse_args(args)
    settings = QUICK if parsed.quick else Settings()
    if parsed.runs is not None:
        settings = replace(settings, runs=parsed.runs)
    started = time.time()
    done: list[dict[str, dict[str, Any]]] = []

    def body(budget: bounded.Budget) -> int:
        # A cut run shows the runs it completed (none yet: what the progress lines said).
        budget.partial = lambda: (
            _write(parsed.out, _results(settings, done, started)) if done else ""
        )
        sys.stdout.write(_write(parsed.out, measure(settings, done)))
        return 0

    return bounded.run(parser.prog, parsed.time_limit, body)


def _write(out: Path, results: dict[str, Any]) -> str:
    out.mkdir(parents=True, exist_ok=True)
    (out / "cluster.json").write_text(json.dumps(results, indent=2) + "\n")
    table = markdown(results)
    (out / "cluster.md").write_text(table)
    return table


if __name__ == "__main__":
    sys.exit(main())
