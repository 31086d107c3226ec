"""Figure 6: the reference server's resident memory over 20,000 chats, without `--db`.

A server that runs for weeks must not grow with every chat it ever had: the
in-memory ledger deletes finished executions after `--retention`, and the
responses kept for a late resume are capped. This starts the server as its own
process and sends `chats` chats from `clients` fake pages (each a
`call add {...}` chat through the scripted model, as in figure 5), reading the
server's VmRSS from /proc every `sample_every` chats.

    $ python -m bench.servermemory --chats 20000 --clients 50 --retention 2
    {"chats": 20000, "rss_bytes": [[1000, ...], ...], "rss_growth_bytes": ..., ...}

`rss_growth_bytes` is RSS after the last chat minus RSS after `warmup` chats.
The retention is short so that pruning reaches a steady state within the run:
the ledger then holds about `retention` x (chats per second) executions, which
is what the default (60 s) gives a server after its first minute.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from tests.support.server_process import ServerProcess
from websockets.asyncio.client import connect

from bench import bounded
from bench.fleet import TOOL, chat


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


async def _load(
    url: str, pid: int, chats: int, clients: int, sample_every: int, samples: list[list[int]]
) -> list[list[int]]:
    counter = iter(range(chats))
    done = 0

    async def page(index: int) -> None:
        nonlocal done
        async with connect(f"{url}/memory-{index}", max_size=None, compression=None) as ws:
            await ws.send(
                json.dumps(
                    {
                        "type": "cf_agent_client_tools",
                        "protocol": 1,
                        "clientId": f"memory-{index}",
                        "tools": [TOOL],
                    }
                )
            )
            for i in counter:
                if not await chat(ws, index, i):
                    raise RuntimeError(f"chat {i} ended without the tool's output")
                done += 1
                if done % sample_every == 0:
                    samples.append([done, rss_bytes(pid)])
                    bounded.current().step("chats", done, chats)

    await asyncio.gather(*(page(i) for i in range(clients)))
    return samples


def measure(
    chats: int = 20_000,
    clients: int = 50,
    retention: float = 2.0,
    warmup: int = 5_000,
    sample_every: int = 1_000,
    samples: list[list[int]] | None = None,
) -> dict[str, Any]:
    """`samples` fills as the chats go: [chats done, RSS bytes] pairs."""
    samples = [] if samples is None else samples
    server = ServerProcess(["--retention", f"{retention:g}"]).start()
    try:
        assert server.process is not None
        pid = server.process.pid
        url = f"ws://127.0.0.1:{server.port}/agents/chat"
        started = time.perf_counter()
        asyncio.run(_load(url, pid, chats, clients, sample_every, samples))
        elapsed = time.perf_counter() - started
    finally:
        server.stop()
    after_warmup = next((rss for n, rss in samples if n >= warmup), samples[0][1])
    return {
        "chats": chats,
        "clients": clients,
        "retention_s": retention,
        "elapsed_s": elapsed,
        "chats_per_s": chats / elapsed,
        "rss_bytes": samples,
        "rss_after_warmup_bytes": after_warmup,
        "rss_end_bytes": samples[-1][1],
        "rss_growth_bytes": samples[-1][1] - after_warmup,
    }


def main(argv: list[str] | None = None) -> int:
    parser = bounded.Parser(prog="python -m bench.servermemory", description=__doc__)
    parser.add_argument("--chats", type=bounded.positive_int, default=20_000)
    parser.add_argument("--clients", type=bounded.positive_int, default=50)
    parser.add_argument("--retention", type=bounded.positive_float, default=2.0)
    parser.add_argument("--warmup", type=int, default=5_000)
    parser.add_argument("--sample-every", type=bounded.positive_int, default=1_000)
    parser.add_time_limit(default=1200)
    args = parser.parse_args(argv)

    def body(budget: bounded.Budget) -> int:
        budget.step(f"{args.chats} chats from {args.clients} pages")
        samples: list[list[int]] = []
        budget.partial = lambda: json.dumps({"rss_bytes": samples}) + "\n"
        result = measure(
            args.chats, args.clients, args.retention, args.warmup, args.sample_every, samples
        )
        sys.stdout.write(json.dumps(result) + "\n")
        return 0

    return bounded.run(parser.prog, args.time_limit, body)


if __name__ == "__main__":
    sys.exit(main())
