"""The core's ordered result store on MicroPython (`ScanFreeRecent`) against an OrderedDict.

MicroPython runs `ScanFreeRecent` (its OrderedDict scans on every lookup); CPython
runs `OrderedRecent`. Both are plain Python, so CPython checks here that the
MicroPython one keeps the same order and contents as an OrderedDict through any mix
of puts, moves to the end, pops (acks, in and out of order) and drops of the oldest.
"""

from __future__ import annotations

import random
from collections import OrderedDict

import pytest

from clienttools.recent import OrderedRecent, ScanFreeRecent


@pytest.mark.parametrize("store_class", [ScanFreeRecent, OrderedRecent])
@pytest.mark.parametrize("seed", range(5))
def test_the_store_matches_an_ordered_dict(store_class: type, seed: int) -> None:
    rng = random.Random(seed)
    store = store_class()
    model: OrderedDict[str, str] = OrderedDict()
    limit = rng.choice([1, 3, 20, 200])
    for step in range(3000):
        action = rng.random()
        key = f"r{rng.randrange(300)}"
        if action < 0.45:
            value = f"v{step}"
            dropped = store.put_within(key, value, limit)
            model[key] = value
            model.move_to_end(key)
            expected = None
            while len(model) > limit:
                oldest = model.popitem(last=False)[0]
                expected = oldest if expected is None else expected
            assert dropped == expected
        elif action < 0.6:
            store.put(key, f"w{step}")
            model[key] = f"w{step}"
            model.move_to_end(key)
        elif action < 0.8 and model:
            oldest = next(iter(model))  # the ack of the oldest result: the common order
            assert store.pop(oldest) == model.pop(oldest)
        elif action < 0.95:
            assert store.pop(key) == model.pop(key, None)
        elif model:
            assert store.pop_oldest() == model.popitem(last=False)[0]
        assert list(store.items()) == list(model.items())
        assert len(store) == len(model)
        assert (key in store) == (key in model)
        assert store.get(key) == model.get(key)
