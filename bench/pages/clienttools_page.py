# Page (a): a trivial tool on the real SDK. Marks show where the start-up time goes.
import js

bench = js.window.__bench
import clienttools  # noqa: E402  (after the mark's clock is in reach: the import is measured)

bench.mark("imported")

client = clienttools.ToolClient(str(bench.wsUrl()))


@client.tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


bench.mark("registered")
await client.connect()  # type: ignore[top-level-await]  # noqa: F704 (runPythonAsync allows it)
bench.status = "connected"
