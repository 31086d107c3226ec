"""A chat's response across server processes: the shared chunk log in PostgreSQL.

A response streams from the process that owns its run, from its
:class:`~clienttools_server.agent.chunk_log.ChunkLog` in memory, as on one process.
With a shared ledger (PostgreSQL, docs/scaling.md) that owner also writes the
log's chunks to the ``chunks`` table (execution id, seq, JSON; a batch of chunks
is one row, and one row with no JSON after the last chunk says the response
ended: :class:`ChunkStore`), so that any other process can serve a page's
``resume``:

- **The owner** (:class:`Publisher`) writes the chunks in batches: one
  ``INSERT`` a little after a chunk (``FLUSH_DELAY`` while another process
  follows the response, ``UNFOLLOWED_FLUSH_DELAY`` while none does; a burst
  is one statement), and at once at the end. The insert is fenced by the lease's
  generation (a process that lost the run writes nothing) and skips rows that
  exist (a retried batch). In the same statement it notifies (``chunks``) the
  processes that follow the response: those that told it so (``follow-chunks``).
- **A follower** (:class:`Follower`) on another process mirrors the rows into
  a ChunkLog of its own and subscribes the page to it through the same
  ``log.subscribe(...)`` as a local resume: so the page gets ``start``, the
  chunks after its ``lastSequence``, and then each new chunk with the owner's
  sequence, and ``end``. It reads on each notification, on the bus's
  reconnect (notifications may have been lost) and every ``poll`` seconds
  (a safety net), and tells each new owner it finds ``follow-chunks``.
- **A take-over**: the new owner seeds the run's ChunkLog with the chunks
  published so far (:meth:`SharedStreams.published`), so the replayed run
  continues the numbering the pages saw instead of starting over, and tells
  every process (``chunks``), so their followers find the new owner at once.
  The process that lost the run turns its log into such a follower, so its
  chat sockets get the rest from the new owner. It mirrors the record from its
  start, matching its chunks by value to those its pages already have: they
  may have had chunks never published, and the replay's order may differ.
  (Streamed text of a model answer that was never recorded, and that the new
  owner's model answers differently, matches nothing: the pages keep it, and
  its sequence numbers, so theirs run past the record's by as many.)
- **abort** on a follower's process reaches the owner (``abort-run``); a
  ``send`` for a chat with an unfinished execution is refused by the ledger
  (:class:`~clienttools_server.ledger.ChatBusy`).

Rows go once the response finished more than the resume grace ago (from the
expiry loop), or with their execution. On SQLite (one process) none of this
runs: the hub serves every resume from memory.

    streams = SharedStreams(ledger, bus, clock, grace=300.0, poll=10.0,
                            abort_run=hub.abort_run, lease_lost=hub.lease_lost)
    streams.start()
    await streams.publish(execution_id, log)                # the owner, at launch
    await streams.resume(client, frame)                     # a page's resume, no local log
    await streams.drained(execution_id)                     # its end written, at the run's end

The log's tap is synchronous (a chunk is appended inside the run); the
writes it starts are tasks. One write at a time per response, and one read at
a time per follower, so rows are neither written nor mirrored twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from clienttools.protocol import AbortFrame, NoActiveFrame, ResumeFrame, WireModel

from ..agent.chunk_log import Chunk, ChunkLog
from ..canonical import canonical_json
from ..clock import Clock, Timer, sleep
from ..ledger import FINISHED_STATUSES, LeaseLost, LedgerUnavailable
from ..tasks import Background

logger = logging.getLogger(__name__)

# Notification kinds (cluster.Bus), each with one argument: the execution id.
CHUNKS = "chunks"  # to a follower: the execution's chunks grew (read them)
FOLLOW = "follow-chunks"  # to the owner: tell me when its chunks grow
ABORT = "abort-run"  # to the owner: a page aborted the response on another process

# Seconds the owner waits after a chunk before it writes it, with those that
# follow it in the meantime: a model streams its deltas in bursts. Short while
# another process follows the response (its page waits for them); long while
# none does, when the rows are there for a page that may resume elsewhere later
# (and for the process that takes the run over), and a chat that ends sooner
# costs one statement: the one at its end. A page that resumes elsewhere makes
# its process follow, and the owner writes at once then (_on_follow): so the
# long delay bears only on a take-over, whose replay makes again what was not
# written. Each streaming chat costs PostgreSQL one insert per delay: at 2 s
# rather than 0.5 s, a busy process's chats (about 2 s each) wrote 1.3 inserts
# a chat instead of 3.3 (bench/README.md, "The 7th's night runs").
FLUSH_DELAY = 0.02
UNFOLLOWED_FLUSH_DELAY = 2.0
# Seconds before a write that met an unreachable database is tried again.
RETRY_DELAY = 1.0


class SharedLedger(Protocol):
    """What the shared chunk log needs of the PostgreSQL ledger, which holds its SQL."""

    @property
    def owner(self) -> str: ...

    async def notify(self, process_id: str | None, kind: str, *args: str) -> None: ...

    async def append_chunks(
        self, execution_id: str, rows: Sequence[Row], kind: str, notify: Sequence[str]
    ) -> int: ...

    async def read_chunks(
        self, execution_id: str, after: int
    ) -> tuple[tuple[str, str | None, float] | None, list[Row]]: ...

    async def latest_of_chat(
        self, session: str, chat_id: str
    ) -> tuple[str, tuple[str, str | None, float]] | None: ...

    async def prune_chunks(self, cutoff: float) -> int: ...


class Notifications(Protocol):
    """The receiving end of the bus (cluster.Bus)."""

    def on(self, kind: str, handler: Callable[[str, tuple[str, ...]], Awaitable[None]]) -> None: ...

    def on_reconnect(self, handler: Callable[[], Awaitable[None]]) -> None: ...


class StreamClient(Protocol):
    """A connection, as far as a resume needs it."""

    @property
    def id(self) -> str: ...

    @property
    def session(self) -> str: ...

    def send(self, frame: WireModel) -> None: ...


@dataclass(frozen=True, slots=True)
class Head:
    """Where an execution stands, as a follower needs it."""

    execution_id: str
    status: str
    owner: str | None
    updated_at: float

    @property
    def finished(self) -> bool:
        return self.status in FINISHED_STATUSES


# One chunk of a log to write: (seq, its JSON, or None for the end).
Encoded = tuple[int, str | None]
# One row of the chunks table: (seq, a batch's JSON, or None for the end; pack).
Row = tuple[int, str | None]
# One chunk of a log as read: (seq, the chunk, or None for the end).
Entry = tuple[int, Chunk | None]


def pack(chunks: Sequence[Encoded]) -> list[Row]:
    """The table's rows for one write of consecutive chunks: one row for them all.

    Its seq is the last chunk's, its JSON ``{"from": first seq, "chunks": [...]}``;
    the end is a row of its own. A write costs a row whatever its chunks: a
    chat's twenty-odd chunks are a few rows, not twenty-odd index entries.

        >>> pack([(3, '{"type":"a"}'), (4, '{"type":"b"}'), (5, None)])
        [(4, '{"from":3,"chunks":[{"type":"a"},{"type":"b"}]}'), (5, None)]
    """
    written = [(seq, text) for seq, text in chunks if text is not None]
    packed: list[Row] = []
    if written:
        body = ",".join(text for _, text in written)
        packed.append((written[-1][0], f'{{"from":{written[0][0]},"chunks":[{body}]}}'))
    return packed + [(seq, None) for seq, text in chunks if text is None]


def unpack(rows: Sequence[Row], after: int) -> list[Entry]:
    """The chunks after seq ``after`` in rows read by seq, each once.

    A write retried after its answer was lost (it may have committed) carries the
    chunks that came meanwhile too, so it is a row of its own over the same first
    chunks: what was read already is skipped. A gap is left for the reader to see.

        >>> unpack([(1, '{"from":0,"chunks":[{},{}]}'), (2, '{"from":0,"chunks":[{},{},{}]}')], 0)
        [(1, {}), (2, {})]
    """
    entries: list[Entry] = []
    last = after
    for seq, text in rows:
        found: list[Entry] = [(seq, None)]
        if text is not None:
            batch = json.loads(text)
            found = [(batch["from"] + i, chunk) for i, chunk in enumerate(batch["chunks"])]
        for entry in found:
            if entry[0] > last:
                entries.append(entry)
                last = entry[0]
    return entries


class ChunkStore:
    """The ``chunks`` table, through the ledger's statements: one statement per call."""

    def __init__(self, ledger: SharedLedger) -> None:
        self.ledger = ledger

    async def append(
        self, execution_id: str, chunks: Sequence[Encoded], notify: Sequence[str]
    ) -> int:
        """Write consecutive chunks (:func:`pack`) and notify ``notify`` (process ids).

        Returns how many of the table's rows were new: none for a write that is
        there already. LeaseLost if another process took the run over.
        """
        return await self.ledger.append_chunks(execution_id, pack(chunks), CHUNKS, notify)

    async def read(self, execution_id: str, after: int) -> tuple[Head | None, list[Entry]]:
        """The execution's head and its chunks after seq ``after`` (None: no such execution)."""
        head, rows = await self.ledger.read_chunks(execution_id, after)
        return (None if head is None else Head(execution_id, *head)), unpack(rows, after)

    async def latest(self, session: str, chat_id: str) -> Head | None:
        """The newest execution of a session's chat."""
        found = await self.ledger.latest_of_chat(session, chat_id)
        return None if found is None else Head(found[0], *found[1])

    async def prune(self, cutoff: float) -> int:
        """Delete the rows of responses that finished before ``cutoff``."""
        return await self.ledger.prune_chunks(cutoff)


