"""Pure pieces: scripted model parsing, the JSON Schema checker, the CLI, static files, pings."""

from __future__ import annotations

import asyncio
import gc
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from server_harness import FakeBrowser
from websockets.asyncio.client import connect

from clienttools.protocol import ChunkFrame, PingFrame, ToolSpec, dump_frame
from clienttools_server.__main__ import config_from_args, parser
from clienttools_server.agent.scripted import parse_call_line, scripted_model, words
from clienttools_server.app import StaticDirs, running_server
from clienttools_server.calls.delivery import (
    DELIVERY_TRANSITIONS,
    LATE_RESULT,
    DeliveryEvent,
    DeliveryState,
    next_delivery_state,
)
from clienttools_server.calls.output_schemas import OutputSchemas
from clienttools_server.calls.pages import Pages
from clienttools_server.config import DB_RETENTION, MEMORY_RETENTION, ServerConfig
from clienttools_server.ledger import SqliteLedger
from clienttools_server.wire.connection import frame_text
from clienttools_server.wire.keepalive import SLOTS, Pinger
from tests.support.clock import ManualClock
from tests.support.wait import wait_until


@given(st.text())
def test_words_rebuild_the_text(text: str) -> None:
    assert "".join(words(text)) == text


@pytest.mark.parametrize(
    ("line", "parsed"),
    [
        ('call echo {"a": 1}', ("echo", {"a": 1})),
        ("  call t  ", ("t", {})),
        ("call t [1]", None),
        ("call t {bad", None),
        ("please call t {}", None),
        ("call 9t {}", None),
    ],
)
def test_call_lines(line: str, parsed: Any) -> None:
    assert parse_call_line(line) == parsed


async def test_scripted_model_answers_one_line_per_call() -> None:
    history: list[ModelMessage] = [
        ModelRequest(parts=[UserPromptPart("call a {}\ncall b {}")]),
        ModelResponse(parts=[ToolCallPart("a", {}, "c1"), ToolCallPart("b", {}, "c2")]),
        ModelRequest(
            parts=[
                ToolReturnPart("b", "timeout: too slow", "c2", outcome="failed"),
                ToolReturnPart("a", {"k": [1, 2]}, "c1"),
            ]
        ),
    ]
    result = await Agent(scripted_model()).run(message_history=history)
    assert result.output == 'a -> {"k":[1,2]}\nb failed: timeout: too slow'


@pytest.mark.parametrize(
    ("schema", "value", "ok"),
    [
        ({"type": "object", "required": ["a"]}, {"a": 1}, True),
        ({"type": "object", "required": ["a"]}, {}, False),
        ({"type": "object", "additionalProperties": False}, {"x": 1}, False),
        ({"type": "array", "items": {"type": "integer"}}, [1, 2.0], True),
        ({"type": "array", "items": {"type": "integer"}}, [1, "2"], False),
        ({"type": ["string", "null"]}, None, True),
        ({"type": "integer"}, True, False),
        ({"enum": [1, 2]}, 3, False),
        ({"type": "number", "minimum": 0, "exclusiveMaximum": 1}, 1, False),
        ({"type": "string", "maxLength": 2}, "abc", False),
        ({"anyOf": [{"type": "string"}, {"type": "integer"}]}, 3, True),
        ({"oneOf": [{"type": "number"}, {"type": "integer"}]}, 3, False),
        ({"$defs": {"x": {"type": "integer"}}, "$ref": "#/$defs/x"}, 3, True),
        ({"$defs": {"x": {"type": "integer"}}, "$ref": "#/$defs/x"}, "3", False),
        ({"const": True}, 1, False),
        # A reference to nothing cannot be checked: the result is refused, not let through.
        ({"$ref": "#/$defs/x"}, 3, False),
    ],
)
def test_schema_checker(schema: dict[str, Any], value: Any, ok: bool) -> None:
    assert (OutputSchemas().errors(schema, value) == []) is ok


