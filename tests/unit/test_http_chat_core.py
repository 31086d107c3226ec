"""The sans-I/O parts of the HTTP chat transport: the body as a ``send``, frames as events."""

from __future__ import annotations

import json

import pytest

from clienttools.protocol import ChunkFrame, EndFrame, ErrorFrame, NoActiveFrame, StartFrame
from clienttools_server.wire.http_chat import (
    DONE,
    ChatRequestError,
    ResponsePeer,
    parse_send,
    sse_event,
)


def test_the_transports_fields_and_the_apps_body() -> None:
    body = {
        "theme": "dark",
        "user": {"id": 7},
        "id": "c1",
        "messages": [{"id": "u1", "role": "user", "parts": []}],
        "trigger": "regenerate-message",
        "messageId": "a1",
    }
    frame = parse_send(json.dumps(body).encode(), "r1")
    assert (frame.request_id, frame.id, frame.trigger, frame.message_id) == (
        "r1", "c1", "regenerate-message", "a1",
    )  # fmt: skip
    assert frame.body == {"theme": "dark", "user": {"id": 7}}
    assert frame.messages == body["messages"]


def test_a_null_message_id_is_absent() -> None:
    body = b'{"id": "c1", "messages": [], "trigger": "submit-message", "messageId": null}'
    assert parse_send(body, "r1").message_id is None


@pytest.mark.parametrize(
    "body",
    [b"", b"null", b'"text"', b'{"id": "c1", "messages": [], "trigger": "submit-message",'],
)
def test_not_an_object_is_400(body: bytes) -> None:
    with pytest.raises(ChatRequestError) as raised:
        parse_send(body, "r1")
    assert raised.value.status == 400
    assert json.loads(raised.value.response().body) == {"error": raised.value.message}


def test_an_event_is_one_data_line_whatever_the_text_holds() -> None:
    event = sse_event({"type": "text-delta", "id": "t", "delta": "a\nb\r\nc\u2028d"})
    assert event.endswith(b"\n\n") and event.count(b"\n") == 2 and b"\r" not in event
    assert json.loads(event.removeprefix(b"data: "))["delta"] == "a\nb\r\nc\u2028d"


def test_frames_become_the_event_stream() -> None:
    peer = ResponsePeer("s1")
    peer.send(StartFrame(request_id="r"))
    peer.send(ChunkFrame(request_id="r", sequence=0, chunk={"type": "start"}))
    peer.send(ErrorFrame(request_id="r", error_text="the model failed"))
    peer.send(ChunkFrame(request_id="r", sequence=1, chunk={"type": "finish"}))  # after the end
    assert isinstance(peer.first, StartFrame)
    assert peer.done
    assert peer.pending == [
        b'data: {"type":"start"}\n\n',
        b'data: {"type":"error","errorText":"the model failed"}\n\n',
        DONE,
    ]


def test_the_end_and_nothing_active() -> None:
    ended = ResponsePeer("s1")
    ended.send(StartFrame(request_id="r"))
    ended.send(EndFrame(request_id="r"))
    assert ended.pending == [DONE] and ended.done
    nothing = ResponsePeer("s1")
    nothing.send(NoActiveFrame(request_id="r"))
    assert isinstance(nothing.first, NoActiveFrame) and nothing.pending == []
