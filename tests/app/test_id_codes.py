"""The engine's codes for ids and rows for hashed slots (``app.engine.codes``): given in order
of first appearance, looked up and added by maps (no Python loop per label), as a loop over the
ids gives them."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from app.engine.dyadic import _SlotRows
from app.engine.project import ProjectEngine, _Codes
from core.dyadic import dyadic_id, dyadic_ids
from tests.app.test_engine import RECORD

batches = st.lists(st.lists(st.integers(0, 30), max_size=40), max_size=6)


@settings(max_examples=60, deadline=None)
@given(batches)
def test_ids_get_codes_in_order_of_first_appearance(batches: list[list[int]]) -> None:
    codes, seen = _Codes(), {}
    for batch in batches:
        ids = [f"id-{x}" for x in batch]
        new_here = [i for i in dict.fromkeys(ids) if i not in seen]
        seen.update((i, len(seen)) for i in new_here)
        got, new = codes.encode(ids)
        assert got.dtype == np.int64 and got.tolist() == [seen[i] for i in ids]
        assert new == new_here
    assert list(codes.names) == list(seen)


@settings(max_examples=60, deadline=None)
@given(batches)
def test_slots_get_rows_in_order_of_first_appearance(batches: list[list[int]]) -> None:
    rows, row_of = _SlotRows(), {}
    for batch in batches:
        first = len(row_of)
        for s in batch:
            row_of.setdefault(s, len(row_of))
        got, given_out = rows.assign(np.array(batch, dtype=np.int64))
        assert got.tolist() == [row_of[s] for s in batch]
        assert given_out.tolist() == list(range(first, len(row_of)))
    assert rows.n == len(row_of)
    assert rows.slots[: rows.n].tolist() == list(row_of)


def test_many_names_hash_as_each_does_alone() -> None:
    names = ["", "a", "ü-ñ 日本", "item-1234567", "x" * 300]
    ids = dyadic_ids(names)
    assert ids.dtype == np.int64 and ids.tolist() == [dyadic_id(n) for n in names]
    assert dyadic_ids([]).size == 0


@settings(max_examples=30, deadline=None)
@given(st.lists(st.lists(st.integers(0, 400), min_size=1, max_size=9), min_size=1, max_size=5))
def test_workers_added_at_once_get_the_rows_and_room_of_ones_added_one_by_one(
    batches: list[list[int]],
) -> None:
    together, alone = ProjectEngine(RECORD), ProjectEngine(RECORD)
    for batch in batches:
        names = list(dict.fromkeys(f"w{x}" for x in batch))
        together._grow_workers(together.workers.encode(names)[1])
        for name in names:
            alone._grow_workers(alone.workers.encode([name])[1])
    n = len(alone.workers.names)
    assert together.n_rows == alone.n_rows
    assert together.slot_of_row.size == alone.slot_of_row.size  # (the tables' room)
    assert np.array_equal(together.slot_of_row, alone.slot_of_row)
    assert np.array_equal(together.worker_row[:n], alone.worker_row[:n])
