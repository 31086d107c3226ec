"""Conversations stored on the server (H1-H5) and their HTTP routes, end to end."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import re
import secrets
import sqlite3
from typing import Any

import pytest
from server_harness import FakeBrowser, settled, tool_spec, user_message

from clienttools import ToolClient
from clienttools_server.agent.conversations import ResponseRecorder
from clienttools_server.agent.journal import JournaledToolset, RunJournal
from clienttools_server.agent.page_tools import PageToolset
from clienttools_server.agent.scripted import scripted_model
from clienttools_server.app import RunningServer
from tests.support.clock import ManualClock
from tests.support.faultproxy import FaultProxy
from tests.support.http import http_json
from tests.support.wait import wait_until

ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")

OpenBrowser = Any


async def echo(tool_input: dict[str, Any]) -> Any:
    return tool_input


async def send(
    tab: FakeBrowser,
    messages: list[dict[str, Any]],
    chat_id: str = "chat-1",
    *,
    trigger: str = "submit-message",
    message_id: str | None = None,
) -> str:
    """A ``send`` with the whole history, as the ``ai`` package's transport sends it."""
    request_id = "req-" + secrets.token_hex(6)
    frame: dict[str, Any] = {
        "type": "send",
        "requestId": request_id,
        "id": chat_id,
        "trigger": trigger,
        "messages": messages,
        "headers": {},
        "body": {},
    }
    if message_id is not None:
        frame["messageId"] = message_id
    await tab.send(frame)
    return request_id


async def subscribe(tab: FakeBrowser, chat_id: str = "chat-1") -> dict[str, Any]:
    await tab.send({"type": "cf_agent_chat_subscribe", "id": chat_id})
    return await tab.expect("cf_agent_chat_messages", id=chat_id)


async def stored_after(tab: FakeBrowser, version: int, timeout: float = 5.0) -> dict[str, Any]:
    """The messages frame of ``version`` (earlier ones are claimed and dropped)."""
    async with asyncio.timeout(timeout):
        while True:
            frame = await tab.expect("cf_agent_chat_messages")
            if frame["version"] >= version:
                assert frame["version"] == version, frame
                return frame


async def http(server: RunningServer, method: str, path: str, **kw: Any) -> Any:
    return await http_json("127.0.0.1", server.port, method, path, **kw)


def _end_index(tab: FakeBrowser, request_id: str) -> int | None:
    for index, frame in enumerate(tab.inbox):
        if frame["type"] == "end" and frame["requestId"] == request_id:
            return index
    return None


def _alive(types: tuple[type, ...]) -> bool:
    return any(isinstance(o, types) for o in gc.get_objects())


def _final_texts(messages: list[dict[str, Any]]) -> list[str]:
    return ["".join(p.get("text", "") for p in m["parts"] if p["type"] == "text") for m in messages]


async def test_the_answer_is_stored_with_its_tool_parts_and_sent_to_subscribers(
    server: RunningServer, open_browser: OpenBrowser
) -> None:
    tab = await open_browser(server)
    other_tab = await open_browser(server)
    stranger = await open_browser(server)  # same session, never subscribes
    await tab.register([tool_spec("echo")], handlers={"echo": echo})
    assert await subscribe(tab) == {
        "type": "cf_agent_chat_messages", "id": "chat-1", "messages": [], "version": 0,
    }  # fmt: skip
    await subscribe(other_tab)
    question = user_message('call echo {"x": 1}')
    request_id = await send(tab, [question])
    first = await stored_after(tab, 1)
    assert first["messages"] == [question]
    await wait_until(lambda: _end_index(tab, request_id) is not None, 5, "the end")
    end = _end_index(tab, request_id)
    # The final state is stored, and sent, before the end goes out.
    tab_frames = [f for f in tab.inbox[:end] if f["type"] == "cf_agent_chat_messages"]
    response = await tab.response(request_id)
    assert response.final["type"] == "end"
    final = tab_frames[-1]
    user, answer = final["messages"]
    assert user == question
    assert answer["id"] == response.chunks[0]["messageId"] and answer["role"] == "assistant"
    [tool] = [p for p in answer["parts"] if p["type"] == "tool-echo"]
    assert tool["state"] == "output-available" and tool["output"] == {"x": 1}
    assert _final_texts([answer]) == ['echo -> {"x":1}']
    # The other tab saw every version the first one saw.
    seen = [f["version"] for f in tab_frames]
    other = [(await stored_after(other_tab, v))["version"] for v in seen]
    assert other == seen
    await stranger.nothing("cf_agent_chat_messages")
    # GET /chats/{id} answers the same messages.
    reply = await http(server, "GET", "/chats/chat-1")
    assert reply.status == 200
    assert reply.json == {
        "id": "chat-1", "session": "s1", "version": final["version"], "messages": [user, answer],
    }  # fmt: skip
    await settled(server.hub)


