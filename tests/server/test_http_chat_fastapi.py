"""examples/fastapi_app.py serves the HTTP chat transport under its mount prefix too."""

from __future__ import annotations

import subprocess
import sys
import urllib.request

from sse_client import HttpResponse, chat_body

from clienttools import ToolClient
from tests.support.server_process import ROOT, free_port
from tests.support.wait import wait_until


async def test_a_turn_over_http_in_the_fastapi_app() -> None:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "examples.fastapi_app:app", "--port", str(port),
         "--log-level", "warning"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:

        def up() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                    return bool(r.status == 200)
            except OSError:
                return False

        await wait_until(lambda: process.poll() is not None or up(), 30, what="uvicorn")
        assert process.poll() is None
        page = ToolClient(f"ws://127.0.0.1:{port}/clienttools/agents/chat/fa")

        @page.tool
        async def page_title() -> str:
            """The title of the page."""
            return "Mounted"

        await page.connect()
        try:
            response = await HttpResponse.open(
                "127.0.0.1", port, "POST", "/clienttools/agents/chat/fa",
                chat_body("call page_title {}"), {"content-type": "application/json"},
            )  # fmt: skip
            assert response.status == 200
            chunks = await response.chunks_until()
            resumed = await HttpResponse.open(
                "127.0.0.1", port, "GET", "/clienttools/agents/chat/fa/chat-1/stream"
            )
            assert resumed.status == 204
            resumed.cut()
        finally:
            await page.close()
        assert response.blocks[-1] == "data: [DONE]"
        output = next(c for c in chunks if c["type"] == "tool-output-available")
        assert output["output"] == "Mounted"
        text = "".join(c["delta"] for c in chunks if c["type"] == "text-delta")
        assert text == 'page_title -> "Mounted"'
    finally:
        process.terminate()
        process.wait(timeout=10)
