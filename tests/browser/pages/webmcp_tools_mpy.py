# webmcp_tools.py for the MicroPython flavour: the same tools, with declared schemas.
import asyncio
import json

import js

from clienttools.mpy import ToolClient, ToolError

ws = js.URLSearchParams.new(js.location.search).get("ws")
client = ToolClient(str(ws), webmcp=True)
standalone = ToolClient(webmcp=True, webmcp_approval=True)  # no server at all
runs = {}


def ran(name):
    runs[name] = runs.get(name, 0) + 1


def state():
    mirrors = {"client": client.webmcp, "standalone": standalone.webmcp}
    return json.dumps(
        {
            "runs": runs,
            "registered": {key: m.registered for key, m in mirrors.items()},
            "proxies": {
                key: [m.proxies_created, m.proxies_destroyed] for key, m in mirrors.items()
            },
        }
    )


def obj(required=(), **properties):
    return {
        "type": "object",
        "properties": properties,
        "required": list(required),
        "additionalProperties": False,
    }


STR = {"type": "string"}
INT = {"type": "integer"}
NUM = {"type": "number"}


@client.tool(
    description="Add two integers.",
    schema=obj(["a", "b"], a=INT, b=INT),
    output_schema=INT,
    read_only=True,
)
def add(a, b):
    ran("add")
    return a + b


@client.tool(
    description="The text of an element and the page's title.",
    schema=obj(["selector"], selector=STR),
)
def page_info(selector):
    ran("page_info")
    return {
        "title": str(js.document.title),
        "text": str(js.document.querySelector(selector).textContent),
    }


@client.tool(description="Raise a ToolError.", schema=obj(["message"], message=STR))
def refuse(message):
    ran("refuse")
    raise ToolError(message, data={"retry": False})


@client.tool(description="Raise an ordinary exception.", schema=obj(["message"], message=STR))
def crash(message):
    ran("crash")
    raise ValueError(message)


@client.tool(description="A string of `size` characters.", schema=obj(["size"], size=INT))
def big_text(size):
    ran("big_text")
    return "x" * size


@client.tool(
    description="Sleep, then return the seconds slept.", schema=obj(["seconds"], seconds=NUM)
)
async def nap(seconds):
    ran("nap")
    await asyncio.sleep(seconds)
    return seconds


@client.tool(
    description="Report progress `steps` times; say what the context was.",
    schema=obj(["steps"], steps=INT),
    context=True,
)
async def count_up(steps, ctx):
    ran("count_up")
    for step in range(1, steps + 1):
        await ctx.progress(step, total=steps)
    return {"requestId": ctx.request_id, "attempt": ctx.attempt, "last": ctx.last_progress}


@client.tool(description="Never return (its timeout ends it).", schema=obj(), timeout=0.2)
async def wait_forever():
    ran("wait_forever")
    await asyncio.sleep(3600)


@client.tool(
    description="Needs the user's approval: not offered to the browser's agent.",
    schema=obj(),
    needs_approval=True,
)
def delete_everything():
    ran("delete_everything")
    return True


@client.tool(description="A tool the test removes.", schema=obj())
def temporary():
    return "here"


@client.tool(schema=obj())
def no_docstring():
    return 1


@standalone.tool(
    description="Echo the text (served to the browser's agent only).",
    schema=obj(["text"], text=STR),
    read_only=True,
)
def standalone_echo(text):
    ran("standalone_echo")
    return text


@standalone.tool(
    description="Needs approval, and this client offers such tools too (webmcp_approval=True).",
    schema=obj(),
    needs_approval=True,
)
def standalone_confirm():
    return True


def add_duplicate():
    # Register `add` on the client with no server too: the context refuses the name.
    standalone.tool(
        name="add", description="Add two integers, again.", schema=obj(["a", "b"], a=INT, b=INT)
    )(lambda a, b: a + b)


async def close_clients():
    await client.close()
    await standalone.close()


js.window.webmcpState = state
js.window.removeTool = lambda name: client.remove_tool(str(name))
js.window.addDuplicate = add_duplicate
js.window.closeClients = lambda: asyncio.create_task(close_clients()) and None

try:
    await client.connect()  # noqa: F704 (PyScript runs a top-level await)
    js.document.getElementById("status").textContent = "connected"
except Exception as exc:
    js.document.getElementById("status").textContent = f"failed: {exc}"
