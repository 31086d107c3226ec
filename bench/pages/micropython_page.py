# Page (d): the trivial tool on the MicroPython flavour. Marks show where the start-up time goes.
import js

bench = js.window.__bench
bench.mark("interpreter")
from clienttools.mpy import ToolClient  # noqa: E402  (after the mark: the import is measured)

bench.mark("imported")

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


bench.mark("registered")
await client.connect()  # noqa: F704 (PyScript runs a top-level await)
bench.status = "connected"
