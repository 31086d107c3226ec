"""The ledger as the durable journal of a pydantic-ai run (S6, S8).

Every non-deterministic thing a run does is a ledger step with its ``seq``:
each model request (``model``), each tool call (``tool``) and the approval in
front of a ``needsApproval`` call (``approval:NAME``). :class:`JournaledModel`
wraps the run's model and :class:`JournaledToolset` the server-side tools, the
way pydantic-ai's durable integrations wrap them; the page toolset settles its
calls through the same :class:`RunJournal`. Re-running an execution replays
recorded steps instead of asking the model or a page again, and a step that
asks for something other than its record raises :class:`~clienttools_server.ledger.Divergence`
naming the step.

A model step is written once, with its answer, in one ledger transaction with
the tool steps it asks for and the first delivery of its browser calls; a crash
while the model is still answering re-asks the model on replay. An answer that
asks for nothing more (the run's last, mostly) is written with what follows it:
the next model step, or the run's end, in the transaction that ends the run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias

from pydantic import JsonValue
from pydantic_ai import ModelRetry, RunContext, ToolDenied
from pydantic_ai.exceptions import ToolFailed
from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart
from pydantic_ai.models import ModelRequestParameters, StreamedResponse
from pydantic_ai.models.function import (
    AgentInfo,
    DeltaThinkingCalls,
    DeltaThinkingPart,
    DeltaToolCall,
    DeltaToolCalls,
    FunctionModel,
)
from pydantic_ai.models.wrapper import WrapperModel
from pydantic_ai.settings import ModelSettings
from pydantic_ai.toolsets import ToolsetTool
from pydantic_ai.toolsets.wrapper import WrapperToolset
from pydantic_core import to_jsonable_python

from clienttools.protocol import ToolSpec

from ..canonical import canonical_json
from ..ledger import Ledger, Resolution, Step, prepare_result
from .chunk_log import Chunk
from .history import digest

logger = logging.getLogger(__name__)

JsonObject: TypeAlias = dict[str, JsonValue]
Emit: TypeAlias = Callable[[Chunk], None]

# The error code a tool's ModelRetry is recorded with: replay raises it again.
RETRY = "retry"


@dataclass(frozen=True, slots=True)
class RequestedCall:
    """One call the model asked for: what an invoke carries to the page."""

    tool_call_id: str
    tool_name: str
    input: JsonObject


class RunFailed(Exception):
    """The run cannot go on; ``message`` is safe to show to the page."""


class ToolFailure(Exception):
    """A server tool failed in a way the model should read: ``code`` and ``message``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class DeliveredCall(Protocol):
    """A browser call the proxy delivered as it was recorded (the proxy's StartedCall)."""

    async def wait(self) -> Step | None:
        """Return once the step is no longer pending: the settled step, or None."""
        ...

    async def abandon(self) -> None:
        """Release the call if ``wait`` never ran."""
        ...


class CallTarget(Protocol):
    """The page's connection a browser call is delivered to (the proxy's peer)."""

    @property
    def id(self) -> str: ...

    @property
    def client_id(self) -> str | None: ...


class PageCalls(Protocol):
    """How a run reaches the pages of its session: the browser-call proxy and approvals."""

    async def find_target(self, tool_name: str) -> CallTarget | None:
        """The connection a call of ``tool_name`` would be delivered to now, if any."""
        ...

    async def start_client_tool(
        self, step: Step, call: RequestedCall, target: CallTarget | None
    ) -> DeliveredCall:
        """Deliver the call of a pending ``client`` step now; wait for it later.

        ``target``: the connection :meth:`find_target` found, which the step was
        recorded with as its first attempt; None: the call is delivered as any other.
        Inside a ledger batch the invoke leaves once the batch has committed.
        """
        ...

    async def run_client_tool(self, step: Step, call: RequestedCall) -> Step | None:
        """Deliver and return once the step is settled: the settled step, or None."""
        ...

    async def await_approval(self, step: Step, call: RequestedCall) -> None:
        """Return once the approval step is no longer pending."""
        ...


