"""What the ledger holds and what it raises: runs, steps, outcomes, chats, exceptions.

Plain values (frozen dataclasses), the same on every store. Example::

    step = await ledger.get_step(execution_id, 0)
    if step is not None and step.state == "applied":
        print(step.result())
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal, cast

ExecutionStatus = Literal["running", "paused", "completed", "error", "expired"]
StepKind = Literal["model", "tool"]
# Who settles a step: the browser tool ("client"), a human answering an approval
# request ("approval"), or the server itself: a server tool or a model output.
Resolution = Literal["client", "approval", "server"]
StepState = Literal["pending", "applied", "error", "expired"]
OutcomeReason = Literal["applied", "not_found", "not_pending", "too_large", "invalid"]

# Protocol default for the largest serialized tool result; applied to every
# stored input, result and error, measured in UTF-8 bytes of the canonical JSON.
MAX_STORED_BYTES = 1_000_000

FINISHED_STATUSES: frozenset[ExecutionStatus] = frozenset({"completed", "error", "expired"})

# Legal status changes, as data: a finished execution never comes back, since
# its pending steps were settled when it finished and replaying it would
# contradict what was already reported to the page and the model.
STATUS_TRANSITIONS: dict[ExecutionStatus, frozenset[ExecutionStatus]] = {
    "running": frozenset({"running", "paused", "completed", "error", "expired"}),
    "paused": frozenset({"running", "paused", "completed", "error", "expired"}),
    "completed": frozenset({"completed"}),
    "error": frozenset({"error"}),
    "expired": frozenset({"expired"}),
}

# The statuses a change to each status writes over (the unfinished ones it may
# follow): a finished execution given its own status again stays as it is.
CHANGED_FROM: dict[ExecutionStatus, tuple[ExecutionStatus, ...]] = {
    status: tuple(
        before
        for before, after in STATUS_TRANSITIONS.items()
        if status in after and before not in FINISHED_STATUSES
    )
    for status in STATUS_TRANSITIONS
}

# The notification that a chat's stored messages changed (a save or a delete), sent
# with its commit to the other processes subscribed to the chat: args (chat id,).
CHAT_CHANGED = "chat"

# Seconds a lease lasts when the ledger is not told otherwise (--lease).
DEFAULT_LEASE = 10.0

# How much of a recorded or asked-for input a Divergence message quotes.
_QUOTE_CHARS = 200


def _quote(text: str) -> str:
    return text if len(text) <= _QUOTE_CHARS else text[:_QUOTE_CHARS] + "..."


class UnknownExecution(LookupError):
    """No execution with that id is in the ledger."""


class UnknownStep(LookupError):
    """No step at that seq is in the ledger."""


class InvalidTransition(ValueError):
    """A status change that :data:`STATUS_TRANSITIONS` does not allow."""


class LedgerClosed(RuntimeError):
    """The ledger was used after :meth:`Ledger.close`."""


class LeaseLost(RuntimeError):
    """Another ledger instance took this execution over: this one may not write for it again.

    Nothing of the refused call was written. The run that met it stops quietly:
    it records nothing (not even its end) and tells the page nothing, since
    the run goes on under its new owner.
    """

    def __init__(self, execution_id: str, held: int, current: int | None) -> None:
        self.execution_id = execution_id
        self.held = held
        self.current = current
        now = "gone" if current is None else f"at generation {current}"
        super().__init__(
            f"the lease of execution {execution_id} was lost: this process held generation "
            f"{held}, the execution is {now}; another process took the run over"
        )


class ChatBusy(RuntimeError):
    """The chat has an unfinished execution already: its response is still streaming.

    Every store raises it (a unique index on the unfinished executions of a
    chat): a second ``send`` for a chat on another process is refused as it is
    on the one that streams it, whose hub refuses it before the ledger sees it.
    """


class LedgerUnavailable(RuntimeError):
    """The ledger's database could not be reached; nothing of the call was written.

    Only a store on a server (PostgreSQL) raises it. A peer whose frame met it
    gets nothing acknowledged, so it sends the frame again once it reconnects.
    """


@dataclass(frozen=True, slots=True)
class Execution:
    """One run: what started it and where it stands."""

    id: str
    session: str
    status: ExecutionStatus
    # What started the run; the runtime stores the chat request here to re-run it.
    request_json: str
    error: str | None
    created_at: float
    updated_at: float
    # The lease: which ledger instance owns the run, how often it changed hands,
    # and until when the owner's last renewal holds (None: nobody holds it).
    owner: str | None = None
    generation: int = 0
    lease_until: float | None = None

    @property
    def finished(self) -> bool:
        return self.status in FINISHED_STATUSES


@dataclass(frozen=True, slots=True)
class Step:
    """One non-deterministic step of an execution, as recorded."""

    execution_id: str
    seq: int
    kind: StepKind
    name: str
    input_json: str
    resolution: Resolution
    state: StepState
    # Canonical JSON of the output; set when state == "applied".
    result_json: str | None
    # Canonical JSON of {"code", "message", "data"?}; set when state is "error" or "expired".
    error_json: str | None
    request_id: str | None
    attempts: int
    created_at: float
    updated_at: float
    # Canonical JSON of the tool spec the call was made with (a ``client`` step),
    # so its outputSchema is checked the same way after a restart; None otherwise.
    spec_json: str | None = None
    # Where the last attempt's invoke went: the connection's id and its page's
    # clientId, so any process of a shared ledger can apply S5 to a result that
    # reaches it; None until an attempt names it.
    target_connection: str | None = None
    target_client_id: str | None = None

    def result(self) -> object:
        """The recorded output; ValueError if the step was not applied."""
        if self.result_json is None:
            raise ValueError(
                f"step {self.seq} of execution {self.execution_id} has no result "
                f"(state {self.state!r})"
            )
        return json.loads(self.result_json)

    def error(self) -> dict[str, object] | None:
        """The recorded error ({"code", "message", "data"?}), or None."""
        if self.error_json is None:
            return None
        return cast("dict[str, object]", json.loads(self.error_json))

    def spec(self) -> dict[str, object] | None:
        """The recorded tool spec (wire field names: ``outputSchema``, ...), or None."""
        if self.spec_json is None:
            return None
        return cast("dict[str, object]", json.loads(self.spec_json))


@dataclass(frozen=True, slots=True)
class Registration:
    """One connection's tool registration (S2), as every process of the ledger sees it.

    ``order`` is the cluster-wide registration order: the highest that offers a
    tool is the session's most recent connection for it.
    """

    connection_id: str
    session: str
    process_id: str
    order: int
    client_id: str | None
    tools_json: str


@dataclass(frozen=True, slots=True)
class StoredChat:
    """A chat's conversation as the ledger holds it: the server's truth (rule H1)."""

    id: str
    session: str
    version: int
    updated_at: float
    # Canonical JSON of each UIMessage, in order.
    messages: tuple[str, ...]
    # The execution whose response is being stored into it, until that response ends.
    streaming: str | None = None


@dataclass(frozen=True, slots=True)
class ChatSummary:
    """One line of a listing of chats: what ``GET /chats`` answers for each."""

    id: str
    session: str
    message_count: int
    version: int
    updated_at: float


class ChatOfOtherSession(LookupError):
    """The chat belongs to another session (rule H5): nothing of it was changed."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a resolve or reject did. Stale, duplicate and oversize calls are outcomes, not errors.

    ``not_pending`` covers both a duplicate (``step.state == "applied"``) and a
    call settled otherwise (error, expired); ``step`` is the step as it stands
    after the call, or None for ``not_found``.
    """

    ok: bool
    reason: OutcomeReason
    message: str
    step: Step | None = None


class Divergence(Exception):
    """A replayed step asked for something other than what the ledger recorded at its seq."""

    def __init__(self, recorded: Step, kind: StepKind, name: str, input_json: str) -> None:
        self.recorded = recorded
        self.kind = kind
        self.name = name
        self.input_json = input_json
        super().__init__(
            f"execution {recorded.execution_id} diverged at seq {recorded.seq}: recorded "
            f"{recorded.kind} {recorded.name!r} with input {_quote(recorded.input_json)}, "
            f"asked {kind} {name!r} with input {_quote(input_json)}"
        )

    @property
    def execution_id(self) -> str:
        return self.recorded.execution_id

    @property
    def seq(self) -> int:
        return self.recorded.seq
