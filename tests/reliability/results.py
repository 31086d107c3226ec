"""The session-level collector of scenario figures, written to build/reliability.json.

    def test_x(scenario: Scenario) -> None:
        scenario.describe("cuts", "cut before the invoke")
        scenario.add_call(settlements=1, executions=1, transcript_equal=True)

The pytest hook in conftest.py writes every record, with each test's outcome, at
the end of the session; report.py renders the table from that file.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS_JSON = ROOT / "build" / "reliability.json"


@dataclass
class Scenario:
    """Figures of one scenario (one test node). Counts are per call unless named otherwise."""

    nodeid: str
    group: str = ""
    name: str = ""
    iterations: int = 0
    calls: int = 0
    settled_once: int = 0
    lost: int = 0
    duplicated: int = 0  # calls that ran more than once on the page, or settled more than once
    transcripts_compared: int = 0
    transcripts_equal: int = 0
    faults: int = 0  # faults really injected (rule hits, cuts, kills)
    cases: int = 0  # fuzz cases / abuse attempts, where "calls" does not fit
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    started: float = field(default_factory=time.monotonic, repr=False)

    def describe(self, group: str, name: str) -> None:
        self.group, self.name = group, name

    def add_call(
        self, *, settlements: int, executions: int, transcript_equal: bool | None = None
    ) -> None:
        """One call: how often it settled (tool-output chunks) and ran on the page."""
        self.calls += 1
        if settlements == 1:
            self.settled_once += 1
        if settlements == 0:
            self.lost += 1
        if settlements > 1 or executions > 1:
            self.duplicated += 1
        if transcript_equal is not None:
            self.transcripts_compared += 1
            self.transcripts_equal += int(transcript_equal)

    def add_transcript(self, equal: bool) -> None:
        self.transcripts_compared += 1
        self.transcripts_equal += int(equal)

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("started")
        return data


# Every Scenario of this pytest session, in the order the tests ran.
RESULTS: list[Scenario] = []


def write_results(outcomes: dict[str, str], references: list[dict[str, Any]], path: Path) -> None:
    """Write the session's scenarios (with their test outcomes) and referenced tests."""
    scenarios = []
    for scenario in RESULTS:
        data = scenario.as_json()
        data["outcome"] = outcomes.get(scenario.nodeid, "not run")
        scenarios.append(data)
    payload = {
        "generated": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "scenarios": scenarios,
        "references": references,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2) + "\n")
