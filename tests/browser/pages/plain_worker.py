# A worker that never touches the page, for a page that is not cross-origin isolated
# (tests/browser/test_worker.py): the page's main thread hands it the URL and reads its
# status, both through PyScript's worker export, which needs no SharedArrayBuffer.
import sys

if "MicroPython" in sys.version:
    from clienttools.mpy import ToolClient

    def tool(client):
        schema = {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        }
        return client.tool(description="Add two integers.", schema=schema)

else:
    from clienttools import ToolClient

    def tool(client):
        return client.tool


from clienttools.worker import StatusExport

clients = []


async def start(url):
    client = ToolClient(url)

    @tool(client)
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    clients.append((client, StatusExport(client)))
    await client.connect()
    return client.status


def client_status():
    return clients[0][1].status() if clients else "idle"


__export__ = ["start", "client_status"]
