"""Fixtures of the reliability scenarios, the `soak` marker, and the results writer.

`--soak` (registered in tests/conftest.py, since pytest reads options only from
the top conftest) multiplies every scenario's iterations by SOAK_FACTOR.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.reliability.references import REFERENCED
from tests.reliability.results import RESULTS, RESULTS_JSON, Scenario, write_results

SOAK_FACTOR = 10

# Which terminal-reporter category wins when one test has several reports (setup, call, teardown).
_OUTCOME_ORDER = ["passed", "skipped", "xfailed", "xpassed", "failed", "error"]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "soak: a reliability scenario; `make soak` runs it longer")


@pytest.fixture(scope="session")
def soak_factor(pytestconfig: pytest.Config) -> int:
    """How many times the base iterations each scenario runs (1, or SOAK_FACTOR with --soak)."""
    return SOAK_FACTOR if pytestconfig.getoption("--soak", default=False) else 1


@pytest.fixture
def scenario(request: pytest.FixtureRequest) -> Iterator[Scenario]:
    """The figures of this test, collected for build/reliability.json."""
    record = Scenario(request.node.nodeid)
    RESULTS.append(record)
    yield record
    record.seconds = round(time.monotonic() - record.started, 2)


def _outcomes(session: pytest.Session) -> dict[str, str]:
    reporter: Any = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return {}
    found: dict[str, str] = {}
    for category in _OUTCOME_ORDER:
        for report in reporter.stats.get(category, []):
            nodeid = getattr(report, "nodeid", None)
            if nodeid is None:
                continue
            previous = found.get(nodeid)
            if previous is None or _OUTCOME_ORDER.index(category) > _OUTCOME_ORDER.index(previous):
                found[nodeid] = category
    return found


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Write build/reliability.json when this session ran any reliability scenario."""
    if not RESULTS:
        return
    outcomes = _outcomes(session)
    references = []
    for prefix, group, what in REFERENCED:
        matched = {k: v for k, v in outcomes.items() if k == prefix or k.startswith(prefix + "[")}
        references.append(
            {
                "nodeid": prefix,
                "group": group,
                "what": what,
                "cases": len(matched),
                "outcomes": sorted(set(matched.values())) or ["not run"],
            }
        )
    write_results(outcomes, references, RESULTS_JSON)
