"""The `ai` package's AbstractChat over its DefaultChatTransport (Node) against a real server
process, with the session's page tools in a CPython ToolClient (tests/node/http_chat.mjs)."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from clienttools.client import ToolClient
from clienttools.native import NativeConnector
from tests.support.server_process import ROOT, ServerProcess, running

pytestmark = [
    pytest.mark.node,
    pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed"),
]

SCRIPT = ROOT / "tests" / "node" / "http_chat.mjs"


def tool_parts(message: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in message["parts"] if p["type"].startswith("tool-")]


def texts(message: dict[str, Any]) -> list[str]:
    return [p["text"] for p in message["parts"] if p["type"] == "text"]


def check_reread(reread: dict[str, Any]) -> None:
    """A response's chunks all passed uiMessageChunkSchema and built a message."""
    assert reread["rejected"] == []
    assert reread["types"][0] == "start" and reread["types"][-1] == "finish"
    assert reread["message"]["role"] == "assistant"


async def test_abstract_chat_over_the_default_transport(tmp_path: Path) -> None:
    # Keep-alive comments every 0.2 s: the `slow` tool's second brings several into the
    # streams the ai package parses.
    server = ServerProcess(["--sse-keepalive", "0.2"], log=tmp_path / "server.log")
    async with running([server]):
        client = ToolClient(server.ws_url("node-http"), connector=NativeConnector())
        calls: list[str] = []

        @client.tool
        def echo(origin: str) -> dict[str, Any]:
            """Echo the input."""
            calls.append("echo")
            return {"echo": {"from": origin}}

        @client.tool
        async def slow(n: int) -> dict[str, int]:
            """Take a while, then answer n squared."""
            calls.append("slow")
            await asyncio.sleep(1.0)
            return {"n": n, "sq": n * n}

        await client.connect()
        try:
            process = await asyncio.create_subprocess_exec(
                "node", str(SCRIPT), server.url, "node-http",
                cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
            stdout, stderr = await asyncio.wait_for(process.communicate(), 60)
        finally:
            await client.close()
    assert process.returncode == 0, stderr.decode()
    result = json.loads(stdout)
    assert result["errors"] == [] or all("network" in e for e in result["errors"]), result["errors"]
    user1, answer1, user2, answer2 = result["messages"]
    assert user1["role"] == user2["role"] == "user"

    # One turn: one POST, one response; the tool's output before the answer.
    one = result["one"]
    assert [(r["method"], r["status"]) for r in one["requests"]] == [("POST", 200)]
    check_reread(one["reread"][0])
    assert one["reread"][0]["message"]["parts"] == answer1["parts"]
    [tool] = tool_parts(answer1)
    assert tool["type"] == "tool-echo" and tool["state"] == "output-available"
    assert tool["output"] == {"echo": {"from": "node"}}
    assert answer1["parts"].index(tool) < answer1["parts"].index(
        next(p for p in answer1["parts"] if p["type"] == "text")
    )
    assert texts(answer1)[-1] == 'echo -> {"echo":{"from":"node"}}'
    # streaming from the first chunk to the end: no flicker to ready while the tool ran
    assert one["statuses"] == ["submitted", "streaming", "ready"], one["statuses"]

    # The cut turn: the POST was cut while `slow` ran; the GET got the whole response
    # again (the transport's replay) and the rest live.
    two = result["two"]
    assert [(r["method"], r.get("cut")) for r in two["requests"]] == [("POST", True)]
    assert result["afterCut"]["status"] == "error"  # the fetch's network error, resumable
    resumed = result["resumed"]
    [get] = resumed["requests"]
    assert get["method"] == "GET" and get["url"].endswith("/node-http-chat/stream")
    assert get["status"] == 200
    check_reread(resumed["reread"][0])
    assert ": keep-alive\n\n" in get["text"]  # and the transport read past them
    assert resumed["statuses"][-1] == "ready" and "error" not in resumed["statuses"]
    [slow_part] = tool_parts(answer2)
    assert slow_part["state"] == "output-available"
    assert slow_part["output"] == {"n": 3, "sq": 9}
    assert texts(answer2)[-1] == 'slow -> {"n":3,"sq":9}'
    assert resumed["reread"][0]["message"]["parts"] == answer2["parts"]
    assert calls == ["echo", "slow"]  # each tool ran once: the cut did not run it again

    assert result["nothingActive"] is True
    assert result["status"] == "ready"
