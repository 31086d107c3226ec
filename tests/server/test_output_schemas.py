"""S5: outputSchema is checked by jsonschema (Draft 2020-12) on every path that applies a result.

One table of schemas, each with an output that breaks it on one keyword and
one that fits, applied on each of the three paths:

- ``live``: the page's result for an invoke of this process;
- ``restart``: the page's result for an invoke of an earlier process, sent to
  the restarted server by a page that registers no tools there, so the only
  schema the server can know is the spec recorded with the ledger step;
- ``http``: ``POST /executions/{id}/steps/{seq}/resolve``.

A breaking output is refused ``invalid`` with jsonschema's own message. From
a page, that settles the call and the model reads ``invalid_output``; from
outside nothing in the ledger changes (the step stays pending for a better
answer). A fitting output is applied on every path.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from server_harness import ChunkCollector, FakeBrowser, settled, sqlite_rows, tool_spec

from clienttools_server.app import running_server
from clienttools_server.config import ServerConfig
from tests.support.http import http_json
from tests.support.wait import wait_until

SESSION = "schemas"
CHAT = "chat-schemas"

# keyword, outputSchema, an output that breaks it on that keyword, one that fits
TABLE: list[tuple[str, dict[str, Any], Any, Any]] = [
    (
        "ref",
        {
            "$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer"}}}},
            "$ref": "#/$defs/point",
        },
        {"x": "1"},
        {"x": 1},
    ),
    ("enum", {"enum": ["red", "green"]}, "blue", "red"),
    ("const", {"const": True}, 1, True),
    ("pattern", {"type": "string", "pattern": "^[a-z]+$"}, "ABC", "abc"),
    (
        "prefixItems",
        {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}]},
        ["a", "b"],
        ["a", 1],
    ),
    ("uniqueItems", {"type": "array", "uniqueItems": True}, [1, 1], [1, 2]),
    (
        "additionalProperties",
        {"type": "object", "properties": {"a": {}}, "additionalProperties": False},
        {"a": 1, "b": 2},
        {"a": 1},
    ),
    ("minItems", {"type": "array", "minItems": 2}, [1], [1, 2]),
    ("maxItems", {"type": "array", "maxItems": 1}, [1, 2], [1]),
    ("minimum", {"type": "number", "minimum": 0}, -1, 0),
    ("maximum", {"type": "number", "maximum": 10}, 10.5, 10),
    ("exclusiveMinimum", {"type": "number", "exclusiveMinimum": 0}, 0, 0.5),
    ("exclusiveMaximum", {"type": "number", "exclusiveMaximum": 1}, 1, 0.5),
]


def _tool(keyword: str) -> str:
    return f"k_{keyword}"


def _specs() -> list[dict[str, Any]]:
    return [tool_spec(_tool(k), outputSchema=schema) for k, schema, _, _ in TABLE]


def _prompt() -> str:
    lines = []
    for keyword, *_ in TABLE:
        lines.append(f'call {_tool(keyword)} {{"case": "bad"}}')
        lines.append(f'call {_tool(keyword)} {{"case": "good"}}')
    return "\n".join(lines)


def _output(tool_name: str, case: str) -> Any:
    [(bad, good)] = [(b, g) for k, _, b, g in TABLE if _tool(k) == tool_name]
    return bad if case == "bad" else good


def _jsonschema_message(schema: dict[str, Any], value: Any) -> str:
    [error] = list(Draft202012Validator(schema).iter_errors(value))
    return str(error.message)


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def _check_model_text(text: str) -> None:
    """What the model read: invalid_output with jsonschema's message for each bad output."""
    lines = text.split("\n")
    assert len(lines) == 2 * len(TABLE), text
    for index, (keyword, schema, bad, good) in enumerate(TABLE):
        refused, applied = lines[2 * index], lines[2 * index + 1]
        prefix = (
            f"{_tool(keyword)} failed: invalid_output: the result does not match outputSchema: "
        )
        assert refused.startswith(prefix), (keyword, refused)
        assert _jsonschema_message(schema, bad) in refused, (keyword, refused)
        assert applied == f"{_tool(keyword)} -> {_compact(good)}", (keyword, applied)


def _config(db: Path) -> ServerConfig:
    return ServerConfig(port=0, log_level="warning", db=str(db))


def _check_page_acks(
    page: FakeBrowser, invokes: list[dict[str, Any]], acks: dict[str, Any]
) -> None:
    assert len(invokes) == 2 * len(TABLE)
    for invoke in invokes:
        ack = acks[invoke["requestId"]]
        if invoke["input"]["case"] == "good":
            assert ack["outcome"] == "applied", (invoke["toolName"], ack)
            continue
        [schema] = [s for k, s, _, _ in TABLE if _tool(k) == invoke["toolName"]]
        bad = _output(invoke["toolName"], "bad")
        assert ack["outcome"] == "invalid", (invoke["toolName"], ack)
        assert _jsonschema_message(schema, bad) in ack["message"], (invoke["toolName"], ack)


