"""The :class:`Ledger` protocol: what the runtime calls, whichever store is under it.

:class:`~clienttools_server.ledger.SqliteLedger` and
:class:`~clienttools_server.ledger.PostgresLedger` implement it, by one class
of rules over a store per dialect (``core.py``). Example::

    async def first_step(ledger: Ledger, execution_id: str) -> Step | None:
        return await ledger.get_step(execution_id, 0)
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Protocol

from .records import (
    ChatSummary,
    Execution,
    ExecutionStatus,
    Outcome,
    Registration,
    Resolution,
    Step,
    StepKind,
    StoredChat,
)


class Ledger(Protocol):
    """What the runtime calls; both stores' ledgers implement it.

    Every method that reads or writes is a coroutine, so a store on a server
    (PostgreSQL) waits for its database without blocking the event loop; what
    needs no I/O (``owner``, ``release``, ``after_commit``) is synchronous.
    """

    @property
    def owner(self) -> str:
        """This instance's process id, drawn when it opens: the owner of the runs it holds."""
        ...

    async def notify(self, process_id: str | None, kind: str, *args: str) -> None:
        """Tell process ``process_id`` (None: every process) that rows changed.

        ``args`` are ids, and what the receiver would read of those rows when it is
        small (``cluster.routing.fits``); PostgreSQL refuses a payload over 8,000
        bytes. Inside :meth:`batch` it is part of the transaction (delivered after the
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

        Returns the ids of those lost since the last renewal (taken over
        meanwhile), each once, whether this renewal found it or a write the
        fence refused (:class:`LeaseLost`, met in whatever task made it): they
        are fenced from now on, and their runs must stop.
        """
        ...

    def release(self, execution_id: str) -> None:
        """Stop renewing the execution's lease (its run ended in this process)."""
        ...

    async def keep_alive(self, now: float) -> frozenset[str]:
        """Mark this process alive until ``now`` + the lease; the ids of the live processes.

        Processes dead for ten leases are forgotten, with their registrations and
        their chat subscriptions.
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
        """Start a run. ``chat_id``: the chat it answers; recorded, so another process
        finds the chat's response, and :class:`ChatBusy` is raised while an execution
        of the same session and chat is unfinished (on every store)."""
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
        spec_json: str | None = None,
        *,
        target_connection: str | None = None,
        target_client_id: str | None = None,
    ) -> Step:
        """Record a step, or check a replay against the step recorded at ``seq``.

        ``spec_json``: the tool spec a result of the call is checked against, if
        known now (else :meth:`record_spec` later); a replay keeps the recorded one.
        ``target_connection``: a call delivered as it is recorded; the step then
        counts that first attempt and where it went, as :meth:`add_attempt` would.
        """
        ...

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

    # the tools each session's pages registered (S2), kept past a restart

    async def remember_tools(
        self, session: str, specs: Mapping[str, str], now: float, *, keep: int
    ) -> None:
        """Set the spec JSON of each named tool of ``session`` (registered at ``now``);
        the session keeps its ``keep`` newest."""
        ...

    async def remembered_tools(self, session: str) -> dict[str, str]:
        """tool name -> spec JSON of every tool remembered for ``session``, oldest first."""
        ...

    async def prune_session_tools(self, retention: float, now: float) -> int:
        """Forget the tools registered before ``now - retention`` of the sessions with no
        unfinished run; how many were forgotten."""
        ...

    # the conversations stored on the server (rules H1-H5)

    async def get_chat(self, chat_id: str) -> StoredChat | None: ...

    async def subscribe_chat(self, chat_id: str) -> StoredChat | None:
        """Record that this process has a connection subscribed to the chat; the chat as
        stored, read after that (idempotent).

        A save or delete that commits after the record tells this process
        (``CHAT_CHANGED``); one in flight meanwhile, the chat's first included, has
        committed before the read, which waits for its lock. (SQLite: one process,
        nothing to record.)
        """
        ...

    async def unsubscribe_chat(self, chat_id: str) -> None:
        """This process has no connection subscribed to the chat any more."""
        ...

    async def save_chat(
        self,
        chat_id: str,
        session: str,
        keep: int,
        messages: Sequence[str],
        now: float,
        *,
        streaming: str | None,
        new: bool = False,
    ) -> int:
        """Keep the first ``keep`` stored messages, put ``messages`` (JSON each) after them.

        Creates the chat for ``session`` if it is new; raises
        :class:`ChatOfOtherSession` if another session has it. ``streaming``
        names the execution still writing into it (None once its response
        ended). ``new``: the chat was not there when last read, so the save
        tries to make it first (one statement fewer; right either way).
        Returns the chat's new version (1 for a new chat, +1 each save).
        The other processes subscribed to the chat (:meth:`subscribe_chat`) are
        told (``CHAT_CHANGED``) when it commits.
        """
        ...

    async def delete_chat(self, chat_id: str) -> bool:
        """Forget the chat and its messages (its subscribers elsewhere are told, as by
        :meth:`save_chat`); False if there was none."""
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