def test_schema_checker_compiles_each_schema_once_and_refuses_bad_schemas() -> None:
    schemas = OutputSchemas(limit=2)
    first = schemas.validator({"type": "integer"})
    assert schemas.validator({"type": "integer"}) is first
    schemas.validator({"type": "string"})
    schemas.validator({"type": "boolean"})  # over the limit: the least recently used goes
    assert schemas.validator({"type": "integer"}) is not first
    assert schemas.problem({"type": "integer"}) is None
    assert schemas.problem({"type": "no-such-type"}) == (
        "'no-such-type' is not valid under any of the given schemas (at $.type)"
    )
    assert schemas.problem({"minimum": "zero"}) == "'zero' is not of type 'number' (at $.minimum)"


def test_cli_options_become_a_config() -> None:
    config = config_from_args(
        [
            "--port", "0", "--static", "a", "--static", "b", "--db", "x.db", "--token", "t",
            "--allow-origin", "https://a.example", "--tool-timeout", "5",
            "--max-tool-timeout", "9", "--disconnect-policy", "fail", "--ttl", "60",
            "--idle-timeout", "7", "--log-level", "debug", "--retention", "30",
        ]
    )  # fmt: skip
    assert config == ServerConfig(
        port=0, static_dirs=("a", "b"), db="x.db", token="t",
        allow_origins=("https://a.example",), tool_timeout=5.0, max_tool_timeout=9.0,
        disconnect_policy="fail", ttl=60.0, idle_timeout=7.0, log_level="debug",
        retention=30.0,
    )  # fmt: skip
    assert config.finished_retention == 30.0


def test_retention_defaults_short_in_memory_and_long_on_a_db() -> None:
    assert config_from_args([]).finished_retention == MEMORY_RETENTION == 60.0
    assert config_from_args(["--db", "x.db"]).finished_retention == DB_RETENTION
    assert DB_RETENTION == 7 * 86_400.0
    with pytest.raises(ValueError):
        ServerConfig(retention=-1.0)


def test_cli_help_explains_every_option() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "clienttools_server", "--help"],
        capture_output=True, text=True, check=True, timeout=30,
    )  # fmt: skip
    options = [a for a in parser()._actions if a.option_strings and a.dest != "help"]
    assert len(options) >= 13, [a.dest for a in options]
    for action in options:
        assert action.help, f"{action.option_strings[0]} has no help"
        assert action.option_strings[0] in done.stdout


# The command up to the point uvicorn would serve: what is frozen, what is not.
_AT_SERVE = """
import gc, uvicorn
async def serve(self, sockets=None):
    print(gc.get_freeze_count(), len(gc.get_objects()))
uvicorn.Server.serve = serve
from clienttools_server.__main__ import main
main(["--port", "0", "--log-level", "warning"])
"""


async def test_the_command_freezes_what_start_up_built_and_an_embedded_server_does_not() -> None:
    done = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-c", _AT_SERVE],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    frozen, unfrozen = map(int, done.stdout.split())
    assert frozen > 50_000 and unfrozen < frozen / 10, (frozen, unfrozen)
    # An app that embeds the server keeps its own collector as it was.
    before = gc.get_freeze_count()
    async with running_server(ServerConfig(port=0, log_level="warning")):
        pass
    assert gc.get_freeze_count() == before


async def test_static_dirs_first_match_wins(tmp_path: Path, start_server: Any) -> None:
    first, second = tmp_path / "demo", tmp_path / "web"
    first.mkdir()
    second.mkdir()
    (first / "index.html").write_text("demo index")
    (second / "index.html").write_text("shadowed")
    (second / "app.js").write_text("built")
    server = await start_server(static_dirs=(str(first), str(second)))
    (second / "docs").mkdir()
    (second / "docs" / "index.html").write_text("docs index")
    (second / "404.html").write_text("not here")
    server = await start_server(static_dirs=(str(first), str(second)))
    assert await _http_get(server.port, "/") == "demo index"
    assert await _http_get(server.port, "/app.js") == "built"
    assert await _http_get(server.port, "/docs/") == "docs index"
    assert await _http_response(server.port, "/missing.js") == (404, "not here")
    assert (await _http_response(server.port, "/docs"))[0] == 307  # to "/docs/"
    assert (await _http_response(server.port, "/app.js", method="POST"))[0] == 405


