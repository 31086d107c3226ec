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

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import JsonValue

from clienttools.protocol import ChunkFrame, EndFrame, ErrorFrame, StartFrame, WireModel

Send = Callable[[WireModel], None]
Chunk = dict[str, JsonValue]


@dataclass(frozen=True, slots=True)
class Subscriber:
    request_id: str
    # Whatever identifies the peer (a connection id), so a closed peer can be dropped.
    owner: str
    send: Send


class ChunkLog:
    """The chunks of one response, numbered from 0, and who is listening."""

    def __init__(self, chat_id: str) -> None:
        self.chat_id = chat_id
        self.chunks: list[Chunk] = []
        self.finished = False
        self._subscribers: dict[str, Subscriber] = {}

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
        self._subscribers[request_id] = Subscriber(request_id, owner, send)

    def unsubscribe(self, request_id: str) -> None:
        self._subscribers.pop(request_id, None)

    def drop_owner(self, owner: str) -> None:
        for request_id in [r for r, s in self._subscribers.items() if s.owner == owner]:
            del self._subscribers[request_id]

    def append(self, chunk: Chunk) -> None:
        if self.finished:
            raise RuntimeError("chunk appended to a finished response")
        sequence = len(self.chunks)
        self.chunks.append(chunk)
        for sub in list(self._subscribers.values()):
            sub.send(ChunkFrame(request_id=sub.request_id, sequence=sequence, chunk=chunk))

    def finish(self, error_text: str | None = None) -> None:
        """End the response for every subscriber: ``end``, or ``error`` with a generic text."""
        if self.finished:
            return
        self.finished = True
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
