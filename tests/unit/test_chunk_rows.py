"""A response's chunks as rows of the shared chunk log: one row a write, read back once each."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from clienttools_server.canonical import canonical_json
from clienttools_server.cluster.shared_streams import pack, unpack


def test_a_write_is_one_row_keyed_by_its_last_chunk_and_the_end_one_more() -> None:
    assert pack([(3, '{"a":1}'), (4, "{}"), (5, None)]) == [
        (4, '{"from":3,"chunks":[{"a":1},{}]}'),
        (5, None),
    ]
    assert pack([(7, None)]) == [(7, None)]
    assert pack([]) == []


def test_a_read_skips_what_it_has_and_leaves_a_gap_for_the_reader() -> None:
    # A write whose answer was lost (it committed), tried again with what came meanwhile.
    first, again = pack([(0, "{}"), (1, '{"n":1}')]), pack([(0, "{}"), (1, '{"n":1}'), (2, "{}")])
    rows = [*first, *again]
    assert unpack(rows, -1) == [(0, {}), (1, {"n": 1}), (2, {})]
    assert unpack(rows, 1) == [(2, {})]
    assert unpack([*pack([(0, "{}")]), *pack([(2, "{}")])], -1) == [(0, {}), (2, {})]


@given(
    st.lists(st.dictionaries(st.text(max_size=3), st.integers()), max_size=12),
    st.lists(st.tuples(st.integers(min_value=1, max_value=4), st.booleans()), max_size=6),
    st.booleans(),
    st.integers(min_value=-1, max_value=13),
)
def test_writes_of_any_sizes_and_retries_read_back_as_the_log(
    chunks: list[dict[str, int]], writes: list[tuple[int, bool]], ended: bool, after: int
) -> None:
    log = [(seq, canonical_json(chunk)) for seq, chunk in enumerate(chunks)]
    entries = [*enumerate(chunks)] + ([(len(chunks), None)] if ended else [])
    rows: dict[int, str | None] = {}  # the table: a row that is there stays (ON CONFLICT)
    start = 0
    for size, lost in [*writes, (len(log), False)]:  # the publisher's writes, then the rest
        batch = log[start : start + size]
        if lost and len(batch) > 1:  # committed, its answer lost: tried again with more
            for seq, text in pack(batch[:-1]):
                rows.setdefault(seq, text)
        for seq, text in pack(batch):
            rows.setdefault(seq, text)
        start += len(batch)
    if ended:
        rows.setdefault(len(chunks), None)
    read = sorted(row for row in rows.items() if row[0] > after)  # WHERE seq > ... ORDER BY seq
    assert unpack(read, after) == [e for e in entries if e[0] > after]
