"""The durable ledger of runs and their non-deterministic steps (protocol rule S8).

Every run (an *execution*) gets an id; every step in it whose outcome the
server cannot recompute (a model output, a tool call) gets a ``seq`` 0, 1, 2,
... and a record here: kind, name, canonical JSON of the input, who resolves it,
its state and, once settled, its result or error. After a restart the runtime
re-runs an unfinished execution and asks for the record at each ``seq``:
recorded steps give back their results, and a step that asks for something
else than what was recorded is a :class:`Divergence`.

:class:`SqliteLedger` implements the :class:`Ledger` protocol: on a file it is
durable (each write is its own committed transaction, or part of one
``batch()``); on ``":memory:"`` it is the ledger of a server without ``--db``.
The caller owns the clock: every write takes ``now`` in seconds.

Each running execution has one owner, the ledger instance (one per server
process) that started it or took it over, under a **lease**: the owner renews
it (:meth:`Ledger.renew`) more often than it lapses, and another instance may
take the execution over (:meth:`Ledger.take_over`) only once it has lapsed.
Each take-over raises the execution's ``generation``; the ledger remembers the
generation it holds for each execution it owns, and every write for such an
execution applies only while that is still the execution's generation. A write
refused so raises :class:`LeaseLost`: the instance lost the run to another one
and must stop it without writing anything more for it (fencing).

Nothing finished is kept forever: :meth:`Ledger.prune_finished` deletes the
executions (and their steps) that finished longer than a retention ago; the
server calls it from its expiry loop.

Every method that reads or writes is a coroutine (a shared store waits for its
database without blocking the event loop). Example::

    async with SqliteLedger("ledger.sqlite3") as ledger:
        run = await ledger.start_execution("chat-1", '{"messages":[]}', now=time.time())
        now = time.time()
        step = await ledger.record_step(run.id, 0, "tool", "get_location", "{}", "client", now)
        outcome = await ledger.resolve(run.id, step.seq, '{"lat":52.5,"lon":13.4}', now)
        stored = await ledger.get_step(run.id, 0)
        assert outcome.ok and stored.result() == {"lat": 52.5, "lon": 13.4}
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sqlite3
import uuid
from collections.abc import AsyncIterator, Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Literal, Protocol, cast

from .canonical import Canonical, canonical_json, canonicalize

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

_SCHEMA_VERSION = 5

# Seconds a lease lasts when the ledger is not told otherwise (--lease).
DEFAULT_LEASE = 10.0

# How much of a recorded or asked-for input a Divergence message quotes.
_QUOTE_CHARS = 200


def _stored_size(text: str) -> int:
    return len(text.encode("utf-8"))


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

    Only a ledger shared by several processes raises it (one process knows its
    own streaming responses): a second ``send`` for a chat on another process
    is refused as it is on the one that streams it.
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
    # reaches it; None where one process knows it in memory (SQLite).
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


def check_replay(recorded: Step, kind: StepKind, name: str, input_json: str) -> None:
    """Raise :class:`Divergence` unless the step asked for matches the record.

    ``input_json`` is compared in canonical form, so key order and whitespace
    do not matter. Resolution is not compared: whether a tool needs approval is
    configuration, and changing it must not break runs already recorded.
    """
    asked_input = canonicalize(input_json)
    if (recorded.kind, recorded.name, recorded.input_json) != (kind, name, asked_input):
        raise Divergence(recorded, kind, name, asked_input)


def _prepare_input(name: str, input_json: str) -> str:
    try:
        canonical = canonicalize(input_json)
    except ValueError as exc:
        raise ValueError(f"input of {name!r} is not valid JSON: {exc}") from exc
    size = _stored_size(canonical)
    if size > MAX_STORED_BYTES:
        # Worded for the model: the runtime may hand this message to it as is.
        raise ValueError(
            f"input of {name!r} is {size:,} bytes as JSON; at most {MAX_STORED_BYTES:,} "
            "bytes can be stored. Call it with a smaller input."
        )
    return canonical


def _prepare_result(result_json: str) -> str | Outcome:
    """Canonical result to store, or the refusing Outcome."""
    try:
        canonical = canonicalize(result_json)
    except ValueError as exc:
        return Outcome(False, "invalid", f"result is not valid JSON: {exc}")
    size = _stored_size(canonical)
    if size > MAX_STORED_BYTES:
        return Outcome(
            False,
            "too_large",
            f"result is {size:,} bytes as JSON; at most {MAX_STORED_BYTES:,} bytes can be stored",
        )
    return canonical


def _prepare_recorded_result(result_json: str | None) -> tuple[StepState, str | None]:
    """State and stored result of a step recorded with ``result_json`` (None: pending)."""
    if result_json is None:
        return "pending", None
    prepared = _prepare_result(result_json)
    if isinstance(prepared, Outcome):
        raise ValueError(prepared.message)
    return "applied", prepared


def _prepare_error(error_json: str) -> str | Outcome:
    """Canonical error to store, or the refusing Outcome."""
    try:
        value = json.loads(error_json)
        canonical = error_json if type(error_json) is Canonical else canonical_json(value)
    except (ValueError, RecursionError) as exc:
        return Outcome(False, "invalid", f"error is not valid JSON: {exc}")
    if not (
        isinstance(value, dict)
        and isinstance(value.get("code"), str)
        and isinstance(value.get("message"), str)
    ):
        return Outcome(
            False, "invalid", 'error must be a JSON object with string "code" and "message"'
        )
    size = _stored_size(canonical)
    if size > MAX_STORED_BYTES:
        return Outcome(
            False,
            "too_large",
            f"error is {size:,} bytes as JSON; at most {MAX_STORED_BYTES:,} bytes can be stored",
        )
    return canonical


def _refusal(step: Step | None, execution_id: str, seq: int) -> Outcome | None:
    """The Outcome for settling a step that is missing or already settled, else None."""
    if step is None:
        return Outcome(False, "not_found", f"no step {seq} in execution {execution_id}")
    if step.state != "pending":
        return Outcome(
            False,
            "not_pending",
            f"step {seq} of execution {execution_id} is already {step.state}",
            step,
        )
    return None


def _check_statuses(statuses: Collection[ExecutionStatus] | None) -> None:
    # A bare string is a Collection too, and "paused" would match "p", "a", ...
    if isinstance(statuses, str):
        raise TypeError(f"statuses must be a collection of statuses, not the string {statuses!r}")


def _check_transition(execution: Execution, status: ExecutionStatus) -> None:
    if status not in STATUS_TRANSITIONS[execution.status]:
        raise InvalidTransition(
            f"execution {execution.id} is {execution.status}; it cannot become {status}"
        )


def _closing_error(status: ExecutionStatus, ttl: float | None = None) -> tuple[StepState, str]:
    """State and error JSON for the pending steps of an execution that finishes with ``status``."""
    if status == "expired":
        message = (
            f"this call waited longer than its time to live ({ttl:g} s) and expired"
            if ttl is not None
            else "this call expired before it was resolved"
        )
        return "expired", canonical_json({"code": "expired", "message": message})
    return "error", canonical_json(
        {"code": "cancelled", "message": f"the run ended ({status}) before this call was resolved"}
    )


class Leases:
    """The executions one ledger instance owns, each at the generation it took it at.

    Shared bookkeeping of both stores. An execution it lost stays fenced (every
    write for it raises :class:`LeaseLost`, without asking the database) until
    this instance takes it over again.
    """

    def __init__(self, seconds: float) -> None:
        if not seconds > 0:
            raise ValueError(f"the lease must be positive, not {seconds}")
        self.seconds = seconds
        self.owner = uuid.uuid4().hex
        self.held: dict[str, int] = {}
        self.lost: dict[str, int] = {}

    def generation(self, execution_id: str) -> int | None:
        """The generation held for the execution, None if it is not ours; LeaseLost if lost."""
        lost = self.lost.get(execution_id)
        if lost is not None:
            raise LeaseLost(execution_id, lost, None)
        return self.held.get(execution_id)

    def hold(self, execution_id: str, generation: int) -> None:
        self.held[execution_id] = generation
        self.lost.pop(execution_id, None)

    def lose(self, execution_id: str, current: int | None) -> LeaseLost:
        held = self.held.pop(execution_id, 0)
        self.lost[execution_id] = held
        return LeaseLost(execution_id, held, current)

    def release(self, execution_id: str) -> None:
        """Stop holding: the run ended here. A lost lease stays fenced."""
        self.held.pop(execution_id, None)


class Ledger(Protocol):
    """What the runtime calls; :class:`SqliteLedger` implements it.

    Every method that reads or writes is a coroutine, so a store on a server
    (PostgreSQL) waits for its database without blocking the event loop; what
    needs no I/O (``owner``, ``release``, ``after_commit``) is synchronous.
    """

    @property
    def owner(self) -> str:
        """This instance's process id, drawn when it opens: the owner of the runs it holds."""
        ...

    async def notify(self, process_id: str | None, kind: str, *args: str) -> None:
        """Tell process ``process_id`` (None: every process) that rows changed; ids only.

        Inside :meth:`batch` it is part of the transaction (delivered after the
        commit). A store with one process (SQLite) needs none: callers take the
        local path for this process, and asking it to reach another raises.
        """
        ...

    async def take_over(self, now: float) -> list[Execution]:
        """Take every unfinished execution whose lease lapsed; they are this instance's now.

        Each comes back with its new generation, which this instance holds from
        now on. (SQLite: a file has one server process, so it also takes every
        one another instance held: that instance is a dead predecessor.)
        """
        ...

    async def renew(self, now: float) -> list[str]:
        """Extend the lease of every execution held to ``now`` + the lease.

        Returns the ids of those that turned out lost (taken over meanwhile):
        they are fenced from now on, and their runs must stop.
        """
        ...

    def release(self, execution_id: str) -> None:
        """Stop renewing the execution's lease (its run ended in this process)."""
        ...

    async def keep_alive(self, now: float) -> frozenset[str]:
        """Mark this process alive until ``now`` + the lease; the ids of the live processes.

        Processes dead for ten leases are forgotten, with their registrations.
        """
        ...

    async def register(
        self, connection_id: str, session: str, client_id: str | None, tools_json: str
    ) -> int:
        """Record (or replace) a connection's tools; its registration order, cluster-wide.

        An older registration of the same page (session and clientId) on any
        connection goes: that page has moved to this connection.
        """
        ...

    async def unregister(self, connection_id: str) -> None: ...

    async def registrations(self, session: str, now: float) -> list[Registration]:
        """The session's registrations on live processes, oldest first."""
        ...

    async def registered(self, connection_id: str, now: float) -> bool:
        """Is the connection registered on a live process?"""
        ...

    async def delivered_to(
        self, connection_ids: Collection[str]
    ) -> list[tuple[str, str, str | None]]:
        """(request id, connection, run's owner) of each pending call last invoked on one."""
        ...

    async def mark_approval(self, execution_id: str, seq: int, tool_call_id: str) -> None:
        """Record the tool call id a pending approval step is answered by."""
        ...

    async def approval_step(
        self, session: str, tool_call_id: str
    ) -> tuple[Step, str | None] | None:
        """The session's pending approval step answered by ``tool_call_id``, and its run's owner."""
        ...

    async def start_execution(
        self, session: str, request_json: str, now: float, chat_id: str | None = None
    ) -> Execution:
        """Start a run. ``chat_id``: the chat it answers; a shared ledger records it, so
        another process finds the chat's response, and raises :class:`ChatBusy` while
        an execution of the same session and chat is unfinished."""
        ...

    async def get_execution(self, execution_id: str) -> Execution | None: ...

    async def executions(
        self,
        statuses: Collection[ExecutionStatus] | None = None,
        session: str | None = None,
    ) -> list[Execution]: ...

    async def set_status(
        self, execution_id: str, status: ExecutionStatus, now: float, error: str | None = None
    ) -> None: ...

    async def record_step(
        self,
        execution_id: str,
        seq: int,
        kind: StepKind,
        name: str,
        input_json: str,
        resolution: Resolution,
        now: float,
        request_id: str | None = None,
        result_json: str | None = None,
    ) -> Step: ...

    def batch(self) -> contextlib.AbstractAsyncContextManager[None]:
        """Commit every write made inside the block in one transaction when it ends.

        Nestable. On a shared store the batch belongs to the task that opened
        it: other tasks' calls while it awaits are not part of it.
        """
        ...

    def after_commit(self, action: Callable[[], None]) -> None:
        """Run ``action`` once the writes so far are committed.

        Outside a batch: at once. Inside one: once the outermost batch of this
        task has committed, in the order registered, even when its block raised
        (a refusal keeps the writes before it); dropped if the batch's
        transaction rolled back (a database error) or its commit failed. Frames
        that announce a batch's writes go through it, so no peer hears of a
        write before it is durable.
        """
        ...

    async def get_step(self, execution_id: str, seq: int) -> Step | None: ...

    async def step_by_request_id(self, request_id: str) -> Step | None: ...

    async def steps(self, execution_id: str) -> list[Step]: ...

    async def pending_steps(
        self, session: str | None = None, resolution: Resolution | None = None
    ) -> list[Step]: ...

    async def resolve(
        self, execution_id: str, seq: int, result_json: str, now: float
    ) -> Outcome: ...

    async def reject(self, execution_id: str, seq: int, error_json: str, now: float) -> Outcome: ...

    async def add_attempt(
        self,
        execution_id: str,
        seq: int,
        now: float,
        *,
        target_connection: str | None = None,
        target_client_id: str | None = None,
    ) -> int:
        """Count one more delivery of the step, recording where it went; the new count."""
        ...

    async def record_spec(self, execution_id: str, seq: int, spec_json: str) -> Step | None: ...

    async def expire_paused(self, ttl: float, now: float) -> list[str]: ...

    async def prune_finished(self, retention: float, now: float) -> int:
        """Delete finished executions (and their steps) last changed before ``now - retention``.

        Returns how many executions were deleted. Running and paused ones are
        never touched, however old.
        """
        ...

    async def claim_session(self, session: str, principal: str, now: float) -> str:
        """Make ``principal`` the owner of ``session`` unless it has one; the owner after.

        Atomic across processes: of two principals claiming one session at
        once, one owns it and both get that one's id back.
        """
        ...

    async def session_owner(self, session: str) -> str | None:
        """The principal id that owns ``session``; None while nobody does."""
        ...

    async def sessions_owned_by(self, principal: str) -> list[str]:
        """Every session ``principal`` owns, by name."""

    # the conversations stored on the server (rules H1-H5)

    async def get_chat(self, chat_id: str) -> StoredChat | None: ...

    async def save_chat(
        self,
        chat_id: str,
        session: str,
        keep: int,
        messages: Sequence[str],
        now: float,
        *,
        streaming: str | None,
    ) -> int:
        """Keep the first ``keep`` stored messages, put ``messages`` (JSON each) after them.

        Creates the chat for ``session`` if it is new; raises
        :class:`ChatOfOtherSession` if another session has it. ``streaming``
        names the execution still writing into it (None once its response
        ended). Returns the chat's new version (1 for a new chat, +1 each save).
        """
        ...

    async def delete_chat(self, chat_id: str) -> bool:
        """Forget the chat and its messages; False if there was none."""
        ...

    async def chats(
        self,
        session: str | None,
        limit: int,
        before: tuple[float, str] | None = None,
        *,
        sessions: Collection[str] | None = None,
    ) -> list[ChatSummary]:
        """Chats newest first (by ``updated_at``, then id); ``before`` is the
        (updated_at, id) of the last one of the previous page; ``sessions``, if
        given, the only sessions whose chats are listed (a principal's own)."""
        ...

    async def prune_chats(self, retention: float, now: float) -> int:
        """Delete the chats last changed before ``now - retention`` that nothing writes into."""
        ...

    async def close(self) -> None: ...