async def test_a_finished_answer_is_freed_by_reference_counting(
    server: RunningServer, tab: FakeBrowser
) -> None:
    # Nothing holds a finished run's objects (a cancelled timer once kept its
    # context for minutes), and no cycle does: only a full collection, which walks
    # the whole heap, would free those.
    ours = (ResponseRecorder, RunJournal, JournaledToolset, PageToolset)
    await tab.register([tool_spec("echo")], handlers={"echo": echo})
    await subscribe(tab)
    gc.collect()
    gc.disable()
    try:
        request_id = await send(tab, [user_message('call echo {"x": 1}')])
        assert (await tab.response(request_id)).final["type"] == "end"
        await settled(server.hub)
        await wait_until(lambda: not _alive(ours), 5, "the run's objects freed")
    finally:
        gc.enable()


async def test_a_run_starts_with_its_history_and_ends_with_its_answer_in_one_transaction(
    start_server: Any, open_browser: OpenBrowser
) -> None:
    # H1 and H2 with the run's start and end: never one committed without the other.
    # On a clock that stands still, so the save along the way (SAVE_DELAY after the
    # tool's output) is still waiting when the run ends, however loaded the machine.
    server = await start_server(clock=ManualClock())
    tab = await open_browser(server)
    transactions: list[list[str]] = []

    def trace(statement: str) -> None:
        if statement.startswith("BEGIN"):
            transactions.append([])
        elif transactions:
            transactions[-1].append(statement)

    connection = server.app.state.ledger._store._connection
    await tab.register([tool_spec("echo")], handlers={"echo": echo})
    connection.set_trace_callback(trace)
    try:
        request_id = await send(tab, [user_message('call echo {"x": 1}')])
        assert (await tab.response(request_id)).final["type"] == "end"
        await settled(server.hub)
    finally:
        connection.set_trace_callback(None)

    def writing(prefix: str) -> list[list[str]]:
        return [t for t in transactions if any(s.startswith(prefix) for s in t)]

    [start] = writing("INSERT INTO executions")
    assert any("call echo" in s for s in start if s.startswith("INSERT INTO chat_messages"))
    [end] = writing("UPDATE executions SET status = 'completed'")
    [final] = [s for s in end if s.startswith("UPDATE chats SET")]
    assert "streaming = NULL" in final, final
    # The status is set without reading the run's row first.
    assert not [s for s in end if s.startswith("SELECT") and "FROM executions" in s], end
    assert end[-1] == "COMMIT"
    # The chat's saves: the start's and the end's. The save after the tool's output
    # waits SAVE_DELAY for more, and the run's end came first.
    assert len(writing("UPDATE chats SET")) == 2
    # The last answer (it asks for nothing more) is written with the end, not alone:
    # four transactions a chat (the start, the answer with its call, the call's
    # result, the end).
    [answer] = [s for s in end if s.startswith("INSERT INTO steps")]
    assert ", 'model', " in answer, answer
    assert len(transactions) == 4, [t[0][:40] for t in transactions]