@dataclass(frozen=True, slots=True)
class OfferedTool:
    """A tool as the run's toolsets offer it to the model."""

    resolution: Resolution  # who settles its calls
    needs_approval: bool
    # A page tool's spec as offered: recorded with each call's step, so a result
    # is checked against the spec the model saw, with no write of its own.
    spec: ToolSpec | None = None


def recorded_spec(spec: ToolSpec) -> str:
    """A tool spec as a step records it: its wire form, canonical."""
    return canonical_json(spec.model_dump(mode="json", by_alias=True, exclude_none=True))


def approval_name(tool_name: str) -> str:
    """Ledger name of the approval half of a needsApproval call."""
    return f"approval:{tool_name}"


def new_request_id() -> str:
    """An unguessable request id (S1): 128 random bits, hex."""
    return secrets.token_hex(16)


@dataclass(slots=True)
class PlannedCall:
    """The ledger steps of one tool call, recorded with the model answer that asked for it."""

    call: RequestedCall
    approval: Step | None
    tool: Step
    # Where its step's first attempt, recorded with it, went (see PageCalls.start_client_tool).
    target: CallTarget | None = None
    # Delivered while it was recorded (a browser call with no approval to wait for).
    started: DeliveredCall | None = None
    # pydantic-ai called the tool (an unknown tool or invalid arguments are never called).
    called: bool = False

    @property
    def deliver_now(self) -> bool:
        tool = self.tool
        return self.approval is None and tool.state == "pending" and tool.resolution == "client"


@dataclass(frozen=True, slots=True)
class ModelStep:
    seq: int
    input_json: str
    # The recorded answer's events when replaying; None when the model is asked.
    recorded: list[JsonObject] | None
    # A pending record of the step exists: resolve it with the answer.
    pending: bool = False


