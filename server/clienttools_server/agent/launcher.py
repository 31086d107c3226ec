"""The runs of this process: launched for a send, resumed after a restart or a takeover.

A chat request becomes one :class:`~clienttools_server.agent.runs.Run` and one
response (a :class:`~clienttools_server.agent.chunk_log.ChunkLog` that pages
subscribe to). A run's lease says which process runs it (S8): a run whose lease
lapsed is taken over and resumed here by replay; a run another process took
over stops here without a word to the page, whose response goes on there.

    runs = RunLauncher(config, ledger, agent, model, server_toolset, pages, proxy,
                       approvals, conversations, finished, clock=clock)
    await runs.start_run(connection, send_frame)   # answers on the connection's chat
    await runs.take_over_now()                     # resumes the runs whose lease lapsed
    runs.lease_lost(execution_id)                  # another process has it now
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from pydantic import JsonValue
from pydantic_ai import Agent
from pydantic_ai.models import Model

from clienttools.protocol import (
    AbortFrame,
    ErrorFrame,
    NoActiveFrame,
    ProtocolErrorFrame,
    ResumeFrame,
    SendFrame,
    ToolSpec,
    WireModel,
)

from ..calls.approvals import Approvals
from ..calls.delivery import Peer
from ..calls.pages import Client, Pages
from ..calls.proxy import CallProxy, StartedCall
from ..clock import Clock
from ..config import ServerConfig
from ..ledger import ChatBusy, Ledger, LedgerUnavailable, Step
from .chunk_log import Chunk, ChunkLog, FinishedResponses
from .conversations import OTHER_SESSION, Conversations, Refusal, ResponseRecorder
from .journal import CallTarget, RequestedCall
from .runs import Run, RunRequest
from .server_tools import ServerToolset

if TYPE_CHECKING:
    from ..cluster.shared_streams import SharedStreams

logger = logging.getLogger(__name__)

# The error text of a send for a chat whose response still streams (HTTP: 409).
BUSY = "a response is already streaming for this chat"


@dataclass(slots=True)
class ActiveRun:
    run: Run
    task: asyncio.Task[None]
    log: ChunkLog
    session: str


class RunLauncher:
    """Every run of this process, by execution id, and the responses they stream."""

    def __init__(
        self,
        config: ServerConfig,
        ledger: Ledger,
        agent: Agent[None, Any],
        model: Model,
        server_toolset: ServerToolset,
        pages: Pages,
        proxy: CallProxy,
        approvals: Approvals,
        conversations: Conversations,
        finished: FinishedResponses,
        *,
        clock: Clock,
    ) -> None:
        self.config = config
        self.ledger = ledger
        self.agent = agent
        self.model = model
        self.server_toolset = server_toolset
        self.pages = pages
        self.proxy = proxy
        self.approvals = approvals
        self.conversations = conversations
        self.finished = finished
        self.clock = clock
        self.runs: dict[str, ActiveRun] = {}
        # The chat streams across processes; set by the hub with a shared ledger.
        self.shared: SharedStreams | None = None
        self.closing = False

    def answering(self, execution_id: str) -> int | None:
        """The seq of the model answer the execution's run here is producing, if any."""
        active = self.runs.get(execution_id)
        return active.run.answering if active is not None else None

    async def close(self) -> None:
        """Stop every run; they stay resumable in the ledger."""
        self.closing = True
        tasks = [active.task for active in self.runs.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- run ownership (leases) -------------------------------------------------------

    async def take_over_now(self) -> list[str]:
        """Resume every unfinished run whose lease lapsed: it is this process's now.

        Replay does the rest: recorded steps are not asked for again, a pending
        call is delivered again to the session's page once one registers here.
        """
        resumed: list[str] = []
        for execution in await self.ledger.take_over(self.clock.now()):
            self.proxy.handed_over.discard(execution.id)
            if execution.id in self.runs:
                continue  # our own lease, renewed late: the run goes on as it was
            try:
                request = RunRequest.from_json(execution.request_json)
            except (ValueError, KeyError, TypeError):
                await self.ledger.set_status(
                    execution.id, "error", self.clock.now(), "its request could not be read"
                )
                continue
            logger.info(
                "resuming run %s of session %s (lease generation %d)",
                execution.id, execution.session, execution.generation,
            )  # fmt: skip
            # Its pages may not be back yet: the model is offered the tools they had.
            await self.pages.recall(execution.session)
            await self._launch(execution.id, execution.session, request)
            resumed.append(execution.id)
        return resumed

    async def renew_now(self) -> list[str]:
        """Renew the leases of this process's runs; stop those another process took over."""
        lost = await self.ledger.renew(self.clock.now())
        for execution_id in lost:
            self.lease_lost(execution_id)
        return lost

    def lease_lost(self, execution_id: str) -> None:
        """Another process owns the run now: stop it here without a word to the ledger or page.

        Its pending calls are not cancelled at the page (the new owner delivers
        them again and takes the page's results), and its response does not end
        here: it goes on where the run went.
        """
        self.proxy.handed_over.add(execution_id)
        active = self.runs.get(execution_id)
        if active is not None and not active.run.lost:
            logger.warning("run %s: lease lost, another process runs it now", execution_id)
            active.run.lost = True
            active.task.cancel()

    # -- launching --------------------------------------------------------------------

    async def start_run(self, client: Client, frame: SendFrame) -> None:
        session = self.pages.session(client.session)
        if frame.id in session.logs:
            client.send(_busy(frame))
            return
        # H1, H5 and the size limit: the stored history decides what the run answers.
        prepared = await self.conversations.prepare(
            client.session, frame.id, frame.trigger, frame.message_id, frame.messages
        )
        if isinstance(prepared, Refusal):
            client.send(_refused(frame, prepared))
            return
        request = RunRequest(frame.id, list[JsonValue](prepared.history))
        try:
            # H1: the run and the history it answers commit together.
            async with self.ledger.batch():
                execution = await self.ledger.start_execution(
                    client.session, request.to_json(), self.clock.now(), chat_id=frame.id
                )
                stored = await self.conversations.store_request(prepared, execution.id)
        except ChatBusy:  # it streams on another process
            client.send(_busy(frame))
            return
        except ValueError:
            client.send(
                ErrorFrame(request_id=frame.request_id, error_text="the request was not usable")
            )
            return
        if stored:
            await self.conversations.announce(frame.id)
        log = ChunkLog(frame.id)
        log.subscribe(frame.request_id, client.id, client.send, after=None)
        await self._launch(execution.id, client.session, request, log, fresh=True)

    async def _launch(
        self,
        execution_id: str,
        session_name: str,
        request: RunRequest,
        log: ChunkLog | None = None,
        *,
        fresh: bool = False,
    ) -> None:
        if log is None:
            log = await self._resumed_log(execution_id, request.chat_id)
        elif self.shared is not None:
            await self.shared.publish(execution_id, log)
        session = self.pages.session(session_name)
        session.logs[request.chat_id] = log
        # H2: the response's message is stored however the run goes (a replay too).
        recorder = self.conversations.recorder(
            session_name, execution_id, request, replayed=not fresh
        )
        run = Run(
            execution_id, request, self.ledger, self.agent, self.model,
            SessionTools(session_name, self.pages.session_specs, self.proxy, self.approvals),
            self.server_toolset, recorder.through(log.append),
            clock=self.clock.now, max_steps=self.config.max_steps, fresh=fresh,
            client_tools=self.config.client_tools, recorder=recorder,
        )  # fmt: skip
        task = asyncio.create_task(self._drive(run, log, session_name, recorder))
        self.runs[execution_id] = ActiveRun(run, task, log, session_name)

    async def _resumed_log(self, execution_id: str, chat_id: str) -> ChunkLog:
        """The log of a run resumed here: on a shared ledger it goes on from the chunks
        published by the process that had it, so pages keep their sequence numbers."""
        if self.shared is None:
            return ChunkLog(chat_id)
        published: list[Chunk] = []
        ended = False
        try:
            published, ended = await self.shared.published(execution_id)
        except LedgerUnavailable as exc:
            logger.warning("run %s: its response so far could not be read: %s", execution_id, exc)
            ended = True  # publish nothing: it would number the response again from 0
        log = ChunkLog(chat_id, published)
        await self.shared.publish(execution_id, log, ended=ended, taken=True)
        return log

    async def _drive(
        self, run: Run, log: ChunkLog, session_name: str, recorder: ResponseRecorder
    ) -> None:
        try:
            await run.execute()
        finally:
            try:
                ended = (not self.closing or run.aborted or run.ended) and not run.lost
                # Stored before the end goes out: a page that sees the end finds the
                # final message stored (H2). Not at shutdown or once lost: the run
                # goes on (after a restart, or on another process) and stores it there.
                await recorder.close(final=ended)
                self.runs.pop(run.execution_id, None)
                session = self.pages.sessions.get(session_name)
                if session is not None:
                    if session.logs.get(log.chat_id) is log:
                        del session.logs[log.chat_id]
                    self.pages.forget_if_idle(session)
                # At shutdown the response is not over: the page resumes it from
                # the restarted server instead of seeing it end. Nor is it when
                # another process took the run over: it goes on there.
                if ended:
                    log.finish()
                    self.finished.keep(session_name, log)
                    if self.shared is not None:
                        # While the lease is held: its end is written fenced.
                        await self.shared.drained(run.execution_id)
                elif run.lost and self.shared is not None:
                    await self.shared.lost(run.execution_id, session_name, log)
            finally:
                self.ledger.release(run.execution_id)

    # -- following and stopping a response ---------------------------------------------

    async def resume(self, client: Client, frame: ResumeFrame) -> None:
        """S7; and a resume that names ``lastSequence`` also reaches a response that just ended.

        Such a page was following the response and lost its socket (a server
        restart, a network drop) just before the end. The result that finished
        the run may arrive first (the page's own outbox re-sends it before its
        chat resumes, C11), so without this the page would get ``no-active`` and
        keep a truncated message. A resume without ``lastSequence`` asks what is
        streaming now, and a finished response is not.
        """
        if await self.conversations.owned_elsewhere(client.session, frame.id):
            client.send(ProtocolErrorFrame(message=OTHER_SESSION, request_id=frame.request_id))
            return
        session = self.pages.sessions.get(client.session)
        log = session.logs.get(frame.id) if session is not None else None
        if log is None and self.shared is not None:
            # Not streaming here: the shared record knows where it streams (or
            # streamed: it keeps the ended ones for the grace too).
            await self.shared.resume(client, frame)
            return
        if log is None and frame.last_sequence is not None:
            log = self.finished.get(client.session, frame.id)
        if log is None:
            client.send(NoActiveFrame(request_id=frame.request_id))
            return
        log.subscribe(frame.request_id, client.id, client.send, after=frame.last_sequence)

    async def abort(self, client: Client, frame: AbortFrame) -> None:
        for active in self.runs.values():
            if active.session == client.session and frame.request_id in active.log.request_ids:
                if active.run.abort():
                    active.task.cancel()
                return
        if self.shared is not None:
            await self.shared.abort(client, frame)  # a response followed here, run elsewhere

    async def abort_chat(self, session_name: str, chat_id: str) -> bool:
        """Abort the run streaming for a chat, here or on another process; False if none.

        What a page without a chat socket asks (the HTTP transport): by chat,
        not by the request that started it, which may be gone.
        """
        for active in self.runs.values():
            if active.session == session_name and active.log.chat_id == chat_id:
                if active.run.lost:
                    break  # another process runs it now
                if not active.run.abort():
                    return False  # it is ending: nothing streams any more
                active.task.cancel()
                return True
        if self.shared is not None:
            return await self.shared.abort_chat(session_name, chat_id)
        return False

    def abort_run(self, execution_id: str) -> bool:
        """Abort a run of this process (a page aborted it on another one); False if none."""
        active = self.runs.get(execution_id)
        if active is None or active.run.lost or not active.run.abort():
            return False
        active.task.cancel()
        return True


class SessionTools:
    """What a run of one session reaches: its pages' tools, the browser-call proxy, approvals."""

    def __init__(
        self,
        session: str,
        specs: Callable[[str], Awaitable[dict[str, ToolSpec]]],
        proxy: CallProxy,
        approvals: Approvals,
    ) -> None:
        self.session = session
        self._specs = specs
        self._proxy = proxy
        self._approvals = approvals

    async def specs(self) -> dict[str, ToolSpec]:
        return await self._specs(self.session)

    async def run_client_tool(self, step: Step, call: RequestedCall) -> Step | None:
        return await self._proxy.call(self.session, step, call)

    async def find_target(self, tool_name: str) -> Peer | None:
        return await self._proxy.find_peer(self.session, tool_name)

    async def start_client_tool(
        self, step: Step, call: RequestedCall, target: CallTarget | None
    ) -> StartedCall:
        # The target is the Peer find_target returned.
        return await self._proxy.start(self.session, step, call, cast("Peer | None", target))

    async def await_approval(self, step: Step, call: RequestedCall) -> None:
        await self._approvals.wait(self.session, step, call)


def _refused(frame: SendFrame, refusal: Refusal) -> WireModel:
    if refusal.protocol:
        return ProtocolErrorFrame(message=refusal.message, request_id=frame.request_id)
    return ErrorFrame(request_id=frame.request_id, error_text=refusal.message)


def _busy(frame: SendFrame) -> ErrorFrame:
    return ErrorFrame(request_id=frame.request_id, error_text=BUSY)
