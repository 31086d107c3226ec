"""Durable runs end to end: a real server PROCESS on a SQLite ledger, the real SDK in Chromium.

The tests share one server (restarted in place, same port and ledger) and, to
keep page loads few, one page until it is closed on purpose; they run in file
order and each leaves the chat idle. What the page's tool saw (per requestId:
the ``attempt`` of every start, how often it finished) is kept in
sessionStorage, so it survives reloads, and published in ``#state``.

The page is served by the server itself (``--static``), so it is same-origin
with the WebSocket. "An hour later" is a simulated clock: the server process is
the CLI on a clock that adds the offset in a file (tests.support.clocked_server).
A chat sent while no page is live comes from a plain CPython WebSocket, the way
a server-side trigger or a second device would start one.

Run counts observed are written to the log (``-o log_cli=true`` shows them).
"""

from __future__ import annotations

import contextlib
import json
import logging
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, BrowserContext, Page
from websockets.sync.client import ClientConnection, connect

from tests.conftest import PLAYWRIGHT_CONFIG, ROOT
from tests.support.chunks import normalized
from tests.support.server_process import ServerProcess

pytestmark = pytest.mark.browser
logger = logging.getLogger(__name__)

SESSION = "durable"
LOAD_MS = PLAYWRIGHT_CONFIG.PAGE_LOAD_TIMEOUT_MS
# Generous: two cores shared with other test runs; waits end as soon as the condition holds.
WAIT_MS = 60_000
TEXT = 'call work {"job": "k"}'


# -- the server process -------------------------------------------------------------------


class DurableServer(ServerProcess):
    """The server on a SQLite ledger and a clock the test can move forward."""

    def __init__(self, tmp: Path, web: Path) -> None:
        self.db = tmp / "ledger.sqlite3"
        self.clock_file = tmp / "clock-offset"
        self.clock_file.write_text("0")
        pages = ROOT / "tests" / "browser" / "pages"
        super().__init__(
            [
                *("--clock-offset-file", str(self.clock_file), "--db", str(self.db)),
                *("--static", str(pages), "--static", str(web)),
            ],
            log=tmp / "server.log",
            module="tests.support.clocked_server",
        )

    def advance_clock(self, seconds: float) -> None:
        self.clock_file.write_text(str(float(self.clock_file.read_text()) + seconds))

    def query(self, sql: str, *params: object) -> list[tuple[Any, ...]]:
        db = sqlite3.connect(self.db, timeout=10)
        try:
            return db.execute(sql, params).fetchall()
        finally:
            db.close()

    def step(self, request_id: str) -> dict[str, Any]:
        [row] = self.query(
            "SELECT s.state, s.attempts, s.created_at, s.updated_at, e.status, e.error "
            "FROM steps s JOIN executions e ON e.id = s.execution_id WHERE s.request_id = ?",
            request_id,
        )
        keys = ("state", "attempts", "created_at", "updated_at", "status", "error")
        return dict(zip(keys, row, strict=True))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, web_build: Path) -> Iterator[DurableServer]:
    process = DurableServer(tmp_path_factory.mktemp("durable"), web_build).start()
    yield process
    process.stop()


@pytest.fixture(scope="module")
def context(browser: Browser) -> Iterator[BrowserContext]:
    context = browser.new_context()
    yield context
    context.close()


def open_page(context: BrowserContext, server: DurableServer, query: str = "") -> Page:
    page = context.new_page()
    page.goto(f"{server.url}/durable.html{query}")
    wait_loaded(page)
    return page


def wait_loaded(page: Page) -> None:
    page.wait_for_function(
        "document.getElementById('status').textContent !== 'loading'", timeout=LOAD_MS
    )
    assert page.text_content("#status") == "connected", page.text_content("#status")


@pytest.fixture(scope="module")
def page(context: BrowserContext, server: DurableServer) -> Page:
    return open_page(context, server)


# -- reading the page -----------------------------------------------------------------------


def state(page: Page) -> dict[str, Any]:
    return json.loads(page.text_content("#state") or "{}")  # type: ignore[no-any-return]


def wait_state(page: Page, predicate: str, timeout: float = WAIT_MS) -> dict[str, Any]:
    """Wait until the JS ``predicate(state)`` holds for the published #state; return the state."""
    page.wait_for_function(
        f"({predicate})(JSON.parse(document.getElementById('state').textContent))",
        timeout=timeout,
    )
    return state(page)


def set_gate(page: Page, value: str) -> None:
    page.evaluate(f"sessionStorage.setItem('gate', '{value}')")


def newest_run(page: Page, known: set[str]) -> str:
    """The requestId of the call the tool started that is not in ``known``."""
    found = wait_state(
        page, f"s => Object.keys(s.runs).some(r => !{json.dumps(sorted(known))}.includes(r))"
    )
    [request_id] = [str(r) for r in found["runs"] if r not in known]
    return request_id


