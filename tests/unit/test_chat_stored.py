"""The chat's stored messages (H3) in the sans-I/O ``ChatState``: newest version wins,
and a list that arrives while our own response streams waits for its end."""

from __future__ import annotations

from typing import Any

from clienttools import protocol
from clienttools.chat import ChatState
from clienttools.uimessage import UIMessage


def _user(message_id: str, text: str) -> dict[str, Any]:
    return {"id": message_id, "role": "user", "parts": [{"type": "text", "text": text}]}


def _answer(message_id: str, text: str) -> dict[str, Any]:
    return {
        "id": message_id,
        "role": "assistant",
        "parts": [{"type": "text", "text": text, "state": "done"}],
    }


def _stored(version: int, *messages: dict[str, Any], chat: str = "c1") -> Any:
    return protocol.ChatMessagesFrame(id=chat, messages=list(messages), version=version)


def test_stored_messages_replace_ours_and_older_versions_are_ignored() -> None:
    state = ChatState(chat_id="c1")
    assert state.receive(_stored(2, _user("u1", "hi"), _answer("a1", "hello")))
    assert [m.id for m in state.messages] == ["u1", "a1"] and state.version == 2
    assert state.messages[1].text == "hello"
    assert not state.receive(_stored(1))  # older: ignored
    assert not state.receive(_stored(2))  # the same version again
    assert not state.receive(_stored(9, chat="other"))  # another chat's
    assert len(state.messages) == 2 and state.ignored_frames == 3
    assert state.receive(_stored(3))  # a clear in another tab
    assert state.messages == [] and state.version == 3


def test_stored_messages_wait_for_the_end_of_our_response() -> None:
    state = ChatState(chat_id="c1", id_factory=iter(f"id{i}" for i in range(9)).__next__)
    send = state.begin_request("r1", "hi")
    user = send.messages[0]
    chunk: dict[str, Any] = {"type": "start", "messageId": "a1"}
    state.receive(protocol.ChunkFrame(request_id="r1", sequence=0, chunk=chunk))
    delta: list[dict[str, Any]] = [
        {"type": "text-start", "id": "t"},
        {"type": "text-delta", "id": "t", "delta": "hello"},
    ]
    for sequence, c in enumerate(delta, 1):
        state.receive(protocol.ChunkFrame(request_id="r1", sequence=sequence, chunk=c))
    # The server stored the user's message at the start: it must not hide the answer.
    assert not state.receive(_stored(1, user))
    assert [m.id for m in state.messages] == [user["id"], "a1"]
    final = _answer("a1", "hello there")
    assert not state.receive(_stored(2, user, final))
    state.receive(protocol.EndFrame(request_id="r1"))
    assert state.version == 2 and state.status == "ready"
    assert [m.text for m in state.messages] == ["hi", "hello there"]


def test_a_resumed_response_replaces_the_stored_partial_message_by_id() -> None:
    state = ChatState(chat_id="c1")
    state.receive(_stored(4, _user("u1", "hi"), _answer("a1", "hel")))
    state.begin_resume("r2")
    chunks: list[dict[str, Any]] = [
        {"type": "start", "messageId": "a1"},
        {"type": "text-start", "id": "t"},
        {"type": "text-delta", "id": "t", "delta": "hello"},
    ]
    for sequence, c in enumerate(chunks):
        state.receive(protocol.ChunkFrame(request_id="r2", sequence=sequence, chunk=c))
    state.receive(protocol.EndFrame(request_id="r2"))
    assert [(m.id, m.text) for m in state.messages] == [("u1", "hi"), ("a1", "hello")]


def test_after_a_reload_the_history_shows_at_once_below_it_the_rejoined_answer() -> None:
    # A reloaded page rejoins the answer (resume) before the stored list arrives.
    state = ChatState(chat_id="c1")
    state.begin_resume("r3")
    chunks: list[dict[str, Any]] = [
        {"type": "start", "messageId": "a2"},
        {"type": "text-start", "id": "t"},
        {"type": "text-delta", "id": "t", "delta": "still "},
    ]
    for sequence, c in enumerate(chunks):
        state.receive(protocol.ChunkFrame(request_id="r3", sequence=sequence, chunk=c))
    stored = _stored(5, _user("u1", "hi"), _answer("a1", "hello"), _user("u2", "more"))
    assert state.receive(stored)  # shown now, not at the end of the answer
    assert [m.id for m in state.messages] == ["u1", "a1", "u2", "a2"]
    # A stored copy of the streaming message (older) does not hide what streams.
    older = _answer("a2", "st")
    assert not state.receive(_stored(6, *stored.messages, older))
    assert state.messages[3].text == "still "
    delta: dict[str, Any] = {"type": "text-delta", "id": "t", "delta": "going"}
    state.receive(protocol.ChunkFrame(request_id="r3", sequence=3, chunk=delta))
    assert [m.text for m in state.messages][3] == "still going"
    state.receive(protocol.EndFrame(request_id="r3"))
    assert [m.id for m in state.messages] == ["u1", "a1", "u2", "a2"]
    assert state.status == "ready" and state.version == 6


def test_stored_messages_that_are_not_ui_messages_are_ignored() -> None:
    state = ChatState(chat_id="c1")
    assert not state.receive(_stored(1, {"id": "x", "role": "robot", "parts": []}))
    assert state.version == 0 and state.messages == [] and state.ignored_frames == 1


def test_clear_returns_the_frame_for_the_server() -> None:
    state = ChatState(chat_id="c1")
    state.receive(_stored(1, _user("u1", "hi")))
    assert protocol.dump_frame(state.clear()) == '{"type":"cf_agent_chat_clear","id":"c1"}'
    assert state.messages == []
    assert protocol.dump_frame(state.subscribe()) == '{"type":"cf_agent_chat_subscribe","id":"c1"}'


def test_a_deleted_chat_empties_every_tab_and_its_next_turns_are_seen() -> None:
    # DELETE /chats/{id} (or the retention) removes the chat: subscribers get version 0
    # with no messages, and the chat's next use starts again at version 1.
    state = ChatState(chat_id="c1")
    assert state.receive(_stored(4, _user("u1", "hi"), _answer("a1", "hello")))
    assert state.receive(_stored(0))
    assert state.messages == [] and state.version == 0
    assert state.receive(_stored(1, _user("u2", "again")))
    assert [m.id for m in state.messages] == ["u2"] and state.version == 1


def test_no_stored_chat_keeps_the_messages_a_page_starts_with() -> None:
    state = ChatState(chat_id="c1", messages=[UIMessage.model_validate(_user("u1", "hi"))])
    assert not state.receive(_stored(0))  # subscribed to a chat never stored
    assert [m.id for m in state.messages] == ["u1"] and state.ignored_frames == 1
