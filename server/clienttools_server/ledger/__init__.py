"""The durable ledger of runs and their non-deterministic steps (protocol rule S8).

Every run (an *execution*) gets an id; every step in it whose outcome the
server cannot recompute (a model output, a tool call) gets a ``seq`` 0, 1, 2,
... and a record here: kind, name, canonical JSON of the input, who resolves it,
its state and, once settled, its result or error. After a restart the runtime
re-runs an unfinished execution and asks for the record at each ``seq``:
recorded steps give back their results, and a step that asks for something
else than what was recorded is a :class:`Divergence`.

The package, one concept a module:

- ``records.py``: the values (:class:`Execution`, :class:`Step`, :class:`Outcome`,
  chats) and the exceptions;
- ``protocol.py``: the :class:`Ledger` protocol the runtime calls;
- ``rules.py`` and ``core.py``: the rules, once: what is prepared and refused,
  what a replay must match, the leases and their fence, batches and
  ``after_commit``, the chats' and owners' rules;
- ``store.py``: what the rules ask of a store, one method per operation;
- ``schema.py``: one schema and one numbering of migrations for both dialects;
- ``sqlite.py`` (:class:`SqliteLedger`, a file or ``":memory:"``) and
  ``postgres.py`` with ``postgres_pool.py`` (:class:`PostgresLedger`, shared by
  several server processes): the SQL of each dialect.

Each running execution has one owner, the ledger instance (one per server
process) that started it or took it over, under a **lease**: the owner renews
it (:meth:`Ledger.renew`) more often than it lapses, and another instance may
take the execution over (:meth:`Ledger.take_over`) only once it has lapsed.
Each take-over raises the execution's ``generation``; every write for an
execution this instance holds applies only while that is still the
execution's generation. A write refused so raises :class:`LeaseLost`: the
instance lost the run to another one and must stop it without writing
anything more for it (fencing). Nothing finished is kept forever:
:meth:`Ledger.prune_finished` deletes what finished longer than a retention ago.

The caller owns the clock: every write takes ``now`` in seconds. Example
(a run that asks the page for one tool call, then settles it)::

    ledger: Ledger = SqliteLedger(":memory:")  # or await PostgresLedger.connect(url)
    run = await ledger.start_execution("chat-1", "{}", now=0.0, chat_id="c")
    await ledger.record_step(run.id, 0, "tool", "t", "{}", "client", 0.0, "req-1")
    assert (await ledger.resolve(run.id, 0, "42", 1.0)).ok
    await ledger.close()
"""

from __future__ import annotations

from .core import LedgerCore
from .protocol import Ledger
from .records import (
    CHAT_CHANGED,
    DEFAULT_LEASE,
    FINISHED_STATUSES,
    MAX_STORED_BYTES,
    STATUS_TRANSITIONS,
    ChatBusy,
    ChatOfOtherSession,
    ChatSummary,
    Divergence,
    Execution,
    ExecutionStatus,
    InvalidTransition,
    LeaseLost,
    LedgerClosed,
    LedgerUnavailable,
    Outcome,
    OutcomeReason,
    Registration,
    Resolution,
    Step,
    StepKind,
    StepState,
    StoredChat,
    UnknownExecution,
    UnknownStep,
)
from .rules import check_replay, prepare_result
from .schema import SCHEMA_VERSION
from .sqlite import SqliteLedger

__all__ = [
    "CHAT_CHANGED",
    "DEFAULT_LEASE",
    "FINISHED_STATUSES",
    "MAX_STORED_BYTES",
    "SCHEMA_VERSION",
    "STATUS_TRANSITIONS",
    "ChatBusy",
    "ChatOfOtherSession",
    "ChatSummary",
    "Divergence",
    "Execution",
    "ExecutionStatus",
    "InvalidTransition",
    "LeaseLost",
    "Ledger",
    "LedgerClosed",
    "LedgerCore",
    "LedgerUnavailable",
    "Outcome",
    "OutcomeReason",
    "Registration",
    "Resolution",
    "SqliteLedger",
    "Step",
    "StepKind",
    "StepState",
    "StoredChat",
    "UnknownExecution",
    "UnknownStep",
    "check_replay",
    "prepare_result",
]