def send_chat(page: Page, text: str) -> None:
    page.evaluate("text => window.sendChat(text)", text)


def wait_chat_done(page: Page, turns: int) -> dict[str, Any]:
    """Wait until the page's ``turns``-th chat turn began (a request id) and ended."""
    return wait_state(
        page,
        f"s => s.chat.turns.length === {turns} && s.chat.turns[{turns - 1}].length > 0"
        " && ['ready', 'error'].includes(s.chat.status)",
    )


def response_chunks(page: Page, request_ids: list[str]) -> tuple[list[dict[str, Any]], str]:
    """The chunks of one response by sequence, across the requests that carried it.

    Asserts that every sequence from 0 arrived, with no gaps, and that a
    sequence seen twice (a resume overlapping) carried the same chunk.
    """
    frames = [f for f in page.evaluate("window.chatFrames") if f["requestId"] in request_ids]
    by_sequence: dict[int, dict[str, Any]] = {}
    for frame in frames:
        if frame["type"] == "chunk":
            seen = by_sequence.setdefault(frame["sequence"], frame["chunk"])
            assert seen == frame["chunk"], (frame["sequence"], seen, frame["chunk"])
    assert sorted(by_sequence) == list(range(len(by_sequence))), sorted(by_sequence)
    finals = [f["type"] for f in frames if f["type"] in ("end", "error", "no-active")]
    return [by_sequence[i] for i in range(len(by_sequence))], finals[-1] if finals else ""


def assistant_text(st: dict[str, Any]) -> str:
    message = st["chat"]["messages"][-1]
    assert message["role"] == "assistant"
    return "".join(p["text"] for p in message["parts"] if p["type"] == "text")


def acks(page: Page, request_id: str) -> list[dict[str, Any]]:
    log = json.loads(page.evaluate("sessionStorage.getItem('acks') || '[]'"))
    return [a for a in log if a["requestId"] == request_id]


def outbox(page: Page, server: DurableServer) -> list[str]:
    key = f"clienttools:outbox:ws://127.0.0.1:{server.port}/agents/chat/{SESSION}"
    text = page.evaluate("key => sessionStorage.getItem(key)", key)
    return [e["requestId"] for e in json.loads(text)["results"]] if text else []


def wait_outbox(page: Page, server: DurableServer, request_id: str, *, held: bool) -> None:
    """Until the stored outbox holds (or no longer holds) the result: its writes are
    batched, 20 ms after a change (outbox.py)."""
    deadline = time.monotonic() + 5
    while (request_id in outbox(page, server)) != held:
        assert time.monotonic() < deadline, f"{request_id} held={not held} in the stored outbox"
        time.sleep(0.02)


def report(scenario: str, runs: dict[str, Any]) -> None:
    logger.warning("run counts, %s: attempts started %s, finished %d",
                   scenario, runs["attempts"], runs["done"])  # fmt: skip


# -- a chat peer that is not a page -----------------------------------------------------------


