"""`python -m bench.cluster --quick` still runs end to end: every figure comes out as numbers."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.postgres import PostgresServer

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def test_quick_cluster_bench_reports_every_figure(postgres: PostgresServer, tmp_path: Path) -> None:
    # The fixture only proves PostgreSQL can run here; the benchmark starts its own.
    done = subprocess.run(
        [sys.executable, "-m", "bench.cluster", "--quick", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "cluster.json").read_text())
    summary = results["summary"]
    for figure in summary["latency"].values():
        for side in ("within", "across"):
            assert math.isfinite(figure[side]["median"]), (figure["label"], side)
    for name in ("1_processes", "2_processes", "3_processes", "3_sticky"):
        figures = summary["throughput"][name]
        assert figures["chats_per_s"]["median"] > 0, name
        assert math.isfinite(figures["busiest_server"]["median"]), name
    [run] = results["runs"]
    assert run["across"]["chats"] == run["within"]["chats"] > 0
    assert run["3_processes"]["calls"] == 2 * run["3_processes"]["chats"]
    table = (tmp_path / "cluster.md").read_text()
    assert "| chat p50 (ms) |" in table and "| 3 |" in table and "| 3, sticky |" in table
