"""Pending calls over HTTP, end to end: a real server process (``--db``, ``--token``), the
CPython ``ToolClient`` as the page, the routes of docs/protocol.md's last section.

A call is pending with no page connected; ``GET /executions?status=paused``
lists it with its input; ``resolve`` applies it and a page that connects
later sees the model's text through ``resume``; a repeated resolve is a 409
``duplicate``, an unknown seq a 404, a wrong token a 401, an output that
breaks the tool's outputSchema a 422 with jsonschema's message, and after
each refusal the ledger is byte for byte what it was. The same across a
SIGKILL and restart between the listing and the resolves. Approval steps are
approved and denied over HTTP.
"""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from server_harness import sqlite_rows

from clienttools import ToolClient
from clienttools_server.app import running_server
from clienttools_server.calls.pending import InvalidQuery
from clienttools_server.config import ServerConfig
from tests.support.http import Reply, http_json
from tests.support.server_process import ServerProcess
from tests.support.wait import wait_until

# Most of its tests start the server as OS processes: the file is not in `make check`.
pytestmark = pytest.mark.process

TOKEN = "page-secret"
ADMIN = "operator-secret"
SESSION = "desk"
ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
EXECUTION_FIELDS = {"executionId", "session", "status", "createdAt", "updatedAt", "pending"}
PENDING_FIELDS = {"seq", "toolName", "input", "resolution", "requestId", "attempts", "createdAt"}


class Weather(BaseModel):
    city: str
    celsius: float


class Server:
    def __init__(self, process: ServerProcess, db: Path) -> None:
        self.process = process
        self.db = db

    async def http(
        self, method: str, path: str, body: Any = None, *, token: str | None = ADMIN, **kw: Any
    ) -> Reply:
        return await http_json(
            "127.0.0.1", self.process.port, method, path, body, token=token, **kw
        )

    async def post(self, execution_id: str, seq: int | str, action: str, body: Any) -> Reply:
        return await self.http("POST", f"/executions/{execution_id}/steps/{seq}/{action}", body)

    def ledger_rows(self) -> list[Any]:
        """Every row of the ledger, read from the file the server process writes."""
        return sqlite_rows(self.db)

    async def restart(self) -> None:
        self.process.kill()  # SIGKILL: nothing of the shutdown runs
        await asyncio.to_thread(self.process.start)

    def page(self) -> ToolClient:
        return ToolClient(self.process.ws_url(SESSION), token=TOKEN, reconnect=False)


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[Server]:
    db = tmp_path / "ledger.sqlite3"
    args = ["--db", str(db), "--token", TOKEN, "--admin-token", ADMIN]
    process = ServerProcess(args, log=tmp_path / "server.log")
    await asyncio.to_thread(process.start)
    try:
        yield Server(process, db)
    finally:
        await asyncio.to_thread(process.stop)


async def _paused(server: Server) -> list[dict[str, Any]]:
    reply = await server.http("GET", f"/executions?status=paused&session={SESSION}")
    assert reply.status == 200, reply.body
    executions: list[dict[str, Any]] = reply.json["executions"]
    return executions


async def _start_calls_and_leave(server: Server, prompt: str) -> dict[str, Any]:
    """A page asks for the calls, gets the invokes, and goes away without answering."""
    page = server.page()
    started = asyncio.Event()

    @page.tool
    async def lookup(city: str) -> Weather:
        """The weather in a city (the page is closed before it answers)."""
        started.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    @page.tool
    async def note(text: str) -> str:
        """Keep a note (the page is closed before it answers)."""
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    await page.connect()
    reply = asyncio.create_task(page.chat.send(prompt))
    await asyncio.wait_for(started.wait(), 20)
    await page.close()
    reply.cancel()
    await asyncio.gather(reply, return_exceptions=True)
    async with asyncio.timeout(20):
        while not (found := await _paused(server)) or len(found[0]["pending"]) < 2:
            await asyncio.sleep(0.05)
    [execution] = found
    return execution


