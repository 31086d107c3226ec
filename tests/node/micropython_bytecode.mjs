// Imports the MicroPython flavour's modules as the page does: the bytecode
// scripts/build_web.py compiles (.mpy), on real MicroPython 1.27 (the npm
// interpreter PyScript uses). Usage: node micropython_bytecode.mjs DIR module...
// Prints "bytecode: ok N" once every module imported from its .mpy.
import fs from "node:fs";
import path from "node:path";
import { loadMicroPython } from "../../node_modules/@micropython/micropython-webassembly-pyscript/micropython.mjs";

const [dir, ...modules] = process.argv.slice(2);
const mp = await loadMicroPython({
  heapsize: 8 * 1024 * 1024,
  stdout: (line) => process.stdout.write(line + "\n"),
  stderr: (line) => process.stderr.write(line + "\n"),
});
mp.FS.mkdirTree("/lib/clienttools");
for (const name of fs.readdirSync(dir)) {
  mp.FS.writeFile("/lib/clienttools/" + name, fs.readFileSync(path.join(dir, name)));
}
mp.runPython(`
import sys
names = ${JSON.stringify(modules)}
for name in names:
    __import__("clienttools." + name)
    where = sys.modules["clienttools." + name].__file__
    assert where.endswith(".mpy"), where
print("bytecode: ok", len(names))
`);
