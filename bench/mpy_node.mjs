// The MicroPython flavour's whole client (clienttools.mpy.ToolClient, the .mpy bytecode
// of build/web) under Node, on a socket faked in JavaScript: no browser, no load
// generator process, so a change to the per-frame or per-result path shows in a few
// seconds, and two builds compare in one run.
//
//   node bench/mpy_node.mjs [build/web/micropython/clienttools/ ...] [--n 3000] [--runs 3]
//
// Each directory of .mpy files is one build; builds are run in turn, --runs times,
// each run in a fresh Node process (two interpreters in one process disturb each
// other), with a 1 MiB heap, as PyScript loads it. Per run: round trip
// (1,000 sequential invokes, each answered before the next; p50 and p99 in us) and
// pipelined throughput (--n invokes queued at once as separate socket messages, every
// result acknowledged as the server does, before the next invoke arrives). Prints one JSON line per run, then the
// medians with [min-max] per build.
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import { loadMicroPython } from "../node_modules/@micropython/micropython-webassembly-pyscript/micropython.mjs";

const args = process.argv.slice(2);
const option = (name, fallback) => {
  const at = args.indexOf(name);
  if (at < 0) return fallback;
  const value = +args[at + 1];
  args.splice(at, 2);
  return value;
};
const N = option("--n", 3000);
const RUNS = option("--runs", 3);
const child = args[0] === "--one";
if (child) args.shift();
const builds = args.length ? args : [new URL("../build/web/micropython/clienttools/", import.meta.url).pathname];

// What the client reaches through `js`: a page's globals, faked just enough.
const store = new Map();
globalThis.window = globalThis;
globalThis.addEventListener = () => {};
globalThis.document = { addEventListener() {}, visibilityState: "visible" };
globalThis.sessionStorage = {
  getItem: (key) => (store.has(key) ? store.get(key) : null),
  setItem: (key, value) => store.set(key, String(value)),
};
let socket = null;
class FakeSocket {
  constructor() {
    socket = this;
    this.readyState = 0;
    this.results = 0;
    this.want = 0;
    this.done = () => {};
    setTimeout(() => {
      this.readyState = 1;
      this.onopen?.({});
    }, 0);
  }
  send(text) {
    const frame = JSON.parse(text);
    if (frame.type === "cf_agent_client_tools") {
      const ack = { type: "cf_agent_client_tools_ack", accepted: ["add"], rejected: [] };
      setTimeout(() => this.onmessage({ data: JSON.stringify(ack) }), 0);
    } else if (frame.type === "cf_agent_client_tool_result") {
      if (frame.output !== frame.requestId.split("-")[1] * 1 + 1) throw new Error(`wrong result: ${text}`);
      const ack = `{"type":"cf_agent_client_tool_result_ack","requestId":${JSON.stringify(frame.requestId)},"outcome":"applied"}`;
      // After the task that sent the result, before the next invoke's: as a server that
      // answers at once (a timer would queue every ack behind every invoke).
      queueMicrotask(() => this.onmessage({ data: ack }));
      if (++this.results === this.want) this.done();
    }
  }
  close() {
    this.readyState = 3;
  }
}
globalThis.WebSocket = FakeSocket;

const invoke = (tag, i) =>
  `{"type":"cf_agent_client_tool_invoke","requestId":"${tag}-${i}-0123456789abcdef","toolCallId":"c${i}","toolName":"add","input":{"a":${i},"b":1}}`;

function expect(n) {
  socket.results = 0;
  socket.want = n;
  return new Promise((resolve) => {
    socket.done = resolve;
  });
}

async function pipelined(n, tag) {
  const done = expect(n);
  const started = performance.now();
  for (let i = 0; i < n; i++) setTimeout(() => socket.onmessage({ data: invoke(tag, i) }), 0);
  await done;
  return (n / (performance.now() - started)) * 1000;
}

async function roundtrip(n, tag) {
  const latencies = [];
  for (let i = 0; i < n; i++) {
    const done = expect(1);
    const started = performance.now();
    socket.onmessage({ data: invoke(tag, i) });
    await done;
    latencies.push((performance.now() - started) * 1000);
    await new Promise((resolve) => setTimeout(resolve, 0));
  }
  latencies.sort((a, b) => a - b);
  return [latencies[n >> 1], latencies[Math.floor(n * 0.99)]];
}

async function run(dir) {
  const mp = await loadMicroPython({ heapsize: 1024 * 1024, stdout: () => {}, stderr: (line) => process.stderr.write(line + "\n") });
  mp.FS.mkdirTree("/lib/clienttools");
  for (const name of fs.readdirSync(dir)) {
    if (name.endsWith(".mpy")) mp.FS.writeFile("/lib/clienttools/" + name, fs.readFileSync(dir + "/" + name));
  }
  const connected = new Promise((resolve) => {
    globalThis.__connected = resolve;
  });
  mp.runPythonAsync(`
import js
from clienttools.mpy import ToolClient
client = ToolClient("ws://bench/agents/chat/node")
@client.tool(description="Add two integers.", schema={"type": "object", "properties": {
    "a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]})
def add(a, b):
    return a + b
await client.connect()
js.__connected(1)
`);
  await connected;
  await pipelined(500, "warm");
  const [p50, p99] = await roundtrip(1000, "rt");
  const perS = await pipelined(N, "p");
  return { per_s: Math.round(perS), roundtrip_p50_us: Math.round(p50), roundtrip_p99_us: Math.round(p99) };
}

if (child) {
  console.log(JSON.stringify(await run(builds[0])));
  process.exit(0);
}
const figures = builds.map(() => ({ per_s: [], roundtrip_p50_us: [], roundtrip_p99_us: [] }));
const self = new URL(import.meta.url).pathname;
for (let r = 0; r < RUNS; r++) {
  for (const [b, dir] of builds.entries()) {
    const out = execFileSync(process.execPath, [self, "--one", dir, "--n", String(N)], { encoding: "utf8" });
    const result = JSON.parse(out.trim().split("\n").pop());
    console.log(JSON.stringify({ run: r + 1, build: dir, ...result }));
    for (const key of Object.keys(result)) figures[b][key].push(result[key]);
  }
}
for (const [b, dir] of builds.entries()) {
  const cells = Object.entries(figures[b]).map(([key, values]) => {
    values.sort((x, y) => x - y);
    return `${key} ${values[values.length >> 1]} [${values[0]}-${values[values.length - 1]}]`;
  });
  console.log(`${dir}: ${cells.join(", ")}`);
}
