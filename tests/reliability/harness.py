"""The pieces every scenario uses: a counting page, a chat peer, transcripts and their checks.

    page = await Page.open(proxy.url("/agents/chat/s1"))      # the real ToolClient, native adapter
    chat = await ChatPeer.open(server.ws_url("s1"))            # a direct socket: never faulted
    response = await chat.ask(prompt_for("r1", [1, 2]))        # two parallel `work` calls
    report = check_response(response, page, "r1", [1, 2], baseline)
    scenario.add_call(...) for each call in report

The page is a `ToolClient` whose one tool, `work`, counts how often each
(tag, n) ran; its output depends on `n` only, so a run with another tag is
the undisturbed twin of a faulted one. The chat peer talks to the server
directly (not through the fault proxy), so faults hit the page's socket only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from clienttools.client import ToolClient
from clienttools.native import NativeConnector
from clienttools_server.app import RunningServer, running_server
from clienttools_server.config import ServerConfig
from tests.reliability.results import Scenario
from tests.server.server_harness import ChunkCollector, FakeBrowser, Response
from tests.support.faultproxy import FaultProxy, Rule, drop
from tests.support.wait import wait_until

INVOKE = "cf_agent_client_tool_invoke"
RESULT = "cf_agent_client_tool_result"
ACK = "cf_agent_client_tool_result_ack"
CANCEL = "cf_agent_client_tool_cancel"
OUTPUT_CHUNKS = ("tool-output-available", "tool-output-error", "tool-output-denied")

# Generous: other test runs share this 2-core machine.
RESPONSE_TIMEOUT = 60.0


class Page:
    """A ToolClient hosting the counting `work` tool."""

    def __init__(self, client: ToolClient) -> None:
        self.client = client
        self.executions: Counter[tuple[str, int]] = Counter()
        self.running: set[tuple[str, int]] = set()
        self.finished: set[tuple[str, int]] = set()
        self.cancelled: set[tuple[str, int]] = set()

    @classmethod
    async def open(
        cls, url: str, *, client_id: str | None = None, connect: bool = True, **options: Any
    ) -> Page:
        # compression=None: the fault proxy must read every payload (it strips the offer anyway).
        client = ToolClient(
            url,
            connector=NativeConnector(compression=None),
            connect_timeout=10.0,
            client_id=client_id,
            **options,
        )
        page = cls(client)

        @client.tool(name="work")
        async def work(n: int, tag: str = "", ms: int = 0) -> dict[str, int]:
            """Count this run, sleep `ms` milliseconds, return n and its square."""
            key = (tag, n)
            page.executions[key] += 1
            page.running.add(key)
            try:
                if ms:
                    await asyncio.sleep(ms / 1000)
            except asyncio.CancelledError:
                page.cancelled.add(key)
                raise
            finally:
                page.running.discard(key)
            page.finished.add(key)
            return {"n": n, "sq": n * n}

        if connect:
            await client.connect()
        return page

    def outbox_empty(self) -> bool:
        return not self.client.session.outbox()

    async def settle(self, timeout: float = 30.0) -> None:
        """Wait until every result of this page was acknowledged (C11: nothing left to resend)."""
        await wait_until(self.outbox_empty, timeout, "the page's outbox to empty")

    async def close(self) -> None:
        await self.client.close()


class ChatPeer:
    """The chat side: sends `send` frames and reads whole responses (a FakeBrowser underneath)."""

    def __init__(self, browser: FakeBrowser, session: str = "") -> None:
        self.browser = browser
        self.session = session
        self._chats = 0

    @classmethod
    async def open(cls, url: str) -> ChatPeer:
        session = url.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
        return cls(await FakeBrowser.connect(url, ChunkCollector()), session)

    def next_chat_id(self) -> str:
        # A chat id belongs to the session that used it first (H5): each session's own.
        self._chats += 1
        return f"chat-{self._chats}-{self.session}" if self.session else f"chat-{self._chats}"

    async def start(self, prompt: str) -> str:
        return await self.browser.start_chat(prompt, self.next_chat_id())

    async def response(self, request_id: str, timeout: float = RESPONSE_TIMEOUT) -> Response:
        return await self.browser.response(request_id, timeout)

    async def ask(self, prompt: str, timeout: float = RESPONSE_TIMEOUT) -> Response:
        return await self.response(await self.start(prompt), timeout)

    @property
    def violations(self) -> list[str]:
        return self.browser.violations

    async def close(self) -> None:
        await self.browser.close()


def prompt_for(tag: str, numbers: Sequence[int], ms: Callable[[int], int] | None = None) -> str:
    """One `call work {...}` line per number: parallel calls in one model step."""
    lines = []
    for n in numbers:
        tool_input: dict[str, Any] = {"n": n, "tag": tag}
        if ms is not None:
            tool_input["ms"] = ms(n)
        lines.append("call work " + json.dumps(tool_input, separators=(",", ":")))
    return "\n".join(lines)


@dataclass
class Transcript:
    """What the user sees of a response: the assistant's text and each call's outcome in order."""

    text: str
    outcomes: list[tuple[str, Any]]
    final: str

    def lines(self) -> list[str]:
        return self.text.split("\n")


@dataclass
class CallReport:
    tool_call_id: str
    n: int | None
    settlements: int
    executions: int


@dataclass
class ResponseReport:
    transcript: Transcript
    calls: list[CallReport] = field(default_factory=list)


def transcript_of(response: Response) -> Transcript:
    """Text plus (toolName, output or "error: <code>") of each call, in call order.

    Call order, not arrival order: parallel calls finish in any order, and the
    assistant's text (one line per call, in call order) is what the user reads.
    """
    order = [c["toolCallId"] for c in response.of_type("tool-input-available")]
    names = {c["toolCallId"]: c["toolName"] for c in response.of_type("tool-input-available")}
    found: dict[str, Any] = {}
    for chunk in response.chunks:
        call_id = chunk.get("toolCallId")
        if chunk["type"] == "tool-output-available":
            found.setdefault(call_id, chunk["output"])
        elif chunk["type"] == "tool-output-error":
            found.setdefault(call_id, "error: " + str(chunk.get("errorText", "")).split(":", 1)[0])
        elif chunk["type"] == "tool-output-denied":
            found.setdefault(call_id, "denied")
    outcomes = [(names[call_id], found.get(call_id, "missing")) for call_id in order]
    return Transcript(response.text, outcomes, response.final["type"])


def report_of(response: Response, page: Page, tag: str) -> ResponseReport:
    """Per call of the response: how often it settled (output chunks) and ran on the page."""
    settled: Counter[str] = Counter(
        c["toolCallId"] for c in response.chunks if c["type"] in OUTPUT_CHUNKS
    )
    report = ResponseReport(transcript_of(response))
    for chunk in response.of_type("tool-input-available"):
        n = chunk["input"].get("n") if isinstance(chunk["input"], dict) else None
        runs = page.executions[(tag, n)] if isinstance(n, int) else 0
        report.calls.append(CallReport(chunk["toolCallId"], n, settled[chunk["toolCallId"]], runs))
    return report


class Spy:
    """A fault-proxy rule that never fires but sees every frame: records acks and cancels.

    A matcher that returns False lets the frame through untouched, so a Spy
    placed first observes what later rules act on.
    """

    def __init__(self) -> None:
        self.acks: dict[str, list[str]] = {}
        self.cancels: dict[str, list[str]] = {}
        self.invokes: dict[str, list[int]] = {}

    def rule(self) -> Rule:
        return Rule("down", self._see, drop(), times=None)

    def _see(self, frame: dict[str, Any] | None, payload: bytes) -> bool:
        if frame is None or not isinstance(frame.get("requestId"), str):
            return False
        rid = frame["requestId"]
        if frame.get("type") == ACK:
            self.acks.setdefault(rid, []).append(str(frame.get("outcome")))
        elif frame.get("type") == CANCEL:
            self.cancels.setdefault(rid, []).append(str(frame.get("reason")))
        elif frame.get("type") == INVOKE:
            self.invokes.setdefault(rid, []).append(int(frame.get("attempt", 0)))
        return False

    def applied_twice(self) -> list[str]:
        """requestIds the server acknowledged as `applied` more than once (a double settlement)."""
        return [rid for rid, outcomes in self.acks.items() if outcomes.count("applied") > 1]


def spy_first(rules: list[Rule], spy: Spy) -> None:
    """Put the spy's rule before every other rule (rules are tried in insertion order)."""
    rules.insert(0, spy.rule())


