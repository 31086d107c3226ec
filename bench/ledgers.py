"""PostgreSQL against SQLite as the ledger of one server process, per browser call.

    .venv/bin/python -m bench.ledgers                    # 3 runs, both loads, both stores
    .venv/bin/python -m bench.ledgers --runs 1 --chats 20
    .venv/bin/python -m bench.ledgers --pool-sizes 1,2,4,8,16   # the ledger alone, by pool size

The same load as figure 5 (``bench/fleet.py``: every chat calls the browser
tool ``add`` through the scripted model, so each call takes the whole path:
run, ledger, model step, invoke, result, ack, model step, end), against one
``python -m clienttools_server`` with ``--db FILE`` (SQLite, WAL,
synchronous=NORMAL) or ``--db postgresql://...`` (a PostgreSQL started for
the run: tests/support/postgres.py, Unix socket). Two loads: one page at a
time (latency: chat p50/p99) and 100 pages at once (throughput and CPU).
CPU per call is the server process's own (/proc/PID/stat) and, for
PostgreSQL, also that of its server processes (the postmaster and its
children), since SQLite does that work inside the server process.

Stores and loads alternate within each run; the report gives median
[min..max] over runs.

``--pool-sizes``: the PostgreSQL ledger alone, in this process with no
server around it, by the size of its pool: ``--tasks`` chats at once (each
its own asyncio task), each making the ledger calls of one chat with one
browser call (``ledger_chat``: run, model step and tool call in a batch,
spec, attempt, result, model step, end), ``--chats`` times over all. It
gives chats per second, the latency of a chat's ledger calls (p50/p99), and
CPU per chat in this process and in PostgreSQL's: how far a bigger pool
lets the calls of many tasks overlap.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.support.postgres import PostgresServer

from bench import bounded
from bench.serverload import ROOT, _cpu_seconds, _free_port, _wait_listening
from clienttools_server.ledger.postgres import PostgresLedger


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _database_cpu(postmaster: int) -> float:
    """CPU seconds PostgreSQL has used so far: the postmaster's, its live children's, and
    those of the children it reaped (stat(5)'s cutime and cstime).

    The difference of two readings is what the server used between them, a backend or
    an autovacuum worker that started or exited in the meantime included.
    """
    total = 0.0
    for pid in [postmaster, *_children(postmaster)]:
        seconds = _cpu_seconds(pid)
        if seconds is not None:
            total += seconds
    try:
        fields = Path(f"/proc/{postmaster}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return total
    return total + (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")


def _postmaster_pid(postgres: PostgresServer) -> int:
    return int((postgres.data / "postmaster.pid").read_text().split()[0])


def measure(db: str, clients: int, chats: int, postgres: PostgresServer | None) -> dict[str, Any]:
    port = _free_port()
    command = [sys.executable, "-m", "clienttools_server", "--port", str(port)]
    command += ["--log-level", "warning", "--db", db]
    server = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL)
    try:
        _wait_listening(port, server)
        cpu_before = _cpu_seconds(server.pid)
        pg_before = _database_cpu(_postmaster_pid(postgres)) if postgres else 0.0
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "bench.fleet",
                f"ws://127.0.0.1:{port}/agents/chat",
                "--clients",
                str(clients),
                "--invokes",
                str(chats),
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=bounded.current().timeout(900),
        )
        cpu_after = _cpu_seconds(server.pid)
        pg_after = _database_cpu(_postmaster_pid(postgres)) if postgres else 0.0
    finally:
        server.terminate()
        server.wait(timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"the fleet failed: {done.stderr.strip()[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    invokes = result["invokes"]
    assert cpu_before is not None and cpu_after is not None
    result["server_cpu_per_call_ms"] = (cpu_after - cpu_before) / invokes * 1000
    database = pg_after - pg_before
    result["database_cpu_per_call_ms"] = database / invokes * 1000
    return result


FIGURES = (
    ("chat_p50_ms", "one page: chat p50 (ms)", "1x"),
    ("chat_p99_ms", "one page: chat p99 (ms)", "1x"),
    ("server_cpu_per_call_ms", "one page: server CPU per call (ms)", "1x"),
    ("per_invoke_ms", "100 pages: wall time per call (ms)", "100x"),
    ("server_cpu_per_call_ms", "100 pages: server CPU per call (ms)", "100x"),
    ("database_cpu_per_call_ms", "100 pages: PostgreSQL CPU per call (ms)", "100x"),
)


def _summary(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} [{min(values):.2f}..{max(values):.2f}]"


async def ledger_chat(ledger: PostgresLedger, session: str) -> None:
    """The ledger calls the server makes for one chat with one browser call."""
    now = time.time()
    run = await ledger.start_execution(session, '{"messages":[]}', now)
    async with ledger.batch():
        await ledger.record_step(run.id, 0, "model", "m", '{"turn":0}', "server", now, None, "1")
        await ledger.record_step(run.id, 1, "tool", "add", '{"a":1,"b":2}', "client", now, session)
    await ledger.record_spec(run.id, 1, '{"name":"add"}')
    await ledger.add_attempt(run.id, 1, now, target_connection="c", target_client_id="p")
    assert (await ledger.resolve(run.id, 1, "3", now)).ok
    async with ledger.batch():
        await ledger.record_step(run.id, 2, "model", "m", '{"turn":1}', "server", now, None, "2")
    await ledger.set_status(run.id, "completed", now)
    ledger.release(run.id)


async def pool_load(
    url: str, max_size: int, tasks: int, chats: int, postmaster: int
) -> dict[str, float]:
    """``chats`` chats' ledger calls, ``tasks`` at a time, on a pool of ``max_size``."""
    async with await PostgresLedger.connect(url, max_size=max_size) as ledger:
        await ledger_chat(ledger, "warm-up")  # the pool's first connections, the plans
        latencies: list[float] = []
        left = iter(range(chats))

        async def worker() -> None:
            for number in left:
                started = time.perf_counter()
                await ledger_chat(ledger, f"s{number}")
                latencies.append(time.perf_counter() - started)

        database = _database_cpu(postmaster)
        cpu, wall = time.process_time(), time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(tasks)))
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        after = _database_cpu(postmaster)
    database_cpu = after - database
    latencies.sort()
    return {
        "chats_per_s": chats / wall,
        "p50_ms": latencies[len(latencies) // 2] * 1000,
        "p99_ms": latencies[min(len(latencies) - 1, len(latencies) * 99 // 100)] * 1000,
        "cpu_per_chat_ms": cpu / chats * 1000,
        "database_cpu_per_chat_ms": database_cpu / chats * 1000,
    }


def pool_sizes(sizes: list[int], runs: int, tasks: int, chats: int) -> None:
    budget = bounded.current()
    results: dict[int, list[dict[str, float]]] = {}
    budget.partial = lambda: _pool_table(sizes, runs, tasks, chats, results)
    budget.step("start PostgreSQL")
    postgres = PostgresServer.start()
    try:
        postmaster = _postmaster_pid(postgres)
        for run in range(runs):
            for number, size in enumerate(sizes if run % 2 == 0 else sizes[::-1], 1):
                budget.step(f"run {run + 1}/{runs}: pool of {size}", number, len(sizes))
                url = postgres.fresh_url()
                measured = asyncio.run(pool_load(url, size, tasks, chats, postmaster))
                results.setdefault(size, []).append(measured)
                print(f"{run}-pool-{size}", json.dumps(measured), file=sys.stderr, flush=True)
    finally:
        postgres.close()
    sys.stdout.write(_pool_table(sizes, runs, tasks, chats, results))


def _pool_table(
    sizes: list[int], runs: int, tasks: int, chats: int, results: dict[int, list[dict[str, float]]]
) -> str:
    lines = [
        f"{tasks} chats at once, {chats} chats per run, {runs} run(s); load {os.getloadavg()}",
        "| pool size | chats/s | chat p50 (ms) | chat p99 (ms) | CPU/chat here (ms) | "
        "CPU/chat PostgreSQL (ms) |",
        "|---|---|---|---|---|---|",
    ]
    for size in sizes:
        rows = results.get(size)
        if not rows:
            continue
        cells = [
            _summary([r[key] for r in rows])
            for key in ("chats_per_s", "p50_ms", "p99_ms", "cpu_per_chat_ms",
                        "database_cpu_per_chat_ms")
        ]  # fmt: skip
        lines.append(f"| {size} | {' | '.join(cells)} |")
    return "\n".join(lines) + "\n"


def _table(results: dict[tuple[str, str], list[dict[str, Any]]]) -> str:
    lines = ["| figure | SQLite | PostgreSQL | ratio |", "|---|---|---|---|"]
    for key, label, load in FIGURES:
        sqlite = [r[key] for r in results.get(("sqlite", load), [])]
        pg = [r[key] for r in results.get(("postgres", load), [])]
        ratios = [p / s for p, s in zip(pg, sqlite, strict=False) if s]
        cells = [_summary(v) if v else "n/a" for v in (sqlite, pg, ratios)]
        lines.append(f"| {label} | {' | '.join(cells)} |")
    return "\n".join(lines) + "\n"


def _pool_size_list(text: str) -> list[int]:
    return [bounded.positive_int(size) for size in text.split(",")]


def main(argv: list[str] | None = None) -> int:
    parser = bounded.Parser(prog="python -m bench.ledgers", description=__doc__)
    parser.add_argument("--runs", type=bounded.positive_int, default=3)
    parser.add_argument(
        "--chats", type=bounded.positive_int, default=300, help="chats of the one page"
    )
    parser.add_argument("--pages", type=bounded.positive_int, default=100)
    parser.add_argument("--chats-per-page", type=bounded.positive_int, default=20)
    parser.add_argument(
        "--pool-sizes",
        type=_pool_size_list,
        help="comma-separated: the ledger alone, by pool size (no server)",
    )
    parser.add_argument(
        "--tasks", type=bounded.positive_int, default=100, help="with --pool-sizes: at once"
    )
    parser.add_time_limit(default=1800)
    args = parser.parse_args(argv)
    return bounded.run(parser.prog, args.time_limit, lambda budget: _body(args, budget))


def _body(args: argparse.Namespace, budget: bounded.Budget) -> int:
    if args.pool_sizes:
        pool_sizes(args.pool_sizes, args.runs, args.tasks, args.chats)
        return 0
    results: dict[tuple[str, str], list[dict[str, Any]]] = {}
    budget.partial = lambda: _table(results)
    budget.step("start PostgreSQL")
    postgres = PostgresServer.start()
    try:
        with tempfile.TemporaryDirectory(prefix="clienttools-bench-") as tmp:
            for run in range(args.runs):
                stores = ["sqlite", "postgres"] if run % 2 == 0 else ["postgres", "sqlite"]
                number = 0
                for store in stores:
                    for load, clients, chats in (
                        ("1x", 1, args.chats),
                        ("100x", args.pages, args.chats_per_page),
                    ):
                        number += 1
                        budget.step(f"run {run + 1}/{args.runs}: {store}, {load}", number, 4)
                        where = f"{run}-{store}-{load}"
                        db = (
                            postgres.fresh_url()
                            if store == "postgres"
                            else str(Path(tmp) / f"{where}.sqlite3")
                        )
                        measured = measure(
                            db, clients, chats, postgres if store == "postgres" else None
                        )
                        results.setdefault((store, load), []).append(measured)
                        print(where, json.dumps(measured), file=sys.stderr, flush=True)
    finally:
        postgres.close()
    sys.stdout.write(_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
