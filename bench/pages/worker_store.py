# In a Pyodide PyScript worker: how long one outbox write takes in each store a worker
# can use. Each write is complete (awaited) before the next; the text is one result.
import json

import js
from pyscript import document, window

N = 300
TEXT = json.dumps(
    {"v": 1, "results": [["r" * 32, '{"type":"cf_agent_client_tool_result","output":13}']]}
)

OPEN_IDB = """return (name, durability) => new Promise((ok, fail) => {
  const open = indexedDB.open(name, 1);
  open.onupgradeneeded = () => open.result.createObjectStore("outbox");
  open.onerror = () => fail(open.error);
  open.onsuccess = () => {
    const db = open.result;
    ok((key, value) => new Promise((done, failed) => {
      const tx = db.transaction("outbox", "readwrite", { durability });
      tx.objectStore("outbox").put(value, key);
      tx.oncomplete = () => done();
      tx.onerror = () => failed(tx.error);
    }));
  };
});"""
OPEN_OPFS = """return async (name, flush) => {
  const dir = await navigator.storage.getDirectory();
  const handle = await (await dir.getFileHandle(name, { create: true })).createSyncAccessHandle();
  const encoder = new TextEncoder();
  return (text) => {
    const bytes = encoder.encode(text);
    handle.truncate(0);
    handle.write(bytes, { at: 0 });
    if (flush) handle.flush();
  };
};"""


def samples_of(write):
    samples = []
    for i in range(N):
        started = js.performance.now()
        write(i)
        samples.append(js.performance.now() - started)
    return samples


async def async_samples_of(write):
    samples = []
    for i in range(N):
        started = js.performance.now()
        await write(i)
        samples.append(js.performance.now() - started)
    return samples


async def main():
    out = {}
    set_item = window.sessionStorage.setItem
    out["sessionStorage of the page, through the proxy"] = samples_of(
        lambda i: set_item("bench-outbox", TEXT + str(i))
    )
    open_idb = js.Function.new(OPEN_IDB)()
    for durability in ("default", "relaxed", "strict"):
        put = await open_idb("bench-outbox-" + durability, durability)
        out["IndexedDB put, " + durability] = await async_samples_of(
            lambda i, put=put: put("outbox", TEXT + str(i))
        )
    open_opfs = js.Function.new(OPEN_OPFS)()
    for flush in (True, False):
        write = await open_opfs(f"bench-outbox-{flush}", flush)
        label = "OPFS sync access handle, " + ("write and flush" if flush else "write")
        out[label] = samples_of(lambda i, write=write: write(TEXT + str(i)))
    document.getElementById("out").textContent = json.dumps(out)


await main()  # noqa: F704 (PyScript runs a top-level await)
