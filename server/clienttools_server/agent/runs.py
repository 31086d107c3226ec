"""Runs: one chat request is one pydantic-ai agent run, streamed as one response (S6, S8).

The run's agent gets the session's page tools (:mod:`.page_tools`) next to its
own tools and the server tools; its model and its server-side tools are
journaled in the ledger (:mod:`.journal`), so ``execute`` is safe to call
again after a restart: recorded steps are replayed, the rest runs. The chunks
the page receives come from the run's events (:mod:`.chunks`). This module
knows nothing of WebSockets: chunks leave through ``emit``.

    run = Run(execution.id, request, ledger, agent, model, pages, server_tools, log.append,
              clock=clock.now)
    await run.execute()   # emits start ... finish; marks the execution completed
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from pydantic import JsonValue
from pydantic_ai import Agent, DeferredToolRequests, RunContext
from pydantic_ai.exceptions import UnexpectedModelBehavior, UsageLimitExceeded, UserError
from pydantic_ai.models import Model
from pydantic_ai.toolsets import AbstractToolset, FunctionToolset, ToolsetTool
from pydantic_ai.toolsets.combined import CombinedToolset
from pydantic_ai.toolsets.wrapper import WrapperToolset
from pydantic_ai.usage import UsageLimits
from pydantic_core import to_jsonable_python

from clienttools.protocol import ToolSpec

from ..canonical import canonical_json
from ..config import ClientToolsMode
from ..ledger import (
    Divergence,
    InvalidTransition,
    LeaseLost,
    Ledger,
    UnknownExecution,
)
from .chunks import ChunkWriter
from .history import history_from_ui
from .journal import Emit, JournaledModel, JournaledToolset, PageCalls, RunFailed, RunJournal
from .page_tools import PageToolset

logger = logging.getLogger(__name__)


class ResponseStore(Protocol):
    """What stores the response's message (H2): its last state commits with the run's end."""

    async def flush(self) -> None:
        """Finish the saves along the way (before the batch that ends the run)."""

    async def store_final(self) -> None:
        """Store the last state, inside that batch; never raises."""


class SessionPages(PageCalls, Protocol):
    """What a run needs of its session: the page tools it may call and how to call them."""

    async def specs(self) -> Mapping[str, ToolSpec]: ...


def combined(toolsets: list[AbstractToolset[Any]]) -> AbstractToolset[Any]:
    """The toolsets as one, leaving out function toolsets that offer nothing.

    An agent built without tools still has its (empty) function toolset, and a
    ``CombinedToolset`` of more than one runs each of its calls (``for_run_step``,
    ``get_tools``, the instructions: three a model step) in an anyio task group of
    its own, about 0.1 ms of CPU each. A plain function toolset with no tools and
    no instructions adds nothing to a run, so it is left out (a subclass that
    offers tools another way stays), and a single toolset is used as it is.
    """
    offering = [toolset for toolset in toolsets if not _offers_nothing(toolset)]
    if len(offering) == 1:
        return offering[0]
    return CombinedToolset(offering)


@dataclass
class RunToolset(WrapperToolset[Any]):
    """What a run offers the model, as one toolset: its own tools (``wrapped``, the
    agent's and the server's, journaled) and then the page's.

    pydantic-ai puts the run's toolsets in a ``CombinedToolset`` beside the agent's
    function toolset, which runs each of its calls in a task group with a task per
    toolset (a gather of three costs 64 µs here, of two 48 µs): handed one toolset
    for both, a chat of one page call starts 16 tasks where it started 23. The
    page's toolset is asked after the run's own, and is the same at every step.
    """

    page: PageToolset

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        tools = await self.wrapped.get_tools(ctx)
        for name, tool in (await self.page.get_tools(ctx)).items():
            if name in tools:
                raise UserError(f"a page tool is named {name!r} like a tool of the server")
            tools[name] = tool
        return tools

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any]
    ) -> Any:
        toolset = self.page if tool.toolset is self.page else self.wrapped
        return await toolset.call_tool(name, tool_args, ctx, tool)

    def apply(self, visitor: Callable[[AbstractToolset[Any]], None]) -> None:
        self.wrapped.apply(visitor)
        self.page.apply(visitor)


# What a FunctionToolset offers a run comes from these methods (pydantic-ai 2.68).
_OFFERING = ("for_run", "for_run_step", "get_tools", "get_instructions")


def _offers_nothing(toolset: AbstractToolset[Any]) -> bool:
    # A subclass that overrides one of them may offer tools it does not hold.
    own_methods = all(getattr(type(toolset), m) is getattr(FunctionToolset, m) for m in _OFFERING)
    return (
        isinstance(toolset, FunctionToolset)
        and own_methods
        and not toolset.tools
        and not toolset._instructions  # no public way to ask
    )


@dataclass(frozen=True, slots=True)
class RunRequest:
    """What started a run, stored with the execution so it can be re-run after a restart."""

    chat_id: str
    messages: list[JsonValue]

    def to_json(self) -> str:
        return canonical_json({"chatId": self.chat_id, "messages": self.messages})

    @classmethod
    def from_json(cls, text: str) -> RunRequest:
        raw = json.loads(text)
        return cls(chat_id=str(raw["chatId"]), messages=list(raw["messages"]))


def _cause(exc: BaseException) -> BaseException:
    """The first LeaseLost, Divergence or RunFailed inside an exception group, else the group."""
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _cause(inner)
            if isinstance(found, LeaseLost | Divergence | RunFailed):
                return found
    return exc


class Run:
    """One execution of the agent; ``execute`` is safe to call again after a restart."""

    def __init__(
        self,
        execution_id: str,
        request: RunRequest,
        ledger: Ledger,
        agent: Agent[None, Any],
        model: Model,
        pages: SessionPages,
        server_tools: AbstractToolset[Any],
        emit: Emit,
        *,
        clock: Callable[[], float],
        max_steps: int = 16,
        fresh: bool = False,
        client_tools: ClientToolsMode = "rpc",
        recorder: ResponseStore | None = None,
    ) -> None:
        self.execution_id = execution_id
        self.request = request
        self.ledger = ledger
        self.agent = agent
        self.model = model
        self.pages = pages
        self.server_tools = server_tools
        self.emit = emit
        self.clock = clock
        self.max_steps = max_steps
        # The execution was just started, so it has no steps to replay yet.
        self.fresh = fresh
        self.client_tools = client_tools
        self.recorder = recorder
        # Set by whoever cancels the task for an abort; a cancel without it is a
        # shutdown, which leaves the execution resumable.
        self.aborted = False
        # Set once another process took the run over (its lease lapsed here): the
        # run stops without writing or emitting anything more.
        self.lost = False
        # Set once the run's last chunk (finish, error) went out: its end is then
        # written whole, and an abort comes too late.
        self.ending = False
        # Set once that end is written (or the run was found finished otherwise).
        self.ended = False
        self.journal: RunJournal | None = None

    def abort(self) -> bool:
        """Mark the run aborted, for the task's cancel to stop it; False once it is
        ending (its finish or error went out): nothing is left to abort."""
        if self.ending:
            return False
        self.aborted = True
        return True

    @property
    def answering(self) -> int | None:
        """The seq of the model step being streamed: it has no record until the answer is in."""
        return self.journal.answering if self.journal is not None else None

    async def execute(self) -> None:
        try:
            await self._run()
        except asyncio.CancelledError:
            if self.aborted:
                self.emit({"type": "abort", "reason": "aborted by the client"})
                await self._finish_status("error", "aborted")
            raise
        except BaseException as raised:
            exc = _cause(raised)
            if isinstance(exc, LeaseLost):
                logger.warning("run %s stopped: %s", self.execution_id, exc)
                self.lost = True
            elif isinstance(exc, Divergence):
                logger.warning("%s", exc)
                await self._fail(
                    f"the run diverged from its record at step {exc.seq} "
                    f"(recorded {exc.recorded.name!r}, asked {exc.name!r}) and was stopped"
                )
            elif isinstance(exc, RunFailed):
                await self._fail(str(exc))
            elif isinstance(exc, UnexpectedModelBehavior):
                logger.warning("run %s: %s", self.execution_id, exc)
                await self._fail(f"the model failed: {exc.message}")
            elif isinstance(exc, Exception):
                logger.exception("run %s failed", self.execution_id)
                await self._fail("the server failed to complete this response")
            else:
                raise

    async def _fail(self, message: str) -> None:
        self.emit({"type": "error", "errorText": message})
        await self._finish_status("error", message)

    async def _finish_status(
        self, status: Literal["completed", "error"], error: str | None
    ) -> None:
        self.ending = True
        # A cancel now (a shutdown, say) waits for the end to be written: cut short,
        # the batch would commit the status without the last answer and the
        # message's last state.
        end = asyncio.ensure_future(self._write_end(status, error))
        cancelled = False
        while True:  # however many cancels come
            try:
                await asyncio.shield(end)
            except asyncio.CancelledError:
                if end.cancelled():
                    raise
                cancelled = True
                continue
            except Exception as exc:
                if not cancelled:
                    raise
                logger.warning("run %s: its end was not written: %s", self.execution_id, exc)
            break
        if cancelled:
            raise asyncio.CancelledError

    async def _write_end(self, status: Literal["completed", "error"], error: str | None) -> None:
        recorder = self.recorder
        if recorder is not None:
            await recorder.flush()
        # Finished otherwise already (expired, say), or not in the ledger: nothing to do.
        with contextlib.suppress(InvalidTransition, UnknownExecution):
            # The end, the last answer's step and the message's last state commit
            # together (H2). The status goes first: a refusal (the lease lost, say)
            # then stores nothing at all. A database error in the save takes the end
            # back with it: the run, no longer held here, is taken over once its
            # lease lapses and ends again (its last answer asked for again).
            async with self.ledger.batch():
                await self.ledger.set_status(self.execution_id, status, self.clock(), error)
                if self.journal is not None:
                    await self.journal.write_answer()
                if recorder is not None:
                    await recorder.store_final()
        self.ended = True

    async def _finish(self, reason: str) -> None:
        self.emit({"type": "finish", "finishReason": reason})
        await self._finish_status("completed", None)

    def _message_id(self) -> str:
        """The id of the assistant message this response builds.

        A request whose last message is the assistant's (a round-trip
        continuation carrying tool outputs) continues that message, as the AI
        SDK's own servers do; otherwise the message is new.
        """
        last = self.request.messages[-1] if self.request.messages else None
        if isinstance(last, dict) and last.get("role") == "assistant":
            message_id = last.get("id")
            if isinstance(message_id, str) and message_id:
                return message_id
        return f"msg-{self.execution_id}"

    async def _run(self) -> None:
        recorded = [] if self.fresh else await self.ledger.steps(self.execution_id)
        journal = self.journal = RunJournal(
            self.execution_id, self.ledger, self.pages, self.emit, self.clock, recorded=recorded
        )
        writer = ChunkWriter(journal)
        self.emit({"type": "start", "messageId": self._message_id()})
        round_trip = self.client_tools == "round-trip"
        own = JournaledToolset(combined([*self.agent.toolsets, self.server_tools]), journal)
        tools = RunToolset(own, PageToolset(self.pages, journal, deferred=round_trip))
        output_type: Any = [str, DeferredToolRequests] if round_trip else None
        try:
            with self.agent.override(tools=[], toolsets=[tools]):
                async with self.agent.iter(
                    message_history=history_from_ui(self.request.messages),
                    model=JournaledModel(self.model, journal),
                    output_type=output_type,
                    usage_limits=UsageLimits(request_limit=self.max_steps),
                ) as run:
                    async for node in run:
                        if Agent.is_model_request_node(node):
                            async with node.stream(run.ctx) as stream:
                                self.emit({"type": "start-step"})
                                async for event in stream:
                                    writer.model_event(event)
                        elif Agent.is_call_tools_node(node):
                            async with node.stream(run.ctx) as tool_stream:
                                async for event in tool_stream:
                                    writer.tool_event(event)
                            await journal.release_uncalled()
                            self.emit({"type": "finish-step"})
                            await journal.check_alive()
            result = run.result
        except UsageLimitExceeded:
            await self._finish("length")
            return
        except UserError as exc:
            raise RunFailed(f"the agent could not run: {exc}") from exc
        finally:
            await journal.abandon_started()
        output = result.output if result is not None else None
        if output is not None and not isinstance(output, str | DeferredToolRequests):
            # A structured output: the page shows it as text (JSON).
            text = json.dumps(to_jsonable_python(output), ensure_ascii=False)
            self.emit({"type": "start-step"})
            self.emit({"type": "text-start", "id": "output"})
            self.emit({"type": "text-delta", "id": "output", "delta": text})
            self.emit({"type": "text-end", "id": "output"})
            self.emit({"type": "finish-step"})
        await self._finish("tool-calls" if isinstance(output, DeferredToolRequests) else "stop")
