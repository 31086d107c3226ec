// Loaded first by every benchmark page (a classic script, so it runs before any module).
// It stamps the moment the page SENDS its first cf_agent_client_tools frame, on the
// page's own clock (performance.now() counts from navigation start), so cold and warm
// start need no clock shared between processes. The wrapper removes itself after that
// frame, so it costs the invoke figures nothing.
window.__bench = { status: "loading", marks: {}, toolsFrameAt: null, error: null };
(() => {
  const originalSend = WebSocket.prototype.send;
  WebSocket.prototype.send = function (data) {
    if (typeof data === "string" && data.includes('"cf_agent_client_tools"')) {
      window.__bench.toolsFrameAt = performance.now();
      WebSocket.prototype.send = originalSend;
    }
    return originalSend.call(this, data);
  };
})();
window.__bench.mark = (name) => { window.__bench.marks[name] = performance.now(); };
window.__bench.fail = (error) => {
  window.__bench.error = String(error);
  window.__bench.status = "failed";
};
window.__bench.wsUrl = () => new URLSearchParams(location.search).get("ws");
// Bytes of wasm linear memory (0 on a page without Pyodide). It only ever grows.
window.__bench.wasmBytes = () => {
  const module = window.pyodide && window.pyodide._module;
  if (!module) return 0;
  const heap = module.HEAPU8 || (module.wasmMemory && module.wasmMemory);
  return heap ? heap.buffer.byteLength : 0;
};
