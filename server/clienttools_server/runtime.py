"""Runs: the agent loop over a model and tools, recorded in the ledger and replayable (S6, S8).

A run alternates model steps and tool steps inside ONE response: the model
streams text and tool calls, the calls run concurrently (browser tools through
the proxy, server tools inline), their results go back to the model, until the
model answers without calling a tool. Every non-deterministic step is a ledger
step with its ``seq``; re-running an execution replays recorded steps instead
of calling the model or the browser again, and a step that asks for something
other than its record fails the run with a divergence error naming the step.

This module knows nothing of WebSockets: chunks leave through ``emit`` and
tools are reached through a :class:`ToolHost`.

With ``client_tools="round-trip"`` page tools are tools without an execute,
the AI SDK's client-tool pattern: a step that calls one ends the response
(``finish`` with ``finishReason: "tool-calls"``), and the page's next ``send``,
whose last assistant message carries the tool parts with their outputs,
starts a run whose model step reads them. Server tools still run inline.

    run = Run(execution.id, request, ledger, ScriptedModel(), host, emit=log.append)
    await run.execute()   # emits start ... finish; marks the execution completed
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, cast

from pydantic import JsonValue

from .config import ClientToolsMode
from .ledger import (
    Divergence,
    InvalidTransition,
    Ledger,
    Resolution,
    Step,
    UnknownExecution,
    canonical_json,
)
from .models import (
    AssistantMessage,
    JsonObject,
    Message,
    Model,
    TextDelta,
    ToolCall,
    ToolDescription,
    ToolResult,
    UserMessage,
    messages_from_ui,
    words,
)

logger = logging.getLogger(__name__)

Chunk = dict[str, JsonValue]
Emit = Callable[[Chunk], None]


class ToolFailure(Exception):
    """A tool failed in a way the model should read: ``code`` and ``message``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class RunFailed(Exception):
    """The run cannot go on; ``message`` is safe to show to the page."""


class ToolHost(Protocol):
    """The tools one run can reach; the server wires browser and server tools behind it."""

    def descriptions(self) -> list[ToolDescription]: ...

    def resolution_for(self, name: str) -> Resolution | None:
        """``server`` or ``client`` for a known tool, None for an unknown one."""
        ...

    def needs_approval(self, name: str) -> bool: ...

    async def run_server_tool(self, name: str, tool_input: JsonObject) -> JsonValue:
        """The output; ToolFailure for an error the model should see."""
        ...

    async def run_client_tool(self, step: Step, call: ToolCall) -> Step | None:
        """Return once the ledger step is no longer pending: the settled step, or None.

        None makes the run read the step back from the ledger.
        """
        ...

    async def await_approval(self, step: Step, call: ToolCall) -> None:
        """Return once the approval step is no longer pending."""
        ...

    def start_client_tool(self, step: Step, call: ToolCall) -> StartedCall:
        """Deliver the call of a pending ``client`` step now; wait for it later.

        Called inside the ledger batch that recorded the step, so the attempt
        it records is committed with the step, before the invoke leaves.
        """
        ...


class StartedCall(Protocol):
    async def wait(self) -> Step | None:
        """Return once the step is no longer pending: the settled step, or None."""
        ...

    def abandon(self) -> None:
        """Release the call if ``wait`` never ran (its task was cancelled before it started)."""
        ...


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


def _tagged(message: Message) -> JsonObject:
    """``{"kind": <class name>, **dataclasses.asdict(message)}``, without asdict's deep copy.

    The digest of these is part of every recorded model step's input, so this
    must give exactly what asdict gave, or recorded runs would diverge on replay.
    """
    if isinstance(message, UserMessage):
        return {"kind": "UserMessage", "text": message.text}
    if isinstance(message, AssistantMessage):
        calls: list[JsonValue] = [
            {"tool_call_id": c.tool_call_id, "tool_name": c.tool_name, "input": c.input}
            for c in message.tool_calls
        ]
        return {"kind": "AssistantMessage", "text": message.text, "tool_calls": calls}
    return {
        "kind": "ToolResult",
        "tool_call_id": message.tool_call_id,
        "tool_name": message.tool_name,
        "output": message.output,
        "error": cast(JsonValue, message.error),
    }


def _digest(messages: Sequence[Message]) -> str:
    tagged = [_tagged(m) for m in messages]
    return hashlib.sha256(canonical_json(tagged).encode()).hexdigest()[:32]


def _call_json(call: ToolCall) -> JsonObject:
    return {"toolCallId": call.tool_call_id, "toolName": call.tool_name, "input": call.input}


def approval_name(tool_name: str) -> str:
    """Ledger name of the approval half of a needsApproval call."""
    return f"approval:{tool_name}"