# --------------------------------------------------------------------------- SQLite

_SCHEMA = """
CREATE TABLE executions (
    id           TEXT PRIMARY KEY,
    session      TEXT NOT NULL,
    status       TEXT NOT NULL
                 CHECK (status IN ('running', 'paused', 'completed', 'error', 'expired')),
    request_json TEXT NOT NULL,
    error        TEXT,
    created_at   REAL NOT NULL,
    updated_at   REAL NOT NULL,
    owner        TEXT,
    generation   INTEGER NOT NULL DEFAULT 0,
    lease_until  REAL
);
CREATE INDEX executions_by_status ON executions (status, updated_at);
CREATE INDEX executions_by_session ON executions (session, status);

CREATE TABLE steps (
    execution_id TEXT NOT NULL REFERENCES executions (id) ON DELETE CASCADE,
    seq          INTEGER NOT NULL CHECK (seq >= 0),
    kind         TEXT NOT NULL CHECK (kind IN ('model', 'tool')),
    name         TEXT NOT NULL,
    input_json   TEXT NOT NULL,
    resolution   TEXT NOT NULL CHECK (resolution IN ('client', 'approval', 'server')),
    state        TEXT NOT NULL CHECK (state IN ('pending', 'applied', 'error', 'expired')),
    result_json  TEXT,
    error_json   TEXT,
    request_id   TEXT,
    attempts     INTEGER NOT NULL DEFAULT 0,
    created_at   REAL NOT NULL,
    updated_at   REAL NOT NULL,
    spec_json    TEXT,
    PRIMARY KEY (execution_id, seq)
);
-- Only pending steps are ever searched by state, and they are few.
CREATE INDEX steps_pending ON steps (resolution, execution_id) WHERE state = 'pending';
CREATE INDEX steps_by_request_id ON steps (request_id) WHERE request_id IS NOT NULL;

CREATE TABLE session_owners (
    session    TEXT PRIMARY KEY,
    principal  TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE INDEX session_owners_by_principal ON session_owners (principal, session);
"""

