"""H2 across a crash: SIGKILL mid-answer with ``--db``, restart, replay: the stored
history holds the final answer once."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from server_harness import ChunkCollector, FakeBrowser, tool_spec, user_message

from tests.support.http import http_json
from tests.support.server_process import ServerProcess

# Real server processes: the whole suite (make test), not the fast lane (make check).
pytestmark = pytest.mark.process


async def test_a_killed_server_stores_the_replayed_answer_once(
    tmp_path: Path, chunk_collector: ChunkCollector
) -> None:
    db = tmp_path / "ledger.sqlite3"
    server = ServerProcess(["--db", str(db)], log=tmp_path / "server.log")
    await asyncio.to_thread(server.start)
    try:
        tab = await FakeBrowser.connect(server.ws_url("s1"), chunk_collector)
        await tab.register([tool_spec("t")], client_id="page-1")  # t never answers here
        await tab.send({"type": "cf_agent_chat_subscribe", "id": "chat-k"})
        question = user_message('call server_time {}\ncall t {"k": 1}')
        await tab.send(
            {"type": "send", "requestId": "r1", "id": "chat-k", "trigger": "submit-message",
             "messages": [question], "headers": {}, "body": {}}
        )  # fmt: skip
        await tab.expect("cf_agent_client_tool_invoke")
        # The server tool's output was stored before the crash: the answer half done.
        async with asyncio.timeout(10):
            while True:
                frame = await tab.expect("cf_agent_chat_messages")
                parts = frame["messages"][-1]["parts"] if len(frame["messages"]) == 2 else []
                if any(p.get("state") == "output-available" for p in parts):
                    break
        await asyncio.to_thread(server.kill)
        await tab.close()
        await asyncio.to_thread(server.start)

        async def answer(tool_input: dict[str, Any]) -> Any:
            return {"after": "restart"}

        back = await FakeBrowser.connect(server.ws_url("s1"), chunk_collector)
        await back.register([tool_spec("t")], handlers={"t": answer}, client_id="page-1")
        async with asyncio.timeout(20):
            while True:
                chat = (await http_json("127.0.0.1", server.port, "GET", "/chats/chat-k")).json
                answer_parts = chat["messages"][-1]["parts"]
                texts = [p["text"] for p in answer_parts if p["type"] == "text"]
                if texts and 't -> {"after":"restart"}' in texts[-1]:
                    break
                await asyncio.sleep(0.05)
        await back.close()
        user, reply = chat["messages"]
        assert user == question and reply["role"] == "assistant"
        tools = [p for p in reply["parts"] if p["type"].startswith("tool-")]
        assert [(p["type"], p["state"]) for p in tools] == [
            ("tool-server_time", "output-available"),
            ("tool-t", "output-available"),
        ]
        assert texts[-1].count("t -> ") == 1 and texts[-1].startswith("server_time -> ")
        listed = (await http_json("127.0.0.1", server.port, "GET", "/chats")).json["chats"]
        assert [(c["id"], c["messageCount"]) for c in listed] == [("chat-k", 2)]
    finally:
        await asyncio.to_thread(server.stop)