@pytest.mark.parametrize("restart", [False, True], ids=["same-process", "after-sigkill"])
async def test_a_pending_call_is_listed_refused_and_resolved_over_http(
    server: Server, restart: bool
) -> None:
    prompt = 'call lookup {"city": "Berlin"}\ncall note {"text": "umbrella"}'
    execution = await _start_calls_and_leave(server, prompt)
    assert set(execution) == EXECUTION_FIELDS
    assert (execution["session"], execution["status"]) == (SESSION, "paused")
    assert ISO_UTC.match(execution["createdAt"]) and ISO_UTC.match(execution["updatedAt"])
    lookup, note = execution["pending"]
    assert set(lookup) == PENDING_FIELDS
    assert (lookup["toolName"], lookup["input"], lookup["resolution"]) == (
        "lookup", {"city": "Berlin"}, "client",
    )  # fmt: skip
    assert (note["toolName"], note["input"]) == ("note", {"text": "umbrella"})
    assert lookup["attempts"] == 1 and re.fullmatch(r"[0-9a-f]{32}", lookup["requestId"])
    assert ISO_UTC.match(lookup["createdAt"])
    run = execution["executionId"]
    if restart:
        await server.restart()
        assert [e["executionId"] for e in await _paused(server)] == [run]

    # Refusals: each leaves the ledger exactly as it was.
    before = server.ledger_rows()
    refusals: list[tuple[Reply, int]] = [
        (await server.http("GET", "/executions", token=None), 401),
        (await server.http("GET", "/executions", token="wrong"), 401),
        (await server.http("POST", f"/executions/{run}/steps/{lookup['seq']}/resolve",
                           {"output": {"city": "Berlin", "celsius": 1}}, token="wrong"), 401),
        (await server.post(run, 99, "resolve", {"output": 1}), 404),
        (await server.post("no-such-run", 1, "resolve", {"output": 1}), 404),
        (await server.post(run, "x", "resolve", {"output": 1}), 404),
        (await server.post(run, lookup["seq"], "resolve", {"value": 1}), 422),
        (await server.post(run, lookup["seq"], "approve", {"approved": True}), 422),
        (await server.post(run, 0, "reject", {"message": "no"}), 422),
    ]  # fmt: skip
    for reply, status in refusals:
        assert reply.status == status, (status, reply.status, reply.body)
        if status == 401:
            assert reply.body == b""
        elif status == 404:
            assert set(reply.json) == {"message"} and reply.json["message"]
        else:
            assert reply.json["outcome"] == "invalid" and reply.json["message"]
    breaking = await server.post(
        run, lookup["seq"], "resolve", {"output": {"city": "Berlin", "celsius": "warm"}}
    )
    assert breaking.status == 422
    assert breaking.json == {
        "outcome": "invalid",
        "message": "the result does not match outputSchema: $.celsius: "
        "'warm' is not of type 'number'",
    }
    not_json = await server.http(
        "POST", f"/executions/{run}/steps/{lookup['seq']}/resolve", raw=b"{nope"
    )
    assert not_json.status == 422 and not_json.json["outcome"] == "invalid"
    assert server.ledger_rows() == before

    # The resolve applies; the run goes on at once and waits for the note.
    weather = {"city": "Berlin", "celsius": 21.5}
    applied = await server.post(run, lookup["seq"], "resolve", {"output": weather})
    assert (applied.status, applied.json) == (200, {"outcome": "applied"})
    after = server.ledger_rows()
    duplicate = await server.post(run, lookup["seq"], "resolve", {"output": weather})
    assert (duplicate.status, duplicate.json["outcome"]) == (409, "duplicate")
    stale = await server.post(run, lookup["seq"], "reject", {"message": "too late"})
    assert (stale.status, stale.json["outcome"]) == (409, "stale")
    assert server.ledger_rows() == after
    [still] = await _paused(server)
    assert [p["toolName"] for p in still["pending"]] == ["note"]
    detail = (await server.http("GET", f"/executions/{run}")).json
    assert set(detail) == EXECUTION_FIELDS | {"steps"}
    assert [(s["seq"], s["kind"], s["toolName"], s["state"]) for s in detail["steps"]] == [
        (0, "model", None, "applied"),
        (1, "tool", "lookup", "applied"),
        (2, "tool", "note", "pending"),
    ]
    assert detail["steps"][1]["result"] == weather

    # A page that connects later follows the response through resume; the
    # second resolve lets it end there.
    page = server.page()
    await page.connect()
    try:
        resumed = asyncio.create_task(page.chat.resume())
        await wait_until(lambda: page.chat.status == "streaming", 20)
        noted = await server.post(run, note["seq"], "resolve", {"output": "noted"})
        assert (noted.status, noted.json) == (200, {"outcome": "applied"})
        message = await asyncio.wait_for(resumed, 20)
    finally:
        await page.close()
    assert message is not None
    assert message.text == 'lookup -> {"celsius":21.5,"city":"Berlin"}\nnote -> "noted"'
    finished = (await server.http("GET", f"/executions/{run}")).json
    assert (finished["status"], finished["pending"]) == ("completed", [])
    late = await server.post(run, note["seq"], "resolve", {"output": "again"})
    assert (late.status, late.json["outcome"]) == (409, "duplicate")


