// Runs the protocol core's cases (tests/unit/core_cases.py) on real MicroPython 1.27 (the
// npm interpreter PyScript uses) and prints "core cases: N cases, M checks";
// tests/unit/test_core.py compares that with the same cases under CPython.
import fs from "node:fs";
import { loadMicroPython } from "../../node_modules/@micropython/micropython-webassembly-pyscript/micropython.mjs";

const client = new URL("../../client/clienttools/", import.meta.url);
const mp = await loadMicroPython({
  heapsize: 16 * 1024 * 1024,
  stdout: (line) => process.stdout.write(line + "\n"),
  stderr: (line) => process.stderr.write(line + "\n"),
});
mp.FS.mkdirTree("/lib/clienttools");
for (const name of ["rules.py", "context.py", "errors.py", "input_schema.py", "portable.py", "jspump.py", "events.py", "outcomes.py", "recent.py", "core.py", "supervisor.py", "outbox.py", "webmcp.py", "worker.py", "mpy_tools.py", "mpy.py"]) {
  mp.FS.writeFile("/lib/clienttools/" + name, fs.readFileSync(new URL(name, client), "utf8"));
}
mp.FS.writeFile("/lib/core_cases.py", fs.readFileSync(new URL("../unit/core_cases.py", import.meta.url), "utf8"));

const script = String.raw`
import sys
import core_cases
from clienttools import portable
portable.log_to(lambda level, message: None)  # the cases make the core log on purpose
count, checks = core_cases.run_all()
print("core cases: %d cases, %d checks on %s" % (count, checks, sys.implementation.name))
`;
try {
  await mp.runPythonAsync(script);
} catch (error) {
  console.log(`FAILED: ${error.type}: ${error.message}`);
  process.exit(1);
}
