"""S8: runs survive a restart on the same SQLite ledger; replay, divergence, resolve, expiry."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from server_harness import (
    ChunkCollector,
    CountingModel,
    FakeBrowser,
    first_step_input,
    settled,
    tool_spec,
)

from clienttools_server.agent.runs import RunRequest
from clienttools_server.app import running_server
from clienttools_server.canonical import canonical_json
from clienttools_server.config import ServerConfig
from clienttools_server.ledger import SqliteLedger
from tests.support.clock import ManualClock
from tests.support.wait import wait_until


def _config(db: Path, **overrides: Any) -> ServerConfig:
    options: dict[str, Any] = {"port": 0, "log_level": "warning", "db": str(db)}
    options.update(overrides)
    return ServerConfig(**options)


async def test_restart_replays_and_redelivers(
    tmp_path: Path, chunk_collector: ChunkCollector
) -> None:
    db = tmp_path / "ledger.sqlite3"
    first_model = CountingModel()
    async with running_server(_config(db), model=first_model) as server:
        tab = await FakeBrowser.connect(server.ws_url("s1"), chunk_collector)
        await tab.register([tool_spec("t")], client_id="page-1")
        await tab.start_chat('call server_time {}\ncall t {"k": 1}', chat_id="chat-d")
        first = await tab.expect("cf_agent_client_tool_invoke")
        assert first_model.calls == 1
        await tab.close()  # the page goes away too; the server then stops mid-call
    second_model = CountingModel()
    async with running_server(_config(db), model=second_model) as server:
        [execution] = await server.app.state.ledger.executions()
        assert execution.status == "running"
        tab = await FakeBrowser.connect(server.ws_url("s1"), chunk_collector)
        await tab.register([tool_spec("t")], client_id="page-1")
        again = await tab.expect("cf_agent_client_tool_invoke")
        assert again["requestId"] == first["requestId"]
        assert (again["attempt"], again["toolCallId"]) == (2, first["toolCallId"])
        await tab.send(
            {"type": "resume", "requestId": "res", "id": "chat-d", "headers": {}, "body": {}}
        )
        await tab.expect("start", requestId="res")
        await tab.send_result(again["requestId"], output="after restart")
        assert (await tab.ack_for(again["requestId"]))["outcome"] == "applied"
        response = await tab.response("res")
        lines = response.text.split("\n")
        assert lines[0].startswith("server_time -> ") and lines[1] == 't -> "after restart"'
        # Step 0 was replayed from the ledger; only the final answer asked the model.
        assert second_model.calls == 1
        await tab.close()
        await settled(server.hub)
        assert (await server.app.state.ledger.get_execution(execution.id)).status == "completed"
        steps = await server.app.state.ledger.steps(execution.id)
        assert [(s.kind, s.name, s.state) for s in steps] == [
            ("model", "scripted", "applied"),
            ("tool", "server_time", "applied"),
            ("tool", "t", "applied"),
            ("model", "scripted", "applied"),
        ]


async def test_result_sent_to_the_restarted_server_before_replay_waits(
    tmp_path: Path, chunk_collector: ChunkCollector
) -> None:
    # C11 after a restart: the page re-sends its result on the new connection.
    db = tmp_path / "ledger.sqlite3"
    async with running_server(_config(db)) as server:
        tab = await FakeBrowser.connect(server.ws_url("s1"), chunk_collector)
        await tab.register([tool_spec("t")], client_id="page-1")
        await tab.start_chat("call t {}", chat_id="chat-e")
        invoke = await tab.expect("cf_agent_client_tool_invoke")
        await tab.close()
    async with running_server(_config(db)) as server:
        tab = await FakeBrowser.connect(server.ws_url("s1"), chunk_collector)
        await tab.register([], client_id="page-1")
        await tab.send_result(invoke["requestId"], output=42)
        assert (await tab.ack_for(invoke["requestId"]))["outcome"] == "applied"
        await settled(server.hub)
        [execution] = await server.app.state.ledger.executions()
        assert execution.status == "completed"
        assert (await server.app.state.ledger.steps(execution.id))[-1].result() == {
            "events": [{"text": w} for w in ["t ", "-> ", "42"]]
        }
        await tab.close()


async def test_divergence_fails_the_run_naming_the_step(tmp_path: Path) -> None:
    db = tmp_path / "ledger.sqlite3"
    request = RunRequest("chat-x", [_user('call t {"a": 1}')])
    async with SqliteLedger(db) as ledger:
        run = await ledger.start_execution("s1", request.to_json(), now=time.time())
        step_input = first_step_input('call t {"a": 1}')
        await ledger.record_step(
            run.id, 0, "model", "scripted", step_input, "server", now=time.time()
        )
        call = {"toolCallId": "c1", "toolName": "t", "input": {"a": 1}}
        answer = canonical_json({"events": [{"toolCall": call}]})
        await ledger.resolve(run.id, 0, answer, now=time.time())
        # The record at seq 1 says the call had another input.
        await ledger.record_step(
            run.id, 1, "tool", "t", '{"a": 2}', "client", time.time(), "r" * 32
        )
    async with running_server(_config(db)) as server:
        ledger = server.app.state.ledger

        async def failed() -> bool:
            return (await ledger.get_execution(run.id)).status == "error"

        await wait_until(failed, 5)
        error = (await ledger.get_execution(run.id)).error
        assert "step 1" in error and "diverged" in error
        await settled(server.hub)


def _user(text: str) -> dict[str, Any]:
    return {"id": "u", "role": "user", "parts": [{"type": "text", "text": text}]}


async def test_resolve_and_reject_never_raise(
    tmp_path: Path, chunk_collector: ChunkCollector
) -> None:
    async with running_server(_config(tmp_path / "l.sqlite3")) as server:
        hub = server.hub
        tab = await FakeBrowser.connect(server.ws_url("s1"), chunk_collector)
        await tab.register([tool_spec("t")])
        request_id = await tab.start_chat("call t {}\ncall t {}")
        invokes = [await tab.expect("cf_agent_client_tool_invoke") for _ in range(2)]
        ledger = server.app.state.ledger
        [execution] = await ledger.executions()
        step1, step2 = [await ledger.step_by_request_id(i["requestId"]) for i in invokes]
        too_big = await hub.resolve(execution.id, step1.seq, "x" * 1_000_001)
        assert not too_big.ok and too_big.reason == "too_large"
        assert (await hub.resolve(execution.id, 99, 1)).reason == "not_found"
        assert (await hub.resolve("no-such-run", 0, 1)).reason == "not_found"
        assert (await hub.resolve(execution.id, step1.seq, {"by": "api"})).ok
        assert (await hub.resolve(execution.id, step1.seq, 2)).reason == "not_pending"
        assert (
            await hub.reject(execution.id, step2.seq, "tool_error", "refused by an operator")
        ).ok
        cancels = [await tab.expect("cf_agent_client_tool_cancel") for _ in range(2)]
        assert {c["reason"] for c in cancels} == {"superseded"}
        response = await tab.response(request_id)
        assert response.text == 't -> {"by":"api"}\nt failed: tool_error: refused by an operator'
        # The page's own result comes after the call was settled from outside: stale.
        await tab.send_result(invokes[0]["requestId"], output=1)
        assert (await tab.ack_for(invokes[0]["requestId"]))["outcome"] == "stale"
        await tab.close()
        await settled(hub)


async def test_paused_run_expires_after_its_ttl(
    tmp_path: Path, chunk_collector: ChunkCollector
) -> None:
    config = _config(tmp_path / "l.sqlite3", ttl=0.3, expiry_interval=0.05)
    async with running_server(config) as server:
        chat = await FakeBrowser.connect(server.ws_url("s1"), chunk_collector)
        tools = await FakeBrowser.connect(server.ws_url("s1"), chunk_collector)
        await tools.register([tool_spec("t")])
        request_id = await chat.start_chat("call t {}")
        await tools.expect("cf_agent_client_tool_invoke")
        await tools.close()  # policy wait: the call is parked until the TTL runs out
        response = await chat.response(request_id, timeout=5)
        assert response.of_type("tool-output-error")[0]["errorText"].startswith("expired: ")
        assert response.of_type("error")[0]["errorText"] == (
            "this run waited longer than its time to live and expired"
        )
        [execution] = await server.app.state.ledger.executions()
        assert execution.status == "expired"
        await chat.close()
        await settled(server.hub)


async def test_oversize_result_refused_by_the_ledger_is_readable(
    tmp_path: Path, chunk_collector: ChunkCollector
) -> None:
    # The wire allows a bit more than the ledger stores: the ledger's refusal
    # still reaches the model as an error it can read.
    config = _config(tmp_path / "l.sqlite3", max_result_bytes=1_040_000)
    async with running_server(config) as server:
        tab = await FakeBrowser.connect(server.ws_url("s1"), chunk_collector)
        await tab.register([tool_spec("big")])
        request_id = await tab.start_chat("call big {}")
        invoke = await tab.expect("cf_agent_client_tool_invoke")
        await tab.send_result(invoke["requestId"], output="x" * 1_000_010)
        assert (await tab.ack_for(invoke["requestId"]))["outcome"] == "invalid"
        text = (await tab.response(request_id)).text
        assert text.startswith("big failed: output_too_large: result is 1,000,012 bytes as JSON")
        await tab.close()
        await settled(server.hub)


async def test_a_model_answer_that_could_not_be_recorded_shows_none_of_its_calls(
    tmp_path: Path, chunk_collector: ChunkCollector, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Such a call is never run, and a run that goes on elsewhere asks the model
    # again: the page is not shown a call that no record holds.
    async with running_server(_config(tmp_path / "l.sqlite3")) as server:
        ledger = server.app.state.ledger
        record_step = ledger.record_step

        async def failing(*args: Any, **kwargs: Any) -> Any:
            if args[2] == "model" and kwargs.get("result_json") is not None:
                raise sqlite3.OperationalError("disk I/O error")
            return await record_step(*args, **kwargs)

        monkeypatch.setattr(ledger, "record_step", failing)
        tab = await FakeBrowser.connect(server.ws_url("s1"), chunk_collector)
        await tab.register([tool_spec("t")])
        request_id = await tab.start_chat('call t {"k": 1}')
        response = await tab.response(request_id)
        assert [c["type"] for c in response.chunks] == ["start", "start-step", "error"]
        assert response.final["type"] == "end"
        assert tab.invokes == []
        await tab.close()
        await settled(server.hub)
        [execution] = await ledger.executions()
        assert execution.status == "error"


async def test_a_restart_while_a_model_answer_is_written_asks_again_with_the_pages_tools(
    tmp_path: Path, chunk_collector: ChunkCollector, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The server stops while its database still writes the model's answer: the
    # answer is not recorded, so the run resumed after the restart asks the model
    # again, before the page is back. The model is still offered the page's tool
    # (the ledger kept the session's tools), so the call it makes waits for the
    # page instead of failing as unknown. The page, resuming after what it had, gets
    # that call, its output and the end, and never the call the lost answer held.
    db = tmp_path / "ledger.sqlite3"
    async with running_server(_config(db)) as server:
        ledger = server.app.state.ledger
        record_step = ledger.record_step
        writing = asyncio.Event()

        async def slow(*args: Any, **kwargs: Any) -> Any:
            if args[2] == "model" and kwargs.get("result_json") is not None:
                writing.set()
                await asyncio.Event().wait()  # until the shutdown cancels it
            return await record_step(*args, **kwargs)

        monkeypatch.setattr(ledger, "record_step", slow)
        tab = await FakeBrowser.connect(server.ws_url("s1"), chunk_collector)
        await tab.register([tool_spec("t")], client_id="page-1")
        request_id = await tab.start_chat('call t {"k": 1}', chat_id="chat-r")
        await asyncio.wait_for(writing.wait(), 10)
    seen = list(tab.chunks.get(request_id, []))
    await tab.close()
    assert [c["type"] for c in seen] == ["start", "start-step"]
    async with running_server(_config(db)) as server:
        ledger = server.app.state.ledger
        [execution] = await ledger.executions()

        async def waits_for_the_page() -> bool:
            return [(s.name, s.state) for s in await ledger.steps(execution.id)][1:] == [
                ("t", "pending")
            ]

        await wait_until(waits_for_the_page, 10, "the call, made before the page is back")
        tab = await FakeBrowser.connect(server.ws_url("s1"), chunk_collector)
        await tab.register([tool_spec("t")], client_id="page-1")
        invoke = await tab.expect("cf_agent_client_tool_invoke")
        tab.resume_from["res"] = len(seen)
        await tab.send(
            {
                "type": "resume", "requestId": "res", "id": "chat-r",
                "lastSequence": len(seen) - 1, "headers": {}, "body": {},
            }
        )  # fmt: skip
        await tab.expect("start", requestId="res")
        await tab.send_result(invoke["requestId"], output="done")
        response = await tab.response("res")
        assert not tab.violations
        await tab.close()
        await settled(server.hub)
    calls = [(c["type"], c.get("toolCallId")) for c in response.chunks if "toolCallId" in c]
    assert calls == [
        ("tool-input-start", invoke["toolCallId"]),
        ("tool-input-available", invoke["toolCallId"]),
        ("tool-output-available", invoke["toolCallId"]),
    ]
    assert response.text == 't -> "done"'


async def test_a_chat_after_a_restart_before_the_page_is_back_may_call_its_tools(
    tmp_path: Path, chunk_collector: ChunkCollector
) -> None:
    # S2 across a restart: the session's tools the page registered before it are
    # offered to the model at once, and the call waits for the page to come back.
    db = tmp_path / "ledger.sqlite3"
    async with running_server(_config(db)) as server:
        page = await FakeBrowser.connect(server.ws_url("s1"), chunk_collector)
        await page.register([tool_spec("t")], client_id="page-1")
        await page.close()
    async with running_server(_config(db)) as server:
        chat = await FakeBrowser.connect(server.ws_url("s1"), chunk_collector)
        request_id = await chat.start_chat('call t {"k": 1}', chat_id="chat-n")
        ledger = server.app.state.ledger

        async def waits_for_the_page() -> bool:
            executions = await ledger.executions()
            steps = await ledger.steps(executions[0].id) if executions else []
            return [(s.name, s.state) for s in steps][1:] == [("t", "pending")]

        await wait_until(waits_for_the_page, 10, "the call, made before the page is back")
        page = await FakeBrowser.connect(server.ws_url("s1"), chunk_collector)
        await page.register([tool_spec("t")], client_id="page-1")
        invoke = await page.expect("cf_agent_client_tool_invoke")
        await page.send_result(invoke["requestId"], output="back")
        assert (await chat.response(request_id)).text == 't -> "back"'
        await page.close()
        await chat.close()
        await settled(server.hub)


async def test_finished_executions_are_pruned_after_the_retention(
    chunk_collector: ChunkCollector,
) -> None:
    # No db: the in-memory ledger must not grow with every chat a server ever had.
    clock = ManualClock()
    # Retention 60 s and resume_grace 300 s by default; the call must outlast both.
    config = ServerConfig(port=0, log_level="warning", tool_timeout=900, max_tool_timeout=900)
    async with running_server(config, clock=clock) as server:
        hub, ledger = server.hub, server.app.state.ledger
        tab = await FakeBrowser.connect(server.ws_url("s1"), chunk_collector)
        await tab.register([tool_spec("t")])
        await tab.response(await tab.start_chat("hello", chat_id="chat-1"))
        request_id = await tab.start_chat("call t {}", chat_id="chat-2")
        invoke = await tab.expect("cf_agent_client_tool_invoke")  # chat-2 waits on the page
        [finished] = await ledger.executions(["completed"])
        clock.advance(60)
        assert await hub.prune_now() == 0  # strictly older than the retention, like the TTL
        clock.advance(1)
        assert await hub.prune_now() == 1
        assert await ledger.get_execution(finished.id) is None
        assert await ledger.steps(finished.id) == []
        # The waiting run is not finished: it stays, however old.
        [waiting] = await ledger.executions()
        assert waiting.status == "running" and len(await ledger.pending_steps()) == 1
        assert len(hub.finished)  # a late resume still reaches the ended response, for resume_grace
        await tab.send_result(invoke["requestId"], output=1)
        await tab.response(request_id)
        clock.advance(301)  # the expiry loop (every 30 s here) prunes both by itself

        async def pruned() -> bool:
            return not await ledger.executions() and not len(hub.finished)

        await wait_until(pruned, 5, "the prune")
        await tab.close()
        await settled(hub)