async def test_the_page_token_reaches_the_routes_and_the_admin_token_not_the_socket(
    server: Server,
) -> None:
    assert (await server.http("GET", "/executions", token=TOKEN)).status == 200
    assert (await server.http("GET", "/executions", token=ADMIN)).status == 200
    listed = await server.http("GET", "/executions?status=nonsense")
    assert listed.status == 422 and "status must be one of" in listed.json["message"]
    missing = await server.http("GET", "/executions/nope")
    assert (missing.status, set(missing.json)) == (404, {"message"})
    operator = ToolClient(server.process.ws_url(SESSION), token=ADMIN, reconnect=False)
    with pytest.raises(Exception):  # noqa: B017 - the handshake is refused (HTTP 403)
        await operator.connect()
    await operator.close()


async def test_approvals_approved_and_denied_over_http(server: Server) -> None:
    page = server.page()
    ran: list[int] = []

    @page.tool(needs_approval=True)
    def transfer(amount: int) -> str:
        """Move money (only once a human approved it)."""
        ran.append(amount)
        return f"moved {amount}"

    await page.connect()
    try:
        reply = asyncio.create_task(
            page.chat.send('call transfer {"amount": 5}\ncall transfer {"amount": 500}')
        )
        async with asyncio.timeout(20):
            while not (found := await _paused(server)) or len(found[0]["pending"]) < 4:
                await asyncio.sleep(0.05)
        [execution] = found
        run = execution["executionId"]
        # Each call is an approval step and, after it, the call's own client step.
        small, small_call, large, large_call = execution["pending"]
        assert (small_call["resolution"], small_call["seq"]) == ("client", small["seq"] + 1)
        assert [(p["toolName"], p["resolution"], p["input"]) for p in (small, large)] == [
            ("transfer", "approval", {"amount": 5}),
            ("transfer", "approval", {"amount": 500}),
        ]
        before = server.ledger_rows()
        wrong_kind = await server.post(run, small["seq"], "resolve", {"output": True})
        assert (wrong_kind.status, wrong_kind.json["outcome"]) == (422, "invalid")
        client_step = await server.post(run, large_call["seq"], "approve", {"approved": True})
        assert (client_step.status, client_step.json["outcome"]) == (422, "invalid")
        not_bool = await server.post(run, small["seq"], "approve", {"approved": "yes"})
        assert (not_bool.status, not_bool.json["outcome"]) == (422, "invalid")
        assert server.ledger_rows() == before
        approved = await server.post(run, small["seq"], "approve", {"approved": True})
        assert (approved.status, approved.json) == (200, {"outcome": "applied"})
        denied = await server.post(
            run, large["seq"], "approve", {"approved": False, "reason": "too much"}
        )
        assert (denied.status, denied.json) == (200, {"outcome": "applied"})
        again = await server.post(run, large["seq"], "approve", {"approved": False})
        assert (again.status, again.json["outcome"]) == (409, "duplicate")
        message = await asyncio.wait_for(reply, 20)
    finally:
        await page.close()
    assert ran == [5]
    assert message.text == 'transfer -> "moved 5"\ntransfer failed: denied: too much'


# -- docs/durability.md: the curl walkthrough runs as written ------------------------------