async def test_live_results_are_checked(tmp_path: Path, chunk_collector: ChunkCollector) -> None:
    async with running_server(_config(tmp_path / "l.sqlite3")) as server:
        page = await FakeBrowser.connect(server.ws_url(SESSION), chunk_collector)
        ack = await page.register(_specs())
        assert ack["rejected"] == []
        request_id = await page.start_chat(_prompt(), chat_id=CHAT)
        invokes = [await page.expect("cf_agent_client_tool_invoke") for _ in range(2 * len(TABLE))]
        for invoke in invokes:
            output = _output(invoke["toolName"], invoke["input"]["case"])
            await page.send_result(invoke["requestId"], output=output)
        acks = {i["requestId"]: await page.ack_for(i["requestId"]) for i in invokes}
        _check_page_acks(page, invokes, acks)
        _check_model_text((await page.response(request_id)).text)
        await page.close()
        await settled(server.hub)


async def test_results_sent_to_a_restarted_server_are_checked_against_the_recorded_spec(
    tmp_path: Path, chunk_collector: ChunkCollector
) -> None:
    db = tmp_path / "l.sqlite3"
    async with running_server(_config(db)) as server:
        page = await FakeBrowser.connect(server.ws_url(SESSION), chunk_collector)
        await page.register(_specs())
        await page.start_chat(_prompt(), chat_id=CHAT)
        invokes = [await page.expect("cf_agent_client_tool_invoke") for _ in range(2 * len(TABLE))]
        await page.close()
    # The restarted server knows no tool of this session: no page registered one
    # since, and the ledger's copy of the session's tools is gone (as once pruned).
    # The only schema it has is the one recorded with each step.
    with contextlib.closing(sqlite3.connect(db)) as raw, raw:
        raw.execute("DELETE FROM session_tools")
    async with running_server(_config(db)) as server:
        assert server.hub.remembered_tool(SESSION, _tool("enum")) is None
        await wait_until(lambda: server.hub.stats()["pending_calls"] == 2 * len(TABLE), 10)
        page = await FakeBrowser.connect(server.ws_url(SESSION), chunk_collector)
        for invoke in invokes:
            output = _output(invoke["toolName"], invoke["input"]["case"])
            await page.send_result(invoke["requestId"], output=output)
        acks = {i["requestId"]: await page.ack_for(i["requestId"]) for i in invokes}
        _check_page_acks(page, invokes, acks)
        resume = "resume-" + CHAT
        await page.send(
            {"type": "resume", "requestId": resume, "id": CHAT, "headers": {}, "body": {}}
        )
        _check_model_text((await page.response(resume, timeout=10)).text)
        await page.close()
        await settled(server.hub)


async def test_http_resolves_are_checked(tmp_path: Path, chunk_collector: ChunkCollector) -> None:
    db = tmp_path / "l.sqlite3"
    async with running_server(_config(db)) as server:
        page = await FakeBrowser.connect(server.ws_url(SESSION), chunk_collector)
        await page.register(_specs())  # no handlers: the page never answers
        request_id = await page.start_chat(_prompt(), chat_id=CHAT)
        invokes = [await page.expect("cf_agent_client_tool_invoke") for _ in range(2 * len(TABLE))]
        ledger = server.app.state.ledger
        steps = {i["requestId"]: await ledger.step_by_request_id(i["requestId"]) for i in invokes}
        host, port = server.host, server.port
        for invoke in invokes:
            if invoke["input"]["case"] != "bad":
                continue
            step = steps[invoke["requestId"]]
            [schema] = [s for k, s, _, _ in TABLE if _tool(k) == invoke["toolName"]]
            bad = _output(invoke["toolName"], "bad")
            before = sqlite_rows(db)
            path = f"/executions/{step.execution_id}/steps/{step.seq}/resolve"
            reply = await http_json(host, port, "POST", path, {"output": bad})
            assert reply.status == 422, (invoke["toolName"], reply.body)
            assert reply.json["outcome"] == "invalid"
            assert _jsonschema_message(schema, bad) in reply.json["message"], reply.json
            assert sqlite_rows(db) == before, invoke["toolName"]  # nothing changed
            # The step is still pending: a reject tells the model what the output was.
            path = f"/executions/{step.execution_id}/steps/{step.seq}/reject"
            reply = await http_json(
                host, port, "POST", path,
                {"code": "invalid_output", "message": reply.json["message"]},
            )  # fmt: skip
            assert (reply.status, reply.json) == (200, {"outcome": "applied"})
        for invoke in invokes:
            if invoke["input"]["case"] != "good":
                continue
            step = steps[invoke["requestId"]]
            path = f"/executions/{step.execution_id}/steps/{step.seq}/resolve"
            good = _output(invoke["toolName"], "good")
            reply = await http_json(host, port, "POST", path, {"output": good})
            assert (reply.status, reply.json) == (200, {"outcome": "applied"}), invoke["toolName"]
        _check_model_text((await page.response(request_id)).text)
        # Every invoke settled over HTTP was cancelled on the page that had it.
        cancels = [await page.expect("cf_agent_client_tool_cancel") for _ in invokes]
        assert {c["reason"] for c in cancels} == {"superseded"}
        assert {c["requestId"] for c in cancels} == {i["requestId"] for i in invokes}
        # The page's own result comes too late: the call was settled over HTTP.
        late = invokes[1]
        await page.send_result(late["requestId"], output=_output(late["toolName"], "good"))
        assert (await page.ack_for(late["requestId"]))["outcome"] == "stale"
        await page.close()
        await settled(server.hub)


