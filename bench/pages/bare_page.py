# Page (c): the fastest Python answer Pyodide allows, the baseline for what clienttools adds.
# One proxy per socket event, json.loads in, json.dumps out; no validation, no asyncio.
import json
from typing import Any

import js
from pyodide.ffi import create_proxy

bench = js.window.__bench
ws = js.WebSocket.new(bench.wsUrl())
TOOLS = {
    "type": "cf_agent_client_tools",
    "protocol": 1,
    "clientId": "bare",
    "tools": [
        {
            "name": "add",
            "description": "Add two integers.",
            "inputSchema": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        }
    ],
}


def on_open(event: Any) -> None:
    ws.send(json.dumps(TOOLS))


def on_message(event: Any) -> None:
    frame = json.loads(event.data)
    kind = frame.get("type")
    if kind == "cf_agent_client_tool_invoke":
        tool_input = frame["input"]
        result = {
            "type": "cf_agent_client_tool_result",
            "requestId": frame["requestId"],
            "output": tool_input["a"] + tool_input["b"],
        }
        ws.send(json.dumps(result))
    elif kind == "cf_agent_client_tools_ack":
        bench.status = "connected"


# Kept for the page's lifetime: the socket lives as long as the page.
ws.onopen = create_proxy(on_open)
ws.onmessage = create_proxy(on_message)
