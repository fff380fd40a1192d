"""The per-item label table: every item's labels come back in arrival order."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.itemlabels import ItemLabels, LargerTable


@settings(max_examples=60, deadline=None)
@given(
    n_items=st.integers(1, 40),
    arrivals=st.lists(st.lists(st.integers(0, 39), max_size=30), min_size=1, max_size=12),
    asked=st.lists(st.integers(0, 39), max_size=60),
)
def test_gather_gives_each_items_labels_in_arrival_order(
    n_items: int, arrivals: list[list[int]], asked: list[int]
) -> None:
    """Chains walked many at a time (``_walk``'s lanes) give what one at a time would: the
    items asked (repeats, items without labels, more items than lanes) each get their own
    labels, in the order they were appended."""
    table = ItemLabels(capacity=4, item_capacity=2)  # (so that both tables grow)
    table.add_items(n_items)
    seen: list[list[int]] = [[] for _ in range(n_items)]
    serial = 0
    for arrival in arrivals:
        items = np.array([i % n_items for i in arrival], dtype=np.int64)
        ids = np.arange(serial, serial + items.size, dtype=np.int64)  # a label's serial number
        table.append(items, ids, ids % 3, ids + 0.5, ids)
        for i, x in zip(items.tolist(), ids.tolist(), strict=True):
            seen[i].append(x)
        serial += items.size
    codes = np.array([i % n_items for i in asked], dtype=np.int64)
    blocks, positions = table.gather(codes)
    assert blocks.n_blocks == codes.size
    for b, i in enumerate(codes.tolist()):
        got = blocks.slots[blocks.ptr[b] : blocks.ptr[b + 1]].tolist()
        assert got == seen[i]
    assert np.array_equal(table.worker[positions], blocks.slots)
    assert np.array_equal(blocks.weights, blocks.slots + 0.5)
    assert np.array_equal(blocks.labels, blocks.slots % 3)
    ptr, at = table.positions(codes)  # (the chains alone: what gather read its columns at)
    assert np.array_equal(ptr, blocks.ptr) and np.array_equal(at, positions)


def test_the_table_moves_to_the_larger_table_a_thread_filled() -> None:
    """Past three quarters of its rows the table's columns are copied by a thread into a table
    of twice the rows, kept whole by the appends after it; the append that needs the room
    moves to those very columns, and every item's labels still come back in arrival order."""
    rng = np.random.default_rng(0)
    table = ItemLabels(capacity=40_000, item_capacity=500)
    table.add_items(500)
    seen: list[list[int]] = [[] for _ in range(500)]
    larger_columns, moves = None, 0
    for serial in range(0, 100_000, 1_000):
        items = rng.integers(0, 500, 1_000)
        ids = np.arange(serial, serial + 1_000, dtype=np.int64)
        if larger_columns is None and table._larger is not None:
            table._larger._thread.join()  # (its copy done: the appends keep it whole)
            larger_columns = table._larger.columns
        before = table.item
        table.append(items, ids, ids % 3, ids + 0.5, ids)
        if table.item is not before and larger_columns is not None:
            assert table.item is larger_columns["item"]  # moved to the thread's columns
            larger_columns, moves = None, moves + 1
        for i, x in zip(items.tolist(), ids.tolist(), strict=True):
            seen[i].append(x)
    assert moves == 2 and table.item.size == 160_000  # 40,000 -> 80,000 -> 160,000 rows
    blocks, positions = table.gather(np.arange(500))
    for i in range(500):
        assert blocks.slots[blocks.ptr[i] : blocks.ptr[i + 1]].tolist() == seen[i]
    assert np.array_equal(table.worker[positions], blocks.slots)


def test_a_table_let_go_waits_for_the_thread_filling_its_larger_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The thread holds the larger table's columns until it ends: letting go of the table
    returns only then (a heap trimmed before would keep that memory)."""
    release, started = threading.Event(), threading.Event()
    fill = LargerTable._fill

    def slow_fill(self: LargerTable, *args: Any) -> None:
        started.set()
        release.wait(5)
        fill(self, *args)

    monkeypatch.setattr(LargerTable, "_fill", slow_fill)
    table = ItemLabels(capacity=8, item_capacity=8)
    table.add_items(1)
    table.append(*[np.zeros(7, dtype=np.int64)] * 3, np.ones(7), np.zeros(7, dtype=np.int64))
    assert started.wait(5)  # three quarters full: the larger table is being filled
    done = threading.Event()
    letting_go = threading.Thread(target=lambda: (table.let_go(), done.set()))
    letting_go.start()
    assert not done.wait(0.2)  # still filling
    release.set()
    assert done.wait(5)
    letting_go.join()
    assert not any(t.name == "label-table" and t.is_alive() for t in threading.enumerate())
