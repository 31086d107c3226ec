"""Every benchmark entry point: a bad flag is one line and exit 2, a run shows its progress,
and a time limit ends it with what it measured, a "cut" line and a non-zero exit.

The benchmarks run as a user runs them (`python -m bench...` in a subprocess), at their
smallest settings; the watchdog is checked on a body that never returns.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from bench import bounded

ROOT = Path(__file__).resolve().parents[2]

#: Every entry point a user runs, with arguments that parse (so a bad flag is the only error).
ENTRY_POINTS = [
    ["bench"],
    ["bench.profile", "start"],
    ["bench.cluster"],
    ["bench.ledgers"],
    ["bench.fleet", "ws://127.0.0.1:1/agents/chat"],
    ["bench.resolves"],
    ["bench.servermemory"],
    ["bench.peer"],
    ["bench.auth"],
    ["bench.idle"],
    ["bench.share"],
]


def _run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.parametrize("entry", ENTRY_POINTS, ids=lambda entry: entry[0])
@pytest.mark.parametrize(
    "bad", [["--no-such-flag"], ["--time-limit", "0"], ["--time-limit", "soon"]]
)
def test_a_bad_flag_is_one_line_and_exit_2(entry: list[str], bad: list[str]) -> None:
    done = _run(*entry, *bad)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"python -m {entry[0]}") and "error:" in lines[0]
    assert "Traceback" not in done.stderr and done.stdout == ""


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (["bench.profile", "start", "--rounds", "0"], "0 is not at least 1"),
        (["bench.profile", "roundtrip", "--loads", "3"], "unrecognized arguments: --loads"),
        (["bench", "--only", "everything"], "invalid choice: 'everything'"),
        (["bench.profile", "page", "--page", "rawjs"], "invalid choice: 'rawjs'"),
        (["bench.fleet", "http://127.0.0.1:1/"], "not a ws:// or wss:// URL"),
        (["bench.ledgers", "--pool-sizes", "1,x"], "'x' is not an integer"),
        (["bench.idle", "--pages", "5", "--holders", "6"], "more than the 5 pages"),
    ],
)
def test_a_bad_value_says_which_and_why(args: list[str], complaint: str) -> None:
    done = _run(*args)
    assert done.returncode == 2
    assert complaint in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_a_run_shows_its_progress_n_of_n() -> None:
    done = _run("bench.auth", "--n", "50", "--runs", "3")
    assert done.returncode == 0, done.stderr
    progress = [
        line for line in done.stderr.splitlines() if line.startswith("python -m bench.auth [")
    ]
    assert [line.rsplit(" ", 1)[-1] for line in progress] == ["1/3", "2/3", "3/3"]
    assert "verify_token:" in done.stdout


def test_a_tiny_time_limit_cuts_a_quick_benchmark_with_what_it_has() -> None:
    # Far more runs than fit in the limit: the first one finishes, the next step is cut.
    done = _run("bench.auth", "--n", "2000", "--runs", "1000", "--time-limit", "0.3")
    assert done.returncode == bounded.EXIT_CUT, done.stderr
    assert "cut by --time-limit 0.3 s" in done.stderr and "partial" in done.stderr
    assert "verify_token:" in done.stdout  # the runs that finished, summarized
    assert "Traceback" not in done.stderr


def test_the_suite_cut_before_its_first_figure_still_writes_a_report(tmp_path: Path) -> None:
    done = _run("bench", "--only", "resolves", "--quick", "--out", str(tmp_path),
                "--time-limit", "0.001")  # fmt: skip
    assert done.returncode == bounded.EXIT_CUT, done.stderr
    assert "cut by --time-limit" in done.stderr
    assert "Cut by the time limit" in (tmp_path / "latest.md").read_text()


def test_the_watchdog_ends_a_step_that_never_returns_and_its_children(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    script = textwrap.dedent(
        f"""
        import subprocess, sys, time
        from bench import bounded
        bounded.GRACE_S = 0.5
        def body(budget):
            budget.partial = lambda: "measured: 1 of 2\\n"
            budget.step("hang", 1, 2)
            child = subprocess.Popen(["sleep", "60"])
            open({str(pid_file)!r}, "w").write(str(child.pid))
            time.sleep(60)  # a step with no timeout of its own
            return 0
        sys.exit(bounded.run("hanger", 0.5, body))
        """
    )
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=30
    )
    assert time.monotonic() - started < 15
    assert done.returncode == bounded.EXIT_CUT, done.stderr
    assert done.stdout == "measured: 1 of 2\n"
    assert "a step did not return" in done.stderr
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while Path(f"/proc/{child}").exists() and time.monotonic() < deadline:
        state = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if state == "Z":  # ended, not yet reaped by init
            break
        time.sleep(0.1)
    else:
        assert not Path(f"/proc/{child}").exists(), "the step's child process was left running"


def test_timeout_is_what_is_left_plus_the_grace_never_more_than_the_cap() -> None:
    budget = bounded.Budget("test", 10.0)
    assert budget.timeout(5) == 5
    assert 10 < budget.timeout(1000) <= 10 + bounded.GRACE_S
    assert bounded.Budget("test", None).timeout(1000) == 1000


def test_a_server_that_is_not_there_is_one_line_and_exit_1() -> None:
    done = _run("bench.fleet", "ws://127.0.0.1:1/agents/chat", "--clients", "2")
    assert done.returncode == bounded.EXIT_FAILED
    assert "python -m bench.fleet: cannot reach ws://127.0.0.1:1/agents/chat" in done.stderr
    assert "registered" not in done.stderr and "Traceback" not in done.stderr


def test_the_share_benchmark_runs_its_bare_side_and_refuses_a_baseline_that_is_not_one(
    tmp_path: Path,
) -> None:
    bare = _run("bench.share", "bare", "20", "5")
    assert bare.returncode == 0, bare.stderr
    figures = json.loads(bare.stdout)
    assert figures["chats"] == 20 and figures["cpu_ms_per_chat"] > 0
    refused = _run("bench.share", "--baseline", str(tmp_path))
    assert refused.returncode == 1
    assert refused.stderr.strip() == (
        f"python -m bench.share: {tmp_path} is not a checkout of this repository (no server/)"
    )