DOC = Path(__file__).resolve().parents[2] / "docs" / "durability.md"


def _walkthrough() -> tuple[list[str], list[tuple[str, str]]]:
    """The server's arguments and each (command, expected output) of the walkthrough."""
    text = DOC.read_text()
    section = text[text.index("### A walkthrough with `curl`") : text.index("### In Python")]
    blocks = re.findall(r"```console\n(.*?)```", section, re.S)
    steps: list[tuple[str, str]] = []
    server_args: list[str] = []
    for block in blocks:
        for chunk in re.split(r"^\$ ", block, flags=re.M)[1:]:
            command, _, output = chunk.partition("\n")
            if command.startswith("clienttools-server "):
                server_args = shlex.split(command)[1:]
            else:
                steps.append((command, output.rstrip("\n")))
    return server_args, steps


class Location(BaseModel):
    lat: float
    lon: float


async def test_the_curl_walkthrough_in_the_docs_runs(tmp_path: Path) -> None:
    server_args, steps = _walkthrough()
    assert server_args and len(steps) >= 8
    env = {"PAGE_TOKEN": "page-" + "p" * 8, "ADMIN_TOKEN": "admin-" + "a" * 8}
    expanded = [env.get(a[1:], a) if a.startswith("$") else a for a in server_args]
    port_at = expanded.index("--port")
    doc_port = expanded[port_at + 1]
    del expanded[port_at : port_at + 2]  # ServerProcess picks a free port
    expanded[expanded.index("--db") + 1] = str(tmp_path / "ledger.sqlite3")
    process = ServerProcess(expanded, log=tmp_path / "server.log")
    await asyncio.to_thread(process.start)
    try:
        page = ToolClient(process.ws_url("demo"), token=env["PAGE_TOKEN"], reconnect=False)
        started = asyncio.Event()

        @page.tool
        async def get_location(precise: bool) -> Location:
            """Where the user is (the page is closed before it answers)."""
            started.set()
            await asyncio.Event().wait()
            raise AssertionError("unreachable")

        await page.connect()
        reply = asyncio.create_task(page.chat.send('call get_location {"precise": true}'))
        await asyncio.wait_for(started.wait(), 20)
        await page.close()
        reply.cancel()
        await asyncio.gather(reply, return_exceptions=True)
        script = "set -euo pipefail\n"
        for command, _ in steps:
            command = command.replace(f"127.0.0.1:{doc_port}", f"127.0.0.1:{process.port}")
            script += f"echo '@@@'\n{command}\n"
        done = await asyncio.to_thread(
            subprocess.run, ["bash", "-c", script], capture_output=True, text=True,
            env={**os.environ, **env}, cwd=tmp_path, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        outputs = [o.strip("\n") for o in done.stdout.split("@@@\n")[1:]]
        execution = (await http_json(
            "127.0.0.1", process.port, "GET", "/executions?session=demo", token=env["ADMIN_TOKEN"]
        )).json["executions"][0]  # fmt: skip
        run = execution["executionId"]
        assert [o.replace(run, "EXECUTION") for o in outputs] == [out for _, out in steps]
        # The run went on: the model answered with the resolved value.
        async with asyncio.timeout(20):
            while True:
                detail = (await http_json(
                    "127.0.0.1", process.port, "GET", f"/executions/{run}",
                    token=env["ADMIN_TOKEN"],
                )).json  # fmt: skip
                if detail["status"] == "completed":
                    break
                await asyncio.sleep(0.05)
        events = detail["steps"][-1]["result"]["events"]
        text = "".join(e.get("text", "") for e in events)
        assert text == 'get_location -> {"lat":52.52,"lon":13.4}'
    finally:
        await asyncio.to_thread(process.stop)


async def test_the_listing_is_newest_first_and_pages_with_before(tmp_path: Path) -> None:
    config = ServerConfig(port=0, log_level="warning", db=str(tmp_path / "l.sqlite3"))
    async with running_server(config) as running:
        ledger, pending = running.app.state.ledger, running.pending
        ids = [(await ledger.start_execution("s", '{"chatId":"c","messages":[]}', now=t)).id
               for t in (10.0, 20.0, 30.0, 40.0, 50.0)]  # fmt: skip
        await ledger.set_status(ids[1], "completed", now=60.0)
        first = await pending.executions(limit=2)
        assert [e["executionId"] for e in first] == [ids[4], ids[3]]
        assert first[0]["createdAt"] == "1970-01-01T00:00:50.000Z"
        second = await pending.executions(limit=2, before=first[-1]["executionId"])
        assert [e["executionId"] for e in second] == [ids[2], ids[1]]
        rest = await pending.executions(limit=2, before=second[-1]["executionId"])
        assert [e["executionId"] for e in rest] == [ids[0]]
        completed = await pending.executions(status="completed")
        assert [e["executionId"] for e in completed] == [ids[1]]
        # No run waits for anything here: unfinished executions are listed as running.
        assert {e["status"] for e in await pending.executions(status="running")} == {"running"}
        assert await pending.executions(status="paused") == []
        assert await pending.executions(session="other") == []
        with pytest.raises(InvalidQuery):
            await pending.executions(before="nope")
        with pytest.raises(InvalidQuery):
            await pending.executions(limit=0)
        reply = await http_json(running.host, running.port, "GET", "/executions?limit=x")
        assert (reply.status, set(reply.json)) == (422, {"message"})
        # An empty parameter is one not given, as a form or URLSearchParams sends it.
        empty = "/executions?status=&session=&limit=&before="
        await ledger.claim_session("s", "shared", 70.0)  # the token rules' one principal
        reply = await http_json(running.host, running.port, "GET", empty)
        assert reply.status == 200, reply.json
        assert [e["executionId"] for e in reply.json["executions"]] == ids[::-1]


@pytest.mark.parametrize(
    ("method", "path", "raw"),
    [
        ("GET", "/executions?limit=99999999999999999999999", None),
        ("GET", "/executions?before=%00%ff&status=", None),
        ("GET", "/executions/%00", None),
        ("POST", "/executions/E/steps/1/resolve", b"[" * 100_000),
        ("POST", "/executions/E/steps/1/resolve", b'{"output": NaN}'),
        ("POST", "/executions/E/steps/1/resolve", b'{"output": 1, "extra": 2}'),
        ("POST", "/executions/E/steps/1/resolve", b"\xff\xfe"),
        ("POST", "/executions/E/steps/1/resolve", b'{"output": "' + b"x" * 2_000_000 + b'"}'),
        ("POST", "/executions/E/steps/1/approve", b'{"approved": 1}'),
        ("POST", "/executions/E/steps/1/reject", b'{"message": "m", "code": ""}'),
        ("POST", "/executions/E/steps/1/reject", b'{"message": "' + b"m" * 1_100_000 + b'"}'),
        ("POST", "/executions/E/steps/99999999999999999999/resolve", b'{"output": 1}'),
        ("POST", "/executions/E/steps/-1/resolve", b'{"output": 1}'),
        ("POST", "/executions/E/steps/1/explode", b'{"output": 1}'),
        ("POST", "/executions/nope/steps/1/resolve", b'{"output": 1}'),
    ],
)
async def test_no_request_gets_a_500(
    tmp_path: Path, method: str, path: str, raw: bytes | None
) -> None:
    config = ServerConfig(port=0, log_level="warning", db=str(tmp_path / "l.sqlite3"))
    async with running_server(config) as running:
        ledger = running.app.state.ledger
        execution = await ledger.start_execution("s", '{"chatId":"c","messages":[]}', now=1.0)
        await ledger.record_step(
            execution.id, 0, "model", "m", "{}", "server", 1.0, result_json="{}"
        )
        await ledger.record_step(execution.id, 1, "tool", "t", "{}", "client", 1.0, "r" * 32)
        before = await ledger.steps(execution.id)
        reply = await http_json(
            running.host, running.port, method, path.replace("/E/", f"/{execution.id}/"),
            raw=raw if raw is not None else None,
        )  # fmt: skip
        assert reply.status in (404, 422), (reply.status, reply.body[:200])
        assert "message" in reply.json
        assert await ledger.steps(execution.id) == before