@dataclass
class Stack:
    """The real server, the fault proxy before it, a page behind the proxy, a chat peer."""

    server: RunningServer
    proxy: FaultProxy
    page: Page
    chat: ChatPeer
    spy: Spy


@contextlib.asynccontextmanager
async def faulted_stack(config: ServerConfig, session: str) -> AsyncIterator[Stack]:
    """A Stack on `session`; on exit, asserts no sequence violation and no proxy error."""
    async with running_server(config) as server, FaultProxy("127.0.0.1", server.port) as proxy:
        spy = Spy()
        spy_first(proxy.rules, spy)
        page = await Page.open(proxy.url(f"/agents/chat/{session}"))
        chat = await ChatPeer.open(server.ws_url(session))
        try:
            yield Stack(server, proxy, page, chat, spy)
        finally:
            await chat.close()
            await page.close()
        assert not chat.violations, chat.violations
        assert not proxy.errors, proxy.errors


async def fuzz_beside_calls(
    server: RunningServer,
    scenario: Scenario,
    cases: Sequence[bytes],
    send_case: Callable[[bytes, int], Awaitable[None]],
) -> None:
    """Send every case while another session keeps calling page tools, and once after.

    Each of the bystander's calls must come out as asked: what the fuzzing does
    to one session must not touch another. Counts the cases sent on ``scenario``.
    """
    page = await Page.open(server.ws_url("calm"))
    chat = await ChatPeer.open(server.ws_url("calm"))
    done = asyncio.Event()

    async def bystander() -> None:
        index = 0
        while True:
            last = done.is_set()
            numbers = [index * 2, index * 2 + 1]
            tag = f"calm-{index}"
            report = report_of(await chat.ask(prompt_for(tag, numbers)), page, tag)
            expected = [("work", {"n": n, "sq": n * n}) for n in numbers]
            for call in report.calls:
                scenario.add_call(settlements=call.settlements, executions=call.executions)
            scenario.add_transcript(report.transcript.outcomes == expected)
            assert report.transcript.outcomes == expected, report.transcript
            index += 1
            if last:
                return

    calls = asyncio.create_task(bystander())
    try:
        for index, wire in enumerate(cases):
            await send_case(wire, index)
            scenario.cases += 1
            if calls.done():
                break
        done.set()
        await asyncio.wait_for(calls, 60)
    finally:
        done.set()
        await chat.close()
        await page.close()
        if not calls.done():
            calls.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await calls
