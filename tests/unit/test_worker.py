"""clienttools.worker under CPython: the status export against a real client and socket,
and the outbox store over Web Storage's getItem/setItem (the browser side runs in
tests/browser/test_worker.py and test_client.py's worker pages)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from clienttools.client import ToolClient
from clienttools.native import NativeConnector
from clienttools.worker import MemoryStorage, StatusExport, StorageOutbox, in_worker, page_window
from tests.unit.test_native_client import ScriptedServer


async def test_the_status_export_follows_every_change() -> None:
    server = await ScriptedServer().start()
    client = ToolClient(server.url, connector=NativeConnector(), connect_timeout=2.0)
    export = StatusExport(client)
    try:
        assert export.status() == "idle"
        # Two callers waiting at once both wake, with the first change.
        first, second = (asyncio.create_task(export.next_status("idle")) for _ in range(2))
        await asyncio.sleep(0)
        assert not first.done()
        await client.connect()
        assert await first == await second == "connecting"
        # A status that already differs answers at once.
        assert await asyncio.wait_for(export.next_status("connecting"), 1) == "open"
        lost = asyncio.create_task(export.next_status("open"))
        await server.connections[-1].close()
        assert await asyncio.wait_for(lost, 5) == "reconnecting"
        assert await asyncio.wait_for(export.next_status("reconnecting"), 5) == "open"
        closed = asyncio.create_task(export.next_status("open"))
        await client.close()
        assert await asyncio.wait_for(closed, 5) == "closed"
    finally:
        await client.close()
        await server.stop()


def test_the_storage_outbox_keeps_the_main_threads_key() -> None:
    storage = MemoryStorage()
    url = "ws://127.0.0.1:8000/agents/chat/s1"
    outbox = StorageOutbox(url, storage)
    assert outbox.load() is None
    outbox.save('{"v":1}')
    # The key of browser.SessionStorageOutbox: a client moved into a worker keeps its outbox.
    assert storage.getItem("clienttools:outbox:" + url) == '{"v":1}'
    assert StorageOutbox(url, storage).load() == '{"v":1}'
    assert StorageOutbox(url + "x", storage).load() is None
    # Whatever JS null arrives as (None, pyodide's jsnull), it is no stored outbox.
    storage.setItem(outbox.key, object())  # type: ignore[arg-type]
    assert outbox.load() is None


def test_a_worker_is_told_by_its_global_scope() -> None:
    assert in_worker(SimpleNamespace(WorkerGlobalScope=object)) is True
    assert in_worker(SimpleNamespace(window=object)) is False
    # Outside PyScript there is no page to reach (and nothing to report).
    assert page_window(SimpleNamespace()) is None
