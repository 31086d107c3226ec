"""The chunk log's part in the shared record, sans I/O: a log that starts from chunks another
process published, its tap, and a subscriber ahead of a mirrored log."""

from __future__ import annotations

from clienttools.protocol import ChunkFrame, WireModel
from clienttools_server.agent.chunk_log import Chunk, ChunkLog


def frames_of(sent: list[WireModel]) -> list[tuple[str, int | None, Chunk | None]]:
    """(type, sequence, chunk) of each frame sent to a subscriber."""
    out: list[tuple[str, int | None, Chunk | None]] = []
    for frame in sent:
        kind = str(frame.model_dump()["type"])
        if isinstance(frame, ChunkFrame):
            out.append((kind, frame.sequence, frame.chunk))
        else:
            out.append((kind, None, None))
    return out


def numbered(n: int) -> Chunk:
    return {"type": "t", "n": n}


def test_a_replay_of_published_chunks_in_another_order_appends_none_of_them() -> None:
    a, b, c, d = (numbered(n) for n in range(4))
    log = ChunkLog("chat", published=[a, b, c])
    tapped: list[tuple[int, Chunk | None]] = []
    log.tap = lambda seq, chunk: tapped.append((seq, chunk))
    sent: list[WireModel] = []
    log.subscribe("r", "conn", sent.append, after=0)
    for chunk in (c, a, b, d):  # the replay: the published ones in its own order, then new
        log.append(chunk)
    log.finish()
    assert log.chunks == [a, b, c, d]
    assert frames_of(sent) == [
        ("start", None, None),
        ("chunk", 1, b),
        ("chunk", 2, c),
        ("chunk", 3, d),
        ("end", None, None),
    ]
    assert tapped == [(3, d), (4, None)]  # only what the record does not hold yet


def test_a_chunk_published_once_and_replayed_twice_is_appended_once() -> None:
    x: Chunk = {"type": "text-delta", "id": "text-0", "delta": "la"}
    log = ChunkLog("chat", published=[x])
    log.append(x)
    log.append(x)
    assert log.chunks == [x, x]


def test_a_log_that_follows_anew_sends_its_pages_only_what_they_lack() -> None:
    # A process that lost the run had sent a, b and c (c never published); the new
    # owner's record is a, b, then d before c (its replay's order), then e.
    a, b, c, d, e = (numbered(n) for n in range(5))
    log = ChunkLog("chat")
    sent: list[WireModel] = []
    log.subscribe("r", "conn", sent.append, after=None)
    for chunk in (a, b, c):
        log.append(chunk)
    log.follow_anew()
    for chunk in (a, b, d, c, e):  # the record, from its start
        log.append(chunk)
    log.finish()
    assert log.chunks == [a, b, c, d, e]
    assert frames_of(sent)[4:] == [("chunk", 3, d), ("chunk", 4, e), ("end", None, None)]


def test_a_log_that_follows_anew_matches_each_chunk_it_has_once() -> None:
    x: Chunk = {"type": "start-step"}
    log = ChunkLog("chat")
    log.append(x)
    log.follow_anew()
    for chunk in (x, x):  # its one, then a second one it does not have
        log.append(chunk)
    assert log.chunks == [x, x]


def test_a_subscriber_ahead_of_the_log_gets_only_what_it_has_not_seen() -> None:
    log = ChunkLog("chat")
    log.append(numbered(0))
    sent: list[WireModel] = []
    log.subscribe("r", "conn", sent.append, after=2)  # it saw up to 2 on the owner
    for n in range(1, 5):
        log.append(numbered(n))
    log.finish()
    assert [(kind, seq) for kind, seq, _ in frames_of(sent)] == [
        ("start", None),
        ("chunk", 3),
        ("chunk", 4),
        ("end", None),
    ]
