"""Bad input and admission: protocol errors, flood, oversize, Origin, token (S9, S10)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from server_harness import FakeBrowser, settled, tool_spec
from websockets.exceptions import InvalidStatus

from clienttools_server.app import RunningServer


@pytest.mark.parametrize(
    ("frame", "request_id", "fragment"),
    [
        ("not json", None, "not valid JSON"),
        ("[1, 2]", None, "must be a JSON object"),
        ('{"type": 3}', None, "no string 'type'"),
        ('{"type": "mystery", "requestId": "r1"}', "r1", "unknown frame type"),
        ('{"type": "cf_agent_client_tool_result", "requestId": "r2"}', "r2", "exactly one"),
        ('{"type": "send", "requestId": "r3"}', "r3", "invalid 'send' frame"),
        (b"\x00\x01", None, "binary"),
    ],
)
async def test_malformed_frames_get_protocol_errors(
    server: RunningServer,
    tab: FakeBrowser,
    frame: str | bytes,
    request_id: str | None,
    fragment: str,
) -> None:
    await tab.send_raw(frame)
    error = await tab.expect("cf_agent_protocol_error")
    assert fragment in error["message"]
    assert error.get("requestId") == request_id
    # The connection stays open and usable.
    assert (await tab.chat("hi")).final["type"] == "end"
    await settled(server.hub)


async def test_a_flood_of_malformed_frames_closes_with_1008(
    server: RunningServer, tab: FakeBrowser, open_browser: Any
) -> None:
    bystander = await open_browser(server, "s2")
    for _ in range(25):
        await tab.send_raw("{")
    assert await tab.expect_closed() == 1008
    # Another session is unaffected.
    assert (await bystander.chat("hi")).final["type"] == "end"


async def test_oversize_frame_closes_with_1009(start_server: Any, open_browser: Any) -> None:
    server = await start_server(max_frame_bytes=10_000)
    tab = await open_browser(server)
    await tab.send_raw(json.dumps({"type": "cf_agent_pong", "t": 1, "pad": "x" * 20_000}))
    assert await tab.expect_closed() == 1009


async def test_default_frame_limit_is_one_mebibyte(server: RunningServer, tab: FakeBrowser) -> None:
    just_under = json.dumps({"type": "cf_agent_pong", "t": 1, "pad": "x" * 1_048_500})
    assert len(just_under) <= 1_048_576
    await tab.send_raw(just_under)
    assert (await tab.chat("hi")).final["type"] == "end"
    await tab.send_raw(json.dumps({"type": "cf_agent_pong", "t": 1, "pad": "x" * 1_048_600}))
    assert await tab.expect_closed() == 1009


async def test_cross_origin_is_refused(server: RunningServer, open_browser: Any) -> None:
    with pytest.raises(InvalidStatus) as refused:
        await open_browser(server, origin="https://evil.example")
    assert refused.value.response.status_code == 403
    own = await open_browser(server, origin=server.http_url)
    assert (await own.chat("hi")).final["type"] == "end"


async def test_allow_origin_list(start_server: Any, open_browser: Any) -> None:
    server = await start_server(allow_origins=("https://app.example",))
    ok = await open_browser(server, origin="https://app.example")
    await ok.register([])
    with pytest.raises(InvalidStatus):
        await open_browser(server, origin="https://other.example")


async def test_token_is_required(start_server: Any, open_browser: Any) -> None:
    server = await start_server(token="s3cret")
    for token in (None, "wrong"):
        with pytest.raises(InvalidStatus) as refused:
            await open_browser(server, token=token)
        assert refused.value.response.status_code == 403
    tab = await open_browser(server, token="s3cret")
    assert (await tab.chat("hi")).final["type"] == "end"


async def test_bad_frames_never_touch_a_running_call(
    server: RunningServer, tab: FakeBrowser
) -> None:
    await tab.register([tool_spec("t")])
    request_id = await tab.start_chat("call t {}")
    invoke = await tab.expect("cf_agent_client_tool_invoke")
    await tab.send_raw(
        json.dumps({"type": "cf_agent_client_tool_result", "requestId": invoke["requestId"]})
    )
    error = await tab.expect("cf_agent_protocol_error")
    assert error["requestId"] == invoke["requestId"]
    await tab.send_result(invoke["requestId"], output=True)
    assert (await tab.response(request_id)).text == "t -> true"
    await settled(server.hub)