# The conversations (H1): one row per chat, one per message at its position.
_CHAT_TABLES = (
    """
    CREATE TABLE chats (
        id            TEXT PRIMARY KEY,
        session       TEXT NOT NULL,
        version       INTEGER NOT NULL,
        message_count INTEGER NOT NULL,
        streaming     TEXT,
        updated_at    REAL NOT NULL
    )
    """,
    "CREATE INDEX chats_by_age ON chats (updated_at, id)",
    "CREATE INDEX chats_by_session ON chats (session, updated_at, id)",
    """
    CREATE TABLE chat_messages (
        chat_id      TEXT NOT NULL REFERENCES chats (id) ON DELETE CASCADE,
        position     INTEGER NOT NULL CHECK (position >= 0),
        message_json TEXT NOT NULL,
        PRIMARY KEY (chat_id, position)
    )
    """,
)

_EXECUTION_COLUMNS = (
    "id, session, status, request_json, error, created_at, updated_at, "
    "owner, generation, lease_until"
)
_STEP_COLUMNS = (
    "execution_id, seq, kind, name, input_json, resolution, state, result_json, "
    "error_json, request_id, attempts, created_at, updated_at, spec_json"
)
# Schema changes after version 1, applied in order to an older file: version N+1's
# statements are _MIGRATIONS[N - 1].
_MIGRATIONS: tuple[tuple[str, ...], ...] = (
    # 2: the tool spec a client call was made with, for the outputSchema after a restart.
    ("ALTER TABLE steps ADD COLUMN spec_json TEXT",),
    # 3: run ownership: the lease's owner, its generation (fencing), until when it holds.
    (
        "ALTER TABLE executions ADD COLUMN owner TEXT",
        "ALTER TABLE executions ADD COLUMN generation INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE executions ADD COLUMN lease_until REAL",
    ),
    # 4: who owns each session (O1). The sessions already in the ledger were used by the
    # one principal there was, the holders of the shared token: they keep them.
    (
        "CREATE TABLE session_owners (session TEXT PRIMARY KEY, principal TEXT NOT NULL, "
        "created_at REAL NOT NULL)",
        "CREATE INDEX session_owners_by_principal ON session_owners (principal, session)",
        "INSERT INTO session_owners (session, principal, created_at) "
        "SELECT session, 'shared', MIN(created_at) FROM executions GROUP BY session",
    ),
    # 5: the conversations stored on the server.
    _CHAT_TABLES,
)