class RunJournal:
    """The ledger steps of one execution, in the order the run asks for them."""

    def __init__(
        self,
        execution_id: str,
        ledger: Ledger,
        pages: PageCalls,
        emit: Emit,
        clock: Callable[[], float],
        *,
        recorded: Sequence[Step] = (),
    ) -> None:
        self.execution_id = execution_id
        self.ledger = ledger
        self.pages = pages
        self.emit = emit
        self.clock = clock
        # The steps the ledger held when the run started (none for a fresh one):
        # any other seq has no record (only this run adds steps to its
        # execution), so it is not read.
        self._recorded = frozenset(s.seq for s in recorded)
        self.recorded_client_tools = frozenset(
            s.name for s in recorded if s.kind == "tool" and s.resolution == "client"
        )
        self._seq = 0
        self._model_steps = 0
        # The seq of the model step being streamed: it has no record until the answer is in.
        self.streaming: int | None = None
        # An answer that asked for nothing more, not written yet (record_answer): its
        # name, step and result.
        self._unwritten: tuple[str, ModelStep, str] | None = None
        # What the model answered so far in this step, as the chunk writer saw it.
        self.events: list[JsonObject] = []
        # Chunks of this step from its first tool call on: they leave once the step
        # is recorded (in its transaction), like the invokes they announce.
        self.held: list[Chunk] | None = None
        self.catalog: dict[str, OfferedTool] = {}
        # Tools offered without execution (round trip): the page answers in its next request.
        self.deferred_tools: set[str] = set()
        # The agent's output tools (structured output): pydantic-ai's, not calls to journal.
        self.output_tools: set[str] = set()
        self.planned: dict[str, PlannedCall] = {}
        # A step of the tool step came back expired: the run may have expired (check_alive).
        self._saw_expired = False

    # -- model steps -----------------------------------------------------------------

    @property
    def answering(self) -> int | None:
        """The seq of the model step that has no record yet: streamed, or answered
        and waiting to be written with what follows it."""
        if self.streaming is not None:
            return self.streaming
        return None if self._unwritten is None else self._unwritten[1].seq

    def _next_seq(self) -> int:
        seq = self._seq
        self._seq += 1
        return seq

    async def begin_model_step(self, name: str, messages: Sequence[ModelMessage]) -> ModelStep:
        await self.write_answer()
        step_input = canonical_json({"step": self._model_steps, "messages": digest(messages)})
        self._model_steps += 1
        seq = self._next_seq()
        self.events = []
        self.held = None
        if seq not in self._recorded:
            return ModelStep(seq, step_input, None)
        step = await self.ledger.record_step(
            self.execution_id, seq, "model", name, step_input, "server", self.clock()
        )
        if step.state == "applied":
            return ModelStep(seq, step_input, _decode_events(step.result()))
        if step.state != "pending":
            raise RunFailed(f"model step {step.seq} was recorded as {step.state}")
        return ModelStep(seq, step_input, None, pending=True)

    async def record_answer(self, name: str, step: ModelStep, response: ModelResponse) -> None:
        """Record the answer (unless replayed) and plan and deliver the calls it asks for."""
        calls = [
            RequestedCall(p.tool_call_id, p.tool_name, call_input(p))
            for p in response.parts
            if isinstance(p, ToolCallPart)
            and p.tool_name not in self.deferred_tools
            and p.tool_name not in self.output_tools
        ]
        result_json = canonical_json({"events": list(self.events)})
        fresh = step.recorded is None and not step.pending
        if fresh and not calls and not self.held and isinstance(prepare_result(result_json), str):
            # Nothing it asks for waits on its record, nothing of it is held, and it can
            # be stored (one that cannot fails the run here, before its finish): it is
            # written with what follows (write_answer), which is mostly the run's end.
            # A crash before then re-asks the model, as one while it answers does.
            self._unwritten = (name, step, result_json)
            self.held = None
            return
        planned: list[PlannedCall] = []
        # The chunks held and the invokes leave once the batch has committed. An
        # answer that was not recorded shows nothing of its calls: a run that goes on
        # elsewhere (the lease lost) asks the model again, and may get other calls.
        try:
            async with self.ledger.batch():
                if step.recorded is None:
                    await self._write_answer(name, step, result_json)
                for call in calls:
                    planned.append(await self._plan(call))
                self.ledger.after_commit(self.release_held)
                for p in planned:
                    self.planned[p.call.tool_call_id] = p
                    if p.deliver_now:
                        p.started = await self.pages.start_client_tool(p.tool, p.call, p.target)
        finally:
            self.held = None

    def hold(self, chunk: Chunk) -> None:
        """Emit ``chunk`` now, or keep it for after the step is recorded (see ``held``)."""
        if self.held is None:
            self.emit(chunk)
        else:
            self.held.append(chunk)

    def release_held(self) -> None:
        held, self.held = self.held or [], None
        for chunk in held:
            self.emit(chunk)

    async def write_answer(self) -> None:
        """Write the answer that waits for what follows it (see record_answer), if any:
        before the next step, and in the batch that ends the run."""
        unwritten, self._unwritten = self._unwritten, None
        if unwritten is not None:
            await self._write_answer(*unwritten)

    async def _write_answer(self, name: str, step: ModelStep, result_json: str) -> None:
        if step.pending:
            outcome = await self.ledger.resolve(
                self.execution_id, step.seq, result_json, self.clock()
            )
            if not outcome.ok:
                raise RunFailed(f"the model's answer could not be recorded: {outcome.message}")
            return
        try:
            await self.ledger.record_step(
                self.execution_id, step.seq, "model", name, step.input_json, "server",
                self.clock(), result_json=result_json,
            )  # fmt: skip
        except ValueError as exc:
            raise RunFailed(f"the model's answer could not be recorded: {exc}") from exc

    # -- tool steps ------------------------------------------------------------------

    async def _plan(self, call: RequestedCall) -> PlannedCall:
        """Record the call's steps in call order, so parallel calls get stable seqs."""
        input_json = canonical_json(call.input)
        seq = self._next_seq()
        recorded = await self._recorded_step(seq)
        known = self.catalog.get(call.tool_name)
        if recorded is not None:
            needs_approval = recorded.resolution == "approval"
        else:
            needs_approval = known is not None and known.needs_approval
        approval: Step | None = None
        if needs_approval:
            approval = await self.ledger.record_step(
                self.execution_id, seq, "tool", approval_name(call.tool_name), input_json,
                "approval", self.clock(),
            )  # fmt: skip
            seq = self._next_seq()
            recorded = await self._recorded_step(seq)
        resolution: Resolution | None
        spec_json: str | None = None
        if recorded is not None:
            resolution = recorded.resolution
        else:
            resolution = known.resolution if known is not None else None
            if known is not None and known.spec is not None:
                spec_json = recorded_spec(known.spec)
        request_id = new_request_id() if resolution == "client" else None
        # A new browser call with no approval to wait for is delivered as it is
        # recorded: its page is found first, so the step's insert names the attempt.
        target = None
        if recorded is None and approval is None and resolution == "client":
            target = await self.pages.find_target(call.tool_name)
        tool = await self.ledger.record_step(
            self.execution_id, seq, "tool", call.tool_name, input_json,
            resolution or "server", self.clock(), request_id, spec_json=spec_json,
            target_connection=None if target is None else target.id,
            target_client_id=None if target is None else target.client_id,
        )  # fmt: skip
        if resolution is None and tool.state == "pending":
            await self._reject(tool, "unknown_tool", f"there is no tool named {call.tool_name!r}")
            tool = await self._reload(tool)
        if tool.request_id != request_id:
            target = None  # another process recorded it first: not this attempt
        return PlannedCall(call, approval, tool, target)

    async def _recorded_step(self, seq: int) -> Step | None:
        if seq not in self._recorded:
            return None
        return await self.ledger.get_step(self.execution_id, seq)

    async def _reload(self, step: Step) -> Step:
        fresh = await self.ledger.get_step(step.execution_id, step.seq)
        assert fresh is not None
        return fresh

    async def _reject(self, step: Step, code: str, message: str) -> None:
        await self.ledger.reject(
            step.execution_id, step.seq, canonical_json({"code": code, "message": message}),
            self.clock(),
        )  # fmt: skip

    async def approved_call(self, ctx: RunContext[Any]) -> PlannedCall:
        """The planned call pydantic-ai is calling, once its approval (if any) is settled."""
        planned = self.planned.get(ctx.tool_call_id or "")
        if planned is None:
            raise RunFailed(f"the tool call {ctx.tool_call_id!r} has no ledger step")
        planned.called = True
        await self._settle_approval(planned)
        return planned

    async def _settle_approval(self, planned: PlannedCall) -> None:
        """Wait for the approval in front of the call, if any; a refusal denies the call."""
        approval, call = planned.approval, planned.call
        if approval is None:
            return
        self.emit(
            {
                "type": "tool-approval-request",
                "approvalId": f"approval-{call.tool_call_id}",
                "toolCallId": call.tool_call_id,
            }
        )
        if approval.state == "pending":
            await self.pages.await_approval(approval, call)
            approval = planned.approval = await self._reload(approval)
        verdict = approval.result() if approval.state == "applied" else None
        if isinstance(verdict, dict) and verdict.get("approved") is True:
            return
        reason = verdict.get("reason") if isinstance(verdict, dict) else None
        if approval.state != "applied":
            error = approval.error() or {}
            reason = str(error.get("message", "the approval was not given"))
        if planned.tool.state == "pending":
            await self._reject(planned.tool, "denied", str(reason or "the user denied this call"))
            planned.tool = await self._reload(planned.tool)

    async def run_client(self, planned: PlannedCall) -> Step:
        """The settled step of a browser call: delivered, and waited for, through the proxy."""
        tool = planned.tool
        if tool.state == "pending":
            settled: Step | None
            if planned.started is not None:
                settled = await planned.started.wait()
            else:
                settled = await self.pages.run_client_tool(tool, planned.call)
            tool = planned.tool = settled if settled is not None else await self._reload(tool)
        return tool

    async def run_server(self, planned: PlannedCall, run: Callable[[], Awaitable[Any]]) -> Step:
        """The settled step of a server-side call: run once, its outcome recorded."""
        step, name = planned.tool, planned.call.tool_name
        if step.state != "pending":
            return step
        try:
            output = await run()
        except ToolFailure as exc:
            await self._reject(step, exc.code, exc.message)
        except ModelRetry as exc:
            await self._reject(step, RETRY, exc.message)
        except ToolFailed as exc:
            await self._reject(step, "tool_error", exc.message)
        except Exception:
            logger.exception("server tool %s failed", name)
            await self._reject(step, "tool_error", f"the server tool {name!r} failed")
        else:
            if isinstance(output, ToolDenied):
                await self._reject(step, "denied", output.message)
            else:
                await self._record_output(step, output)
        planned.tool = await self._reload(step)
        return planned.tool

    async def _record_output(self, step: Step, output: object) -> None:
        try:
            result_json = canonical_json(to_jsonable_python(output))
        except ValueError as exc:
            await self._reject(step, "invalid_output", f"the output is not JSON: {exc}")
            return
        outcome = await self.ledger.resolve(step.execution_id, step.seq, result_json, self.clock())
        if not outcome.ok:
            # Too large or not JSON: tell the model in words it can act on.
            code = "output_too_large" if outcome.reason == "too_large" else "invalid_output"
            await self._reject(step, code, outcome.message)

    async def release_uncalled(self) -> None:
        """After a tool step: settle what pydantic-ai did not call (invalid arguments, say)."""
        await self.abandon_started()
        for planned in self.planned.values():
            if not planned.called and planned.tool.state == "pending":
                await self._reject(planned.tool, "not_called", "the call was not made")
            if "expired" in (planned.tool.state, planned.approval and planned.approval.state):
                self._saw_expired = True
        self.planned.clear()

    async def abandon_started(self) -> None:
        """Release delivered calls nobody waits for (a no-op for those that were awaited)."""
        for planned in list(self.planned.values()):
            if planned.started is not None:
                await planned.started.abandon()

    async def check_alive(self) -> None:
        """After a tool step: raise if the run expired while it waited.

        Expiry settles every pending step of the run as ``expired``, so only a
        step of this tool step that came back so is worth reading the run for.
        """
        if not self._saw_expired:
            return
        self._saw_expired = False
        execution = await self.ledger.get_execution(self.execution_id)
        if execution is not None and execution.status == "expired":
            raise RunFailed("this run waited longer than its time to live and expired")


