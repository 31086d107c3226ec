"""bench.idle at a tiny N: every page comes back after the restart and no held result is lost;
a time limit cuts it with what it measured; the fd limit it needs is checked first."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from bench import bounded, idle

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bench.idle", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_few_pages_survive_a_restart_with_their_held_results(tmp_path: Path) -> None:
    figures = tmp_path / "idle.json"
    done = _run("--pages", "12", "--holders", "3", "--window", "1", "--json", str(figures))
    assert done.returncode == 0, done.stderr
    assert "connect and register 12 pages" in done.stderr  # progress as it goes
    result = json.loads(figures.read_text())
    assert result["pages_back"] == 12 and result["all_back"]
    assert result["held_outcomes"] == {"applied": 3} and result["held_unacked"] == 0
    assert result["ledger_hold_steps"] == {"applied": 3} and result["runs_completed"] == 3
    assert result["no_lost_result"] is True
    assert 0 <= result["core_at_rest"] < 1
    assert "none lost met" in done.stdout


def test_a_time_limit_cuts_it_with_what_it_has() -> None:
    done = _run("--pages", "12", "--holders", "3", "--window", "60", "--time-limit", "4")
    assert done.returncode == bounded.EXIT_CUT, done.stderr
    assert "cut by --time-limit 4 s" in done.stderr and "Traceback" not in done.stderr
    assert "Idle pages on one server process" in done.stdout  # the partial table


def test_more_pages_than_the_hard_fd_limit_is_one_clear_error() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        pytest.skip("no hard limit on open files here")
    with pytest.raises(bounded.Failed, match="file descriptors needed, the hard limit is"):
        idle.raise_fd_limit(hard + 1)