async def test_static_dirs_without_a_404_page(tmp_path: Path, start_server: Any) -> None:
    (tmp_path / "a.txt").write_text("a")
    server = await start_server(static_dirs=(str(tmp_path),))
    assert (await _http_response(server.port, "/b.txt"))[0] == 404
    with pytest.raises(RuntimeError):
        StaticDirs((str(tmp_path / "absent"),))


async def test_static_files_carry_the_cross_origin_isolation_headers(
    tmp_path: Path, start_server: Any
) -> None:
    (tmp_path / "page.html").write_text("page")
    isolated = {
        "cross-origin-opener-policy": "same-origin",
        "cross-origin-embedder-policy": "require-corp",
        "cross-origin-resource-policy": "same-origin",
    }
    server = await start_server(static_dirs=(str(tmp_path),))
    for path, status in (("/page.html", 200), ("/missing.js", 404)):
        got_status, headers = await _http_headers(server.port, path)
        assert got_status == status
        assert {k: v for k, v in headers.items() if k in isolated} == isolated, path
    plain = await start_server(static_dirs=(str(tmp_path),), cross_origin_isolation=False)
    _, headers = await _http_headers(plain.port, "/page.html")
    assert not set(isolated) & set(headers)
    assert config_from_args([]).cross_origin_isolation is True
    assert config_from_args(["--no-cross-origin-isolation"]).cross_origin_isolation is False


async def _http_headers(port: int, path: str) -> tuple[int, dict[str, str]]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
    data = await reader.read()
    writer.close()
    await writer.wait_closed()
    lines = data.split(b"\r\n\r\n", 1)[0].decode().split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split(" ", 2)[1]), headers


async def _http_get(port: int, path: str) -> str:
    status, body = await _http_response(port, path)
    assert status == 200, (status, body)
    return body


async def _http_response(port: int, path: str, method: str = "GET") -> tuple[int, str]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    request = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    writer.write(request.encode())
    data = await reader.read()
    writer.close()
    await writer.wait_closed()
    head, body = data.split(b"\r\n\r\n", 1)
    return int(head.split(b" ", 2)[1]), body.decode()


async def test_server_pings(start_server: Any, chunk_collector: Any) -> None:
    server = await start_server(ping_interval=0.05)
    tab = await FakeBrowser.connect(server.ws_url("s1"), chunk_collector)
    await tab.register([])
    ping = await tab.expect("cf_agent_ping")
    await tab.send({"type": "cf_agent_pong", "t": ping["t"]})
    await tab.close()


async def test_a_pong_is_read_as_it_arrives_and_a_malformed_one_is_refused(
    start_server: Any, chunk_collector: Any
) -> None:
    """Pongs skip the reader's queue (the socket offers them first); the rules stay."""
    server = await start_server()
    tab = await FakeBrowser.connect(server.ws_url("s1"), chunk_collector)
    await tab.register([])
    for bad in ('{"type":"cf_agent_pong","t":"soon"}', '{"type": "cf_agent_pong"}'):
        await tab.send_raw(bad)
        error = await tab.expect("cf_agent_protocol_error")
        assert error["message"].startswith("invalid 'cf_agent_pong' frame: t: "), error
    # Spaced JSON, extra fields, and a pong after other frames are all still pongs: they
    # are answered by nothing, and the socket stays open and in order.
    await tab.send_raw('{ "type" : "cf_agent_pong", "t": 1.5, "pad": "x" }')
    await tab.send_raw(json.dumps({"t": 2, "type": "cf_agent_pong"}))
    assert (await tab.chat("hi")).final["type"] == "end"
    await tab.nothing("cf_agent_protocol_error", wait=0.1)
    await tab.close()


async def test_no_pings_to_a_chat_only_client(start_server: Any, chunk_collector: Any) -> None:
    """The AI SDK's stock transport drops its socket on a frame without a requestId."""
    server = await start_server(ping_interval=0.05)
    chat_only = await FakeBrowser.connect(server.ws_url("s1"), chunk_collector)
    page = await FakeBrowser.connect(server.ws_url("s1"), chunk_collector)
    await page.register([])
    response = await chat_only.chat("hello")
    assert response.final["type"] == "end"
    for _ in range(3):  # three ping intervals for the page
        await page.expect("cf_agent_ping")
        page.inbox.clear()
    await chat_only.nothing("cf_agent_ping", wait=0.0)
    await chat_only.close()
    await page.close()


