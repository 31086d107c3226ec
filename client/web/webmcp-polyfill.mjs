// The WebMCP polyfill (npm @mcp-b/webmcp-polyfill, pinned in package.json), installed only
// where the browser has no document.modelContext of its own. A page asks for it with
//
//   <script type="module" src="/webmcp/polyfill.mjs"></script>
//
// (`?testing` adds the polyfill's testing API, navigator.modelContextTesting). The polyfill
// itself is fetched only when it is needed. Whatever the order in which this script and the
// page's Python start, a `ToolClient(..., webmcp=True)` finds the context: this script fires
// `clienttools:modelcontext` on the document once document.modelContext exists.
if (!document.modelContext) {
  const testing = new URL(import.meta.url).searchParams.has("testing");
  const options = { ...(window.__webMCPPolyfillOptions ?? {}) };
  if (testing) options.installTestingShim = true;
  const { initializeWebMCPPolyfill } = await import("./polyfill/index.js");
  initializeWebMCPPolyfill(options);
}
document.dispatchEvent(new Event("clienttools:modelcontext"));
