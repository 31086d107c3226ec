"""The browser-call proxy when its ledger suspends: interleavings only a shared store allows.

On SQLite the ledger's coroutines never suspend, so nothing runs between a
read and the write after it; on PostgreSQL every call awaits the database and
other frames, timers and notifications run meanwhile. These tests give the
proxy a ledger that suspends where PostgreSQL would (a fake, to place the
interleaving exactly) and check that the call still reaches its page and the
run still wakes.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from clienttools.protocol import (
    InvokeFrame,
    ResultAckFrame,
    ToolApprovalFrame,
    ToolResultFrame,
    ToolSpec,
    WireModel,
)
from clienttools_server.agent.journal import RequestedCall
from clienttools_server.calls.approvals import Approvals
from clienttools_server.calls.proxy import CallProxy, DeliveryState
from clienttools_server.config import ServerConfig
from clienttools_server.ledger import Outcome, SqliteLedger, Step


def pending_step(resolution: str = "client") -> Step:
    return Step(
        "run-1", 1, "tool", "t", "{}", resolution, "pending",  # type: ignore[arg-type]
        None, None, "r" * 32, 0, 0.0, 0.0, "{}",
    )  # fmt: skip


@dataclass
class SlowLedger:
    """Writes that take a while, as a database's round trips do."""

    owner: str = "this-process"
    attempts: int = 0
    marked: bool = False

    async def add_attempt(self, *args: object, **kwargs: object) -> int:
        await asyncio.sleep(0.005)
        self.attempts += 1
        return self.attempts

    async def record_spec(self, *args: object) -> None:
        await asyncio.sleep(0)

    def after_commit(self, action: object) -> None:
        action()  # type: ignore[operator]

    async def mark_approval(self, *args: object) -> None:
        await asyncio.sleep(0.01)
        self.marked = True

    async def approval_step(self, session: str, tool_call_id: str) -> None:
        return None

    async def resolve(self, *args: object) -> Outcome:
        return Outcome(True, "applied", "settled")

    async def reject(self, *args: object) -> Outcome:
        return Outcome(True, "applied", "settled")


@dataclass(eq=False)
class Page:
    id: str
    session: str = "s1"
    client_id: str | None = "page-1"
    is_open: bool = True
    sent: list[WireModel] = field(default_factory=list)

    def send(self, frame: WireModel) -> None:
        self.sent.append(frame)

    def tool_spec(self, name: str) -> ToolSpec | None:
        return ToolSpec(name=name, description="a tool", input_schema={"type": "object"})


async def test_a_delivery_overtaken_while_it_read_the_registrations_does_not_park_the_call() -> (
    None
):
    # The page's old socket A closes, and the read of the registrations that its
    # re-delivery makes is slow; meanwhile the page's new socket B registers and
    # delivers the call. The slow read, answering "no page" from before B, must not
    # undo B's delivery.
    old, new = Page("A"), Page("B")
    registered: dict[str, Page | None] = {"page": old}

    async def find_peer(session: str, tool: str) -> Page | None:
        seen = registered["page"]
        await asyncio.sleep(0.01 if seen is None else 0.001)
        return seen

    tools = CallProxy(SlowLedger(), ServerConfig(port=0), find_peer, durable=True)  # type: ignore[arg-type]
    started = await tools.start("s1", pending_step(), RequestedCall("call-1", "t", {}))
    entry = started.entry
    assert [type(f) for f in old.sent] == [InvokeFrame]
    old.is_open = False
    registered["page"] = None
    closing = asyncio.create_task(tools.on_disconnect(old))
    await asyncio.sleep(0.002)
    registered["page"] = new
    await asyncio.gather(closing, tools.on_registered(new))
    assert entry.state is DeliveryState.DELIVERED and entry.target is new
    assert [type(f) for f in new.sent] == [InvokeFrame]
    assert entry.timers == 2
    await started.abandon()
    await tools.close()


async def test_an_approval_answered_while_its_mark_is_written_wakes_the_run() -> None:
    ledger = SlowLedger()
    approvals = Approvals(ledger, shared=True)  # type: ignore[arg-type]
    waiting = asyncio.create_task(
        approvals.wait("s1", pending_step("approval"), RequestedCall("call-1", "t", {}))
    )
    await asyncio.sleep(0.001)  # the mark is being written
    assert not ledger.marked
    frame = ToolApprovalFrame(tool_call_id="call-1", approved=True)
    problem = await approvals.on_approval(Page("A"), frame)  # type: ignore[arg-type]
    assert problem is None
    await asyncio.wait_for(waiting, 1)


async def test_a_result_that_comes_before_the_replayed_call_registers_still_wakes_the_run() -> None:
    # A run taken over from another process replays its pending call: it reads the
    # step (pending), and only then registers the call. The page's result comes in
    # between: no entry, so it is applied to the ledger alone. The call then
    # registers and delivers again; the page sends its stored result once more,
    # which finds the step settled: the run must wake, not wait for ever.
    async with SqliteLedger(":memory:") as ledger:
        execution = await ledger.start_execution("s1", '{"messages":[]}', 1.0)
        step = await ledger.record_step(
            execution.id, 0, "tool", "t", "{}", "client", 1.0, request_id="r" * 32
        )
        page = Page("A")

        async def find_peer(session: str, tool: str) -> Page:
            return page

        tools = CallProxy(ledger, ServerConfig(port=0), find_peer, durable=True)  # type: ignore[arg-type]
        result = ToolResultFrame(request_id="r" * 32, output={"ok": True})
        first = await tools.results.on_result(page, result)  # type: ignore[arg-type]
        assert first.outcome == "applied"
        started = await tools.start("s1", step, RequestedCall("call-1", "t", {}))
        assert [type(f) for f in page.sent] == [InvokeFrame]
        again = await tools.results.on_result(page, result)  # type: ignore[arg-type]
        assert isinstance(again, ResultAckFrame) and again.outcome == "duplicate"
        settled = await asyncio.wait_for(started.wait(), 1)
        assert settled is not None and settled.state == "applied"
        assert started.entry.state is DeliveryState.APPLIED
        await tools.close()


async def test_a_run_handed_over_to_another_process_delivers_nothing_here() -> None:
    # The lease was lost: the new owner delivers the call. A page that registers
    # here afterwards gets no invoke from this process, and no attempt is written.
    ledger = SlowLedger()
    old, new = Page("A"), Page("B")
    registered: dict[str, Page] = {"page": old}

    async def find_peer(session: str, tool: str) -> Page:
        return registered["page"]

    tools = CallProxy(ledger, ServerConfig(port=0), find_peer, durable=True)  # type: ignore[arg-type]
    started = await tools.start("s1", pending_step(), RequestedCall("call-1", "t", {}))
    assert ledger.attempts == 1
    tools.handed_over.add("run-1")
    old.is_open = False
    registered["page"] = new
    await tools.on_registered(new)
    await tools.relay.registered_elsewhere("s1")
    assert new.sent == [] and ledger.attempts == 1
    await started.abandon()
    await tools.close()
