"""The ledger's rules, written once, over a store per dialect.

:class:`LedgerCore` implements the :class:`~clienttools_server.ledger.protocol.Ledger`
protocol: it prepares every value before any SQL (canonical JSON, the size
limit), turns stale, duplicate and oversize settlements into
:class:`~clienttools_server.ledger.records.Outcome` values, checks a replayed
step against its record, keeps the leases this instance holds and fences
every write for a run with them, and runs what waits for a batch's commit.
The :class:`~clienttools_server.ledger.store.Store` under it runs one
dialect's SQL per operation. So the same input does the same thing on every
store: ``tests/server/test_ledger_contract.py`` checks it on SQLite and
PostgreSQL.

Example::

    async with SqliteLedger(":memory:") as ledger:  # a LedgerCore over the SQLite store
        run = await ledger.start_execution("s", "{}", now=0.0)
        async with ledger.batch():
            await ledger.record_step(run.id, 0, "tool", "t", "{}", "client", 0.0)
            ledger.after_commit(lambda: print("recorded"))  # once the batch has committed
"""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from types import TracebackType
from typing import Generic, Literal, Self

from ..canonical import canonicalize
from .records import (
    CHANGED_FROM,
    FINISHED_STATUSES,
    ChatBusy,
    ChatOfOtherSession,
    ChatSummary,
    Execution,
    ExecutionStatus,
    Outcome,
    Registration,
    Resolution,
    Step,
    StepKind,
    StepState,
    StoredChat,
    UnknownExecution,
    UnknownStep,
)
from .rules import (
    Leases,
    check_replay,
    check_statuses,
    check_transition,
    closing_error,
    prepare_error,
    prepare_input,
    prepare_recorded_result,
    prepare_result,
    refusal,
)
from .store import Batch, Store, Tx

# A process dead for this many leases is forgotten, with its registrations.
FORGET_DEAD_AFTER_LEASES = 10


def _by_age(execution: Execution) -> tuple[float, str]:
    return execution.created_at, execution.id