class Publisher:
    """The owner's side of one response: its chunks into the table, its followers told."""

    def __init__(self, streams: SharedStreams, execution_id: str, log: ChunkLog) -> None:
        self.streams = streams
        self.execution_id = execution_id
        self.pending: list[Encoded] = []
        # The processes that follow the response (they told us so).
        self.followers: set[str] = set()
        self.done = False
        self._timer: Timer | None = None
        # One write at a time: a flush waits for the one before it.
        self._writing = asyncio.Lock()
        log.tap = self.tap

    def tap(self, seq: int, chunk: Chunk | None) -> None:
        """A chunk appended to the log (None: the end); never raises into the run."""
        if self.done:
            return
        self.pending.append((seq, None if chunk is None else canonical_json(chunk)))
        if chunk is None:
            self._flush_later(0.0)
        elif self._timer is None:
            self._flush_later(FLUSH_DELAY if self.followers else UNFOLLOWED_FLUSH_DELAY)

    def _flush_later(self, delay: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.streams.clock.call_later(delay, self.streams.background.call, self.flush)

    async def flush(self) -> None:
        """Write the rows not written yet (with those that come while a write is on)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        async with self._writing:
            if self.done or not self.pending:
                return
            rows = list(self.pending)
            try:
                await self.streams.store.append(self.execution_id, rows, sorted(self.followers))
            except LeaseLost:
                self.stop()  # the new owner writes the rest
                self.streams.lease_lost(self.execution_id)  # and the run stops here
                return
            except LedgerUnavailable as exc:
                logger.warning(
                    "response of run %s: %s; writing it again soon", self.execution_id, exc
                )
                self._flush_later(RETRY_DELAY)
                return
            except Exception:
                logger.exception("writing the response of run %s failed", self.execution_id)
                self._flush_later(RETRY_DELAY)
                return
            if self.done:
                return
            del self.pending[: len(rows)]
            ended = rows[-1][1] is None
        await self.streams.flushed(self.execution_id)
        if ended:
            self.stop()
        elif self.pending and self._timer is None:
            self._flush_later(FLUSH_DELAY if self.followers else UNFOLLOWED_FLUSH_DELAY)

    def stop(self) -> None:
        self.done = True
        self.pending = []
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.streams.publishers.get(self.execution_id) is self:
            del self.streams.publishers[self.execution_id]


class Follower:
    """A response streaming on another process, mirrored from the table into a ChunkLog."""

    def __init__(
        self, streams: SharedStreams, execution_id: str, session: str, log: ChunkLog, next_seq: int
    ) -> None:
        self.streams = streams
        self.execution_id = execution_id
        self.session = session
        self.owner: str | None = None
        self.log = log
        # The record's next chunk to read: the log's end, or 0 for a log that follows anew.
        self.next_seq = next_seq
        # One read at a time: two would mirror the same rows twice.
        self._reading = asyncio.Lock()

    async def refresh(self) -> None:
        """Read the rows past those read so far into the log; follow a new owner; end when ended."""
        async with self._reading:
            await self._read()

    async def _read(self) -> None:
        if self.log.finished:
            return
        head, rows = await self.streams.store.read(self.execution_id, self.next_seq - 1)
        if self.log.finished:
            return
        for seq, chunk in rows:
            if seq != self.next_seq:
                break  # not written yet (cannot happen: the owner writes them in order)
            if chunk is None:
                self._end()
                return
            self.next_seq += 1
            self.log.append(chunk)
        if head is None:
            self._end()  # pruned with its execution
            return
        if head.owner != self.owner:
            self.owner = head.owner
            # A run of this process tells this follower itself (SharedStreams.flushed).
            if head.owner not in (None, self.streams.ledger.owner) and not head.finished:
                await self.streams.tell(head.owner, FOLLOW, self.execution_id)
        # The owner writes the end right after the status, and tries again while
        # the database is away: a run finished for longer than a poll with no end
        # written had an owner that died in between.
        stale = self.streams.clock.now() - head.updated_at > self.streams.poll
        if head.finished and not rows and stale:
            self._end()

    def _end(self) -> None:
        self.log.finish()
        self.streams.forget(self)


class SharedStreams:
    """What the hub does with chat streams when the ledger is shared by several processes."""

    def __init__(
        self,
        ledger: SharedLedger,
        bus: Notifications,
        clock: Clock,
        *,
        grace: float,
        poll: float,
        abort_run: Callable[[str], bool],
        lease_lost: Callable[[str], None],
    ) -> None:
        self.ledger = ledger
        self.store = ChunkStore(ledger)
        self.clock = clock
        self.grace = grace
        self.poll = poll
        self._abort_run = abort_run
        # Whoever meets the ledger's LeaseLost tells the hub at once (the next
        # renewal reports the loss too, should it be met where nobody can).
        self.lease_lost = lease_lost
        self.publishers: dict[str, Publisher] = {}
        self.followers: dict[str, Follower] = {}
        self.background = Background("shared streams")
        self._poller: asyncio.Task[None] | None = None
        bus.on(CHUNKS, self._on_chunks)
        bus.on(FOLLOW, self._on_follow)
        bus.on(ABORT, self._on_abort)
        bus.on_reconnect(self.refresh_all)

    def start(self) -> None:
        self._poller = asyncio.create_task(self._poll())

    async def close(self) -> None:
        """Write what is still unwritten (a shutdown: the response goes on elsewhere)."""
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)
            self._poller = None
        for publisher in list(self.publishers.values()):
            await publisher.flush()
            publisher.stop()
        await self.background.close()

    # -- the owner ------------------------------------------------------------------

    async def published(self, execution_id: str) -> tuple[list[Chunk], bool]:
        """The chunks published for a run so far, and whether its response ended."""
        _, rows = await self.store.read(execution_id, -1)
        chunks: list[Chunk] = []
        for seq, chunk in rows:
            if seq != len(chunks):
                break
            if chunk is None:
                return chunks, True
            chunks.append(chunk)
        return chunks, False

    async def publish(
        self, execution_id: str, log: ChunkLog, *, ended: bool = False, taken: bool = False
    ) -> None:
        """Write the log's chunks from now on (``ended``: its published response is over).

        ``taken``: the run was taken over from another process, so whoever follows
        its response follows that one: every process is told to read again, and
        finds this one the owner.
        """
        publisher = Publisher(self, execution_id, log)
        if ended:
            publisher.done = True
            return
        self.publishers[execution_id] = publisher
        if taken:
            with contextlib.suppress(LedgerUnavailable):
                await self.ledger.notify(None, CHUNKS, execution_id)

    async def drained(self, execution_id: str) -> None:
        """Write what the run's response has not written yet (its end, at the run's end).

        Awaited while the run's lease is still held, so the write is fenced.
        """
        publisher = self.publishers.get(execution_id)
        if publisher is not None:
            await publisher.flush()

    async def flushed(self, execution_id: str) -> None:
        """This process wrote rows of a run: a follower here reads them (no bus needed)."""
        follower = self.followers.get(execution_id)
        if follower is not None:
            await self._refresh(follower)

    async def _on_follow(self, sender: str, args: tuple[str, ...]) -> None:
        if not args:
            return
        execution_id = args[0]
        publisher = self.publishers.get(execution_id)
        if publisher is not None:
            publisher.followers.add(sender)
            await publisher.flush()
        # Whatever was written before the follower was known: it reads it now.
        await self.tell(sender, CHUNKS, execution_id)

    async def _on_abort(self, sender: str, args: tuple[str, ...]) -> None:
        if args and not self._abort_run(args[0]):
            logger.info("abort of run %s from %s: not running here", args[0], sender)

    # -- a follower -----------------------------------------------------------------

    async def resume(self, client: StreamClient, frame: ResumeFrame) -> None:
        """S7 for a response that does not stream on this process: follow it from the table.

        As on the owner: a response that is still going on, or (with
        ``lastSequence``) one that finished within the resume grace.
        """
        head = await self.store.latest(client.session, frame.id)
        if head is None or (
            head.finished
            and (frame.last_sequence is None or head.updated_at < self.clock.now() - self.grace)
        ):
            client.send(NoActiveFrame(request_id=frame.request_id))
            return
        follower = self.followers.get(head.execution_id)
        if follower is None:
            follower = await self.follow(head.execution_id, client.session, ChunkLog(frame.id))
        follower.log.subscribe(frame.request_id, client.id, client.send, after=frame.last_sequence)
        if follower.log.finished:
            self.forget(follower)

    async def follow(
        self, execution_id: str, session: str, log: ChunkLog, *, anew: bool = False
    ) -> Follower:
        """Mirror the run's published chunks into ``log``: from its end on, or (``anew``)
        the whole record into a log that has some of it already (ChunkLog.follow_anew)."""
        follower = Follower(self, execution_id, session, log, 0 if anew else len(log.chunks))
        self.followers[execution_id] = follower
        await self._refresh(follower)
        return follower

    async def lost(self, execution_id: str, session: str, log: ChunkLog) -> None:
        """This process lost the run to another one (its lease lapsed): the new owner
        writes the record now, and the chat sockets that followed the run's log here
        keep following it, from the new owner's record."""
        publisher = self.publishers.get(execution_id)
        if publisher is not None:
            publisher.stop()
        log.tap = None
        if log.request_ids:
            log.follow_anew()
            await self.follow(execution_id, session, log, anew=True)

    async def abort(self, client: StreamClient, frame: AbortFrame) -> bool:
        """An abort of a response followed here: tell its owner; False if none is followed."""
        for follower in self.followers.values():
            if follower.session == client.session and frame.request_id in follower.log.request_ids:
                head, _ = await self.store.read(follower.execution_id, follower.next_seq)
                owner = head.owner if head is not None else None
                if owner == self.ledger.owner:
                    self._abort_run(follower.execution_id)
                elif owner is not None:
                    await self.tell(owner, ABORT, follower.execution_id)
                return True
        return False

    async def abort_chat(self, session: str, chat_id: str) -> bool:
        """Abort the chat's unfinished run on the process that owns it; False if none."""
        head = await self.store.latest(session, chat_id)
        if head is None or head.finished or head.owner is None:
            return False
        if head.owner == self.ledger.owner:
            return self._abort_run(head.execution_id)
        await self.tell(head.owner, ABORT, head.execution_id)
        return True

    def drop_owner(self, owner: str) -> None:
        """A connection closed: its subscriptions go, and the followers nobody listens to."""
        for follower in list(self.followers.values()):
            follower.log.drop_owner(owner)
            if not follower.log.request_ids:
                self.forget(follower)

    def forget(self, follower: Follower) -> None:
        if self.followers.get(follower.execution_id) is follower:
            del self.followers[follower.execution_id]

    async def _on_chunks(self, sender: str, args: tuple[str, ...]) -> None:
        follower = self.followers.get(args[0]) if args else None
        if follower is not None:
            await self._refresh(follower)

    async def refresh_all(self) -> None:
        for follower in list(self.followers.values()):
            await self._refresh(follower)

    async def _refresh(self, follower: Follower) -> None:
        try:
            await follower.refresh()
        except LedgerUnavailable as exc:
            logger.warning("following run %s: %s", follower.execution_id, exc)
        except Exception:
            logger.exception("following run %s failed", follower.execution_id)

    async def _poll(self) -> None:
        while True:
            await sleep(self.clock, self.poll)
            await self.refresh_all()

    # -- both -----------------------------------------------------------------------

    async def tell(self, process_id: str, kind: str, execution_id: str) -> None:
        """Notify one process; a database away loses it (the poll and a reconnect catch up)."""
        with contextlib.suppress(LedgerUnavailable):
            await self.ledger.notify(process_id, kind, execution_id)

    async def prune(self, now: float) -> int:
        """Delete the chunks of responses that finished more than the resume grace ago."""
        return await self.store.prune(now - self.grace)
