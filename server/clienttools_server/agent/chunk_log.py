"""One response's chunk log: sequences, subscribers and replay for ``resume`` (S6, S7).

A run appends UIMessageChunks; every subscriber (the request that started the
response, and any request that resumed it) receives each as a ``chunk`` frame
whose ``sequence`` is the chunk's index in the log, so a resumed request sees
the same numbering and can skip what it already has.

    >>> sent: list[str] = []
    >>> log = ChunkLog("chat-1")
    >>> log.subscribe("req-1", owner="conn-1", send=lambda f: sent.append(f.type), after=None)
    >>> log.append({"type": "start"})
    >>> log.finish()
    >>> sent
    ['start', 'chunk', 'end']
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pydantic import JsonValue

from clienttools.protocol import ChunkFrame, EndFrame, ErrorFrame, StartFrame, WireModel

from ..canonical import canonical_json

Send = Callable[[WireModel], None]
Chunk = dict[str, JsonValue]
# What sees every chunk as it is appended, with its sequence, and then the end
# (None) with the sequence after the last chunk: the shared chunk log's writer.
Tap = Callable[[int, Chunk | None], None]


@dataclass(frozen=True, slots=True)
class Subscriber:
    request_id: str
    # Whatever identifies the peer (a connection id), so a closed peer can be dropped.
    owner: str
    send: Send
    # The last sequence it has: a log that mirrors another process's (cluster/shared_streams.py)
    # may be behind what the page saw there.
    after: int = -1


class ChunkLog:
    """The chunks of one response, numbered from 0, and who is listening.

    ``published``: the chunks another process already streamed for this
    response (a run taken over after its owner died, docs/scaling.md). They
    are the log's first chunks, and the replayed run's chunks equal to one of
    them are not appended again: a replay produces the recorded part of the
    response again, but the outputs of parallel tool calls in the order of the
    replay rather than of their completion, so matching by value, not by
    position, keeps the published numbering.
    """

    def __init__(self, chat_id: str, published: Sequence[Chunk] = ()) -> None:
        self.chat_id = chat_id
        self.chunks: list[Chunk] = list(published)
        self.finished = False
        self._subscribers: dict[str, Subscriber] = {}
        self.tap: Tap | None = None
        # canonical JSON -> how many published chunks of that value the replay has
        # not produced yet
        self._unreplayed: Counter[str] = Counter(canonical_json(c) for c in published)

    @property
    def request_ids(self) -> frozenset[str]:
        return frozenset(self._subscribers)

    def subscribe(self, request_id: str, owner: str, send: Send, after: int | None) -> None:
        """Send ``start``, replay every chunk after sequence ``after``, then follow live."""
        send(StartFrame(request_id=request_id))
        first = 0 if after is None else after + 1
        for sequence in range(first, len(self.chunks)):
            send(ChunkFrame(request_id=request_id, sequence=sequence, chunk=self.chunks[sequence]))
        if self.finished:
            send(EndFrame(request_id=request_id))
            return
        self._subscribers[request_id] = Subscriber(request_id, owner, send, first - 1)

    def follow_anew(self) -> None:
        """Take the chunks so far for ones the log's source produces again, in its own order.

        For a log whose run another process took over, now mirroring that one's
        record from its start: its subscribers already have these chunks, so only
        the record's others are appended (the same matching by value as a replay's).
        """
        self._unreplayed = Counter(canonical_json(c) for c in self.chunks)

    def unsubscribe(self, request_id: str) -> None:
        self._subscribers.pop(request_id, None)

    def drop_owner(self, owner: str) -> None:
        for request_id in [r for r, s in self._subscribers.items() if s.owner == owner]:
            del self._subscribers[request_id]

    def append(self, chunk: Chunk) -> None:
        if self.finished:
            raise RuntimeError("chunk appended to a finished response")
        if self._unreplayed:
            key = canonical_json(chunk)
            if self._unreplayed[key] > 0:
                self._unreplayed[key] -= 1
                if not self._unreplayed[key]:
                    del self._unreplayed[key]
                return  # published already, under its own sequence
        sequence = len(self.chunks)
        self.chunks.append(chunk)
        if self.tap is not None:
            self.tap(sequence, chunk)
        for sub in list(self._subscribers.values()):
            if sequence > sub.after:
                # Our own chunk, JSON already: built without validating it again per page.
                frame = ChunkFrame.model_construct(
                    request_id=sub.request_id, sequence=sequence, chunk=chunk
                )
                sub.send(frame)

    def finish(self, error_text: str | None = None) -> None:
        """End the response for every subscriber: ``end``, or ``error`` with a generic text."""
        if self.finished:
            return
        self.finished = True
        if self.tap is not None:
            self.tap(len(self.chunks), None)
        for sub in list(self._subscribers.values()):
            if error_text is None:
                sub.send(EndFrame(request_id=sub.request_id))
            else:
                sub.send(ErrorFrame(request_id=sub.request_id, error_text=error_text))
        self._subscribers.clear()


# Finished responses kept for a resume that names lastSequence; beyond this
# many, the oldest goes first.
MAX_FINISHED_RESPONSES = 1_000


class FinishedResponses:
    """Responses that ended in the last ``grace`` seconds, by (session, chat id) (S7).

    A page that was following one and lost its socket just before the end
    still gets the chunks it missed and the end.
    """

    def __init__(
        self, grace: float, now: Callable[[], float], limit: int = MAX_FINISHED_RESPONSES
    ) -> None:
        self.grace = grace
        self.now = now
        self.limit = limit
        # (session, chat id) -> the log and when it ended (``now()``)
        self._kept: OrderedDict[tuple[str, str], tuple[ChunkLog, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._kept)

    def keep(self, session: str, log: ChunkLog) -> None:
        key = (session, log.chat_id)
        self._kept.pop(key, None)
        self._kept[key] = (log, self.now())
        self.prune()

    def get(self, session: str, chat_id: str) -> ChunkLog | None:
        self.prune()
        kept = self._kept.get((session, chat_id))
        return kept[0] if kept is not None else None

    def prune(self) -> None:
        cutoff = self.now() - self.grace
        while self._kept:
            key, (_, ended) = next(iter(self._kept.items()))
            if ended >= cutoff and len(self._kept) <= self.limit:
                break
            del self._kept[key]
