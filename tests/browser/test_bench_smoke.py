"""`python -m bench --quick` still runs end to end: every figure comes out as numbers.

The benchmark itself is `make bench`, not part of the test suite; this keeps it
working (pages, load generator, fleet, report) with tiny N and one run.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from bench.peer import QUICK
from bench.report import ROWS

pytestmark = pytest.mark.browser
ROOT = Path(__file__).resolve().parents[2]


def test_quick_bench_reports_every_figure(web_build: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=960,  # past the quick run's own --time-limit (900 s), which says where it was
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "latest.json").read_text())
    rows = {(row["label"], row["subject"]): row for row in results["rows"]}
    for expected in ROWS:
        row = rows.get((expected.label, expected.subject))
        assert row is not None, f"missing figure {expected.label!r}"
        # A figure without a baseline (6: one server's growth) has only its subject.
        sides = ("subject_stats", "baseline_stats") if expected.baseline else ("subject_stats",)
        for side in sides:
            assert math.isfinite(row[side]["median"]), (expected.label, side)
        if expected.target_kind != "none":
            assert isinstance(row["met"], bool), expected.label
    table = (tmp_path / "latest.md").read_text()
    assert "| 1. round trip p50 (µs) | clienttools |" in table
    # The peer benchmark: both patterns ran their turns; RPC answered each in one request,
    # the round trip needed a continuation request.
    peer = results["peer"]["figures"]
    for pattern in ("rpc", "round-trip"):
        figures = peer[pattern]["all"]
        assert figures["turns"] == QUICK.turns, pattern
        assert math.isfinite(figures["p50_ms"]), pattern
    assert peer["rpc"]["all"]["answered"] == QUICK.turns
    assert peer["rpc"]["all"]["requests"] == {"1": QUICK.turns}
    assert peer["round-trip"]["all"]["requests_per_turn"] > 1
    assert "| turn time p50 (ms) | all |" in table
    # Tools on the page against in a PyScript worker (bench/worker.py): every page measured.
    worker_pages = results["worker"]["summary"]["pages"]
    for name in ("pyodide-main", "pyodide-worker", "micropython-main", "micropython-worker"):
        for figure in ("longest_task_ms", "max_frame_gap_ms", "roundtrip_p50_us"):
            assert math.isfinite(worker_pages[name][figure][0]), (name, figure)
    assert "| pyodide-worker |" in table
    # The cluster figures (bench/cluster.py): server processes on one PostgreSQL.
    if "cluster" not in results:
        assert "skipping the cluster figures, no PostgreSQL" in done.stderr, done.stderr[-3000:]
        return
    cluster = results["cluster"]
    for figure in cluster["summary"]["latency"].values():
        for side in ("within", "across"):
            assert math.isfinite(figure[side]["median"]), (figure["label"], side)
    for name in ("1_processes", "2_processes", "3_processes", "3_sticky"):
        figures = cluster["summary"]["throughput"][name]
        assert figures["chats_per_s"]["median"] > 0, name
        assert math.isfinite(figures["busiest_server"]["median"]), name
    [run] = cluster["runs"]
    assert run["across"]["chats"] == run["within"]["chats"] > 0
    assert run["3_processes"]["calls"] == 2 * run["3_processes"]["chats"]
    assert "| chat p50 (ms) |" in table and "| 3, sticky |" in table
