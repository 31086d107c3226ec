"""The protocol core (core.py): its cases under CPython, the same cases on MicroPython.

tests/unit/core_cases.py holds the cases as plain functions; here each is a pytest
test, and one more test runs them all on real MicroPython 1.27 under Node.js and
holds the count of cases and of checks equal to CPython's, so neither interpreter
skips a check the other makes.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.imports import IO_MODULES, imports_of, io_imports_reachable
from tests.unit import core_cases

ROOT = Path(__file__).resolve().parents[2]
CASES: list[Callable[[], None]] = core_cases.cases()  # type: ignore[assignment]


@pytest.mark.parametrize("case", CASES, ids=[case.__name__ for case in CASES])
def test_case(case: Callable[[], None]) -> None:
    case()


def test_the_core_imports_no_io() -> None:
    """No js, pyodide, asyncio (nor pydantic) in the core; context.py's asyncio is ToolContext's."""
    assert not imports_of("clienttools.core") & IO_MODULES
    assert "pydantic" not in {name.split(".")[0] for name in imports_of("clienttools.core")}
    found = io_imports_reachable("clienttools.core", {"clienttools.context": {"asyncio"}})
    assert {module: roots for module, roots in found.items() if roots} == {}
    assert {"clienttools.core", "clienttools.rules", "clienttools.context"} <= set(found)


@pytest.mark.node
@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_the_same_cases_and_checks_pass_on_micropython() -> None:
    interpreter = ROOT / "node_modules/@micropython/micropython-webassembly-pyscript"
    if not (interpreter / "micropython.mjs").is_file():
        pytest.skip("node_modules is missing: run `make bootstrap`")
    count, checks = core_cases.run_all()
    assert count == len(CASES) and checks > 3 * count  # most cases check several things
    done = subprocess.run(
        ["node", str(ROOT / "tests/node/core_cases.mjs")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    found = re.search(r"core cases: (\d+) cases, (\d+) checks on (\w+)", done.stdout)
    assert found is not None, done.stdout[-3000:]
    assert found.groups() == (str(count), str(checks), "micropython")
