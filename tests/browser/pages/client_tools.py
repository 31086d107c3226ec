# The tools of tests/browser/test_client.py: they touch the DOM and localStorage like real
# page tools, and publish what they observed (runs, cancellations) into #state for the test.
# The same file runs on the page (client.html: plain Pyodide) and in a PyScript worker
# (client_worker.html), where the page's window is PyScript's proxy of it.
import asyncio
import json
from urllib.parse import parse_qs

import js

from clienttools import ToolClient, ToolContext, ToolError
from clienttools.worker import StatusExport

try:
    from pyscript import window
except ImportError:  # plain Pyodide, on the page itself
    window = js
document = window.document

params = parse_qs(str(window.location.search).lstrip("?"))
client = ToolClient(params["ws"][0], ping_interval=float(params.get("ping", ["15"])[0]))
runs: dict[str, int] = {}
cancelled: list[str] = []


def publish() -> None:
    connector = client.connector
    document.getElementById("state").textContent = json.dumps(
        {
            "runs": runs,
            "cancelled": cancelled,
            "proxiesCreated": getattr(connector, "proxies_created", None),
            "proxiesDestroyed": getattr(connector, "proxies_destroyed", None),
            "jsHandlers": getattr(connector, "js_handlers", None),
        }
    )


def ran(name: str) -> None:
    runs[name] = runs.get(name, 0) + 1
    publish()


@client.tool
def read_text(selector: str) -> str:
    """Read the text of the first element matching a CSS selector."""
    ran("read_text")
    element = document.querySelector(selector)
    if not element:  # JS null arrives as pyodide.ffi.jsnull, which is falsy
        raise ToolError(f"no element matches {selector!r}", data={"selector": selector})
    value = getattr(element, "value", None)  # inputs have a value; other elements only text
    return str(element.textContent if value is None else value)


@client.tool
def write_text(selector: str, text: str) -> bool:
    """Replace the text of the first element matching a CSS selector."""
    ran("write_text")
    document.querySelector(selector).textContent = text
    return True


@client.tool
def remember(key: str, value: str) -> None:
    """Keep a value in localStorage."""
    ran("remember")
    window.localStorage.setItem(key, value)


@client.tool
def recall(key: str) -> str | None:
    """Read a value from localStorage."""
    ran("recall")
    return window.localStorage.getItem(key)  # JS null (a missing key) is sent as JSON null


@client.tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    ran("add")
    return a + b


@client.tool
def crash(message: str) -> int:
    """Raise an ordinary exception."""
    ran("crash")
    raise ValueError(message)


@client.tool
def refuse(message: str) -> int:
    """Raise a ToolError with data."""
    ran("refuse")
    raise ToolError(message, data={"retry": False})


@client.tool
def body_element():  # no return annotation: whatever it returns must still be JSON
    """Return a DOM node, which cannot be serialized."""
    ran("body_element")
    return document.body


@client.tool
def big_text(size: int) -> str:
    """Return a string of `size` characters."""
    ran("big_text")
    return "x" * size


@client.tool
async def nap(seconds: float) -> float:
    """Sleep, then return how long."""
    ran("nap")
    await asyncio.sleep(seconds)
    return seconds


@client.tool
async def wait_forever(ctx: ToolContext) -> None:
    """Wait until cancelled."""
    ran("wait_forever")
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        cancelled.append(ctx.request_id)
        publish()
        raise


@client.tool
async def count_up(steps: int, ctx: ToolContext) -> int:
    """Report progress `steps` times."""
    ran("count_up")
    for step in range(1, steps + 1):
        await ctx.progress(step, total=steps, message=f"step {step}")
        await asyncio.sleep(0.01)
    return steps


def outbox_size() -> int:
    return len(client.session.outbox())


status_export = StatusExport(client)
client_status, next_status = status_export.status, status_export.next_status

# What a worker page's main thread calls (client_worker.html): PyScript's worker export.
__export__ = ["outbox_size", "publish", "client_status", "next_status"]

publish()
await client.connect()  # noqa: F704 (top-level await: Pyodide runs this with runPythonAsync)
document.getElementById("status").textContent = "connected"