class ChatPeer:
    """A plain WebSocket client of the session (no tools): starts a chat, reads its chunks."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.chunks: list[dict[str, Any]] = []
        self.final: dict[str, Any] | None = None

    def send_chat(self, chat_id: str, text: str) -> None:
        message = {"id": f"u-{chat_id}", "role": "user", "parts": [{"type": "text", "text": text}]}
        self.ws.send(json.dumps({
            "type": "send", "requestId": f"req-{chat_id}", "id": chat_id,
            "trigger": "submit-message", "messages": [message], "headers": {}, "body": {},
        }))  # fmt: skip

    def read_until(self, done: Callable[[], bool], timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            frame = json.loads(self.ws.recv(timeout=max(0.01, deadline - time.monotonic())))
            if frame["type"] == "chunk":
                self.chunks.append(frame["chunk"])
            elif frame["type"] in ("end", "error"):
                self.final = frame

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [c for c in self.chunks if c["type"] == kind]


@contextlib.contextmanager
def chat_peer(server: DurableServer) -> Iterator[ChatPeer]:
    with connect(f"ws://127.0.0.1:{server.port}/agents/chat/{SESSION}") as ws:
        yield ChatPeer(ws)


# -- one response ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def undisturbed(page: Page) -> dict[str, Any]:
    """The page's first chat, with nothing disturbed: what a disturbed one must reproduce.

    ``chunks``: its response, normalized; ``runs``: the request ids of the tool calls
    the page has made, each test adding its own (so the next one finds its new call).
    """
    send_chat(page, TEXT)
    st = wait_chat_done(page, turns=1)
    [turn] = st["chat"]["turns"]
    frames = [f for f in page.evaluate("window.chatFrames") if f["requestId"] == turn[0]]
    chunks, final = response_chunks(page, turn)
    return {
        "state": st, "turn": turn, "frames": frames, "final": final,
        "chunks": normalized(chunks), "runs": set(st["runs"]),
    }  # fmt: skip


def test_tool_call_and_follow_up_text_arrive_in_one_response(undisturbed: dict[str, Any]) -> None:
    st, turn = undisturbed["state"], undisturbed["turn"]
    assert len(turn) == 1, turn  # one request carried the whole exchange
    kinds = [
        f["chunk"]["type"] if f["type"] == "chunk" else f["type"] for f in undisturbed["frames"]
    ]
    assert kinds[0] == "start" and kinds[-1] == "end" and kinds.count("end") == 1
    given, output = kinds.index("tool-input-available"), kinds.index("tool-output-available")
    assert given < output < kinds.index("text-delta") < kinds.index("finish") < len(kinds) - 1
    assert "end" not in kinds[given:output]
    assert assistant_text(st) == 'work -> "done k"'
    [tool] = [p for p in st["chat"]["messages"][-1]["parts"] if p["type"] == "tool-work"]
    assert tool["state"] == "output-available" and tool["output"] == "done k"
    # C14: streaming from the first chunk to the end, no flicker to ready while the tool ran.
    assert st["chat"]["statuses"] == ["ready", "submitted", "streaming", "ready"]
    [request_id] = st["runs"]
    assert st["runs"][request_id] == {"attempts": [1], "done": 1}
    assert undisturbed["final"] == "end"


# -- durability ------------------------------------------------------------------------------


def test_sigkill_while_the_tool_runs(
    page: Page, server: DurableServer, undisturbed: dict[str, Any]
) -> None:
    baseline = undisturbed
    set_gate(page, "closed")
    send_chat(page, TEXT)
    request_id = newest_run(page, baseline["runs"])
    server.kill()
    # The tool finishes while no server is up: its result waits in the outbox.
    set_gate(page, "open")
    wait_state(page, f"s => s.runs['{request_id}'].done === 1")
    wait_outbox(page, server, request_id, held=True)
    assert server.step(request_id)["state"] == "pending"
    server.start()
    st = wait_chat_done(page, turns=2)
    runs = st["runs"][request_id]
    report("SIGKILL while the tool runs", runs)
    assert runs == {"attempts": [1], "done": 1}  # exactly once
    assert st["chat"]["status"] == "ready" and assistant_text(st) == 'work -> "done k"'
    turn = st["chat"]["turns"][-1]
    assert len(turn) == 2, turn  # the send, then the resume on the restarted server
    chunks, final = response_chunks(page, turn)
    assert final == "end"
    assert normalized(chunks) == baseline["chunks"]
    assert server.step(request_id) | {"created_at": 0, "updated_at": 0} == {
        "state": "applied", "attempts": 2, "created_at": 0, "updated_at": 0,
        "status": "completed", "error": None,
    }  # fmt: skip
    # The re-sent result was applied; the re-delivered invoke got the stored result again.
    page.wait_for_function(
        "rid => JSON.parse(sessionStorage.getItem('acks') || '[]')"
        ".some(a => a.requestId === rid && a.outcome === 'applied')",
        arg=request_id,
        timeout=WAIT_MS,
    )
    assert [a["outcome"] for a in acks(page, request_id)] in (
        ["applied"], ["applied", "duplicate"], ["duplicate", "applied"],
    )  # fmt: skip
    baseline["runs"].add(request_id)


def test_reload_while_the_tool_runs(
    page: Page, server: DurableServer, undisturbed: dict[str, Any]
) -> None:
    baseline = undisturbed
    set_gate(page, "closed")
    send_chat(page, 'call work {"job": "reload-1"}')
    request_id = newest_run(page, baseline["runs"])
    page.reload()
    wait_loaded(page)
    # The reloaded page gets the call again (attempt 2) and starts it from scratch.
    wait_state(page, f"s => s.runs['{request_id}'].attempts.length === 2")
    # It resumed the chat too: the response so far, and it is still streaming.
    wait_state(page, "s => s.chat.turns.length === 1 && s.chat.status === 'streaming'")
    set_gate(page, "open")
    st = wait_chat_done(page, turns=1)
    runs = st["runs"][request_id]
    report("reload while the tool runs", runs)
    assert runs == {"attempts": [1, 2], "done": 1}
    assert assistant_text(st) == 'work -> "done reload-1"'
    chunks, final = response_chunks(page, st["chat"]["turns"][0])
    assert final == "end" and chunks[0]["type"] == "start"  # every chunk, from 0
    assert [c["type"] for c in normalized(chunks)] == [c["type"] for c in baseline["chunks"]]
    assert server.step(request_id)["attempts"] == 2
    assert [a["outcome"] for a in acks(page, request_id)] == ["applied"]
    baseline["runs"].add(request_id)


def test_reload_after_the_tool_finished_before_the_ack(
    page: Page, server: DurableServer, undisturbed: dict[str, Any]
) -> None:
    baseline = undisturbed
    page.evaluate("sessionStorage.setItem('drop_acks', '1')")
    set_gate(page, "open")
    send_chat(page, 'call work {"job": "reload-2"}')
    request_id = newest_run(page, baseline["runs"])
    st = wait_chat_done(page, turns=2)  # the server applied the result; the page never heard
    assert assistant_text(st) == 'work -> "done reload-2"'
    assert acks(page, request_id) == [
        {"requestId": request_id, "outcome": "applied", "dropped": True}
    ]
    wait_outbox(page, server, request_id, held=True)
    page.evaluate("sessionStorage.setItem('drop_acks', '0')")
    page.reload()
    wait_loaded(page)
    # The reloaded page re-sends the stored result; the server already has one.
    page.wait_for_function(
        "rid => JSON.parse(sessionStorage.getItem('acks')).filter(a => a.requestId === rid)"
        ".length === 2",
        arg=request_id,
        timeout=WAIT_MS,
    )
    assert [a["outcome"] for a in acks(page, request_id)] == ["applied", "duplicate"]
    runs = state(page)["runs"][request_id]
    report("reload after the tool finished, before the ack", runs)
    assert runs == {"attempts": [1], "done": 1}
    wait_outbox(page, server, request_id, held=False)
    assert server.step(request_id)["attempts"] == 1  # nothing was re-delivered
    baseline["runs"].add(request_id)


def test_all_pages_closed_the_call_waits_an_hour(
    page: Page, context: BrowserContext, server: DurableServer
) -> None:
    # The session's last page leaves: it closes its client, the server answers the
    # close (readyState CLOSED), then the tab goes. (A tab closed without this may
    # still get the next invoke on its dying socket; that is then attempt 1, which
    # never runs, and the next page gets attempt 2.)
    page.evaluate("pyodide.runPythonAsync('await client.close()')")
    page.wait_for_function("window.sockets.every(s => s.readyState === WebSocket.CLOSED)")
    page.close()
    with chat_peer(server) as peer:  # the chat's sender leaves right after sending
        peer.send_chat("chat-hour", 'call work {"job": "hour"}')
        peer.read_until(lambda: bool(peer.of_type("tool-input-available")))
    [(request_id, state_, delivered)] = server.query(
        "SELECT request_id, state, attempts FROM steps WHERE name = 'work' AND state = 'pending'"
    )
    # S2: the call to a tool of the session waits for a page (not unknown_tool) and
    # is not delivered anywhere meanwhile.
    assert (state_, delivered) == ("pending", 0)
    server.advance_clock(3600)
    later = open_page(context, server, "?chat=chat-hour&resume=1&gate=closed")
    wait_state(later, f"s => s.runs['{request_id}'] && s.chat.status === 'streaming'")
    set_gate(later, "open")
    st = wait_chat_done(later, turns=1)
    runs = st["runs"][request_id]
    report("all pages closed, a new page an hour later", runs)
    assert runs == {"attempts": [1], "done": 1}
    assert assistant_text(st) == 'work -> "done hour"'
    step = server.step(request_id)
    assert step["state"] == "applied" and step["status"] == "completed"
    assert step["updated_at"] - step["created_at"] >= 3600


def test_with_a_one_second_ttl_the_run_expires(
    context: BrowserContext, server: DurableServer
) -> None:
    [later] = context.pages
    opens = state(later)["clientStatuses"].count("open")
    server.kill()
    server.start("--ttl", "1")
    # The page reconnects by itself (and registers its tools with the new process).
    wait_state(later, f"s => s.clientStatuses.filter(x => x === 'open').length > {opens}")
    set_gate(later, "closed")
    known = set(state(later)["runs"])
    with chat_peer(server) as peer:  # it follows the response; it is not a page
        peer.send_chat("chat-ttl", 'call work {"job": "ttl"}')
        request_id = newest_run(later, known)
        later.close()  # every page of the session is gone
        started = time.monotonic()
        peer.read_until(lambda: peer.final is not None, timeout=30)
    logger.warning("the run expired %.1f s after the last page closed", time.monotonic() - started)
    [error] = peer.of_type("tool-output-error")
    assert error["errorText"] == (
        "expired: this call waited longer than its time to live (1 s) and expired"
    )
    assert peer.of_type("error") == [
        {"type": "error", "errorText": "this run waited longer than its time to live and expired"}
    ]
    assert peer.final == {"type": "end", "requestId": "req-chat-ttl"}
    step = server.step(request_id)
    assert (step["state"], step["status"]) == ("expired", "expired")
    assert step["error"] == "expired after 1 s without progress"