@dataclass(slots=True)
class _Answer:
    """One model step's answer, before the caller records it."""

    seq: int
    input_json: str
    events: list[TextDelta | ToolCall]
    # Replayed from the ledger: nothing to write.
    recorded: bool
    # A pending record of the step exists (written by an older server): resolve it.
    pending: bool = False


@dataclass(slots=True)
class _Planned:
    call: ToolCall
    approval: Step | None
    tool: Step
    # Delivered while it was recorded (no approval to wait for).
    started: StartedCall | None = None

    @property
    def deliver_now(self) -> bool:
        """A pending browser call with no approval to wait for: delivered as it is recorded."""
        tool = self.tool
        return self.approval is None and tool.state == "pending" and tool.resolution == "client"


class Run:
    """One execution of the agent loop; ``execute`` is safe to call again after a restart."""

    def __init__(
        self,
        execution_id: str,
        request: RunRequest,
        ledger: Ledger,
        model: Model,
        host: ToolHost,
        emit: Emit,
        *,
        clock: Callable[[], float] = time.time,
        max_steps: int = 16,
        fresh: bool = False,
        client_tools: ClientToolsMode = "rpc",
    ) -> None:
        self.execution_id = execution_id
        self.request = request
        self.ledger = ledger
        self.model = model
        self.host = host
        self.emit = emit
        self.clock = clock
        self.max_steps = max_steps
        self.client_tools = client_tools
        # The execution was just started, so it has no steps to replay yet.
        self.fresh = fresh
        # Set by whoever cancels the task for an abort; a cancel without it is a
        # shutdown, which leaves the execution resumable.
        self.aborted = False
        self._seq = 0
        # The seqs the ledger held when the loop started: any other seq has no
        # record (only this run adds steps to its execution), so it is not read.
        self._recorded: frozenset[int] = frozenset()
        # The seq of the model step being streamed: it has no record until the answer is in.
        self.answering: int | None = None
        self._text_parts = 0
        self._open_text: str | None = None

    # -- the loop ------------------------------------------------------------------

    async def execute(self) -> None:
        try:
            await self._loop()
        except asyncio.CancelledError:
            if self.aborted:
                self.emit({"type": "abort", "reason": "aborted by the client"})
                self._finish_status("error", "aborted")
            raise
        except Divergence as exc:
            logger.warning("%s", exc)
            self._fail(
                f"the run diverged from its record at step {exc.seq} "
                f"(recorded {exc.recorded.name!r}, asked {exc.name!r}) and was stopped"
            )
        except RunFailed as exc:
            self._fail(str(exc))
        except Exception:
            logger.exception("run %s failed", self.execution_id)
            self._fail("the server failed to complete this response")

    def _fail(self, message: str) -> None:
        self.emit({"type": "error", "errorText": message})
        self._finish_status("error", message)

    def _finish_status(self, status: Literal["completed", "error"], error: str | None) -> None:
        # Finished otherwise already (expired, say), or not in the ledger: nothing to do.
        with contextlib.suppress(InvalidTransition, UnknownExecution):
            self.ledger.set_status(self.execution_id, status, self.clock(), error)

    async def _loop(self) -> None:
        if not self.fresh:
            self._recorded = frozenset(s.seq for s in self.ledger.steps(self.execution_id))
        self.emit({"type": "start", "messageId": self._message_id()})
        messages: list[Message] = messages_from_ui(self.request.messages)
        for step_no in range(self.max_steps):
            self.emit({"type": "start-step"})
            answer = await self._model_step(step_no, messages)
            planned: list[_Planned] = []
            try:
                # From the model's answer to the calls it asked for, delivered (or
                # to the end of the run): one ledger transaction. No await in it,
                # so the chunks and invokes queued here leave after the commit.
                with self.ledger.batch():
                    text, calls = self._record_answer(answer)
                    messages.append(AssistantMessage(text, tuple(calls)))
                    if not calls:
                        self.emit({"type": "finish-step"})
                        self._finish("stop")
                        return
                    # Round trip: the page runs these after the response ends.
                    handed = [c for c in calls if self._handed_to_page(c)]
                    planned = [self._plan(call) for call in calls if call not in handed]
                    for p in planned:
                        if p.deliver_now:
                            p.started = self.host.start_client_tool(p.tool, p.call)
                async with asyncio.TaskGroup() as group:
                    tasks = [group.create_task(self._tool_step(p)) for p in planned]
            finally:
                for p in planned:
                    if p.started is not None:
                        p.started.abandon()
            messages.extend(task.result() for task in tasks)
            self.emit({"type": "finish-step"})
            if handed:
                self._finish("tool-calls")
                return
            self._check_alive()
        self._finish("length")

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

    def _handed_to_page(self, call: ToolCall) -> bool:
        return (
            self.client_tools == "round-trip"
            and self.host.resolution_for(call.tool_name) == "client"
        )

    def _finish(self, reason: str) -> None:
        self.emit({"type": "finish", "finishReason": reason})
        self._finish_status("completed", None)

    def _check_alive(self) -> None:
        execution = self.ledger.get_execution(self.execution_id)
        if execution is not None and execution.status == "expired":
            raise RunFailed("this run waited longer than its time to live and expired")

    def _next_seq(self) -> int:
        seq = self._seq
        self._seq += 1
        return seq

    # -- model steps ---------------------------------------------------------------

    async def _model_step(self, step_no: int, messages: list[Message]) -> _Answer:
        """Replay the recorded answer, or stream a new one; the caller records it."""
        step_input = canonical_json({"step": step_no, "messages": _digest(messages)})
        seq = self._next_seq()
        step: Step | None = None
        if seq in self._recorded:
            step = self.ledger.record_step(
                self.execution_id, seq, "model", self.model.name, step_input, "server",
                self.clock(),
            )  # fmt: skip
            if step.state == "applied":
                events = self._decode_events(step.result())
                for event in events:
                    if isinstance(event, TextDelta):
                        for word in words(event.text):
                            self._emit_text(word)
                    else:
                        self._emit_call(event)
                return _Answer(seq, step_input, events, recorded=True)
            if step.state != "pending":
                raise RunFailed(f"model step {step.seq} was recorded as {step.state}")
        # Not recorded (or recorded pending by an older server): ask the model. The
        # step is written once, with the answer; a crash before that re-asks.
        events = []
        self.answering = seq
        try:
            async for event in self.model.stream(messages, self.host.descriptions()):
                if isinstance(event, TextDelta):
                    if event.text:
                        self._emit_text(event.text)
                        events.append(event)
                else:
                    self._emit_call(event)
                    events.append(event)
        finally:
            self.answering = None
        return _Answer(seq, step_input, events, recorded=False, pending=step is not None)

    def _record_answer(self, answer: _Answer) -> tuple[str, list[ToolCall]]:
        events = answer.events
        if not answer.recorded:
            result_json = canonical_json(self._encode_events(events))
            if answer.pending:
                outcome = self.ledger.resolve(
                    self.execution_id, answer.seq, result_json, self.clock()
                )
                if not outcome.ok:
                    raise RunFailed(f"the model's answer could not be recorded: {outcome.message}")
            else:
                try:
                    self.ledger.record_step(
                        self.execution_id, answer.seq, "model", self.model.name,
                        answer.input_json, "server", self.clock(), result_json=result_json,
                    )  # fmt: skip
                except ValueError as exc:
                    raise RunFailed(f"the model's answer could not be recorded: {exc}") from exc
        self._close_text()
        text = "".join(e.text for e in events if isinstance(e, TextDelta))
        return text, [e for e in events if isinstance(e, ToolCall)]

    @staticmethod
    def _encode_events(events: Sequence[TextDelta | ToolCall]) -> JsonObject:
        encoded: list[JsonValue] = []
        for event in events:
            if isinstance(event, TextDelta):
                encoded.append({"text": event.text})
            else:
                encoded.append({"toolCall": _call_json(event)})
        return {"events": encoded}

    @staticmethod
    def _decode_events(value: object) -> list[TextDelta | ToolCall]:
        if not isinstance(value, dict) or not isinstance(value.get("events"), list):
            raise RunFailed("a recorded model step is unreadable")
        events: list[TextDelta | ToolCall] = []
        for item in value["events"]:
            if isinstance(item, dict) and isinstance(item.get("text"), str):
                events.append(TextDelta(item["text"]))
            elif isinstance(item, dict) and isinstance(item.get("toolCall"), dict):
                raw = item["toolCall"]
                events.append(ToolCall(str(raw["toolCallId"]), str(raw["toolName"]), raw["input"]))
            else:
                raise RunFailed("a recorded model step is unreadable")
        return events

    def _emit_text(self, delta: str) -> None:
        if self._open_text is None:
            self._open_text = f"text-{self._text_parts}"
            self._text_parts += 1
            self.emit({"type": "text-start", "id": self._open_text})
        self.emit({"type": "text-delta", "id": self._open_text, "delta": delta})

    def _close_text(self) -> None:
        if self._open_text is not None:
            self.emit({"type": "text-end", "id": self._open_text})
            self._open_text = None

    def _emit_call(self, call: ToolCall) -> None:
        self._close_text()
        self.emit(
            {
                "type": "tool-input-start",
                "toolCallId": call.tool_call_id,
                "toolName": call.tool_name,
            }
        )
        self.emit(
            {
                "type": "tool-input-available",
                "toolCallId": call.tool_call_id,
                "toolName": call.tool_name,
                "input": call.input,
            }
        )

    # -- tool steps ----------------------------------------------------------------

    def _plan(self, call: ToolCall) -> _Planned:
        """Record the call's steps in call order, so parallel calls get stable seqs."""
        input_json = canonical_json(call.input)
        seq = self._next_seq()
        recorded = self._recorded_step(seq)
        if recorded is not None:
            needs_approval = recorded.resolution == "approval"
        else:
            needs_approval = self.host.needs_approval(call.tool_name)
        approval: Step | None = None
        if needs_approval:
            approval = self.ledger.record_step(
                self.execution_id, seq, "tool", approval_name(call.tool_name), input_json,
                "approval", self.clock(),
            )  # fmt: skip
            seq = self._next_seq()
            recorded = self._recorded_step(seq)
        resolution: Resolution | None
        if recorded is not None:
            resolution = recorded.resolution
        else:
            resolution = self.host.resolution_for(call.tool_name)
        request_id = new_request_id() if resolution == "client" else None
        tool = self.ledger.record_step(
            self.execution_id, seq, "tool", call.tool_name, input_json,
            resolution or "server", self.clock(), request_id,
        )  # fmt: skip
        if resolution is None and tool.state == "pending":
            self._reject(tool, "unknown_tool", f"there is no tool named {call.tool_name!r}")
            tool = self._reload(tool)
        return _Planned(call, approval, tool)

    def _recorded_step(self, seq: int) -> Step | None:
        if seq not in self._recorded:
            return None
        return self.ledger.get_step(self.execution_id, seq)

    def _reload(self, step: Step) -> Step:
        fresh = self.ledger.get_step(step.execution_id, step.seq)
        assert fresh is not None
        return fresh

    def _reject(self, step: Step, code: str, message: str) -> None:
        self.ledger.reject(
            step.execution_id, step.seq, canonical_json({"code": code, "message": message}),
            self.clock(),
        )  # fmt: skip

    async def _tool_step(self, planned: _Planned) -> ToolResult:
        call, tool = planned.call, planned.tool
        if planned.approval is not None:
            approval = planned.approval
            self.emit(
                {
                    "type": "tool-approval-request",
                    "approvalId": f"approval-{call.tool_call_id}",
                    "toolCallId": call.tool_call_id,
                }
            )
            if approval.state == "pending":
                await self.host.await_approval(approval, call)
                approval = self._reload(approval)
            verdict = approval.result() if approval.state == "applied" else None
            if not (isinstance(verdict, dict) and verdict.get("approved") is True):
                reason = verdict.get("reason") if isinstance(verdict, dict) else None
                if approval.state != "applied":
                    error = approval.error() or {}
                    reason = str(error.get("message", "the approval was not given"))
                if tool.state == "pending":
                    self._reject(tool, "denied", str(reason or "the user denied this call"))
                    tool = self._reload(tool)
        if tool.state == "pending":
            settled: Step | None = None
            if planned.started is not None:
                settled = await planned.started.wait()
            elif tool.resolution == "client":
                settled = await self.host.run_client_tool(tool, call)
            else:
                await self._run_server_tool(tool, call)
            tool = settled if settled is not None else self._reload(tool)
        return self._emit_outcome(tool, call)

    async def _run_server_tool(self, step: Step, call: ToolCall) -> None:
        try:
            output = await self.host.run_server_tool(call.tool_name, call.input)
            result_json = canonical_json(output)
        except ToolFailure as exc:
            self._reject(step, exc.code, exc.message)
            return
        except Exception:
            logger.exception("server tool %s failed", call.tool_name)
            self._reject(step, "tool_error", f"the server tool {call.tool_name!r} failed")
            return
        outcome = self.ledger.resolve(step.execution_id, step.seq, result_json, self.clock())
        if not outcome.ok:
            # Too large or not JSON: tell the model in words it can act on.
            code = "output_too_large" if outcome.reason == "too_large" else "invalid_output"
            self._reject(step, code, outcome.message)

    def _emit_outcome(self, step: Step, call: ToolCall) -> ToolResult:
        if step.state == "applied":
            output = cast(JsonValue, step.result())
            self.emit(
                {"type": "tool-output-available", "toolCallId": call.tool_call_id, "output": output}
            )
            return ToolResult(call.tool_call_id, call.tool_name, output=output)
        raw = step.error() or {}
        error = {"code": str(raw.get("code", "error")), "message": str(raw.get("message", ""))}
        if error["code"] == "denied":
            self.emit({"type": "tool-output-denied", "toolCallId": call.tool_call_id})
        else:
            self.emit(
                {
                    "type": "tool-output-error",
                    "toolCallId": call.tool_call_id,
                    "errorText": f"{error['code']}: {error['message']}",
                }
            )
        return ToolResult(call.tool_call_id, call.tool_name, error=error)


def new_request_id() -> str:
    """An unguessable request id (S1): 128 random bits, hex."""
    return secrets.token_hex(16)