def tool_result(step: Step) -> Any:
    """A settled tool step as pydantic-ai reads it.

    An output is the tool's return value; a refused approval a denied call;
    ``invalid_input`` (and a recorded ModelRetry) a retry prompt, so the model
    can fix its arguments; any other error a failed call whose text, ``code:
    message``, the model reads.
    """
    if step.state == "applied":
        return step.result()
    error = step.error() or {}
    code, message = str(error.get("code", "error")), str(error.get("message", ""))
    if code == "denied":
        return ToolDenied(message)
    if code == RETRY:
        raise ModelRetry(message)
    if code == "invalid_input":
        raise ModelRetry(f"{code}: {message}")
    raise ToolFailed(f"{code}: {message}")


def call_input(part: ToolCallPart) -> JsonObject:
    """The arguments of a model's tool call as JSON; ``{}`` when they do not parse."""
    try:
        args = part.args_as_dict()
    except ValueError:
        return {}
    return {str(k): to_jsonable_python(v) for k, v in args.items()}


def _decode_events(value: object) -> list[JsonObject]:
    if not isinstance(value, dict) or not isinstance(value.get("events"), list):
        raise RunFailed("a recorded model step is unreadable")
    events: list[JsonObject] = []
    for item in value["events"]:
        ok = isinstance(item, dict) and (
            isinstance(item.get("text"), str)
            or isinstance(item.get("reasoning"), str)
            or isinstance(item.get("toolCall"), dict)
        )
        if not ok:
            raise RunFailed("a recorded model step is unreadable")
        events.append(item)
    return events


