"""What checking who is asking costs: a signed token verified, a session's owner looked up.

Measured in one process, no server: ``verify_token`` on a valid token (the
signature, the payload, the expiry), and ``Access.allows`` on a SQLite ledger
file, first for sessions nobody owns yet (one read and one insert each: the
first handshake of a session) and then again for the same sessions (the owner
is cached in the process: no ledger call). One bare HMAC-SHA256 is measured
alongside, as the yardstick of the machine. Times are per call, the median of
``--runs`` runs of ``--n`` calls each, with the range.

    python -m bench.auth
    python -m bench.auth --n 5000 --runs 5
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench import bounded
from clienttools_server.ledger import SqliteLedger
from clienttools_server.wire.auth import Access, Principal, mint_token, verify_token

SECRET = "bench-secret-0123456789abcdef"


def _per_call(runs: list[float]) -> str:
    return f"{statistics.median(runs):.1f} us ({min(runs):.1f}-{max(runs):.1f})"


def _hmac(n: int) -> float:
    """One bare HMAC-SHA256 of a token's size: the yardstick of this machine, this run."""
    key, message = b"k" * 32, b"m" * 100
    start = time.perf_counter()
    for _ in range(n):
        hmac.new(key, message, hashlib.sha256).digest()
    return (time.perf_counter() - start) / n * 1e6


def _verify(n: int) -> float:
    token = mint_token(SECRET, "alice", session="desk", ttl=3600)
    start = time.perf_counter()
    for _ in range(n):
        verify_token(SECRET, token, now=time.time())
    return (time.perf_counter() - start) / n * 1e6


async def _owners(n: int, run: int, directory: Path) -> tuple[float, float]:
    async with SqliteLedger(directory / f"ledger-{run}.sqlite3") as ledger:
        access = Access(lambda connection: None, ledger)
        alice = Principal("alice")
        timings = []
        for _ in range(2):
            start = time.perf_counter()
            for i in range(n):
                await access.allows(alice, f"s{i}", route="WS /bench", claim=True)
            timings.append((time.perf_counter() - start) / n * 1e6)
        return timings[0], timings[1]


def main(argv: list[str] | None = None) -> int:
    parser = bounded.Parser(prog="python -m bench.auth", description=__doc__)
    parser.add_argument(
        "--n", type=bounded.positive_int, default=2000, help="calls per run (default: 2000)"
    )
    parser.add_argument("--runs", type=bounded.positive_int, default=3, help="runs (default: 3)")
    parser.add_time_limit(default=300)
    args = parser.parse_args(argv)
    return bounded.run(parser.prog, args.time_limit, lambda budget: _body(args, budget))


def _body(args: argparse.Namespace, budget: bounded.Budget) -> int:
    bare: list[float] = []
    verify: list[float] = []
    first: list[float] = []
    again: list[float] = []

    def table() -> str:
        rows = (
            ("one bare HMAC-SHA256:             ", bare),
            ("verify_token:                     ", verify),
            ("allows, first use (read + insert):", first),
            ("allows, again (owner cached):     ", again),
        )
        return "".join(f"{label} {_per_call(runs)}\n" for label, runs in rows if runs)

    budget.partial = table
    with tempfile.TemporaryDirectory() as directory:
        for index in range(args.runs):
            budget.step("run", index + 1, args.runs)
            bare.append(_hmac(args.n * 5))
            verify.append(_verify(args.n * 5))
            claimed, cached = asyncio.run(_owners(args.n, index, Path(directory)))
            first.append(claimed)
            again.append(cached)
    sys.stdout.write(table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
