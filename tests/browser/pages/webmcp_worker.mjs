// tests/browser/test_webmcp.py: ToolClient(webmcp=True) in a worker, where there is no
// document.modelContext, must fail at once and say so; a client without it still works.
import { loadPyodide } from "/pyodide/pyodide.mjs";

const pyodide = await loadPyodide({ indexURL: "/pyodide/" });
await pyodide.loadPackage("clienttools");
const outcome = pyodide.runPython(`
from clienttools import ToolClient
from clienttools.webmcp import WebMCPUnavailable

try:
    ToolClient("ws://127.0.0.1:1/agents/chat/worker", webmcp=True)
    refused = "no error"
except WebMCPUnavailable as exc:
    refused = f"WebMCPUnavailable: {exc}"
plain = ToolClient("ws://127.0.0.1:1/agents/chat/worker")
refused
`);
postMessage(outcome);