def _replay_stream(
    events: list[JsonObject],
) -> Callable[
    [list[ModelMessage], AgentInfo], AsyncIterator[str | DeltaToolCalls | DeltaThinkingCalls]
]:
    async def stream(
        messages: list[ModelMessage], info: AgentInfo
    ) -> AsyncIterator[str | DeltaToolCalls | DeltaThinkingCalls]:
        for index, event in enumerate(events):
            text, reasoning, call = event.get("text"), event.get("reasoning"), event.get("toolCall")
            if isinstance(text, str):
                yield text
            elif isinstance(reasoning, str):
                yield {-1: DeltaThinkingPart(content=reasoning)}
            elif isinstance(call, dict):
                name, args = str(call["toolName"]), canonical_json(call["input"])
                yield {index: DeltaToolCall(name, args, tool_call_id=str(call["toolCallId"]))}

    return stream


@dataclass(init=False)
class JournaledModel(WrapperModel):
    """The run's model with every request a ledger step: recorded answers are replayed."""

    def __init__(self, wrapped: Any, journal: RunJournal) -> None:
        super().__init__(wrapped)
        self.journal = journal

    @contextlib.asynccontextmanager
    async def request_stream(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
        run_context: RunContext[Any] | None = None,
    ) -> AsyncIterator[StreamedResponse]:
        journal, name = self.journal, self.model_name
        journal.output_tools = {t.name for t in model_request_parameters.output_tools}
        step = await journal.begin_model_step(name, messages)
        if step.recorded is not None:
            replay = FunctionModel(stream_function=_replay_stream(step.recorded), model_name=name)
            async with replay.request_stream(
                messages, model_settings, model_request_parameters, run_context
            ) as response:
                yield response
        else:
            journal.streaming = step.seq
            try:
                async with self.wrapped.request_stream(
                    messages, model_settings, model_request_parameters, run_context
                ) as response:
                    yield response
            finally:
                journal.streaming = None
        await journal.record_answer(name, step, response.get())

    async def request(self, *args: Any, **kwargs: Any) -> ModelResponse:
        raise RunFailed("the run asked for an unrecorded model request")


@dataclass
class JournaledToolset(WrapperToolset[Any]):
    """Server-side tools (the server's and the agent's own) with every call a ledger step.

    A tool with pydantic-ai's ``requires_approval`` waits for its approval
    inside the run, as a page tool with ``needsApproval`` does, instead of
    ending the run with deferred tool requests.
    """

    journal: RunJournal

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        tools = await super().get_tools(ctx)
        offered: dict[str, ToolsetTool[Any]] = {}
        for name, tool in tools.items():
            needs_approval = tool.tool_def.kind == "unapproved"
            self.journal.catalog[name] = OfferedTool("server", needs_approval)
            if needs_approval:
                tool = dataclasses.replace(
                    tool, tool_def=dataclasses.replace(tool.tool_def, kind="function")
                )
            offered[name] = tool
        return offered

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any]
    ) -> Any:
        planned = await self.journal.approved_call(ctx)
        approved = dataclasses.replace(ctx, tool_call_approved=True)
        step = await self.journal.run_server(
            planned, lambda: self.wrapped.call_tool(name, tool_args, approved, tool)
        )
        return tool_result(step)
