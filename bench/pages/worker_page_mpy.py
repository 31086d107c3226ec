# worker_page.py for the MicroPython flavour: the same two tools, on the page or in a worker.
import time

from pyscript import window

from clienttools.mpy import ToolClient

bench = window.__bench
client = ToolClient(str(bench.wsUrl()))


@client.tool(
    description="Add two integers.",
    schema={
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    },
)
def add(a, b):
    return a + b


@client.tool(
    description="Keep this thread busy for `seconds`; return how many loops that was.",
    schema={
        "type": "object",
        "properties": {"seconds": {"type": "number"}},
        "required": ["seconds"],
    },
)
def compute(seconds):
    loops = 0
    end = time.ticks_add(time.ticks_ms(), int(seconds * 1000))
    while time.ticks_diff(end, time.ticks_ms()) > 0:
        loops += 1
    return loops


await client.connect()  # noqa: F704 (PyScript runs a top-level await)
bench.status = "connected"