_INSERT_STEP = (
    f"INSERT INTO steps ({_STEP_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (execution_id, seq) DO NOTHING"
)
_TOUCH_EXECUTION = "UPDATE executions SET updated_at = ? WHERE id = ?"
_SETTLE_SQL = {
    field: (
        f"UPDATE steps SET state = ?, {field}_json = ?, updated_at = ? "
        f"WHERE execution_id = ? AND seq = ? AND state = 'pending' RETURNING {_STEP_COLUMNS}"
    )
    for field in ("result", "error")
}


def _execution_from_row(row: tuple[object, ...]) -> Execution:
    return Execution(*row)  # type: ignore[arg-type]


def _step_from_row(row: tuple[object, ...]) -> Step:
    return Step(*row)  # type: ignore[arg-type]


def _by_age(execution: Execution) -> tuple[float, str]:
    return execution.created_at, execution.id


class SqliteLedger:
    """The ledger in one SQLite file (or ``":memory:"``).

    Use it from one thread: the one that opened it (the event loop's). Every
    write commits before returning (inside :meth:`batch`: when the batch ends),
    so a process killed right after a call loses nothing that call acknowledged.
    """

    def __init__(self, path: str | os.PathLike[str], *, lease: float = DEFAULT_LEASE) -> None:
        self._leases = Leases(lease)
        self._registrations: dict[str, Registration] = {}
        self._registration_order = 0
        # isolation_level=None: we open transactions ourselves (BEGIN IMMEDIATE),
        # so a read-then-write cannot interleave with another process's write.
        self._connection: sqlite3.Connection | None = sqlite3.connect(path, isolation_level=None)
        self._batch_depth = 0
        self._after_commit: list[Callable[[], None]] = []
        self._rolled_back = False  # the open batch's transaction was rolled back
        try:
            db = self._connection
            db.execute("PRAGMA busy_timeout = 5000")
            db.execute("PRAGMA journal_mode = WAL")
            # In WAL mode NORMAL survives a killed process; only power loss may
            # drop the last commits, a trade we take for not syncing on every step.
            db.execute("PRAGMA synchronous = NORMAL")
            db.execute("PRAGMA foreign_keys = ON")
            self._migrate()
        except BaseException:
            self._close()  # a half-opened ledger must not leak its connection
            raise

    def _migrate(self) -> None:
        with self._write() as db:
            (version,) = db.execute("PRAGMA user_version").fetchone()
            if version == _SCHEMA_VERSION:
                return
            if not 0 <= version < _SCHEMA_VERSION:
                raise RuntimeError(
                    f"ledger schema version {version} is not supported "
                    f"(this code knows version {_SCHEMA_VERSION})"
                )
            if version == 0:
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        db.execute(statement)
                for statement in _CHAT_TABLES:
                    db.execute(statement)
            else:
                for statements in _MIGRATIONS[version - 1 :]:
                    for statement in statements:
                        db.execute(statement)
            db.execute(f"PRAGMA user_version = {_SCHEMA_VERSION}")

    @property
    def _db(self) -> sqlite3.Connection:
        if self._connection is None:
            raise LedgerClosed("the ledger is closed")
        return self._connection

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One atomic write: its own committed transaction, or a part of the batch's."""
        db = self._db
        if self._batch_depth:
            if not db.in_transaction:
                db.execute("BEGIN IMMEDIATE")
            changes = db.total_changes
            try:
                yield db
            except BaseException:
                # Every call checks before it writes, so a call that raises has
                # usually written nothing. One that failed halfway (a database
                # error) takes the whole batch with it rather than leave half a call.
                if db.total_changes != changes and db.in_transaction:
                    db.execute("ROLLBACK")
                    self._rolled_back = True
                raise
            return
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    @contextlib.asynccontextmanager
    async def batch(self) -> AsyncIterator[None]:
        """Commit every write made inside the block in one transaction, when the block ends.

        For the writes of one logical step (a model answer and the tool calls it
        asked for). A call that raises before writing (a divergence, a refused
        value) leaves the calls before it to be committed, as if each had
        committed on its own; one that fails after writing part of its change
        rolls the whole batch back. Durability holds only if nothing is
        acknowledged to a peer inside the block: what announces its writes goes
        through :meth:`after_commit`. One connection: this store's coroutines
        never suspend, so nothing else runs inside a block that awaits only
        ledger calls. Nestable.
        """
        db = self._db
        self._batch_depth += 1
        try:
            yield
        finally:
            self._batch_depth -= 1
            if not self._batch_depth:
                actions, self._after_commit = self._after_commit, []
                rolled_back, self._rolled_back = self._rolled_back, False
                if db.in_transaction:
                    try:
                        db.execute("COMMIT")
                    except BaseException:
                        if db.in_transaction:
                            db.execute("ROLLBACK")
                        raise
                if not rolled_back:
                    # Committed (a refusal inside leaves the writes before it):
                    # what announces them may go now.
                    for action in actions:
                        action()

    def after_commit(self, action: Callable[[], None]) -> None:
        """Run ``action`` once the writes so far are committed: now, or when the batch ends."""
        if self._batch_depth:
            self._after_commit.append(action)
        else:
            action()

    async def __aenter__(self) -> SqliteLedger:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._close()

    async def close(self) -> None:
        self._close()

    def _close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    # the registrations (S2): one process, so they live in its memory

    async def keep_alive(self, now: float) -> frozenset[str]:
        return frozenset({self._leases.owner})

    async def register(
        self, connection_id: str, session: str, client_id: str | None, tools_json: str
    ) -> int:
        self._registration_order += 1
        for other in [
            r.connection_id
            for r in self._registrations.values()
            if client_id is not None and (r.session, r.client_id) == (session, client_id)
        ]:
            del self._registrations[other]
        self._registrations[connection_id] = Registration(
            connection_id, session, self._leases.owner, self._registration_order, client_id,
            tools_json,
        )  # fmt: skip
        return self._registration_order

    async def unregister(self, connection_id: str) -> None:
        self._registrations.pop(connection_id, None)

    async def registrations(self, session: str, now: float) -> list[Registration]:
        return sorted(
            (r for r in self._registrations.values() if r.session == session),
            key=lambda r: r.order,
        )

    async def registered(self, connection_id: str, now: float) -> bool:
        return connection_id in self._registrations

    async def delivered_to(
        self, connection_ids: Collection[str]
    ) -> list[tuple[str, str, str | None]]:
        return []  # one process knows where its invokes went: nothing is recorded

    async def mark_approval(self, execution_id: str, seq: int, tool_call_id: str) -> None:
        pass  # one process: the approval waits in its memory, by tool call id

    async def approval_step(
        self, session: str, tool_call_id: str
    ) -> tuple[Step, str | None] | None:
        return None

    # the bus: one process, nobody to tell

    @property
    def owner(self) -> str:
        return self._leases.owner

    async def notify(self, process_id: str | None, kind: str, *args: str) -> None:
        if process_id is not None and process_id != self._leases.owner:
            raise RuntimeError(
                f"a SQLite ledger has one process; it cannot notify process {process_id}"
            )

    # leases

    def _fence(self, db: sqlite3.Connection, execution_id: str) -> None:
        """Raise LeaseLost if this instance held the execution and no longer does.

        Inside the write's own transaction (BEGIN IMMEDIATE), so no take-over
        can come between this check and the write.
        """
        held = self._leases.generation(execution_id)
        if held is None:
            return
        row = db.execute(
            "SELECT generation FROM executions WHERE id = ?", (execution_id,)
        ).fetchone()
        if row is not None and row[0] != held:
            raise self._leases.lose(execution_id, int(row[0]))

    async def take_over(self, now: float) -> list[Execution]:
        leases = self._leases
        with self._write() as db:
            rows = db.execute(
                "UPDATE executions SET owner = ?, generation = generation + 1, lease_until = ? "
                "WHERE status IN ('running', 'paused') "
                "AND (owner IS NOT ? OR lease_until IS NULL OR lease_until < ?) "
                f"RETURNING {_EXECUTION_COLUMNS}",
                (leases.owner, now + leases.seconds, leases.owner, now),
            ).fetchall()
        taken = sorted((_execution_from_row(row) for row in rows), key=_by_age)
        for execution in taken:
            leases.hold(execution.id, execution.generation)
        return taken

    async def renew(self, now: float) -> list[str]:
        leases = self._leases
        lost: list[str] = []
        with self._write() as db:
            for execution_id, generation in list(leases.held.items()):
                renewed = db.execute(
                    "UPDATE executions SET lease_until = ? WHERE id = ? AND generation = ?",
                    (now + leases.seconds, execution_id, generation),
                ).rowcount
                if not renewed:
                    lost.append(execution_id)
        for execution_id in lost:
            leases.lose(execution_id, None)
        return lost

    def release(self, execution_id: str) -> None:
        self._leases.release(execution_id)

    # executions

    async def start_execution(
        self, session: str, request_json: str, now: float, chat_id: str | None = None
    ) -> Execution:
        # chat_id: one process knows its streaming responses itself; not stored.
        canonicalize(request_json)  # refuse what could not be re-run later
        leases = self._leases
        execution = Execution(
            uuid.uuid4().hex, session, "running", request_json, None, now, now,
            leases.owner, 1, now + leases.seconds,
        )  # fmt: skip
        with self._write() as db:
            db.execute(
                f"INSERT INTO executions ({_EXECUTION_COLUMNS}) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                dataclasses.astuple(execution),
            )
        leases.hold(execution.id, execution.generation)
        return execution

    async def get_execution(self, execution_id: str) -> Execution | None:
        row = self._db.execute(
            f"SELECT {_EXECUTION_COLUMNS} FROM executions WHERE id = ?", (execution_id,)
        ).fetchone()
        return None if row is None else _execution_from_row(row)

    async def executions(
        self,
        statuses: Collection[ExecutionStatus] | None = None,
        session: str | None = None,
    ) -> list[Execution]:
        _check_statuses(statuses)
        where: list[str] = []
        params: list[object] = []
        if statuses is not None:
            if not statuses:
                return []
            where.append(f"status IN ({', '.join('?' * len(statuses))})")
            params.extend(statuses)
        if session is not None:
            where.append("session = ?")
            params.append(session)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        rows = self._db.execute(
            f"SELECT {_EXECUTION_COLUMNS} FROM executions {clause} ORDER BY created_at, id",
            params,
        ).fetchall()
        return [_execution_from_row(row) for row in rows]

    async def set_status(
        self, execution_id: str, status: ExecutionStatus, now: float, error: str | None = None
    ) -> None:
        with self._write() as db:
            execution = self._execution_in(db, execution_id)
            self._fence(db, execution_id)
            _check_transition(execution, status)
            if execution.finished:
                return  # same finished status again: nothing changes
            db.execute(
                "UPDATE executions SET status = ?, error = ?, updated_at = ? WHERE id = ?",
                (status, error, now, execution_id),
            )
            if status in FINISHED_STATUSES:
                self._settle_pending(db, execution_id, status, now, ttl=None)

    def _execution_in(self, db: sqlite3.Connection, execution_id: str) -> Execution:
        row = db.execute(
            f"SELECT {_EXECUTION_COLUMNS} FROM executions WHERE id = ?", (execution_id,)
        ).fetchone()
        if row is None:
            raise UnknownExecution(f"no execution {execution_id}")
        return _execution_from_row(row)

    def _settle_pending(
        self,
        db: sqlite3.Connection,
        execution_id: str,
        status: ExecutionStatus,
        now: float,
        ttl: float | None,
    ) -> None:
        state, error_json = _closing_error(status, ttl)
        db.execute(
            "UPDATE steps SET state = ?, error_json = ?, updated_at = ? "
            "WHERE execution_id = ? AND state = 'pending'",
            (state, error_json, now, execution_id),
        )

    async def expire_paused(self, ttl: float, now: float) -> list[str]:
        cutoff = now - ttl
        with self._write() as db:
            rows = db.execute(
                "SELECT id FROM executions AS e WHERE updated_at < ? AND ("
                " status = 'paused' OR (status = 'running' AND EXISTS ("
                "  SELECT 1 FROM steps WHERE execution_id = e.id AND state = 'pending')))"
                " ORDER BY created_at, id",
                (cutoff,),
            ).fetchall()
            expired = [row[0] for row in rows]
            for execution_id in expired:
                db.execute(
                    "UPDATE executions SET status = 'expired', error = ?, updated_at = ? "
                    "WHERE id = ?",
                    (f"expired after {ttl:g} s without progress", now, execution_id),
                )
                self._settle_pending(db, execution_id, "expired", now, ttl)
        return expired

    async def prune_finished(self, retention: float, now: float) -> int:
        if retention < 0:
            raise ValueError(f"retention must not be negative, not {retention}")
        finished = ", ".join(f"'{status}'" for status in sorted(FINISHED_STATUSES))
        with self._write() as db:
            # The steps go with their execution (ON DELETE CASCADE).
            deleted = db.execute(
                f"DELETE FROM executions WHERE status IN ({finished}) AND updated_at < ?",
                (now - retention,),
            ).rowcount
        return int(deleted)

    # steps

    async def record_step(
        self,
        execution_id: str,
        seq: int,
        kind: StepKind,
        name: str,
        input_json: str,
        resolution: Resolution,
        now: float,
        request_id: str | None = None,
        result_json: str | None = None,
    ) -> Step:
        if seq < 0:
            raise ValueError(f"seq must be >= 0, not {seq}")
        canonical_input = _prepare_input(name, input_json)
        state, stored_result = _prepare_recorded_result(result_json)
        values = (
            execution_id, seq, kind, name, canonical_input, resolution, state,
            stored_result, None, request_id, 0, now, now, None,
        )  # fmt: skip
        with self._write() as db:
            self._fence(db, execution_id)
            try:
                inserted = db.execute(_INSERT_STEP, values).rowcount
            except sqlite3.IntegrityError:
                self._execution_in(db, execution_id)  # UnknownExecution when that is why
                raise
            if inserted:
                # A step recorded is progress: the run is not idle, so not expirable yet.
                db.execute(_TOUCH_EXECUTION, (now, execution_id))
                return Step(*values)
            existing = self._step_in(db, execution_id, seq)
        assert existing is not None
        check_replay(existing, kind, name, canonical_input)
        return existing

    def _step_in(self, db: sqlite3.Connection, execution_id: str, seq: int) -> Step | None:
        row = db.execute(
            f"SELECT {_STEP_COLUMNS} FROM steps WHERE execution_id = ? AND seq = ?",
            (execution_id, seq),
        ).fetchone()
        return None if row is None else _step_from_row(row)

    async def get_step(self, execution_id: str, seq: int) -> Step | None:
        return self._step_in(self._db, execution_id, seq)

    async def step_by_request_id(self, request_id: str) -> Step | None:
        row = self._db.execute(
            f"SELECT {_STEP_COLUMNS} FROM steps WHERE request_id = ? ORDER BY created_at LIMIT 1",
            (request_id,),
        ).fetchone()
        return None if row is None else _step_from_row(row)

    async def steps(self, execution_id: str) -> list[Step]:
        rows = self._db.execute(
            f"SELECT {_STEP_COLUMNS} FROM steps WHERE execution_id = ? ORDER BY seq",
            (execution_id,),
        ).fetchall()
        return [_step_from_row(row) for row in rows]

    async def pending_steps(
        self, session: str | None = None, resolution: Resolution | None = None
    ) -> list[Step]:
        columns = ", ".join(f"s.{column.strip()}" for column in _STEP_COLUMNS.split(","))
        where = ["s.state = 'pending'", "e.status IN ('running', 'paused')"]
        params: list[object] = []
        if session is not None:
            where.append("e.session = ?")
            params.append(session)
        if resolution is not None:
            where.append("s.resolution = ?")
            params.append(resolution)
        rows = self._db.execute(
            f"SELECT {columns} FROM steps AS s JOIN executions AS e ON e.id = s.execution_id "
            f"WHERE {' AND '.join(where)} ORDER BY s.created_at, s.execution_id, s.seq",
            params,
        ).fetchall()
        return [_step_from_row(row) for row in rows]

    async def resolve(self, execution_id: str, seq: int, result_json: str, now: float) -> Outcome:
        return self._settle(execution_id, seq, "result", result_json, now)

    async def reject(self, execution_id: str, seq: int, error_json: str, now: float) -> Outcome:
        return self._settle(execution_id, seq, "error", error_json, now)

    def _settle(
        self,
        execution_id: str,
        seq: int,
        field: Literal["result", "error"],
        value_json: str,
        now: float,
    ) -> Outcome:
        prepared = _prepare_result(value_json) if field == "result" else _prepare_error(value_json)
        with self._write() as db:
            self._fence(db, execution_id)
            if not isinstance(prepared, Outcome):
                state = "applied" if field == "result" else "error"
                rows = db.execute(
                    _SETTLE_SQL[field], (state, prepared, now, execution_id, seq)
                ).fetchall()
                if rows:
                    db.execute(_TOUCH_EXECUTION, (now, execution_id))
                    settled = _step_from_row(rows[0])
                    return Outcome(
                        True, "applied", f"step {seq} of execution {execution_id} settled", settled
                    )
            # Missing, already settled, or a value that cannot be stored: nothing was written.
            step = self._step_in(db, execution_id, seq)
        refusal = _refusal(step, execution_id, seq)
        if refusal is not None:
            return refusal
        assert isinstance(prepared, Outcome)
        return dataclasses.replace(prepared, step=step)

    async def add_attempt(
        self,
        execution_id: str,
        seq: int,
        now: float,
        *,
        target_connection: str | None = None,
        target_client_id: str | None = None,
    ) -> int:
        # The target is not stored: one process knows where its invokes went.
        with self._write() as db:
            self._fence(db, execution_id)
            row = db.execute(
                "UPDATE steps SET attempts = attempts + 1, updated_at = ? "
                "WHERE execution_id = ? AND seq = ? RETURNING attempts",
                (now, execution_id, seq),
            ).fetchone()
        if row is None:
            raise UnknownStep(f"no step {seq} in execution {execution_id}")
        return int(row[0])

    # who owns each session (O1)

    async def claim_session(self, session: str, principal: str, now: float) -> str:
        with self._write() as db:
            db.execute(
                "INSERT INTO session_owners (session, principal, created_at) VALUES (?, ?, ?) "
                "ON CONFLICT (session) DO NOTHING",
                (session, principal, now),
            )
            (owner,) = db.execute(
                "SELECT principal FROM session_owners WHERE session = ?", (session,)
            ).fetchone()
        return str(owner)

    async def session_owner(self, session: str) -> str | None:
        row = self._db.execute(
            "SELECT principal FROM session_owners WHERE session = ?", (session,)
        ).fetchone()
        return None if row is None else str(row[0])

    async def sessions_owned_by(self, principal: str) -> list[str]:
        rows = self._db.execute(
            "SELECT session FROM session_owners WHERE principal = ? ORDER BY session",
            (principal,),
        ).fetchall()
        return [str(session) for (session,) in rows]

    async def record_spec(self, execution_id: str, seq: int, spec_json: str) -> Step | None:
        """Record the tool spec of a step once (the first stays); the step, None if missing."""
        canonical = canonicalize(spec_json)
        with self._write() as db:
            self._fence(db, execution_id)
            db.execute(
                "UPDATE steps SET spec_json = ? "
                "WHERE execution_id = ? AND seq = ? AND spec_json IS NULL",
                (canonical, execution_id, seq),
            )
            return self._step_in(db, execution_id, seq)

    # the conversations (H1-H5)

    async def get_chat(self, chat_id: str) -> StoredChat | None:
        db = self._db
        row = db.execute(
            "SELECT session, version, updated_at, streaming FROM chats WHERE id = ?", (chat_id,)
        ).fetchone()
        if row is None:
            return None
        messages = db.execute(
            "SELECT message_json FROM chat_messages WHERE chat_id = ? ORDER BY position",
            (chat_id,),
        ).fetchall()
        return StoredChat(chat_id, row[0], row[1], row[2], tuple(m[0] for m in messages), row[3])

    async def save_chat(
        self,
        chat_id: str,
        session: str,
        keep: int,
        messages: Sequence[str],
        now: float,
        *,
        streaming: str | None,
    ) -> int:
        if keep < 0:
            raise ValueError(f"keep must not be negative, not {keep}")
        with self._write() as db:
            row = db.execute(
                "SELECT session, version, message_count FROM chats WHERE id = ?", (chat_id,)
            ).fetchone()
            if row is None:
                version, keep = 1, 0
                db.execute(
                    "INSERT INTO chats (id, session, version, message_count, streaming, "
                    "updated_at) VALUES (?, ?, 1, ?, ?, ?)",
                    (chat_id, session, len(messages), streaming, now),
                )
            else:
                if row[0] != session:
                    raise ChatOfOtherSession(f"chat {chat_id!r} belongs to another session")
                version, keep = row[1] + 1, min(keep, row[2])
                db.execute(
                    "DELETE FROM chat_messages WHERE chat_id = ? AND position >= ?",
                    (chat_id, keep),
                )
                db.execute(
                    "UPDATE chats SET version = ?, message_count = ?, streaming = ?, "
                    "updated_at = ? WHERE id = ?",
                    (version, keep + len(messages), streaming, now, chat_id),
                )
            db.executemany(
                "INSERT INTO chat_messages (chat_id, position, message_json) VALUES (?, ?, ?)",
                [(chat_id, keep + i, text) for i, text in enumerate(messages)],
            )
        return int(version)

    async def delete_chat(self, chat_id: str) -> bool:
        with self._write() as db:
            deleted = db.execute("DELETE FROM chats WHERE id = ?", (chat_id,)).rowcount
        return bool(deleted)

    async def chats(
        self,
        session: str | None,
        limit: int,
        before: tuple[float, str] | None = None,
        *,
        sessions: Collection[str] | None = None,
    ) -> list[ChatSummary]:
        where: list[str] = []
        params: list[object] = []
        if session is not None:
            where.append("session = ?")
            params.append(session)
        if sessions is not None:
            where.append(f"session IN ({', '.join('?' * len(sessions))})")
            params.extend(sessions)
        if before is not None:
            where.append("(updated_at < ? OR (updated_at = ? AND id < ?))")
            params.extend((before[0], before[0], before[1]))
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        rows = self._db.execute(
            "SELECT id, session, message_count, version, updated_at FROM chats "
            f"{clause} ORDER BY updated_at DESC, id DESC LIMIT ?",
            (*params, limit),
        ).fetchall()
        return [ChatSummary(*row) for row in rows]

    async def prune_chats(self, retention: float, now: float) -> int:
        if retention < 0:
            raise ValueError(f"retention must not be negative, not {retention}")
        with self._write() as db:
            deleted = db.execute(
                # A response that can no longer finish (its run ended without a
                # last save, or expired) does not keep its chat alive.
                "DELETE FROM chats WHERE updated_at < ? AND (streaming IS NULL OR NOT EXISTS ("
                " SELECT 1 FROM executions WHERE id = streaming "
                " AND status IN ('running', 'paused')))",
                (now - retention,),
            ).rowcount
        return int(deleted)
