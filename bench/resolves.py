"""Pending calls resolved over HTTP: N concurrent resolves on N pending steps.

A server process with a ledger (`--db`) and a token; one fake page registers a
tool and starts N chats, each asking for one call the page never answers, so
N executions wait with one pending `client` step each. Then N
`POST /executions/{id}/steps/{seq}/resolve` requests go out at once, each on
its own connection. Every one must be `applied` (200), each step must be
applied exactly once in the ledger, a second round must be all `duplicate`
(409), and every run must then finish. Reported: the latency of each resolve
(p50, p99, max, from the first byte written to the last byte read), the wall
time of the whole burst, and the time until every run had completed. Before
the burst, N / 10 more pending steps (at most 100) are resolved one at a time:
the latency of a resolve with nothing queued ahead of it.

    python -m bench.resolves            # N = 1,000
    python -m bench.resolves --n 50
"""

from __future__ import annotations

import asyncio
import json
import secrets
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.support.http import http_json
from tests.support.server_process import ServerProcess
from websockets.asyncio.client import connect

from bench import bounded

TOKEN = "bench-" + "t" * 16
SESSION = "resolves"
TOOL = {
    "name": "hold",
    "description": "a call the page never answers",
    "inputSchema": {"type": "object"},
    "outputSchema": {"type": "object", "required": ["n"], "properties": {"n": {"type": "integer"}}},
}


def _send_frame(index: int) -> str:
    request_id = f"req-{index}"
    return json.dumps(
        {
            "type": "send",
            "requestId": request_id,
            "id": f"chat-{index}",
            "trigger": "submit-message",
            "messages": [
                {
                    "id": f"u-{index}",
                    "role": "user",
                    "parts": [{"type": "text", "text": f'call hold {{"n": {index}}}'}],
                }
            ],
            "headers": {},
            "body": {},
        }
    )


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


async def _pending_steps(port: int, n: int) -> list[tuple[str, int]]:
    async with asyncio.timeout(bounded.current().timeout(120)):
        while True:
            steps: list[tuple[str, int]] = []
            cursor = ""
            while True:  # page through the listing, 1,000 at a time (its largest limit)
                path = f"/executions?status=paused&session={SESSION}&limit=1000{cursor}"
                executions = (await http_json("127.0.0.1", port, "GET", path, token=TOKEN)).json[
                    "executions"
                ]
                steps += [(e["executionId"], p["seq"]) for e in executions for p in e["pending"]]
                if len(executions) < 1000:
                    break
                cursor = f"&before={executions[-1]['executionId']}"
            if len(steps) >= n:
                return steps
            await asyncio.sleep(0.2)


async def _resolve_all(port: int, steps: list[tuple[str, int]]) -> list[tuple[int, str, float]]:
    async def one(execution_id: str, seq: int, n: int) -> tuple[int, str, float]:
        path = f"/executions/{execution_id}/steps/{seq}/resolve"
        started = time.perf_counter()
        reply = await http_json(
            "127.0.0.1", port, "POST", path, {"output": {"n": n}}, token=TOKEN, timeout=120
        )
        return reply.status, reply.json.get("outcome", ""), time.perf_counter() - started

    return await asyncio.gather(*(one(e, s, i) for i, (e, s) in enumerate(steps)))


def _ledger_counts(db: Path) -> dict[str, int]:
    with sqlite3.connect(db) as raw:
        rows = raw.execute(
            "SELECT state, COUNT(*) FROM steps WHERE name = 'hold' GROUP BY state"
        ).fetchall()
        done = raw.execute("SELECT COUNT(*) FROM executions WHERE status = 'completed'").fetchone()
    raw.close()
    return {**{state: count for state, count in rows}, "completed": done[0]}


