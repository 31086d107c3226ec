"""The server's share of a browser call: its CPU per call above a bare pydantic-ai run's.

    .venv/bin/python -m bench.share                        # 3 runs, 30 pages x 40 chats
    .venv/bin/python -m bench.share --runs 5 --clients 30 --chats 40
    .venv/bin/python -m bench.share --baseline /tmp/other  # and another checkout's server
    .venv/bin/python -m bench.share bare 1200 30           # the bare side alone (JSON)

Each run measures, back to back and in alternating order:

- **server**: `python -m clienttools_server --db FILE` (the SQLite ledger, every
  step committed), driven by `python -m bench.fleet` (figure 5's load: each page
  registers `add`, then sends chats `call add {"a": I, "b": 1}`). The server
  process's CPU seconds over the chats, per chat. Each chat is one browser call
  and the model's two steps around it.
- **bare**: in a process of its own, the same scripted model and the same two
  steps with no server, no socket and no ledger: `Agent.iter` with every node's
  events streamed (as the server runs an agent), `add` a plain tool in the
  process, the same number of chats, as many at once as the fleet has pages.
  The process's CPU seconds over the chats, per chat.

With ``--baseline DIR`` (another checkout of this repository, say an older
commit's), each run also measures that checkout's server, in the same rotation:
an A/B of the share within one run.

The share is server minus bare: the journal, the chunks and their frames, the
proxy, the ledger's batches, the conversation store and the socket. Goal: at
most 2 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import bounded
from bench.serverload import ROOT, measure

GOAL_SHARE_MS = 2.0


async def _bare_chats(chats: int, at_once: int) -> float:
    """CPU seconds of `chats` bare runs, `at_once` at a time (start-up not counted)."""
    from pydantic_ai import Agent

    from clienttools_server.agent.scripted import scripted_model

    agent: Agent[None, str] = Agent(scripted_model())

    @agent.tool_plain
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    async def one(i: int) -> None:
        async with agent.iter(f'call add {{"a": {i}, "b": 1}}') as run:
            async for node in run:
                if Agent.is_model_request_node(node) or Agent.is_call_tools_node(node):
                    async with node.stream(run.ctx) as stream:
                        async for _event in stream:
                            pass
        assert run.result is not None and str(i + 1) in run.result.output, run.result

    async def page(index: int) -> None:
        for i in range(index, chats, at_once):
            await one(i)

    await one(0)  # the first run builds what every later one reuses
    started = time.process_time()
    await asyncio.gather(*(page(index) for index in range(at_once)))
    return time.process_time() - started


def bare(chats: int, at_once: int) -> dict[str, Any]:
    """The bare side in a process of its own: CPU ms per chat."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.share", "bare", str(chats), str(at_once)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=bounded.current().timeout(600),
    )
    if done.returncode != 0:
        raise bounded.Failed(f"the bare run failed: {done.stderr.strip()[-800:]}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def _median(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.2f} [{min(values):.2f}..{max(values):.2f}]"


def _body(args: argparse.Namespace, budget: bounded.Budget) -> int:
    server_ms: list[float] = []
    bare_ms: list[float] = []
    shares: list[float] = []
    baseline_ms: list[float] = []
    baseline_shares: list[float] = []
    baseline_env = None
    if args.baseline is not None:
        tree = Path(args.baseline).resolve()
        if not (tree / "server" / "clienttools_server").is_dir():
            raise bounded.Failed(f"{tree} is not a checkout of this repository (no server/)")
        baseline_env = {"PYTHONPATH": f"{tree / 'server'}:{tree / 'client'}"}

    def table() -> str:
        verdict = ""
        if shares:
            met = statistics.median(shares) <= GOAL_SHARE_MS
            verdict = "met" if met else "MISSED"
        return (
            f"## The server's share of a browser call ({args.clients} pages x "
            f"{args.chats} chats, {len(shares)} runs)\n\n"
            "| figure | median [min..max] |\n|---|---|\n"
            f"| server CPU per call (ms) | {_median(server_ms)} |\n"
            f"| bare pydantic-ai run, CPU per chat (ms) | {_median(bare_ms)} |\n"
            f"| the server's share (ms) | {_median(shares)} (goal <= {GOAL_SHARE_MS:g}) "
            f"{verdict} |\n"
            + (
                f"| baseline server CPU per call (ms) | {_median(baseline_ms)} |\n"
                f"| baseline's share (ms) | {_median(baseline_shares)} |\n"
                if baseline_ms
                else ""
            )
        )

    budget.partial = table
    chats = args.clients * args.chats
    for index in range(args.runs):
        budget.step("run", index + 1, args.runs)
        pair: dict[str, float] = {}
        sides = ["server", "bare"] + (["baseline"] if baseline_env is not None else [])
        order = sides[index % len(sides) :] + sides[: index % len(sides)]
        for side in order:
            if side == "bare":
                pair["bare"] = bare(chats, args.clients)["cpu_ms_per_chat"]
                continue
            env = baseline_env if side == "baseline" else None
            fleet = measure(True, args.clients, args.chats, server_env=env)
            if fleet.get("errors"):
                raise bounded.Failed(f"{fleet['errors']} chats failed: {fleet}")
            pair[side] = fleet["server_cpu_per_invoke_ms"]
        server_ms.append(pair["server"])
        bare_ms.append(pair["bare"])
        shares.append(pair["server"] - pair["bare"])
        if "baseline" in pair:
            baseline_ms.append(pair["baseline"])
            baseline_shares.append(pair["baseline"] - pair["bare"])
        budget.say(
            f"  server {pair['server']:.2f} ms, bare {pair['bare']:.2f} ms, "
            f"share {shares[-1]:.2f} ms"
            + (f", baseline server {pair['baseline']:.2f} ms" if "baseline" in pair else "")
        )
    sys.stdout.write(table())
    return 0


def main(argv: list[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else argv
    if arguments[:1] == ["bare"]:  # the bare side's own process
        chats, at_once = (int(value) for value in arguments[1:3])
        cpu = asyncio.run(_bare_chats(chats, at_once))
        print(json.dumps({"chats": chats, "cpu_ms_per_chat": cpu * 1000 / chats}))
        return 0
    parser = bounded.Parser(prog="python -m bench.share", description=__doc__)
    parser.add_argument("--runs", type=bounded.positive_int, default=3, help="runs (default 3)")
    parser.add_argument(
        "--clients", type=bounded.positive_int, default=30, help="pages at once (default 30)"
    )
    parser.add_argument(
        "--chats", type=bounded.positive_int, default=40, help="chats per page (default 40)"
    )
    parser.add_argument(
        "--baseline", metavar="DIR", help="another checkout whose server is measured beside"
    )
    parser.add_time_limit(default=1200)
    args = parser.parse_args(arguments)
    return bounded.run(parser.prog, args.time_limit, lambda budget: _body(args, budget))


if __name__ == "__main__":
    sys.exit(main())
