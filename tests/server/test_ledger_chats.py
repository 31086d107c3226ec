"""The conversation store of the ledger (rule H1): every store passes the same tests.

The same three stores as ``test_ledger.py``: a SQLite file, ``:memory:`` and a
fresh PostgreSQL schema.
"""

# ruff: noqa: F811  (pytest fixtures imported, then named as parameters)

from __future__ import annotations

from pathlib import Path

import pytest

from clienttools_server.canonical import canonical_json
from clienttools_server.ledger import ChatOfOtherSession, Ledger, SqliteLedger

# The fixtures of the contract tests, so both files test the same stores.
from tests.server.test_ledger import T0, _opened, ledger, open_durable_ledger, store  # noqa: F401


def _messages(*texts: str) -> list[str]:
    return [
        canonical_json({"id": f"m{i}", "role": "user", "parts": [{"type": "text", "text": t}]})
        for i, t in enumerate(texts)
    ]


async def test_a_new_chat_is_stored_with_its_session_and_version_1(ledger: Ledger) -> None:
    assert await ledger.get_chat("c1") is None
    version = await ledger.save_chat("c1", "s1", 0, _messages("a", "b"), T0, streaming="e1")
    chat = await ledger.get_chat("c1")
    assert version == 1 and chat is not None
    assert (chat.id, chat.session, chat.version, chat.updated_at, chat.streaming) == (
        "c1", "s1", 1, T0, "e1",
    )  # fmt: skip
    assert chat.messages == tuple(_messages("a", "b"))


async def test_save_keeps_a_prefix_and_replaces_the_rest(ledger: Ledger) -> None:
    a, b, c, d = _messages("a", "b", "c", "d")
    await ledger.save_chat("c1", "s1", 0, [a, b, c], T0, streaming=None)
    assert await ledger.save_chat("c1", "s1", 1, [d], T0 + 1, streaming=None) == 2
    chat = await ledger.get_chat("c1")
    assert chat is not None and chat.messages == (a, d) and chat.updated_at == T0 + 1
    # keep past the end appends; keep 0 with nothing clears
    assert await ledger.save_chat("c1", "s1", 99, [b], T0 + 2, streaming=None) == 3
    chat = await ledger.get_chat("c1")
    assert chat is not None and chat.messages == (a, d, b)
    assert await ledger.save_chat("c1", "s1", 0, [], T0 + 3, streaming=None) == 4
    chat = await ledger.get_chat("c1")
    assert chat is not None and chat.messages == () and chat.version == 4


async def test_a_sqlite_save_writes_only_what_changed(tmp_path: Path) -> None:
    """A new chat's row is made once; a message is written over its old text, and only
    what is past the new end is deleted."""
    a, b, c = _messages("a", "b", "c")
    async with SqliteLedger(str(tmp_path / "ledger.sqlite3")) as ledger:
        statements: list[str] = []
        ledger._store._db.set_trace_callback(statements.append)  # type: ignore[attr-defined]

        async def save(keep: int, messages: list[str]) -> list[str]:
            statements.clear()
            await ledger.save_chat("c1", "s1", keep, messages, T0, streaming=None)
            return [" ".join(s.split()[:3]) for s in statements if s != "BEGIN IMMEDIATE"]

        assert await save(0, [a, b]) == [
            "SELECT session, version,", "INSERT INTO chats", "INSERT INTO chat_messages",
            "INSERT INTO chat_messages", "UPDATE chats SET", "COMMIT",
        ]  # fmt: skip
        assert await save(1, [c]) == [
            "SELECT session, version,", "INSERT INTO chat_messages", "UPDATE chats SET", "COMMIT",
        ]  # fmt: skip
        assert await save(0, [b]) == [
            "SELECT session, version,", "DELETE FROM chat_messages", "INSERT INTO chat_messages",
            "UPDATE chats SET", "COMMIT",
        ]  # fmt: skip
        chat = await ledger.get_chat("c1")
        assert chat is not None and chat.messages == (b,) and chat.version == 3


async def test_a_save_told_the_chat_is_new_is_right_also_when_it_is_not(
    ledger: Ledger,
) -> None:
    """``new`` only says the chat was missing when read: one made since (another
    process, another send) is saved as any other, and another session's is refused."""
    a, b, c = _messages("a", "b", "c")
    assert await ledger.save_chat("c1", "s1", 0, [a], T0, streaming="e1", new=True) == 1
    assert await ledger.save_chat("c1", "s1", 1, [b, c], T0 + 1, streaming=None, new=True) == 2
    chat = await ledger.get_chat("c1")
    assert chat is not None and chat.session == "s1" and chat.messages == (a, b, c)
    assert (chat.version, chat.updated_at, chat.streaming) == (2, T0 + 1, None)
    with pytest.raises(ChatOfOtherSession):
        await ledger.save_chat("c1", "s2", 0, [], T0 + 2, streaming=None, new=True)
    chat = await ledger.get_chat("c1")
    assert chat is not None and chat.version == 2 and chat.messages == (a, b, c)


async def test_a_sqlite_save_of_a_new_chat_makes_it_without_reading_it(tmp_path: Path) -> None:
    (a,) = _messages("a")
    async with SqliteLedger(str(tmp_path / "ledger.sqlite3")) as ledger:
        statements: list[str] = []
        ledger._store._db.set_trace_callback(statements.append)  # type: ignore[attr-defined]
        await ledger.save_chat("c1", "s1", 0, [a], T0, streaming=None, new=True)
        assert [" ".join(s.split()[:3]) for s in statements] == [
            "BEGIN IMMEDIATE", "INSERT INTO chats", "INSERT INTO chat_messages",
            "UPDATE chats SET", "COMMIT",
        ]  # fmt: skip


