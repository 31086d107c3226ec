"""OutboxWriter: where nothing saves it at the page's end, a new result is in the store
before it is sent and acks are written batched; where the page's end saves it, every
change is batched and a result acknowledged in time is never written."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

from clienttools.client import ToolClient
from clienttools.outbox import OUTBOX_SAVE_DELAY, OutboxWriter
from clienttools.session import Session
from clienttools.tools import ToolRegistry
from clienttools.transport import MemoryOutboxStore
from tests.support.wait import wait_until


class RecordingStore(MemoryOutboxStore):
    def __init__(self) -> None:
        super().__init__()
        self.saves: list[str] = []

    def save(self, text: str) -> None:
        super().save(text)
        self.saves.append(text)


def stored_ids(store: MemoryOutboxStore) -> list[str]:
    text = store.load()
    return [entry["requestId"] for entry in json.loads(text)["results"]] if text else []


def invoke(request_id: str) -> str:
    return json.dumps(
        {
            "type": "cf_agent_client_tool_invoke",
            "requestId": request_id,
            "toolCallId": f"call-{request_id}",
            "toolName": "add",
            "input": {"a": 1, "b": 2},
        }
    )


def ack(request_id: str) -> str:
    return json.dumps(
        {"type": "cf_agent_client_tool_result_ack", "requestId": request_id, "outcome": "applied"}
    )


def registry() -> ToolRegistry:
    tools = ToolRegistry()

    @tools.tool
    def add(a: int, b: int) -> int:
        return a + b

    return tools


def answer(session: Session, frame: str) -> None:
    session.receive_frame(frame, 1.0)
    for run in session.events():
        session.tool_returned(run.request_id, run.tool.call(run.arguments, None))  # type: ignore[union-attr]


def connected_writer(store: MemoryOutboxStore, **options: bool) -> tuple[Session, OutboxWriter]:
    """A session on an open connection and its writer, restored from `store`."""
    session = Session(registry(), client_id="page")
    session.connection_opened(0.0)
    writer = OutboxWriter(session, store, **options)
    writer.restore()
    return session, writer


async def test_results_are_written_at_once_and_acks_batched() -> None:
    store = RecordingStore()
    session, writer = connected_writer(store)
    answer(session, invoke("r1"))
    writer.save_soon()
    assert stored_ids(store) == ["r1"], "a new result is written at once"
    answer(session, ack("r1"))
    writer.save_soon()
    assert stored_ids(store) == ["r1"], "an ack alone waits"
    answer(session, invoke("r2"))
    writer.save_soon()
    assert stored_ids(store) == ["r2"], "the next result's write carries the ack along"
    answer(session, ack("r2"))
    writer.save_soon()
    assert len(store.saves) == 2
    await wait_until(lambda: len(store.saves) == 3, 5, "the batched write")
    assert stored_ids(store) == [], "the batched write carries the ack"
    writer.cancel()


class PageHideStore(RecordingStore):
    """A store that, like the browser's sessionStorage outbox, is saved when the page ends."""

    def __init__(self) -> None:
        super().__init__()
        self.on_page_hide: Callable[[], None] | None = None

    def flush_on_page_hide(self, flush: Callable[[], None]) -> None:
        self.on_page_hide = flush


async def test_where_the_page_end_saves_a_result_acknowledged_in_time_is_never_written() -> None:
    store = PageHideStore()
    session, writer = connected_writer(store)
    assert writer.page_hide_saves and store.on_page_hide is not None
    for i in range(5):  # a live connection: each result acknowledged a moment later
        answer(session, invoke(f"r{i}"))
        writer.save_soon()
        answer(session, ack(f"r{i}"))
        writer.save_soon()
    assert store.saves == []
    await asyncio.sleep(OUTBOX_SAVE_DELAY * 3)
    assert store.saves == [], "nothing was ever waiting: nothing to write"
    answer(session, invoke("held"))
    writer.save_soon()
    assert store.saves == [], "a new result waits for the timer too"
    await wait_until(lambda: stored_ids(store) == ["held"], 5, "the batched write")
    answer(session, invoke("late"))
    writer.save_soon()
    store.on_page_hide()  # a reload: pagehide comes before the page goes
    assert stored_ids(store) == ["held", "late"]
    writer.cancel()


async def test_a_writer_told_that_the_page_end_saves_it_batches_new_results() -> None:
    store = RecordingStore()
    session, writer = connected_writer(store, page_hide_saves=True)  # mpy.py's main thread
    answer(session, invoke("r1"))
    writer.save_soon()
    assert store.saves == []
    await wait_until(lambda: stored_ids(store) == ["r1"], 5, "the batched write")
    writer.cancel()


class BatchSocket:
    """An in-memory socket that pushes frames to the client, one by one or as one batch."""

    def __init__(self, store: MemoryOutboxStore) -> None:
        self.store = store
        self.sent: list[dict[str, object]] = []
        self.stored_at_send: list[bool] = []
        self.receiver: Callable[[str | bytes, bool], None] | None = None
        self.closed = asyncio.Event()

    def deliver_to(self, receiver: Callable[[str | bytes, bool], None]) -> None:
        self.receiver = receiver

    def push(self, frames: list[str]) -> None:
        assert self.receiver is not None
        for i, text in enumerate(frames):
            self.receiver(text, i + 1 < len(frames))

    def send_nowait(self, text: str) -> None:
        frame = json.loads(text)
        self.sent.append(frame)
        if frame["type"] == "cf_agent_client_tools":
            loop = asyncio.get_running_loop()
            names = [tool["name"] for tool in frame["tools"]]  # type: ignore[index]
            tools_ack = {"type": "cf_agent_client_tools_ack", "accepted": names, "rejected": []}
            loop.call_soon(self.push, [json.dumps(tools_ack)])
        elif frame["type"] == "cf_agent_client_tool_result":
            self.stored_at_send.append(frame["requestId"] in stored_ids(self.store))

    async def send(self, text: str) -> None:
        self.send_nowait(text)

    async def receive(self) -> str | bytes | None:
        await self.closed.wait()
        return None

    async def close(self, code: int = 1000, reason: str = "") -> None:
        self.closed.set()


class BatchConnector:
    def __init__(self, store: MemoryOutboxStore) -> None:
        self.socket = BatchSocket(store)

    async def open(self, url: str, timeout: float) -> BatchSocket:
        return self.socket


async def test_every_result_is_stored_before_it_is_sent_and_a_batch_is_one_write() -> None:
    store = RecordingStore()
    connector = BatchConnector(store)
    client = ToolClient(
        "ws://test/agents/chat/s", connector=connector, outbox_store=store, registry=registry()
    )
    await client.connect()
    socket = connector.socket
    socket.push([invoke("r1")])
    assert socket.stored_at_send == [True]
    socket.push([ack("r1")] + [invoke(f"b{i}") for i in range(10)])
    assert len(socket.stored_at_send) == 11
    assert all(socket.stored_at_send), "each result was in the store when it was sent"
    assert len(store.saves) == 2, "the batch of ten was one write"
    assert stored_ids(store) == [f"b{i}" for i in range(10)]
    await client.close()