@pytest.mark.parametrize(
    ("schema", "reason"),
    [
        ({"type": "no-such-type"}, "'no-such-type' is not valid under any of the given schemas"),
        ({"minItems": -1}, "-1 is less than the minimum of 0"),
        ({"pattern": 3}, "3 is not of type 'string'"),
    ],
)
async def test_a_spec_whose_output_schema_is_not_a_schema_is_refused(
    schema: dict[str, Any], reason: str, tmp_path: Path, chunk_collector: ChunkCollector
) -> None:
    async with running_server(_config(tmp_path / "l.sqlite3")) as server:
        page = await FakeBrowser.connect(server.ws_url(SESSION), chunk_collector)
        ack = await page.register([tool_spec("broken", outputSchema=schema), tool_spec("fine")])
        assert ack["accepted"] == ["fine"]
        [rejected] = ack["rejected"]
        assert rejected["name"] == "broken"
        assert rejected["reason"].startswith(
            "the outputSchema is not a valid JSON Schema (Draft 2020-12): "
        )
        assert reason in rejected["reason"]
        await page.close()
        await settled(server.hub)


async def test_a_result_for_a_step_no_run_waits_for_is_checked_against_the_recorded_spec(
    tmp_path: Path, chunk_collector: ChunkCollector
) -> None:
    # The path of a result that reaches a restarted server before the replay
    # asked for its step: only the ledger answers, with the spec recorded there.
    async with running_server(_config(tmp_path / "l.sqlite3")) as server:
        ledger = server.app.state.ledger
        execution = await ledger.start_execution(SESSION, '{"chatId":"x","messages":[]}', now=0.0)
        schema = {"type": "array", "prefixItems": [{"type": "string"}]}
        spec = json.dumps({"name": "t", "inputSchema": {}, "outputSchema": schema})
        for seq, request_id in ((0, "a" * 32), (1, "b" * 32)):
            await ledger.record_step(
                execution.id, seq, "tool", "t", "{}", "client", 0.0, request_id
            )
            await ledger.record_spec(execution.id, seq, spec)
        page = await FakeBrowser.connect(server.ws_url(SESSION), chunk_collector)
        await page.send_result("a" * 32, output=[1])
        ack = await page.ack_for("a" * 32)
        assert ack["outcome"] == "invalid"
        assert _jsonschema_message(schema, [1]) in ack["message"]
        assert (await ledger.get_step(execution.id, 0)).error()["code"] == "invalid_output"
        await page.send_result("b" * 32, output=["x"])
        assert (await page.ack_for("b" * 32))["outcome"] == "applied"
        assert (await ledger.get_step(execution.id, 1)).result() == ["x"]
        await page.close()


async def test_a_page_calls_step_is_recorded_with_the_spec_and_attempt_the_page_saw(
    tmp_path: Path, chunk_collector: ChunkCollector
) -> None:
    # In the step's own insert: no write of their own before the invoke leaves.
    db = tmp_path / "l.sqlite3"
    [spec] = _specs()[:1]
    async with running_server(_config(db)) as server:
        page = await FakeBrowser.connect(server.ws_url(SESSION), chunk_collector)
        await page.register([spec])
        statements: list[str] = []
        connection = server.app.state.ledger._store._connection
        connection.set_trace_callback(statements.append)
        try:
            request_id = await page.start_chat(f'call {spec["name"]} {{"case": "good"}}')
            invoke = await page.expect("cf_agent_client_tool_invoke")
            await page.send_result(invoke["requestId"], output=_output(spec["name"], "good"))
            assert (await page.ack_for(invoke["requestId"]))["outcome"] == "applied"
            await page.response(request_id)
            await settled(server.hub)
        finally:
            connection.set_trace_callback(None)
        await page.close()
    with contextlib.closing(sqlite3.connect(db)) as raw:
        [(recorded, attempts, connection, client_id)] = raw.execute(
            "SELECT spec_json, attempts, target_connection, target_client_id FROM steps "
            "WHERE request_id = ?",
            (invoke["requestId"],),
        ).fetchall()
    assert json.loads(recorded) == spec
    assert invoke["attempt"] == attempts == 1
    assert connection is not None and client_id == page.client_id
    assert [s for s in statements if s.startswith("INSERT INTO steps")]
    assert not [s for s in statements if s.startswith("UPDATE steps SET spec_json")]
    assert not [s for s in statements if s.startswith("UPDATE steps SET attempts")]
