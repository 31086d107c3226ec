# The tools of tests/browser/test_webmcp.py (Pyodide): one client on a server and on
# document.modelContext, one on document.modelContext only; state() says what they saw.
import asyncio
import json
from urllib.parse import parse_qs

import js

from clienttools import ToolClient, ToolContext, ToolError

params = parse_qs(str(js.location.search).lstrip("?"))
client = ToolClient(params["ws"][0], webmcp=True)
standalone = ToolClient(webmcp=True, webmcp_approval=True)  # no server at all
runs: dict[str, int] = {}


def ran(name: str) -> None:
    runs[name] = runs.get(name, 0) + 1


def state() -> str:
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


@client.tool(read_only=True)
def add(a: int, b: int) -> int:
    """Add two integers."""
    ran("add")
    return a + b


@client.tool
def page_info(selector: str) -> dict[str, str]:
    """The text of an element and the page's title."""
    ran("page_info")
    return {
        "title": str(js.document.title),
        "text": str(js.document.querySelector(selector).textContent),
    }


@client.tool
def refuse(message: str) -> int:
    """Raise a ToolError."""
    ran("refuse")
    raise ToolError(message, data={"retry": False})


@client.tool
def crash(message: str) -> int:
    """Raise an ordinary exception."""
    ran("crash")
    raise ValueError(message)


@client.tool
def big_text(size: int) -> str:
    """A string of `size` characters."""
    ran("big_text")
    return "x" * size


@client.tool
async def nap(seconds: float) -> float:
    """Sleep, then return the seconds slept."""
    ran("nap")
    await asyncio.sleep(seconds)
    return seconds


@client.tool
async def count_up(steps: int, ctx: ToolContext) -> dict[str, object]:
    """Report progress `steps` times; say what the context was."""
    ran("count_up")
    for step in range(1, steps + 1):
        await ctx.progress(step, total=steps)
    return {"requestId": ctx.request_id, "attempt": ctx.attempt, "last": ctx.last_progress}


@client.tool(timeout=0.2)
async def wait_forever() -> None:
    """Never return (its timeout ends it)."""
    ran("wait_forever")
    await asyncio.sleep(3600)


@client.tool(needs_approval=True)
def delete_everything() -> bool:
    """Needs the user's approval: not offered to the browser's agent."""
    ran("delete_everything")
    return True


@client.tool
def temporary() -> str:
    """A tool the test removes."""
    return "here"


@client.tool
def no_docstring() -> int:
    return 1


@standalone.tool(read_only=True)
def standalone_echo(text: str) -> str:
    """Echo the text (served to the browser's agent only)."""
    ran("standalone_echo")
    return text


@standalone.tool(needs_approval=True)
def standalone_confirm() -> bool:
    """Needs approval, and this client offers such tools too (webmcp_approval=True)."""
    return True


def add_duplicate() -> None:
    """Register `add` on the client with no server too: the context refuses the name."""

    def add(a: int, b: int) -> int:
        """Add two integers, again."""
        return a + b

    standalone.registry.add(add)


async def close_clients() -> None:
    await client.close()
    await standalone.close()


await client.connect()  # noqa: F704 (Pyodide runs a top-level await)
