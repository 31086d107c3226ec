"""What the ledger's rules ask of a store: one method per operation, in one dialect's SQL.

:class:`~clienttools_server.ledger.core.LedgerCore` holds the rules (what is
prepared, refused, replayed, fenced, batched); a :class:`Store` runs the SQL of
each operation on its database and hands back records. ``Tx`` is the store's
own handle on an open transaction: the rules only pass it back to the store.
A write that carries the fence (:func:`~clienttools_server.ledger.schema.fence`)
takes ``held``, the generation this instance holds (None: not one of its
runs), and returns nothing (False, None) when the fence or a missing row
refused it; the rules then ask :meth:`Store.generation` why.

Example (the rules' side)::

    async with store.write() as tx:
        changed = await store.set_status(tx, id, "completed", None, now, held, froms, settle)
        if not changed:
            execution = await store.locked_execution(tx, id)  # why not
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, TypeVar

from .records import (
    ChatSummary,
    Execution,
    ExecutionStatus,
    Registration,
    Resolution,
    Step,
    StepState,
    StoredChat,
)

Tx = TypeVar("Tx")


@dataclass(eq=False)
class Batch:
    """One open batch: what waits for its commit, and whether the commit happened."""

    actions: list[Callable[[], None]] = field(default_factory=list)
    committed: bool = False  # set by the store once the batch's writes are durable


class Store(Protocol[Tx]):
    """One dialect's SQL for every operation of the ledger."""

    def check_open(self) -> None:
        """Raise LedgerClosed once the store is closed."""
        ...

    def write(self) -> contextlib.AbstractAsyncContextManager[Tx]:
        """One atomic write: its own committed transaction, or a part of the open batch's."""
        ...

    def current_batch(self) -> Batch | None:
        """The batch the calls made now are part of, if one is open."""
        ...

    def open_batch(self) -> contextlib.AbstractAsyncContextManager[Batch]:
        """Open a batch; commit it when the block ends (also when it raised).

        Sets ``committed`` once the commit went through; leaves it False when a
        database error rolled the batch back or the commit failed.
        """
        ...

    async def close(self) -> None: ...

    # leases

    async def generation(self, execution_id: str) -> int | None:
        """The execution's generation now; None if there is no such execution."""
        ...

    async def take_over(self, owner: str, until: float, now: float) -> list[Execution]: ...

    async def renew(self, held: Sequence[tuple[str, int]], until: float) -> set[str]:
        """Extend the leases still at the generation held; the ids renewed."""
        ...

    # executions

    async def insert_execution(self, execution: Execution, chat_id: str | None) -> bool:
        """Insert a run; False if an unfinished one of the same session and chat is there."""
        ...

    async def get_execution(self, execution_id: str) -> Execution | None: ...

    async def executions(
        self, statuses: Collection[ExecutionStatus] | None, session: str | None
    ) -> list[Execution]: ...

    async def locked_execution(self, tx: Tx, execution_id: str) -> Execution | None:
        """The execution, locked against other writers until the transaction ends."""
        ...

    async def set_status(
        self, tx: Tx, execution_id: str, status: ExecutionStatus, error: str | None, now: float,
        held: int | None, froms: Sequence[ExecutionStatus], settle: tuple[StepState, str] | None,
    ) -> bool:  # fmt: skip
        """Set the status of the execution if it is one of ``froms`` and at the generation
        ``held`` (None: any), and then settle its pending steps with ``settle`` (state,
        error JSON), if given; True if it changed. Takes the row's lock either way."""
        ...

    async def idle_executions(self, tx: Tx, cutoff: float) -> list[str]:
        """Paused runs, and running ones waiting for a call, last changed before ``cutoff``."""
        ...

    async def prune_finished(self, cutoff: float) -> int: ...

    # steps

    async def insert_step(self, step: Step, held: int | None) -> bool:
        """Insert the step (fenced) unless one is at its seq; True if inserted."""
        ...

    async def get_step(self, execution_id: str, seq: int) -> Step | None: ...

    async def step_by_request_id(self, request_id: str) -> Step | None: ...

    async def steps(self, execution_id: str) -> list[Step]: ...

    async def pending_steps(
        self, session: str | None, resolution: Resolution | None,
    ) -> list[Step]:  # fmt: skip
        ...

    async def settle(
        self, execution_id: str, seq: int, field: Literal["result", "error"], state: StepState,
        value_json: str, now: float, held: int | None,
    ) -> Step | None:  # fmt: skip
        """Settle a pending step (fenced); the settled step, None if nothing changed."""
        ...

    async def add_attempt(
        self, execution_id: str, seq: int, now: float, target: tuple[str | None, str | None],
        held: int | None,
    ) -> int | None:  # fmt: skip
        """Count a delivery to ``target`` (connection, clientId), fenced; the new count."""
        ...

    async def record_spec(
        self, execution_id: str, seq: int, spec_json: str, held: int | None
    ) -> Step | None:
        """Set the step's spec unless it has one (fenced); the step as it stands after."""
        ...

    async def mark_approval(self, execution_id: str, seq: int, tool_call_id: str) -> None: ...

    async def approval_step(
        self, session: str, tool_call_id: str
    ) -> tuple[Step, str | None] | None: ...

    async def delivered_to(
        self, connection_ids: Collection[str]
    ) -> list[tuple[str, str, str | None]]: ...

    # processes and registrations

    async def keep_alive(
        self, owner: str, now: float, until: float, forget_before: float
    ) -> frozenset[str]:
        """Mark ``owner`` alive until ``until``, forget the dead; the live processes."""
        ...

    async def register(
        self, owner: str, connection_id: str, session: str, client_id: str | None, tools: str
    ) -> int: ...

    async def unregister(self, connection_id: str) -> None: ...

    async def registrations(self, owner: str, session: str, now: float) -> list[Registration]: ...

    async def registered(self, owner: str, connection_id: str, now: float) -> bool: ...

    async def notify(
        self, owner: str, process_id: str | None, kind: str, args: Sequence[str]
    ) -> None: ...

    # who owns each session

    async def claim_session(self, session: str, principal: str, now: float) -> str: ...

    async def session_owner(self, session: str) -> str | None: ...

    async def sessions_owned_by(self, principal: str) -> list[str]: ...

    # the tools each session's pages registered (S2)

    async def remember_tools(
        self, session: str, specs: Sequence[tuple[str, str]], now: float, keep: int
    ) -> None:
        """Set the (name, spec JSON) rows of the session; keep its ``keep`` newest."""
        ...

    async def remembered_tools(self, session: str) -> list[tuple[str, str]]:
        """The session's (name, spec JSON) rows, oldest first."""
        ...

    async def prune_session_tools(self, cutoff: float) -> int: ...

    # the conversations

    async def get_chat(self, chat_id: str) -> StoredChat | None: ...

    async def subscribe_chat(self, owner: str, chat_id: str) -> StoredChat | None: ...

    async def unsubscribe_chat(self, owner: str, chat_id: str) -> None: ...

    async def locked_chat(
        self, tx: Tx, chat_id: str, session: str, now: float, new: bool
    ) -> tuple[str, int, int]:
        """(session, version, message count) of the chat, made (version 0) if new; locked.
        ``new``: it was not there when last read, so making it is tried first."""
        ...

    async def store_chat(
        self, owner: str, tx: Tx, chat_id: str, keep: int, messages: Sequence[str],
        version: int, streaming: str | None, now: float, count: int,
    ) -> None:  # fmt: skip
        """Keep the first ``keep`` messages of the ``count`` stored, append ``messages``,
        set the chat's row; tell the chat's subscribers on processes other than ``owner``."""
        ...

    async def delete_chat(self, owner: str, chat_id: str) -> bool: ...

    async def chats(
        self, session: str | None, limit: int, before: tuple[float, str] | None,
        sessions: Collection[str] | None,
    ) -> list[ChatSummary]:  # fmt: skip
        ...

    async def prune_chats(self, cutoff: float) -> int: ...
