"""`Recent`: requestId -> result text, oldest first, for the session core's results and outbox.

C7's remembered results and the outbox of unacknowledged ones both need lookups by
requestId, the oldest dropped first, and an entry moved to the end when it is put
again. CPython and Pyodide get that from an OrderedDict (`OrderedRecent`);
MicroPython's OrderedDict scans on every lookup and has no `move_to_end`, so it
gets `ScanFreeRecent`. Both flavours import this module (MicroPython 1.27 subset).

    results = Recent()
    dropped = results.put_within(request_id, text, limit)   # the first key dropped, or None
"""

from collections import OrderedDict

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (MicroPython has none)
if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = ["OrderedRecent", "Recent", "ScanFreeRecent"]


class ScanFreeRecent:
    """requestId -> result text, oldest first, with O(1) lookups on MicroPython too.

    MicroPython's plain dicts keep no order, and its OrderedDict is a linear array
    (a lookup scans it): with C7's 1,000 remembered results that made every invoke
    cost milliseconds. So: a dict for lookups and a list of (seq, key) for the order;
    an entry moved to the end is appended again, and stale list entries are skipped
    and compacted away.
    """

    def __init__(self) -> None:
        self._items: dict[str, tuple[int, str]] = {}
        self._order: list[tuple[int, str]] = []
        self._head = 0
        self._seq = 0

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: str) -> bool:
        return key in self._items

    def get(self, key: str) -> "str | None":
        entry = self._items.get(key)
        return None if entry is None else entry[1]

    def put(self, key: str, value: str) -> None:
        """Insert, or replace and move to the end."""
        self._seq += 1
        self._items[key] = (self._seq, value)
        self._order.append((self._seq, key))
        self._compact()

    def put_within(self, key: str, value: str, limit: int) -> "str | None":
        """`put`, then drop the oldest entries over `limit`; returns the first key dropped.

        One call per result, not put + len + pop_oldest: on MicroPython each call
        into a method of this class is a good part of an invoke's time.
        """
        seq = self._seq = self._seq + 1
        items = self._items
        items[key] = (seq, value)
        order = self._order
        order.append((seq, key))
        dropped = None
        while len(items) > limit:
            oldest = self.pop_oldest()
            if dropped is None:
                dropped = oldest
        if len(order) - self._head > 2 * len(items) + 64:
            self._compact()
        return dropped

    def pop(self, key: str) -> "str | None":
        entry = self._items.pop(key, None)
        if entry is None:
            return None
        self._skip_stale_head()
        self._compact()
        return entry[1]

    def _skip_stale_head(self) -> None:
        # Acks mostly come oldest first, so removed entries gather at the front of the
        # order; stepping past them now keeps `items()` (the outbox, written after
        # every result) from walking them again and again until the next compaction.
        # An entry once stale stays so (sequence numbers only grow): each is passed once.
        order, items, head = self._order, self._items, self._head
        end = len(order)
        while head < end:
            seq, key = order[head]
            entry = items.get(key)
            if entry is not None and entry[0] == seq:
                break
            head += 1
        self._head = head

    def pop_oldest(self) -> str:
        while True:
            seq, key = self._order[self._head]
            self._head += 1
            entry = self._items.get(key)
            if entry is not None and entry[0] == seq:
                del self._items[key]
                return key

    def items(self) -> "list[tuple[str, str]]":
        live = []
        for seq, key in self._order[self._head :]:
            entry = self._items.get(key)
            if entry is not None and entry[0] == seq:
                live.append((key, entry[1]))
        return live

    def _compact(self) -> None:
        if len(self._order) - self._head > 2 * len(self._items) + 64:
            self._order = [(self._items[key][0], key) for key, _ in self.items()]
            self._head = 0


class OrderedRecent:
    """`ScanFreeRecent` on CPython and Pyodide: an OrderedDict, whose order is kept in C.

    Its `items()` is a view, not a list made by a Python loop: the outbox is written
    (exported) after every burst of results, so that loop was the pipelined hot path.
    """

    __slots__ = ("_items",)

    def __init__(self) -> None:
        self._items: OrderedDict[str, str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: str) -> bool:
        return key in self._items

    def get(self, key: str) -> "str | None":
        return self._items.get(key)

    def put(self, key: str, value: str) -> None:
        """Insert, or replace and move to the end."""
        items = self._items
        items[key] = value
        items.move_to_end(key)

    def pop(self, key: str) -> "str | None":
        return self._items.pop(key, None)

    def pop_oldest(self) -> str:
        return self._items.popitem(last=False)[0]

    def put_within(self, key: str, value: str, limit: int) -> "str | None":
        """`put`, then drop the oldest entries over `limit`; returns the first key dropped."""
        items = self._items
        items[key] = value
        items.move_to_end(key)
        dropped = None
        while len(items) > limit:
            oldest = items.popitem(last=False)[0]
            if dropped is None:
                dropped = oldest
        return dropped

    def items(self) -> "Iterable[tuple[str, str]]":
        return self._items.items()


# MicroPython's OrderedDict has no move_to_end (and scans on every lookup).
Recent = OrderedRecent if hasattr(OrderedDict, "move_to_end") else ScanFreeRecent
