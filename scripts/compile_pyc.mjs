// Compile Python sources to bytecode with the Pyodide the pages load (its CPython's magic number).
// stdin: {"path/in/wheel.py": "source", ...}; stdout: {"tag": "cpython-314", "pyc": {path: base64}}.
// Used by build_web.py so a page does not compile the SDK's modules on every load.
import { loadPyodide } from "pyodide";

let input = "";
for await (const chunk of process.stdin) input += chunk;
const pyodide = await loadPyodide();
pyodide.globals.set("sources_json", input);
const output = pyodide.runPython(`
import base64, json, os, py_compile, sys, tempfile
sources = json.loads(sources_json)
out = {}
with tempfile.TemporaryDirectory() as tmp:
    for name, text in sources.items():
        source = os.path.join(tmp, "source.py")
        with open(source, "w", encoding="utf-8") as f:
            f.write(text)
        target = os.path.join(tmp, "out.pyc")
        py_compile.compile(
            source, cfile=target, dfile=name, doraise=True,
            invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
        )
        with open(target, "rb") as f:
            out[name] = base64.b64encode(f.read()).decode()
json.dumps({"tag": sys.implementation.cache_tag, "pyc": out})
`);
process.stdout.write(output);