async def test_outputs_are_stored_along_the_way_when_the_answer_takes_longer(
    start_server: Any, open_browser: OpenBrowser
) -> None:
    """A model that takes longer than SAVE_DELAY to answer again: the chat shows both
    outputs, settled together, in one save while the answer goes on; then its end."""
    model = scripted_model(first_chunk_delay=0.5)
    server = await start_server(model_object=model)
    tab = await open_browser(server)
    other_tab = await open_browser(server)
    await tab.register([tool_spec("echo")], handlers={"echo": echo})
    await subscribe(other_tab)
    request_id = await send(tab, [user_message('call echo {"x": 1}\ncall echo {"x": 2}')])
    await stored_after(other_tab, 1)  # the request's history
    along = await stored_after(other_tab, 2)
    assert _end_index(tab, request_id) is None  # stored while the answer goes on
    [_, answer] = along["messages"]
    outputs = [p.get("output") for p in answer["parts"] if p["type"] == "tool-echo"]
    assert outputs == [{"x": 1}, {"x": 2}]
    assert (await tab.response(request_id)).final["type"] == "end"
    final = await stored_after(other_tab, 3)
    assert _final_texts(final["messages"])[1] == 'echo -> {"x":1}\necho -> {"x":2}'
    await settled(server.hub)
    [(version,)] = [(c.version,) for c in await server.app.state.ledger.chats("s1", 10)]
    assert version == 3