class LedgerCore(Generic[Tx]):
    """The rules of the ledger over one store; see the module docstring."""

    def __init__(self, store: Store[Tx], leases: Leases) -> None:
        self._leases = leases
        self._store = store

    @property
    def owner(self) -> str:
        """This instance's process id: the owner it writes into the runs it holds."""
        return self._leases.owner

    # batches

    @contextlib.asynccontextmanager
    async def batch(self) -> AsyncIterator[None]:
        """Commit every write made inside the block in one transaction, when the block ends.

        For the writes of one logical step (a model answer and the tool calls it
        asked for). A call that refuses before writing (a divergence, an unknown
        execution, a value that cannot be stored) leaves the calls before it to
        be committed, as if each had committed on its own; a database error
        rolls the whole batch back. Durability holds only if nothing is
        acknowledged to a peer inside the block: what announces its writes goes
        through :meth:`after_commit`. Nestable: the outermost batch commits.
        """
        self._store.check_open()
        if self._store.current_batch() is not None:
            yield
            return
        batch: Batch | None = None
        try:
            async with self._store.open_batch() as batch:
                yield
        finally:
            if batch is not None and batch.committed:
                # Committed (a refusal inside leaves the writes before it):
                # what announces them may go now, in the order registered.
                for action in batch.actions:
                    action()

    def after_commit(self, action: Callable[[], None]) -> None:
        """Run ``action`` once the writes so far are committed: now, or when the batch ends.

        Dropped if a database error rolled the batch back or its commit failed.
        """
        batch = self._store.current_batch()
        if batch is None:
            action()
        else:
            batch.actions.append(action)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self._store.close()

    # leases and the fence

    def _held(self, execution_id: str) -> int | None:
        """The generation held for the execution (None: not ours); LeaseLost if lost."""
        return self._leases.generation(execution_id)

    async def _check_lease(self, execution_id: str, held: int | None) -> None:
        """After a fenced write changed nothing: raise LeaseLost if the fence is why."""
        if held is None:
            return
        current = await self._store.generation(execution_id)
        if current is not None and current != held:
            raise self._leases.lose(execution_id, current)

    async def take_over(self, now: float) -> list[Execution]:
        leases = self._leases
        rows = await self._store.take_over(leases.owner, now + leases.seconds, now)
        taken = sorted(rows, key=_by_age)
        for execution in taken:
            leases.hold(execution.id, execution.generation)
        return taken

    async def renew(self, now: float) -> list[str]:
        leases = self._leases
        if leases.held:
            held = list(leases.held.items())
            renewed = await self._store.renew(held, now + leases.seconds)
            for execution_id, _ in held:
                if execution_id not in renewed:
                    leases.lose(execution_id, None)
        return leases.reported()

    def release(self, execution_id: str) -> None:
        self._leases.release(execution_id)

    # processes, registrations (S2) and the bus

    async def keep_alive(self, now: float) -> frozenset[str]:
        seconds = self._leases.seconds
        return await self._store.keep_alive(
            self.owner, now, now + seconds, now - seconds * FORGET_DEAD_AFTER_LEASES
        )

    async def register(
        self, connection_id: str, session: str, client_id: str | None, tools_json: str
    ) -> int:
        return await self._store.register(self.owner, connection_id, session, client_id, tools_json)

    async def unregister(self, connection_id: str) -> None:
        await self._store.unregister(connection_id)

    async def registrations(self, session: str, now: float) -> list[Registration]:
        return await self._store.registrations(self.owner, session, now)

    async def registered(self, connection_id: str, now: float) -> bool:
        return await self._store.registered(self.owner, connection_id, now)

    async def notify(self, process_id: str | None, kind: str, *args: str) -> None:
        await self._store.notify(self.owner, process_id, kind, args)

    # executions

    async def start_execution(
        self, session: str, request_json: str, now: float, chat_id: str | None = None
    ) -> Execution:
        canonicalize(request_json)  # refuse what could not be re-run later
        leases = self._leases
        execution = Execution(
            uuid.uuid4().hex, session, "running", request_json, None, now, now,
            leases.owner, 1, now + leases.seconds,
        )  # fmt: skip
        # The unique index on the unfinished executions of a chat decides, in the
        # same statement: of two processes starting one chat at once, one gets it.
        if not await self._store.insert_execution(execution, chat_id):
            raise ChatBusy(f"chat {chat_id!r} of session {session!r} has a response streaming")
        # Held once committed: inside a batch, a renewal on another connection would
        # not see the row yet, and would take the lease for lost.
        self.after_commit(lambda: leases.hold(execution.id, execution.generation))
        return execution

    async def get_execution(self, execution_id: str) -> Execution | None:
        return await self._store.get_execution(execution_id)

    async def executions(
        self,
        statuses: Collection[ExecutionStatus] | None = None,
        session: str | None = None,
    ) -> list[Execution]:
        check_statuses(statuses)
        self._store.check_open()
        if statuses is not None and not statuses:
            return []
        return await self._store.executions(statuses, session)

    async def set_status(
        self, execution_id: str, status: ExecutionStatus, now: float, error: str | None = None
    ) -> None:
        held = self._held(execution_id)
        async with self._store.write() as tx:
            settle = closing_error(status) if status in FINISHED_STATUSES else None
            froms = CHANGED_FROM.get(status, ())  # none for a status not in the table
            change = (tx, execution_id, status, error, now, held, froms, settle)
            if await self._store.set_status(*change):
                return
            execution = await self._store.locked_execution(tx, execution_id)
            if execution is None:
                raise UnknownExecution(f"no execution {execution_id}")
            if held is not None and execution.generation != held:
                raise self._leases.lose(execution_id, execution.generation)
            check_transition(execution, status)

    async def expire_paused(self, ttl: float, now: float) -> list[str]:
        settle, froms = closing_error("expired", ttl), CHANGED_FROM["expired"]
        why = f"expired after {ttl:g} s without progress"
        async with self._store.write() as tx:
            expired = await self._store.idle_executions(tx, now - ttl)
            for execution_id in expired:
                await self._store.set_status(
                    tx, execution_id, "expired", why, now, None, froms, settle
                )
        return expired

    async def prune_finished(self, retention: float, now: float) -> int:
        return await self._store.prune_finished(_cutoff(retention, now))

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
        spec_json: str | None = None,
        *,
        target_connection: str | None = None,
        target_client_id: str | None = None,
    ) -> Step:
        if seq < 0:
            raise ValueError(f"seq must be >= 0, not {seq}")
        canonical_input = prepare_input(name, input_json)
        state, stored_result = prepare_recorded_result(result_json)
        spec = None if spec_json is None else canonicalize(spec_json)
        held = self._held(execution_id)
        # A call delivered as it is recorded: its first attempt is in its insert.
        attempts = 0 if target_connection is None else 1
        step = Step(
            execution_id, seq, kind, name, canonical_input, resolution, state, stored_result,
            None, request_id, attempts, now, now, spec, target_connection, target_client_id,
        )  # fmt: skip
        if await self._store.insert_step(step, held):
            return step
        await self._check_lease(execution_id, held)
        # Recorded before (a replay), or no such execution: only now worth a read.
        existing = await self._store.get_step(execution_id, seq)
        if existing is None:
            raise UnknownExecution(f"no execution {execution_id}")
        check_replay(existing, kind, name, canonical_input)
        return existing

    async def get_step(self, execution_id: str, seq: int) -> Step | None:
        return await self._store.get_step(execution_id, seq)

    async def step_by_request_id(self, request_id: str) -> Step | None:
        return await self._store.step_by_request_id(request_id)

    async def steps(self, execution_id: str) -> list[Step]:
        return await self._store.steps(execution_id)

    async def pending_steps(
        self, session: str | None = None, resolution: Resolution | None = None
    ) -> list[Step]:
        return await self._store.pending_steps(session, resolution)

    async def resolve(self, execution_id: str, seq: int, result_json: str, now: float) -> Outcome:
        return await self._settle(execution_id, seq, "result", result_json, now)

    async def reject(self, execution_id: str, seq: int, error_json: str, now: float) -> Outcome:
        return await self._settle(execution_id, seq, "error", error_json, now)

    async def _settle(
        self,
        execution_id: str,
        seq: int,
        field: Literal["result", "error"],
        value_json: str,
        now: float,
    ) -> Outcome:
        prepared = prepare_result(value_json) if field == "result" else prepare_error(value_json)
        held = self._held(execution_id)
        if not isinstance(prepared, Outcome):
            state: StepState = "applied" if field == "result" else "error"
            # The UPDATE's "AND state = 'pending'" is the one check that counts:
            # of two processes settling the same step, exactly one gets the row.
            settled = await self._store.settle(execution_id, seq, field, state, prepared, now, held)
            if settled is not None:
                return Outcome(
                    True, "applied", f"step {seq} of execution {execution_id} settled", settled
                )
        # Missing, already settled, fenced, or a value that cannot be stored: nothing was written.
        await self._check_lease(execution_id, held)
        step = await self._store.get_step(execution_id, seq)
        refused = refusal(step, execution_id, seq)
        if refused is not None:
            return refused
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
        held = self._held(execution_id)
        target = (target_connection, target_client_id)
        attempts = await self._store.add_attempt(execution_id, seq, now, target, held)
        if attempts is None:
            await self._check_lease(execution_id, held)
            raise UnknownStep(f"no step {seq} in execution {execution_id}")
        return attempts

    async def record_spec(self, execution_id: str, seq: int, spec_json: str) -> Step | None:
        """Record the tool spec of a step once (the first stays); the step, None if missing."""
        canonical = canonicalize(spec_json)
        held = self._held(execution_id)
        step = await self._store.record_spec(execution_id, seq, canonical, held)
        if step is None or step.spec_json != canonical:
            # Nothing updated: a spec recorded before (fine), or the fence refused it.
            await self._check_lease(execution_id, held)
        return step

    async def mark_approval(self, execution_id: str, seq: int, tool_call_id: str) -> None:
        await self._store.mark_approval(execution_id, seq, tool_call_id)

    async def approval_step(
        self, session: str, tool_call_id: str
    ) -> tuple[Step, str | None] | None:
        return await self._store.approval_step(session, tool_call_id)

    async def delivered_to(
        self, connection_ids: Collection[str]
    ) -> list[tuple[str, str, str | None]]:
        if not connection_ids:
            self._store.check_open()
            return []
        return await self._store.delivered_to(connection_ids)

    # who owns each session (O1)

    async def claim_session(self, session: str, principal: str, now: float) -> str:
        return await self._store.claim_session(session, principal, now)

    async def session_owner(self, session: str) -> str | None:
        return await self._store.session_owner(session)

    async def sessions_owned_by(self, principal: str) -> list[str]:
        return await self._store.sessions_owned_by(principal)

    # the tools each session's pages registered (S2)

    async def remember_tools(
        self, session: str, specs: Mapping[str, str], now: float, *, keep: int
    ) -> None:
        if keep < 1:
            raise ValueError(f"keep must be at least 1, not {keep}")
        await self._store.remember_tools(session, sorted(specs.items()), now, keep)

    async def remembered_tools(self, session: str) -> dict[str, str]:
        return dict(await self._store.remembered_tools(session))

    async def prune_session_tools(self, retention: float, now: float) -> int:
        return await self._store.prune_session_tools(_cutoff(retention, now))

    # the conversations (H1-H5)

    async def get_chat(self, chat_id: str) -> StoredChat | None:
        return await self._store.get_chat(chat_id)

    async def subscribe_chat(self, chat_id: str) -> StoredChat | None:
        return await self._store.subscribe_chat(self.owner, chat_id)

    async def unsubscribe_chat(self, chat_id: str) -> None:
        await self._store.unsubscribe_chat(self.owner, chat_id)

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
        if keep < 0:
            raise ValueError(f"keep must not be negative, not {keep}")
        async with self._store.write() as tx:
            # The row lock: two saves of one chat (two processes) queue up on it.
            owner, version, count = await self._store.locked_chat(tx, chat_id, session, now, new)
            if owner != session:
                raise ChatOfOtherSession(f"chat {chat_id!r} belongs to another session")
            version, keep = version + 1, min(keep, count)
            await self._store.store_chat(
                self.owner, tx, chat_id, keep, messages, version, streaming, now, count
            )
        return version

    async def delete_chat(self, chat_id: str) -> bool:
        return await self._store.delete_chat(self.owner, chat_id)

    async def chats(
        self,
        session: str | None,
        limit: int,
        before: tuple[float, str] | None = None,
        *,
        sessions: Collection[str] | None = None,
    ) -> list[ChatSummary]:
        self._store.check_open()
        return await self._store.chats(session, limit, before, sessions)

    async def prune_chats(self, retention: float, now: float) -> int:
        return await self._store.prune_chats(_cutoff(retention, now))


def _cutoff(retention: float, now: float) -> float:
    """``now - retention``: what last changed before it is past the retention."""
    if retention < 0:
        raise ValueError(f"retention must not be negative, not {retention}")
    return now - retention