async def test_pings_and_the_idle_timeout_run_on_the_injected_clock(
    start_server: Any, chunk_collector: Any
) -> None:
    clock = ManualClock()
    server = await start_server(clock=clock)  # pings every 15 s, idle peers closed after 30 s
    start = clock.now()
    # Pings go to a page that registered tools; the idle peer only has its idle timer.
    page = await FakeBrowser.connect(server.ws_url("s1"), chunk_collector)
    await page.register([])
    idle = await FakeBrowser.connect(server.ws_url("s1"), chunk_collector)
    # The pinger's tick and the idle timer are waiting on the clock, not on real time.
    tick = 15 / SLOTS
    await wait_until(lambda: {start + tick, start + 30} <= set(clock.deadlines()), 5, "the timers")
    clock.advance(15 - tick)
    await page.nothing("cf_agent_ping", wait=0.05)  # a page joined is pinged an interval later
    clock.advance(tick)
    ping = await page.expect("cf_agent_ping")
    assert ping["t"] == (start + 15) * 1000
    assert idle.close_code is None
    clock.advance(15)
    assert await idle.expect_closed() == 1008
    await idle.close()
    await page.close()


async def test_wrong_path_is_not_a_chat(server: Any) -> None:
    with pytest.raises(Exception):  # noqa: B017 - any refusal of the handshake will do
        async with connect(f"ws://127.0.0.1:{server.port}/elsewhere"):
            pass


def test_the_pending_call_table_settles_once_and_answers_every_late_result() -> None:
    settled = {state for state, moves in DELIVERY_TRANSITIONS.items() if not moves}
    assert settled == set(LATE_RESULT) == {
        DeliveryState.APPLIED, DeliveryState.SUPERSEDED, DeliveryState.CLOSED,
    }  # fmt: skip
    for state, moves in DELIVERY_TRANSITIONS.items():
        if state in settled:
            continue
        # Every unsettled state can be settled in each of the three ways, and only there.
        assert {
            moves[e] for e in (DeliveryEvent.RESULT, DeliveryEvent.OUTSIDE, DeliveryEvent.SERVER)
        } == (settled)
        assert moves[DeliveryEvent.DELIVER] is DeliveryState.DELIVERED
    assert (
        DELIVERY_TRANSITIONS[DeliveryState.ORPHANED][DeliveryEvent.NO_PAGE]
        is DeliveryState.ORPHANED
    )
    assert (
        DELIVERY_TRANSITIONS[DeliveryState.DELIVERED][DeliveryEvent.NO_PAGE]
        is DeliveryState.WAITING
    )
    with pytest.raises(RuntimeError, match="'applied' cannot take event 'result'"):
        next_delivery_state(DeliveryState.APPLIED, DeliveryEvent.RESULT)
    assert LATE_RESULT[DeliveryState.APPLIED] == "duplicate"
    assert LATE_RESULT[DeliveryState.SUPERSEDED] == LATE_RESULT[DeliveryState.CLOSED] == "stale"


async def test_a_page_that_answered_pings_and_falls_silent_is_closed(
    start_server: Any, chunk_collector: Any
) -> None:
    """2.5 ping intervals of silence from a page that answers pings: it is gone (1011)."""
    clock = ManualClock()
    server = await start_server(clock=clock)  # pings every 15 s
    page = await FakeBrowser.connect(server.ws_url("s1"), chunk_collector)
    await page.register([])
    # A peer that never answered a ping is not judged by them: uvicorn's pings stay its test.
    mute = await FakeBrowser.connect(server.ws_url("s1"), chunk_collector)
    await mute.register([])
    tick = 15 / SLOTS  # the pinger's timer: both pages joined at this time, so share a slot
    await wait_until(lambda: clock.now() + tick in set(clock.deadlines()), 5, "the pinger")
    clock.advance(15)
    ping = await page.expect("cf_agent_ping")
    await page.send({"type": "cf_agent_pong", "t": ping["t"]})
    # Frames are handled in order: once this one's answer is back, so is the pong.
    await page.send({"type": "cf_agent_chat_subscribe", "id": "silence"})
    await page.expect("cf_agent_chat_messages")
    await mute.expect("cf_agent_ping")
    for _ in range(2):  # 45 s after the pong: still under 2.5 intervals at 30 s
        await wait_until(lambda: clock.now() + tick in set(clock.deadlines()), 5, "the pinger")
        clock.advance(15)
        await page.expect("cf_agent_ping")
        await mute.expect("cf_agent_ping")
    assert page.close_code is None
    await wait_until(lambda: clock.now() + tick in set(clock.deadlines()), 5, "the pinger")
    clock.advance(15)  # 45 s since the pong: over 37.5 s
    assert await page.expect_closed() == 1011
    await mute.expect("cf_agent_ping")
    assert mute.close_code is None
    await page.close()
    await mute.close()


