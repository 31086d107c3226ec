"""The demo, end to end: the real server, the real page, `python -m demo.drive`.

One server process and one page load (Pyodide's cold start costs 5-7 s): the
driver runs the whole scripted conversation, saves the screenshots and the
page's chat log (one JSON line per change of `chat.status` or of any tool part
state, appended by the page's `chat.on_change`), and the tests read them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from clienttools.chat import TOOL_STATE_ORDER
from tests.conftest import ROOT
from tests.support.server_process import ServerProcess

pytestmark = pytest.mark.browser

OUT = ROOT / "build" / "demo"
PYTHON = (
    str(ROOT / ".venv" / "bin" / "python")
    if (ROOT / ".venv" / "bin" / "python").exists()
    else sys.executable
)
REQUIRED_SHOTS = (
    "ready.png", "progress.png", "approval.png", "finished.png", "dark.png", "reloaded.png",
    "second-window.png",
)  # fmt: skip
RANK: dict[str, int] = dict(TOOL_STATE_ORDER)
FINAL_RANK = max(RANK.values())
SERVER_START_TIMEOUT = 30.0
DRIVE_TIMEOUT = 300.0


@pytest.fixture(scope="module")
def demo_url(web_build: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`python -m clienttools_server` serving demo/ and build/web/ on a free port."""
    log = tmp_path_factory.mktemp("demo-server") / "server.log"
    server = ServerProcess(["--static", "demo", "--static", str(web_build)], log=log)
    server.start(timeout=SERVER_START_TIMEOUT)
    try:
        yield server.url
    finally:
        server.stop()


@dataclass
class DriveRun:
    returncode: int
    output: str
    seconds: float


@pytest.fixture(scope="module")
def drive(demo_url: str) -> DriveRun:
    """`python -m demo.drive --url ...`, once for the module."""
    started = time.monotonic()
    result = subprocess.run(
        [PYTHON, "-m", "demo.drive", "--url", demo_url, "--out", str(OUT)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=DRIVE_TIMEOUT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    return DriveRun(result.returncode, result.stdout + result.stderr, time.monotonic() - started)


def test_driver_passes_and_saves_screenshots(drive: DriveRun) -> None:
    assert drive.returncode == 0, drive.output
    assert "passed" in drive.output
    for name in REQUIRED_SHOTS:
        shot = OUT / name
        assert shot.exists(), f"{name} missing; driver said:\n{drive.output}"
        assert shot.stat().st_size > 10_000, f"{name} looks empty"
    # loading.png is taken only when the loading screen can be caught: not required.


def read_log() -> list[dict[str, Any]]:
    lines = (OUT / "chat-log.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def responses(entries: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The log cut into responses: each starts at a `submitted` entry."""
    cut: list[list[dict[str, Any]]] = []
    for entry in entries:
        if entry["status"] == "submitted" or not cut:
            cut.append([])
        cut[-1].append(entry)
    return cut


def test_chat_log_never_moves_back_and_never_flickers(drive: DriveRun) -> None:
    assert drive.returncode == 0, drive.output
    entries = read_log()
    assert len(entries) > 20, entries

    # No tool part state moves backwards; a final state never changes.
    seen: dict[str, str] = {}
    for index, entry in enumerate(entries):
        for call_id, state in entry["tools"].items():
            before = seen.get(call_id)
            if before is not None:
                assert RANK[state] >= RANK[before], (index, call_id, before, state)
                if RANK[before] == FINAL_RANK:
                    assert state == before, (index, call_id, before, state)
            seen[call_id] = state
        assert set(seen) <= set(entry["tools"]), f"a tool part vanished at entry {index}"

    # Every response: submitted, then only streaming, then ready (no ready in between).
    cut = responses(entries)
    assert len(cut) >= 9, [r[0]["status"] for r in cut]  # the driver sends 9 prompts
    for number, response in enumerate(cut):
        statuses = [e["status"] for e in response]
        assert statuses[0] == "submitted", (number, statuses)
        assert statuses[-1] == "ready", (number, statuses)
        middle = statuses[1:-1]
        assert set(middle) <= {"streaming"}, (number, statuses)

    # The run with two page tools and one approval: three calls in one response,
    # the approval part passes approval-requested and approval-responded, and
    # the chat stays "streaming" while it waits for the human.
    mixed = []
    for response in cut:
        earlier = set(response[0]["tools"])
        new = [c for c in response[-1]["tools"] if c not in earlier]
        history = {c: [e["tools"].get(c) for e in response if c in e["tools"]] for c in new}
        approval = [c for c, states in history.items() if "approval-requested" in states]
        if len(new) == 3 and len(approval) == 1:
            mixed.append((response, history, approval[0]))
    assert mixed, "no response with three calls, one of them approved"
    response, history, approval_id = mixed[0]
    assert history[approval_id][-1] == "output-available"
    assert "approval-responded" in history[approval_id]
    for call_id, states in history.items():
        assert states[-1] == "output-available", (call_id, states)
    waiting = [e["status"] for e in response if e["tools"].get(approval_id) == "approval-requested"]
    assert waiting and set(waiting) == {"streaming"}, waiting
