# The tools of bench/worker.py (Pyodide flavour), the same file on the page and in a worker:
# the trivial `add` of the invoke figures, and `compute`, which keeps its thread busy.
import time

from pyscript import window

from clienttools import ToolClient

bench = window.__bench
client = ToolClient(str(bench.wsUrl()))


@client.tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@client.tool
def compute(seconds: float) -> int:
    """Keep this thread busy for `seconds`; return how many loops that was."""
    loops = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        loops += 1
    return loops


await client.connect()  # noqa: F704 (PyScript runs a top-level await)
bench.status = "connected"