async def test_the_pinger_pings_each_page_once_an_interval_from_one_timer() -> None:
    clock = ManualClock()
    pinger = Pinger(clock, interval=16.0)  # a tick a second

    class Page:
        def __init__(self) -> None:
            self.pings: list[tuple[float, str]] = []

        def on_ping(self, now: float, text: str) -> None:
            self.pings.append((now, text))

    first, second = Page(), Page()
    start = clock.now()
    pinger.add(first)
    clock.advance(5.5)
    pinger.add(second)
    assert clock.deadlines() == [start + 6]  # one timer for every page
    clock.advance(40)
    assert [now - start for now, _ in first.pings] == [16, 32]
    assert [now - start for now, _ in second.pings] == [21, 37]  # an interval after it joined
    assert first.pings[0][1] == dump_frame(PingFrame(t=(start + 16) * 1000))
    pinger.discard(first)
    clock.advance(16)
    assert len(first.pings) == 2 and len(second.pings) == 3
    pinger.discard(second)
    pinger.discard(second)  # twice is harmless
    assert clock.deadlines() == [] and len(pinger) == 0  # no pages, no timer


@pytest.mark.parametrize(
    "chunk",
    [
        {"type": "text-delta", "id": "t1", "delta": 'héllo "quoted" \u2028 </script>'},
        {"type": "tool-input-available", "toolCallId": "c1", "input": {"a": [1, 2.5, None]}},
        {"type": "data-x", "data": {"nested": {"deep": [True, False, {"k": -0.0}]}}},
        {"type": "finish"},
    ],
)
def test_a_chunk_frame_reads_as_dump_frame_writes_it(chunk: dict[str, Any]) -> None:
    frame = ChunkFrame(request_id="r\u00e9-1", sequence=7, chunk=chunk)
    built = ChunkFrame.model_construct(request_id="r\u00e9-1", sequence=7, chunk=chunk)
    assert frame_text(frame) == frame_text(built) == dump_frame(frame)
    assert json.loads(frame_text(frame)) == {
        "type": "chunk", "requestId": "r\u00e9-1", "sequence": 7, "chunk": chunk,
    }  # fmt: skip
    assert frame_text(PingFrame(t=1.5)) == dump_frame(PingFrame(t=1.5))


async def test_a_recall_takes_the_ledgers_newest_specs_and_survives_a_ledger_away() -> None:
    def spec(name: str, description: str) -> ToolSpec:
        return ToolSpec(name=name, description=description, inputSchema={})

    def described(session: str) -> dict[str, str]:
        return {n: t.description for n, t in pages.remembered.of(session).items()}

    ledger = SqliteLedger(":memory:")
    pages = Pages(ledger, frozenset(), OutputSchemas(), now=lambda: 0.0)
    pages.remembered.remember("s", {"a": spec("a", "seen here"), "w": spec("w", "seen here")})
    kept = {n: spec(n, "newer, from another process").model_dump_json() for n in ("a", "b")}
    await ledger.remember_tools("s", kept, 1.0, keep=8)
    await pages.recall("s")
    assert described("s") == {
        "w": "seen here",  # not in the ledger (pruned, say): what is remembered here stays
        "a": "newer, from another process",
        "b": "newer, from another process",
    }
    await ledger.close()  # a ledger that cannot be read changes nothing
    await pages.recall("t")
    assert not pages.remembered.knows("t")
    assert described("s")["a"] == "newer, from another process"
