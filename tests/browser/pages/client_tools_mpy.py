# client_tools.py for the MicroPython flavour: the same tools, each with the JSON Schema its
# Pyodide twin gets from its signature, publishing what they observe into #state. On the
# page (client_mpy.html) and in a PyScript worker (client_worker_mpy.html) alike.
import asyncio
import json

import js
from pyscript import RUNNING_IN_WORKER, window

from clienttools.mpy import ToolClient, ToolError

document = window.document


def query(name, default):
    params = js.URLSearchParams.new(window.location.search)
    value = params.get(name)
    return default if value is None else str(value)


client = ToolClient(query("ws", ""), ping_interval=float(query("ping", "15")))
runs = {}
cancelled = []


def publish():
    document.getElementById("state").textContent = json.dumps(
        {
            "runs": runs,
            "cancelled": cancelled,
            "proxiesCreated": client.proxies_created,
            "proxiesDestroyed": client.proxies_destroyed,
        }
    )


def ran(name):
    runs[name] = runs.get(name, 0) + 1
    publish()


def obj(required=(), **properties):
    return {"type": "object", "properties": properties, "required": list(required)}


STR = {"type": "string"}
INT = {"type": "integer"}
NUM = {"type": "number"}


@client.tool(
    description="Read the text of the first element matching a CSS selector.",
    schema=obj(["selector"], selector=STR),
    output_schema=STR,
)
def read_text(selector):
    ran("read_text")
    element = document.querySelector(selector)
    if element is None:
        raise ToolError(f"no element matches {selector!r}", data={"selector": selector})
    value = getattr(element, "value", None)  # inputs have a value; other elements only text
    return str(element.textContent if value is None else value)


@client.tool(
    description="Replace the text of the first element matching a CSS selector.",
    schema=obj(["selector", "text"], selector=STR, text=STR),
    output_schema={"type": "boolean"},
)
def write_text(selector, text):
    ran("write_text")
    document.querySelector(selector).textContent = text
    return True


@client.tool(
    description="Keep a value in localStorage.", schema=obj(["key", "value"], key=STR, value=STR)
)
def remember(key, value):
    ran("remember")
    window.localStorage.setItem(key, value)


@client.tool(description="Read a value from localStorage.", schema=obj(["key"], key=STR))
def recall(key):
    ran("recall")
    return window.localStorage.getItem(key)  # JS null (a missing key) arrives as None


@client.tool(
    description="Add two integers.", schema=obj(["a", "b"], a=INT, b=INT), output_schema=INT
)
def add(a, b):
    ran("add")
    return a + b


@client.tool(description="Raise an ordinary exception.", schema=obj(["message"], message=STR))
def crash(message):
    ran("crash")
    raise ValueError(message)


@client.tool(description="Raise a ToolError with data.", schema=obj(["message"], message=STR))
def refuse(message):
    ran("refuse")
    raise ToolError(message, data={"retry": False})


@client.tool(description="Return a DOM node, which cannot be serialized.")
def body_element():
    ran("body_element")
    return document.body


@client.tool(description="Return a string of `size` characters.", schema=obj(["size"], size=INT))
def big_text(size):
    ran("big_text")
    return "x" * size


@client.tool(description="Sleep, then return how long.", schema=obj(["seconds"], seconds=NUM))
async def nap(seconds):
    ran("nap")
    await asyncio.sleep(seconds)
    return seconds


@client.tool(description="Wait until cancelled.", context=True)
async def wait_forever(ctx):
    ran("wait_forever")
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        cancelled.append(ctx.request_id)
        publish()
        raise


@client.tool(
    description="Report progress `steps` times.", schema=obj(["steps"], steps=INT), context=True
)
async def count_up(steps, ctx):
    ran("count_up")
    for step in range(1, steps + 1):
        await ctx.progress(step, total=steps, message=f"step {step}")
        await asyncio.sleep(0.01)
    return steps


def outbox_size():
    return len(client.session.outbox())


# What the test reads without knowing the flavour (client.html defines the same two); a
# worker page's main thread calls them through PyScript's worker export.
if RUNNING_IN_WORKER:
    from clienttools.worker import StatusExport

    status_export = StatusExport(client)
    client_status, next_status = status_export.status, status_export.next_status
    __export__ = ["outbox_size", "publish", "client_status", "next_status"]
else:
    js.window.outboxSize = outbox_size
    js.window.publishState = publish

publish()
try:
    await client.connect()  # noqa: F704 (PyScript runs a top-level await)
    document.getElementById("status").textContent = "connected"
except Exception as exc:
    document.getElementById("status").textContent = f"failed: {exc}"