async def test_a_chat_of_another_session_is_refused_unchanged(ledger: Ledger) -> None:
    await ledger.save_chat("c1", "s1", 0, _messages("a"), T0, streaming=None)
    with pytest.raises(ChatOfOtherSession):
        await ledger.save_chat("c1", "s2", 0, [], T0 + 1, streaming=None)
    chat = await ledger.get_chat("c1")
    assert chat is not None and chat.session == "s1" and chat.version == 1
    assert chat.messages == tuple(_messages("a"))


async def test_negative_keep_is_refused(ledger: Ledger) -> None:
    with pytest.raises(ValueError, match="keep"):
        await ledger.save_chat("c1", "s1", -1, [], T0, streaming=None)
    assert await ledger.get_chat("c1") is None


async def test_chats_are_listed_newest_first_by_session_and_paged(ledger: Ledger) -> None:
    for i, (chat_id, session) in enumerate([("a", "s1"), ("b", "s2"), ("c", "s1"), ("d", "s1")]):
        await ledger.save_chat(
            chat_id, session, 0, _messages("x") * (i + 1), T0 + i, streaming=None
        )
    everything = await ledger.chats(None, 10)
    assert [c.id for c in everything] == ["d", "c", "b", "a"]
    assert (everything[0].message_count, everything[0].version, everything[0].updated_at) == (
        4, 1, T0 + 3,
    )  # fmt: skip
    assert [c.id for c in await ledger.chats("s1", 10)] == ["d", "c", "a"]
    first = await ledger.chats("s1", 2)
    assert [c.id for c in first] == ["d", "c"]
    rest = await ledger.chats("s1", 2, before=(first[-1].updated_at, first[-1].id))
    assert [c.id for c in rest] == ["a"]


async def test_same_time_chats_page_by_id(ledger: Ledger) -> None:
    for chat_id in ("a", "b", "c"):
        await ledger.save_chat(chat_id, "s1", 0, [], T0, streaming=None)
    assert [c.id for c in await ledger.chats(None, 10)] == ["c", "b", "a"]
    assert [c.id for c in await ledger.chats(None, 10, before=(T0, "b"))] == ["a"]


async def test_delete_chat_forgets_it_and_its_messages(ledger: Ledger) -> None:
    await ledger.save_chat("c1", "s1", 0, _messages("a"), T0, streaming=None)
    assert await ledger.delete_chat("c1") is True
    assert await ledger.get_chat("c1") is None
    assert await ledger.delete_chat("c1") is False
    # The id is free again, for any session.
    assert await ledger.save_chat("c1", "s2", 0, [], T0, streaming=None) == 1


async def test_prune_chats_keeps_recent_and_streaming_ones(ledger: Ledger) -> None:
    run = await ledger.start_execution("s1", "{}", now=T0)
    await ledger.save_chat("old", "s1", 0, _messages("a"), T0, streaming=None)
    await ledger.save_chat("streaming", "s1", 0, [], T0, streaming=run.id)
    await ledger.save_chat("stale-mark", "s1", 0, [], T0, streaming="a-run-that-is-gone")
    await ledger.save_chat("new", "s1", 0, [], T0 + 100, streaming=None)
    assert await ledger.prune_chats(50, T0 + 120) == 2
    assert [c.id for c in await ledger.chats(None, 10)] == ["new", "streaming"]
    with pytest.raises(ValueError, match="retention"):
        await ledger.prune_chats(-1, T0)


async def test_unicode_and_backslashes_come_back_as_stored(ledger: Ledger) -> None:
    text = canonical_json({"id": "m", "parts": [{"text": 'Zürich \\ "q" \u0000 \u2028'}]})
    await ledger.save_chat("c\\1", "s\\1", 0, [text], T0, streaming=None)
    chat = await ledger.get_chat("c\\1")
    assert chat is not None and chat.messages == (text,) and chat.session == "s\\1"
    assert [c.id for c in await ledger.chats("s\\1", 10)] == ["c\\1"]


async def test_a_stored_chat_survives_reopening(open_durable_ledger: tuple[str, str]) -> None:
    async with _opened(*open_durable_ledger) as ledger:
        await ledger.save_chat("c1", "s1", 0, _messages("a", "b"), T0, streaming=None)
    async with _opened(*open_durable_ledger) as ledger:
        chat = await ledger.get_chat("c1")
        assert chat is not None and chat.messages == tuple(_messages("a", "b"))


async def test_a_subscription_reads_the_chat_as_stored_and_ends_quietly(ledger: Ledger) -> None:
    assert await ledger.subscribe_chat("c1") is None  # a chat not made yet
    await ledger.save_chat("c1", "s1", 0, _messages("a"), T0, streaming=None)
    assert await ledger.subscribe_chat("c1") == await ledger.get_chat("c1")
    await ledger.save_chat("c1", "s1", 1, [], T0, streaming=None)  # nobody else to tell
    assert await ledger.delete_chat("c1") is True
    await ledger.unsubscribe_chat("c1")
    await ledger.unsubscribe_chat("c1")  # twice: still nothing to do
