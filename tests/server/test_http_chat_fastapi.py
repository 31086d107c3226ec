"""examples/fastapi_app.py serves the HTTP chat transport under its mount prefix too, behind
the app's own login: the cookie that opens the page's socket is the one the POST carries."""

from __future__ import annotations

import pytest
from sse_client import HttpResponse, chat_body
from test_fastapi_example import COOKIE, App, example  # noqa: F401 (the fixture)

from clienttools import ToolClient
from clienttools.native import NativeConnector

# Real server processes: the whole suite (make test), not the fast lane (make check).
pytestmark = pytest.mark.process


async def test_a_turn_over_http_in_the_fastapi_app(example: App) -> None:  # noqa: F811
    alice = await example.login("alice")
    cookie = {"Cookie": f"{COOKIE}={alice}"}
    page = ToolClient(
        example.ws_url("fa"), connector=NativeConnector(additional_headers=cookie), reconnect=False
    )

    @page.tool
    async def page_title() -> str:
        """The title of the page."""
        return "Mounted"

    await page.connect()
    try:
        response = await HttpResponse.open(
            "127.0.0.1", example.port, "POST", "/clienttools/agents/chat/fa",
            chat_body("call page_title {}"), {"content-type": "application/json", **cookie},
        )  # fmt: skip
        assert response.status == 200
        chunks = await response.chunks_until()
        resumed = await HttpResponse.open(
            "127.0.0.1", example.port, "GET", "/clienttools/agents/chat/fa/chat-1/stream",
            headers=cookie,
        )  # fmt: skip
        assert resumed.status == 204
        resumed.cut()
        # Without the cookie the app's authorizer refuses: 401, no stream.
        refused = await HttpResponse.open(
            "127.0.0.1", example.port, "POST", "/clienttools/agents/chat/fa",
            chat_body("hi"), {"content-type": "application/json"},
        )  # fmt: skip
        assert refused.status == 401
        refused.cut()
    finally:
        await page.close()
    assert response.blocks[-1] == "data: [DONE]"
    output = next(c for c in chunks if c["type"] == "tool-output-available")
    assert output["output"] == "Mounted"
    text = "".join(c["delta"] for c in chunks if c["type"] == "text-delta")
    assert text == 'page_title -> "Mounted"'
