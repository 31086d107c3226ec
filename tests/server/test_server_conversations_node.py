"""Edit and regenerate (H1) as the `ai` package's own AbstractChat sends them (Node)."""

from __future__ import annotations

import asyncio
import json
import shutil
from typing import Any

import pytest
from server_harness import NODE_DIR, ROOT, settled

from clienttools_server.app import RunningServer

pytestmark = [
    pytest.mark.node,
    pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed"),
]


def _shape(messages: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """(id, role, text) of each message: what both sides must agree on."""
    return [
        (m["id"], m["role"], "".join(p.get("text", "") for p in m["parts"] if p["type"] == "text"))
        for m in messages
    ]


async def test_abstract_chat_edit_and_regenerate_keep_the_stored_history_equal(
    server: RunningServer,
) -> None:
    process = await asyncio.create_subprocess_exec(
        "node", str(NODE_DIR / "abstract_chat_edit.mjs"), server.ws_url("node-edit"), "edit-chat",
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    stdout, stderr = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, stderr.decode()
    steps = {step["step"]: step for step in json.loads(stdout)["steps"]}
    for name, step in steps.items():
        assert _shape(step["stored"]) == _shape(step["chat"]), name
    second = _shape(steps["second"]["stored"])
    assert [role for _, role, _ in second] == ["user", "assistant", "user", "assistant"]
    # regenerate(): the last answer is replaced by a new one, the rest kept.
    regenerated = _shape(steps["regenerate"]["stored"])
    assert regenerated[:3] == second[:3] and len(regenerated) == 4
    assert regenerated[3][0] != second[3][0]
    # sendMessage with the first message's id: it is replaced, all after it dropped.
    edited = _shape(steps["edit"]["stored"])
    assert len(edited) == 2 and edited[0][0] == second[0][0]
    assert edited[0][2] == "hello, edited" and edited[1][1] == "assistant"
    tools = [p for p in steps["second"]["stored"][3]["parts"] if p["type"].startswith("tool-")]
    assert [p["state"] for p in tools] == ["output-available"]
    await settled(server.hub)
