"""What a module of the client package imports, read from its source (lazy imports included).

Every `import` and `from ... import` anywhere in the module counts, inside
functions too, so a core cannot hide `asyncio` or `js` behind a lazy import.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "client" / "clienttools"

#: What a sans-I/O core must never import: sockets, timers, tasks, the browser.
IO_MODULES = frozenset({"js", "pyodide", "pyscript", "asyncio", "websockets", "threading"})


def _path(module: str) -> Path:
    return PACKAGE / f"{module.removeprefix('clienttools.')}.py"


def imports_of(module: str) -> set[str]:
    """Every module `module` (a `clienttools.x` name) imports, anywhere in its source."""
    tree = ast.parse(_path(module).read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            # `from . import x` and `from .x import y` are package imports too.
            base = "clienttools" if node.level else ""
            full = ".".join(part for part in (base, node.module or "") if part)
            if not full:
                continue
            names.add(full)
            if full == "clienttools":
                names.update(f"clienttools.{alias.name}" for alias in node.names)
    return names


def io_imports_reachable(
    start: str, allowed: dict[str, set[str]] | None = None
) -> dict[str, set[str]]:
    """Walk the package modules `start` reaches; return each one's I/O imports, by module.

    `allowed` lists I/O imports a given module may have. The result maps every
    module reached to the forbidden roots it imports (empty sets when all is well).
    """
    allowed = allowed or {}
    found: dict[str, set[str]] = {}
    pending = [start]
    while pending:
        module = pending.pop()
        if module in found or not _path(module).exists():
            continue
        imported = imports_of(module)
        roots = {name.split(".")[0] for name in imported}
        found[module] = roots & (IO_MODULES - allowed.get(module, set()))
        pending.extend(n for n in imported if n.startswith("clienttools."))
    return found