async def _measure(n: int, workdir: Path) -> dict[str, Any]:
    db = workdir / "ledger.sqlite3"
    server = ServerProcess(["--db", str(db), "--token", TOKEN], log=workdir / "server.log")
    budget = bounded.current()
    budget.step("start the server")
    await asyncio.to_thread(server.start)
    try:
        url = f"{server.ws_url(SESSION)}?token={TOKEN}"
        async with connect(url, max_size=None) as page:
            tools = {
                "type": "cf_agent_client_tools",
                "protocol": 1,
                "clientId": "bench-" + secrets.token_hex(4),
                "tools": [TOOL],
            }
            await page.send(json.dumps(tools))
            reader = asyncio.create_task(_drain(page))
            alone = min(100, max(1, n // 10))
            budget.step(f"{n + alone} chats that each wait for one call")
            for index in range(n + alone):
                await page.send(_send_frame(index))
            steps = await _pending_steps(server.port, n + alone)
            assert len(steps) == n + alone, len(steps)
            budget.step(f"{alone} resolves one at a time")
            sequential = []
            for execution_id, seq in steps[n:]:
                sequential += await _resolve_all(server.port, [(execution_id, seq)])
            steps = steps[:n]
            budget.step(f"{n} resolves at once, then again (each a duplicate)")
            started = time.perf_counter()
            first = await _resolve_all(server.port, steps)
            burst_s = time.perf_counter() - started
            second = await _resolve_all(server.port, steps)
            budget.step("wait for every run to complete")
            async with asyncio.timeout(budget.timeout(120)):
                while (counts := _ledger_counts(db))["completed"] < n + alone:
                    await asyncio.sleep(0.1)
            finished_s = time.perf_counter() - started
            reader.cancel()
    finally:
        await asyncio.to_thread(server.stop)
    latencies = [seconds * 1000 for _, _, seconds in first]
    alone_ms = [seconds * 1000 for _, _, seconds in sequential]
    applied = sum(1 for status, outcome, _ in first if (status, outcome) == (200, "applied"))
    applied_alone = sum(1 for status, _, _ in sequential if status == 200)
    duplicates = sum(1 for status, outcome, _ in second if (status, outcome) == (409, "duplicate"))
    return {
        "n": n,
        "applied": applied,
        "duplicate_on_second_round": duplicates,
        "ledger_applied": counts.get("applied", 0) - applied_alone,
        "ledger_other": sum(v for k, v in counts.items() if k not in ("applied", "completed")),
        "completed_runs": counts["completed"],
        "exactly_once": applied == n == duplicates == counts.get("applied", 0) - applied_alone
        and applied_alone == alone,
        "p50_ms": statistics.median(latencies),
        "p99_ms": _percentile(latencies, 0.99),
        "max_ms": max(latencies),
        "burst_s": burst_s,
        "resolves_per_s": n / burst_s,
        "all_runs_completed_s": finished_s,
        "alone_n": alone,
        "alone_p50_ms": statistics.median(alone_ms),
        "alone_p99_ms": _percentile(alone_ms, 0.99),
    }


async def _drain(page: Any) -> None:
    """Read (and drop) the invokes, chunks and cancels the server sends the page."""
    async for _ in page:
        pass


def measure(n: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-resolves-") as workdir:
        return asyncio.run(_measure(n, Path(workdir)))


def markdown(result: dict[str, Any]) -> str:
    return (
        f"| {result['n']:,} concurrent HTTP resolves | p50 {result['p50_ms']:.1f} ms | "
        f"p99 {result['p99_ms']:.1f} ms | max {result['max_ms']:.1f} ms | "
        f"burst {result['burst_s']:.2f} s ({result['resolves_per_s']:,.0f}/s) | "
        f"applied {result['applied']:,}, duplicate after {result['duplicate_on_second_round']:,}, "
        f"ledger applied {result['ledger_applied']:,} | "
        f"all runs done {result['all_runs_completed_s']:.2f} s | "
        f"one at a time: p50 {result['alone_p50_ms']:.1f} ms, "
        f"p99 {result['alone_p99_ms']:.1f} ms |\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = bounded.Parser(prog="python -m bench.resolves", description=__doc__)
    parser.add_argument(
        "--n", type=bounded.positive_int, default=1000, help="pending steps (default %(default)s)"
    )
    parser.add_time_limit(default=600)
    args = parser.parse_args(argv)

    def body(budget: bounded.Budget) -> int:
        result = measure(args.n)
        sys.stdout.write(json.dumps(result, indent=2) + "\n" + markdown(result))
        return 0 if result["exactly_once"] else bounded.EXIT_FAILED

    return bounded.run(parser.prog, args.time_limit, body)


if __name__ == "__main__":
    sys.exit(main())
