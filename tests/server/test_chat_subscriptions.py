"""H3 across processes on a real PostgreSQL: a chat's change is told to the processes
with a subscriber of it, and to no other.

Ledgers on one schema stand for server processes, each with its own Bus; the last
test puts the Conversations of two of them in front of fake connections.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from clienttools.protocol import ChatClearFrame, ChatSubscribeFrame, WireModel, dump_frame
from clienttools_server.agent.conversations import Conversations
from clienttools_server.calls.pages import Client
from clienttools_server.clock import SYSTEM_CLOCK
from clienttools_server.ledger import CHAT_CHANGED
from clienttools_server.ledger.postgres import PostgresLedger, escape
from tests.server.test_routing_bus import Heard, processes, restart
from tests.support.postgres import PostgresServer

T0 = 1_000.0
CHAT = 'chat "\u00e9\\ 1'  # stored escaped: any id works


async def _subscribed(ledger: PostgresLedger) -> list[tuple[str, str]]:
    rows = await ledger.statement(
        "SELECT chat_id, process_id FROM chat_subscribers ORDER BY chat_id, process_id", ()
    )
    return [(str(chat), str(process)) for chat, process in rows]


async def test_a_change_is_told_to_the_subscribed_processes_only(
    postgres: PostgresServer,
) -> None:
    async with processes(postgres.fresh_url(), 3) as [(a, bus_a), (b, bus_b), (c, bus_c)]:
        heard = {name: Heard(bus, CHAT_CHANGED, "barrier") for name, bus in
                 (("a", bus_a), ("b", bus_b), ("c", bus_c))}  # fmt: skip
        for bus in (bus_a, bus_b, bus_c):
            await bus.start()
        assert await b.subscribe_chat(CHAT) is None  # not made yet
        assert await a.subscribe_chat(CHAT) is None  # the sender's own: never told
        assert await b.subscribe_chat(CHAT) is None  # idempotent
        await a.save_chat(CHAT, "s", 0, ['{"id":"m1"}'], T0, streaming=None)
        for ledger in (b, c, a):  # after it: whoever was told has heard it by then
            await a.notify(ledger.owner, "barrier")
        for name in heard:
            await heard[name].until(lambda n=name: any(k == "barrier" for k, _, _ in heard[n].got))
        assert heard["b"].got == [(CHAT_CHANGED, a.owner, (CHAT,)), ("barrier", a.owner, ())]
        assert heard["c"].got == [("barrier", a.owner, ())]
        assert heard["a"].got == [("barrier", a.owner, ())]

        async def told_b(change: Callable[[], Awaitable[object]]) -> bool:
            """Whether b hears of ``change``: a barrier after it says when to look."""
            heard["b"].got.clear()
            await change()
            await a.notify(b.owner, "barrier")
            await heard["b"].until(lambda: any(k == "barrier" for k, _, _ in heard["b"].got))
            return heard["b"].got[0] == (CHAT_CHANGED, a.owner, (CHAT,))

        assert await told_b(lambda: a.delete_chat(CHAT))
        assert not await told_b(lambda: a.delete_chat(CHAT))  # nothing was deleted
        await b.unsubscribe_chat(CHAT)
        assert await _subscribed(a) == [(escape(CHAT), a.owner)]
        assert not await told_b(lambda: a.save_chat(CHAT, "s", 0, [], T0, streaming=None))


@pytest.mark.parametrize("made", [True, False], ids=["chat-made", "chat-new"])
async def test_a_subscription_waits_for_a_save_in_flight_and_reads_it_whole(
    postgres: PostgresServer, made: bool
) -> None:
    async with processes(postgres.fresh_url(), 2) as [(a, _), (b, _)]:
        if made:  # the save in flight holds the chat's row lock; else the new chat's lock
            await a.save_chat(CHAT, "s", 0, ['{"id":"m1"}'], T0, streaming=None)
        saved = asyncio.Event()
        commit = asyncio.Event()

        async def save_in_a_batch() -> None:
            async with a.batch():
                await a.save_chat(CHAT, "s", 1, ['{"id":"m2"}', '{"id":"m3"}'], T0, streaming=None)
                saved.set()
                await commit.wait()

        saving = asyncio.create_task(save_in_a_batch())
        await saved.wait()
        subscribing = asyncio.create_task(b.subscribe_chat(CHAT))
        await asyncio.sleep(0.3)
        assert not subscribing.done()  # it waits for the save's lock
        commit.set()
        await saving
        stored = await asyncio.wait_for(subscribing, 10)
        assert stored is not None
        head = ('{"id":"m1"}',) if made else ()
        assert (stored.version, stored.messages) == (
            2 if made else 1, (*head, '{"id":"m2"}', '{"id":"m3"}'),
        )  # fmt: skip


async def test_a_forgotten_process_loses_its_subscriptions(postgres: PostgresServer) -> None:
    async with processes(postgres.fresh_url(), 2) as [(a, _), (b, _)]:
        await b.keep_alive(T0)
        await b.subscribe_chat(CHAT)
        await b.subscribe_chat("other")
        await a.keep_alive(T0 + 1)  # b is dead, not forgotten yet
        assert len(await _subscribed(a)) == 2
        await a.keep_alive(T0 + 1_000_000)  # dead for far more than ten leases
        assert await _subscribed(a) == []


@dataclass
class _Tab:
    """A connection as Conversations sees it: its frames, as sent."""

    id: str
    session: str
    frames: list[dict[str, Any]] = field(default_factory=list)
    is_open: bool = True
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def send(self, frame: WireModel) -> None:
        self.frames.append(json.loads(dump_frame(frame)))
        self.changed.set()

    async def until(self, count: int, timeout: float = 10.0) -> list[dict[str, Any]]:
        async with asyncio.timeout(timeout):
            while len(self.frames) < count:
                self.changed.clear()
                await self.changed.wait()
        return self.frames


async def test_conversations_record_their_subscribers_and_again_after_a_restart(
    postgres: PostgresServer,
) -> None:
    async with processes(postgres.fresh_url(), 2) as [(a, bus_a), (b, bus_b)]:
        here, there = (
            Conversations(a, SYSTEM_CLOCK, bus=bus_a),
            Conversations(b, SYSTEM_CLOCK, bus=bus_b),
        )
        await bus_a.start()
        await bus_b.start()
        await a.save_chat(
            CHAT, "s", 0, ['{"id":"m1","role":"user","parts":[]}'], T0, streaming=None
        )
        clearing, tab1, tab2 = _Tab("c0", "s"), _Tab("t1", "s"), _Tab("t2", "s")
        stranger = _Tab("x", "other-session")
        await there.subscribe(cast(Client, stranger), ChatSubscribeFrame(id=CHAT))
        assert stranger.frames[0]["type"] == "cf_agent_protocol_error"
        assert await _subscribed(a) == []  # refused: nothing recorded
        for tab in (tab1, tab2):
            await there.subscribe(cast(Client, tab), ChatSubscribeFrame(id=CHAT))
            assert (await tab.until(1))[0]["version"] == 1
        assert await _subscribed(a) == [(escape(CHAT), b.owner)]

        await here.clear(cast(Client, clearing), ChatClearFrame(id=CHAT), streaming=False)
        for tab in (tab1, tab2):
            assert (await tab.until(2))[1] == {
                "type": "cf_agent_chat_messages", "id": CHAT, "messages": [], "version": 2,
            }  # fmt: skip
        await there.drop(cast(Client, tab1))
        assert await _subscribed(a) == [(escape(CHAT), b.owner)]  # tab2 is still there

        # The database loses the record, then comes back: each bus reconnects, checks
        # its ledger's connections, and b records its subscriber again (its handler
        # comes before the test's) before it reads what it missed. b's process row
        # had lapsed long before: b marks itself alive first, so that a's next
        # heartbeat does not forget it, and the record with it.
        await a.statement("DELETE FROM chat_subscribers RETURNING 1", ())
        await b.keep_alive(T0)
        heard_a, heard_b = Heard(bus_a), Heard(bus_b)
        await restart(postgres, heard_b, bus_a, bus_b)
        await heard_b.until(lambda: heard_a.reconnects == heard_b.reconnects == 1, timeout=20)
        assert await _subscribed(b) == [(escape(CHAT), b.owner)]
        await a.keep_alive(SYSTEM_CLOCK.now())
        assert await _subscribed(b) == [(escape(CHAT), b.owner)]
        await here.clear(cast(Client, clearing), ChatClearFrame(id=CHAT), streaming=False)
        assert (await tab2.until(3))[2]["version"] == 3
        assert len(tab1.frames) == 2  # dropped: nothing more

        await there.drop(cast(Client, tab2))
        assert await _subscribed(a) == []