async def test_an_end_whose_message_fails_to_store_still_completes_and_stores_it_after(
    server: RunningServer, tab: FakeBrowser, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The run's end does not fail for its message: the end commits, and the
    # message's last state is stored again once the run is over.
    ledger = server.app.state.ledger
    save_chat = ledger.save_chat
    failed: list[str] = []

    async def failing_once(*args: Any, streaming: str | None, **kwargs: Any) -> int:
        if streaming is None and not failed:
            failed.append(args[0])
            raise sqlite3.OperationalError("disk I/O error")
        return int(await save_chat(*args, streaming=streaming, **kwargs))

    monkeypatch.setattr(ledger, "save_chat", failing_once)
    await tab.register([tool_spec("echo")], handlers={"echo": echo})
    request_id = await send(tab, [user_message('call echo {"x": 1}')])
    assert (await tab.response(request_id)).final["type"] == "end"
    await settled(server.hub)
    assert failed == ["chat-1"]
    [execution] = await ledger.executions()
    assert execution.status == "completed"
    [_, answer] = (await http(server, "GET", "/chats/chat-1")).json["messages"]
    assert [p["type"] for p in answer["parts"]][-1] == "text"
    assert any(p.get("state") == "output-available" for p in answer["parts"])
    stored = await ledger.get_chat("chat-1")
    assert stored is not None and stored.streaming is None  # the last save is the final one


async def test_a_send_that_extends_appends_an_edit_replaces_regenerate_drops(
    server: RunningServer, tab: FakeBrowser
) -> None:
    await subscribe(tab)
    first = user_message("hello")
    await tab.response(await send(tab, [first]))
    stored = (await http(server, "GET", "/chats/chat-1")).json["messages"]
    assert [m["role"] for m in stored] == ["user", "assistant"]
    second = user_message("and again")
    await tab.response(await send(tab, [*stored, second]))
    stored = (await http(server, "GET", "/chats/chat-1")).json["messages"]
    assert [m["role"] for m in stored] == ["user", "assistant", "user", "assistant"]
    assert stored[:3] == [*stored[:2], second]
    # An edit of the first message: what followed it goes.
    edited = {**first, "parts": [{"type": "text", "text": "hello, edited"}]}
    await tab.response(await send(tab, [edited]))
    stored = (await http(server, "GET", "/chats/chat-1")).json["messages"]
    assert [m["id"] for m in stored][:1] == [first["id"]] and len(stored) == 2
    assert stored[0]["parts"][0]["text"] == "hello, edited"
    old_answer = stored[1]["id"]
    # Regenerate naming the answer, sent with it still in (a client that does not slice).
    await tab.response(await send(tab, stored, trigger="regenerate-message", message_id=old_answer))
    stored = (await http(server, "GET", "/chats/chat-1")).json["messages"]
    assert len(stored) == 2 and stored[1]["id"] != old_answer
    # Regenerate without a messageId drops the last assistant message.
    again = stored[1]["id"]
    await tab.response(await send(tab, stored, trigger="regenerate-message"))
    stored = (await http(server, "GET", "/chats/chat-1")).json["messages"]
    assert len(stored) == 2 and stored[1]["id"] not in (again, old_answer)
    await settled(server.hub)


async def test_clear_is_refused_while_streaming_then_empties_every_tab(
    server: RunningServer, open_browser: OpenBrowser
) -> None:
    tab = await open_browser(server)
    other = await open_browser(server)
    release = asyncio.Event()

    async def gated(tool_input: dict[str, Any]) -> Any:
        await release.wait()
        return tool_input

    await tab.register([tool_spec("slow")], handlers={"slow": gated})
    await subscribe(tab)
    await subscribe(other)
    request_id = await send(tab, [user_message("call slow {}")])
    await tab.chunk(request_id, "tool-input-available")
    await other.send({"type": "cf_agent_chat_clear", "id": "chat-1"})
    refusal = await other.expect("cf_agent_protocol_error")
    assert "streaming" in refusal["message"]
    release.set()
    await tab.response(request_id)
    version = (await http(server, "GET", "/chats/chat-1")).json["version"]
    assert len((await http(server, "GET", "/chats/chat-1")).json["messages"]) == 2
    await other.send({"type": "cf_agent_chat_clear", "id": "chat-1"})
    for page in (tab, other):
        cleared = await stored_after(page, version + 1)
        assert cleared["messages"] == []
    assert (await http(server, "GET", "/chats/chat-1")).json["messages"] == []
    await settled(server.hub)


async def test_a_page_that_clears_then_sends_starts_afresh_on_the_server(
    server: RunningServer, caplog: pytest.LogCaptureFixture
) -> None:
    """``clear()`` does not wait, yet its frame leaves before the ``send`` after it: the
    server clears the chat instead of refusing it as streaming."""
    page = ToolClient(f"ws://127.0.0.1:{server.port}/agents/chat/afresh")
    await page.connect()
    try:
        chat = page.chat
        await chat.send("hello")
        first = await http(server, "GET", "/chats/afresh")
        chat.clear()
        await chat.send("hello again")  # in the task that cleared, as a page writes it
        stored = (await http(server, "GET", "/chats/afresh")).json
        assert [m.role for m in chat.messages] == ["user", "assistant"]
        assert [m.to_wire() for m in chat.messages] == stored["messages"]
        # the clear made a version of its own, then the turn's start and its end did
        assert stored["version"] == first.json["version"] + 3
        assert "protocol error" not in caplog.text
    finally:
        await page.close()
    await settled(server.hub)


async def test_a_chat_of_another_session_is_refused_and_reveals_nothing(
    server: RunningServer, open_browser: OpenBrowser
) -> None:
    owner = await open_browser(server, "s1")
    await owner.response(await send(owner, [user_message("secret plans")]))
    intruder = await open_browser(server, "s2")
    await intruder.send({"type": "cf_agent_chat_subscribe", "id": "chat-1"})
    refusal = await intruder.expect("cf_agent_protocol_error")
    request_id = await send(intruder, [user_message("hi")])
    refused_send = await intruder.expect("cf_agent_protocol_error", requestId=request_id)
    await intruder.send({"type": "resume", "requestId": "r-1", "id": "chat-1"})
    refused_resume = await intruder.expect("cf_agent_protocol_error", requestId="r-1")
    await intruder.send({"type": "cf_agent_chat_clear", "id": "chat-1"})
    refused_clear = await intruder.expect("cf_agent_protocol_error")
    for frame in (refusal, refused_send, refused_resume, refused_clear):
        assert "secret" not in str(frame) and "session" in frame["message"]
    await intruder.nothing("cf_agent_chat_messages")
    await intruder.nothing("start")
    stored = (await http(server, "GET", "/chats/chat-1")).json
    assert stored["session"] == "s1" and len(stored["messages"]) == 2
    await settled(server.hub)


async def test_a_full_chat_refuses_the_next_send_and_keeps_what_it_holds(
    server: RunningServer, tab: FakeBrowser
) -> None:
    server.hub.conversations.max_messages = 3
    first = user_message("one")
    await tab.response(await send(tab, [first]))
    stored = (await http(server, "GET", "/chats/chat-1")).json["messages"]
    response = await tab.response(await send(tab, [*stored, user_message("two")]))
    assert response.final["type"] == "error" and "full" in response.final["errorText"]
    assert response.chunks == []
    assert (await http(server, "GET", "/chats/chat-1")).json["messages"] == stored
    await settled(server.hub)


async def test_an_aborted_answer_is_stored_as_far_as_it_got(
    server: RunningServer, tab: FakeBrowser
) -> None:
    release = asyncio.Event()

    async def gated(tool_input: dict[str, Any]) -> Any:
        await release.wait()
        return tool_input

    await tab.register([tool_spec("slow")], handlers={"slow": gated})
    request_id = await send(tab, [user_message("call slow {}")])
    await tab.chunk(request_id, "tool-input-available")
    await tab.send({"type": "abort", "requestId": request_id})
    await tab.response(request_id)
    release.set()
    await settled(server.hub)
    stored = (await http(server, "GET", "/chats/chat-1")).json["messages"]
    [tool] = [p for p in stored[1]["parts"] if p["type"] == "tool-slow"]
    assert tool["state"] == "input-available"
    # Nothing streams any more: the chat can be cleared and deleted.
    assert (await http(server, "DELETE", "/chats/chat-1")).status == 204


async def test_an_abort_that_comes_while_the_run_ends_is_too_late(
    server: RunningServer, tab: FakeBrowser, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The finish went out: the run's end (its status, its last answer, its message's
    # last state) is written whole, and the abort changes nothing.
    ledger = server.app.state.ledger
    set_status = ledger.set_status
    request_ids: list[str] = []

    async def abort_first(execution_id: str, status: str, *args: Any) -> Any:
        if status == "completed":
            await tab.send({"type": "abort", "requestId": request_ids[0]})
            await asyncio.sleep(0.2)  # the abort is handled meanwhile
        return await set_status(execution_id, status, *args)

    monkeypatch.setattr(ledger, "set_status", abort_first)
    await tab.register([tool_spec("echo")], handlers={"echo": echo})
    request_ids.append(await send(tab, [user_message('call echo {"x": 1}')]))
    response = await tab.response(request_ids[0])
    assert response.final["type"] == "end"
    assert response.types[-1] == "finish", response.types
    await settled(server.hub)
    [execution] = await ledger.executions()
    assert (execution.status, execution.error) == ("completed", None)
    steps = await ledger.steps(execution.id)
    assert [(s.kind, s.state) for s in steps] == [
        ("model", "applied"), ("tool", "applied"), ("model", "applied")
    ]  # fmt: skip
    stored = await ledger.get_chat("chat-1")
    assert stored is not None and stored.streaming is None
    [_, answer] = (await http(server, "GET", "/chats/chat-1")).json["messages"]
    assert _final_texts([answer]) == ['echo -> {"x":1}']


async def test_a_shutdown_while_the_run_ends_waits_for_the_end_to_be_written(
    server: RunningServer, tab: FakeBrowser, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Cut short after its status, the end's batch would commit a completed run
    # without its last answer and with its message still streaming.
    ledger = server.app.state.ledger
    set_status = ledger.set_status
    closed: list[asyncio.Task[None]] = []

    async def close_after(execution_id: str, status: str, *args: Any) -> Any:
        await set_status(execution_id, status, *args)
        if status == "completed":
            closed.append(asyncio.create_task(server.hub.runs.close()))
            await asyncio.sleep(0.1)  # the runs are cancelled meanwhile
            for active in list(server.hub.runs.runs.values()):
                active.task.cancel()  # and cancelled again
            await asyncio.sleep(0.1)

    monkeypatch.setattr(ledger, "set_status", close_after)
    await tab.register([tool_spec("echo")], handlers={"echo": echo})
    request_id = await send(tab, [user_message('call echo {"x": 1}')])
    await wait_until(lambda: bool(closed) and closed[0].done())
    # Its end was written: the response ends, rather than wait for a restart.
    assert (await tab.response(request_id)).final["type"] == "end"
    [execution] = await ledger.executions()
    assert execution.status == "completed"
    steps = await ledger.steps(execution.id)
    assert [(s.kind, s.state) for s in steps] == [
        ("model", "applied"), ("tool", "applied"), ("model", "applied")
    ]  # fmt: skip
    stored = await ledger.get_chat("chat-1")
    assert stored is not None and stored.streaming is None


async def test_the_chat_routes(server: RunningServer, open_browser: OpenBrowser) -> None:
    for session, chat_id in [("s1", "a"), ("s2", "b"), ("s1", "c")]:
        page = await open_browser(server, session)
        await page.response(await send(page, [user_message("hi")], chat_id))
    listed = (await http(server, "GET", "/chats")).json["chats"]
    assert [c["id"] for c in listed] == ["c", "b", "a"]
    assert set(listed[0]) == {"id", "session", "messageCount", "version", "updatedAt"}
    assert listed[0]["messageCount"] == 2 and listed[0]["session"] == "s1"
    # The same time format as the executions' createdAt and updatedAt.
    assert ISO_UTC.match(listed[0]["updatedAt"]), listed[0]["updatedAt"]
    assert [c["id"] for c in (await http(server, "GET", "/chats?session=s1")).json["chats"]] == [
        "c", "a",
    ]  # fmt: skip
    # An empty parameter is one not given, as a form or URLSearchParams sends it.
    empty = await http(server, "GET", "/chats?session=&limit=&before=")
    assert empty.status == 200 and [c["id"] for c in empty.json["chats"]] == ["c", "b", "a"]
    page = (await http(server, "GET", "/chats?limit=1&before=c")).json["chats"]
    assert [c["id"] for c in page] == ["b"]
    for query, problem in [
        ("limit=x", "integer"), ("limit=0", "between"), ("before=nope", "no chat"),
    ]:  # fmt: skip
        reply = await http(server, "GET", f"/chats?{query}")
        assert reply.status == 422 and problem in reply.json["message"]
    missing = await http(server, "GET", "/chats/nope")
    assert missing.status == 404 and "nope" in missing.json["message"]
    assert (await http(server, "DELETE", "/chats/nope")).status == 404
    assert (await http(server, "DELETE", "/chats/a")).status == 204
    assert (await http(server, "GET", "/chats/a")).status == 404
    await settled(server.hub)


async def test_delete_is_refused_while_streaming(server: RunningServer, tab: FakeBrowser) -> None:
    release = asyncio.Event()

    async def gated(tool_input: dict[str, Any]) -> Any:
        await release.wait()
        return tool_input

    await tab.register([tool_spec("slow")], handlers={"slow": gated})
    request_id = await send(tab, [user_message("call slow {}")])
    await tab.chunk(request_id, "tool-input-available")
    reply = await http(server, "DELETE", "/chats/chat-1")
    assert reply.status == 409 and "streaming" in reply.json["message"]
    release.set()
    await tab.response(request_id)
    assert (await http(server, "DELETE", "/chats/chat-1")).status == 204
    await settled(server.hub)


@pytest.mark.parametrize("token", [None, "wrong"])
async def test_the_chat_routes_need_the_token(
    start_server: Any, open_browser: OpenBrowser, token: str | None
) -> None:
    server = await start_server(token="t0ken")
    for method, path in [("GET", "/chats"), ("GET", "/chats/x"), ("DELETE", "/chats/x")]:
        reply = await http(server, method, path, token=token)
        assert reply.status == 401 and reply.body == b""
    assert (await http(server, "GET", "/chats", token="t0ken")).status == 200


async def test_an_answer_that_finished_without_the_page_is_there_when_it_comes_back(
    server: RunningServer,
) -> None:
    """A needsApproval page tool paused, the page closed, approved (and its output given)
    over HTTP: the run finishes, and the page opened again shows the answer."""
    url = server.ws_url("away")
    page = ToolClient(url)

    @page.tool(needs_approval=True)
    def transfer(amount: int) -> str:
        """Move money (only once a human approved it)."""
        return f"moved {amount}"

    await page.connect()
    sending = asyncio.create_task(page.chat.send('call transfer {"amount": 5}'))
    async with asyncio.timeout(20):
        while True:
            listed = (await http(server, "GET", "/executions?session=away")).json
            pending = listed["executions"][0]["pending"] if listed["executions"] else []
            if pending:
                break
            await asyncio.sleep(0.05)
    await page.close()
    sending.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await sending
    run = listed["executions"][0]["executionId"]
    # The approval step and, after it, the call's own client step.
    approval, call = pending
    assert (approval["resolution"], call["resolution"]) == ("approval", "client")
    steps = f"/executions/{run}/steps"
    approve = f"{steps}/{approval['seq']}/approve"
    assert (await http(server, "POST", approve, body={"approved": True})).status == 200
    resolve = f"{steps}/{call['seq']}/resolve"
    assert (await http(server, "POST", resolve, body={"output": "moved by hand"})).status == 200
    async with asyncio.timeout(20):
        while (await http(server, "GET", f"/executions/{run}")).json["status"] != "completed":
            await asyncio.sleep(0.05)
    back = ToolClient(url)
    back.tool(transfer)
    await back.connect()
    try:
        chat = back.chat  # subscribes by itself
        async with asyncio.timeout(10):
            while len(chat.messages) < 2:
                await asyncio.sleep(0.02)
        user, answer = chat.messages
        assert user.text == 'call transfer {"amount": 5}'
        [part] = answer.tool_parts
        assert part.state == "output-available" and part.output == "moved by hand"
        assert answer.text == 'transfer -> "moved by hand"'
        assert await chat.resume() is None  # nothing streams: the answer is whole already
        assert len(chat.messages) == 2
    finally:
        await back.close()
    await settled(server.hub)


async def test_after_a_drop_mid_answer_the_chat_holds_the_stored_messages_once(
    server: RunningServer,
) -> None:
    release = asyncio.Event()
    started = asyncio.Event()
    async with FaultProxy("127.0.0.1", server.port) as proxy:
        page = ToolClient(proxy.url("/agents/chat/drop"))

        @page.tool
        async def slow() -> str:
            """Wait for the test."""
            started.set()
            await release.wait()
            return "done"

        await page.connect()
        try:
            chat = page.chat
            await page.chat.send("hello")  # a first turn, stored
            sending = asyncio.create_task(chat.send("call slow {}"))
            await asyncio.wait_for(started.wait(), 10)
            assert proxy.cut_all() >= 1  # the socket drops mid-answer
            async with asyncio.timeout(10):
                while not (page.connected and chat.state.version >= 1):
                    await asyncio.sleep(0.02)
            release.set()
            answer = await asyncio.wait_for(sending, 20)
            assert answer.text == 'slow -> "done"'
            stored = (await http(server, "GET", "/chats/drop")).json["messages"]
            assert [m.to_wire() for m in chat.messages] == stored
            assert [m.role for m in chat.messages] == ["user", "assistant"] * 2
            assert len({m.id for m in chat.messages}) == 4
        finally:
            await page.close()
    await settled(server.hub)


async def test_a_chat_is_deleted_a_retention_after_its_last_change(
    start_server: Any, open_browser: OpenBrowser
) -> None:
    server = await start_server(retention=0.5)
    tab = await open_browser(server)
    await tab.response(await send(tab, [user_message("hello")]))
    assert (await http(server, "GET", "/chats/chat-1")).status == 200
    async with asyncio.timeout(10):
        while (await http(server, "GET", "/chats/chat-1")).status != 404:
            await asyncio.sleep(0.1)
    await settled(server.hub)
