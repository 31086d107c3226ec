"""The server's shape: no class over 400 lines, no module over 1,000, the hub under 300.

Size is not a design, but past these a class or module holds several parts
that want names of their own; the hub only composes the parts.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "server" / "clienttools_server"
MAX_CLASS_LINES = 400
MAX_MODULE_LINES = 1_000
MAX_HUB_LINES = 300


def _modules() -> list[Path]:
    paths = PACKAGE.rglob("*.py")
    return sorted(paths)


def class_sizes(source: str) -> dict[str, int]:
    """Every class of a module's source (nested ones too) and its length in lines."""
    sizes: dict[str, int] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            assert node.end_lineno is not None
            sizes[node.name] = node.end_lineno - node.lineno + 1
    return sizes


def test_class_sizes_counts_every_line_of_a_class() -> None:
    source = "class A:\n    x = 1\n\n    def f(self):\n        return 2\n\nclass B: ...\n"
    assert class_sizes(source) == {"A": 5, "B": 1}


def test_the_package_has_its_parts() -> None:
    # Nothing to measure would pass the checks below without measuring anything.
    parts = {path.parent.name for path in _modules()}
    assert {"wire", "calls", "agent", "cluster"} <= parts
    assert len(_modules()) > 30


@pytest.mark.parametrize("path", _modules(), ids=lambda p: p.relative_to(PACKAGE).as_posix())
def test_no_class_over_400_lines_and_no_module_over_1000(path: Path) -> None:
    source = path.read_text()
    too_long = {n: size for n, size in class_sizes(source).items() if size > MAX_CLASS_LINES}
    assert not too_long, f"classes over {MAX_CLASS_LINES} lines: {too_long}"
    assert source.count("\n") <= MAX_MODULE_LINES


def test_the_hub_composes_its_parts_in_under_300_lines() -> None:
    assert (PACKAGE / "hub.py").read_text().count("\n") < MAX_HUB_LINES
