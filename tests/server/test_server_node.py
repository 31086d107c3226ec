"""The stock AI SDK WebSocketChatTransport (Node, `ws`) holds a conversation with the server."""

from __future__ import annotations

import asyncio
import json
import shutil
from typing import Any

import pytest
from server_harness import NODE_DIR, ROOT, settled, tool_spec

from clienttools_server.app import RunningServer

pytestmark = [
    pytest.mark.node,
    pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed"),
]


async def test_stock_transport_conversation(server: RunningServer, open_browser: Any) -> None:
    page = await open_browser(server, "node-session")

    async def echo(tool_input: dict[str, Any]) -> Any:
        return {"echo": tool_input}

    await page.register([tool_spec("echo")], handlers={"echo": echo})
    process = await asyncio.create_subprocess_exec(
        "node", str(NODE_DIR / "transport_chat.mjs"), server.ws_url("node-session"),
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    stdout, stderr = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, stderr.decode()
    result = json.loads(stdout)
    assert result["resumedNothing"] is True
    _, answer1, _, answer2 = result["messages"]
    assert answer1["role"] == "assistant"
    texts = [p["text"] for p in answer1["parts"] if p["type"] == "text"]
    assert texts and texts[0].startswith("I can call these tools: echo, server_time.")
    tools = {p["type"]: p for p in answer2["parts"] if p["type"].startswith("tool-")}
    assert tools["tool-server_time"]["state"] == "output-available"
    assert tools["tool-echo"]["state"] == "output-available"
    assert tools["tool-echo"]["output"] == {"echo": {"from": "node"}}
    final = [p["text"] for p in answer2["parts"] if p["type"] == "text"][-1]
    assert final.splitlines()[1] == 'echo -> {"echo":{"from":"node"}}'
    await settled(server.hub)
