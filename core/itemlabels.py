"""Every label seen so far, kept per item in arrival order, for re-running an item's EM.

Labels for one item trickle in over hours. Each arrival is appended (its labels in the
canonical order of ``LabelBlocks.group``) to a flat append-only table; a per-item chain links
an item's labels in arrival order. ``gather`` builds, for any set of items, the blocks that
``OnlineEM.learn_many`` expects: the labels already learned at the head, the new ones after.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from core._numba import jit
from core.blocks import FloatArray, IntArray, LabelBlocks


class ItemLabels:
    """Append-only labels with a per-item chain; items are dense codes 0..n_items-1."""

    def __init__(self, capacity: int = 1024, item_capacity: int = 1024) -> None:
        self.n_labels = 0
        self.n_items = 0
        self.item = np.empty(capacity, dtype=np.int64)
        self.slot = np.empty(capacity, dtype=np.int64)
        self.label = np.empty(capacity, dtype=np.int64)
        self.weight = np.empty(capacity, dtype=np.float64)
        self.worker = np.empty(capacity, dtype=np.int64)
        self.next = np.empty(capacity, dtype=np.int64)
        self.first = np.full(item_capacity, -1, dtype=np.int64)
        self.last = np.full(item_capacity, -1, dtype=np.int64)
        self.count = np.zeros(item_capacity, dtype=np.int64)

    def add_items(self, n: int) -> None:
        """Make room for ``n`` more items (codes n_items..n_items+n-1)."""
        need = self.n_items + n
        if need > self.first.size:
            cap = max(need, 2 * self.first.size)
            self.first = grow(self.first, cap, -1)
            self.last = grow(self.last, cap, -1)
            self.count = grow(self.count, cap, 0)
        self.n_items = need

    def append(
        self,
        items: IntArray,
        slots: IntArray,
        labels: IntArray,
        weights: FloatArray,
        workers: IntArray,
    ) -> None:
        """Append labels, in the order given, to their items' chains."""
        n = items.size
        if n and (items.min() < 0 or items.max() >= self.n_items):
            raise ValueError("item codes must be in 0..n_items-1 (call add_items first)")
        need = self.n_labels + n
        if need > self.item.size:
            cap = max(need, 2 * self.item.size)
            for name in ("item", "slot", "label", "weight", "worker", "next"):
                setattr(self, name, extend(getattr(self, name), cap))
        lo = self.n_labels
        self.item[lo:need] = items
        self.slot[lo:need] = slots
        self.label[lo:need] = labels
        self.weight[lo:need] = weights
        self.worker[lo:need] = workers
        _link(lo, need, self.item, self.next, self.first, self.last, self.count)
        self.n_labels = need

    def gather(self, items: IntArray) -> tuple[LabelBlocks, IntArray]:
        """Blocks holding all labels of ``items`` (one block each, arrival order) and the
        position in the table of every gathered label (the columns read as the chains are
        walked: 0.9 + 1.9 ms apart, 80,000 labels of 800 items)."""
        ptr = self._ptr(items)
        n = int(ptr[-1])
        positions, slots = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
        labels, weights = np.empty(n, dtype=np.int64), np.empty(n)
        columns = (self.slot, self.label, self.weight, slots, labels, weights)
        _walk(items, ptr, self.first, self.next, positions, True, *columns)
        return LabelBlocks(ptr, slots, labels, weights), positions

    def positions(self, items: IntArray) -> tuple[IntArray, IntArray]:
        """Where each item's labels are in the table, arrival order: item b's are
        ``positions[ptr[b]:ptr[b + 1]]``."""
        ptr = self._ptr(items)
        positions = np.empty(int(ptr[-1]), dtype=np.int64)
        ints, floats = np.empty(0, dtype=np.int64), np.empty(0)
        columns = (ints, ints, floats, ints, ints, floats)  # (not read: no columns gathered)
        _walk(items, ptr, self.first, self.next, positions, False, *columns)
        return ptr, positions

    def _ptr(self, items: IntArray) -> IntArray:
        ptr = np.zeros(items.size + 1, dtype=np.int64)
        np.cumsum(self.count[items], out=ptr[1:])
        return ptr


def grow(a: npt.NDArray[Any], cap: int, fill: float) -> npt.NDArray[Any]:
    """A copy of ``a`` with ``cap`` rows, the new rows set to ``fill``."""
    out = np.full((cap, *a.shape[1:]), fill, dtype=a.dtype)
    out[: a.shape[0]] = a
    return out


def extend(a: npt.NDArray[Any], cap: int) -> npt.NDArray[Any]:
    """A copy of ``a`` with ``cap`` rows, the new ones not set (the table's rows past its
    labels are never read): its new pages are mapped when labels are written there, not all
    at once. Filling them cost the step that grew the table 60-400 ms at 2M labels."""
    out = np.empty((cap, *a.shape[1:]), dtype=a.dtype)
    out[: a.shape[0]] = a
    return out


@jit
def _link(lo, hi, item, nxt, first, last, count):  # type: ignore[no-untyped-def]
    for pos in range(lo, hi):
        i = item[pos]
        nxt[pos] = -1
        if last[i] < 0:
            first[i] = pos
        else:
            nxt[last[i]] = pos
        last[i] = pos
        count[i] += 1


# Chains are walked _LANES at a time, one step of each in turn: a step waits on a load from
# anywhere in the table, and the steps of different chains do not wait on one another, so the
# processor overlaps their cache misses (one chain at a time waits on one miss after another).
_LANES = 16


@jit
def _walk(  # type: ignore[no-untyped-def]
    items, ptr, first, nxt, positions, gather, slot, label, weight, out_slot, out_label, out_weight
):
    """Each item's chain into ``positions``; with ``gather``, each label's slot, label and
    weight too, read at the position just found."""
    at = np.empty(_LANES, dtype=np.int64)  # the next position of each lane's chain
    row = np.empty(_LANES, dtype=np.int64)  # where it goes in ``positions``
    for lo in range(0, items.size, _LANES):
        hi = min(lo + _LANES, items.size)
        longest = 0
        for b in range(lo, hi):
            at[b - lo] = first[items[b]]
            row[b - lo] = ptr[b]
            longest = max(longest, ptr[b + 1] - ptr[b])
        for _ in range(longest):
            for b in range(lo, hi):
                r = row[b - lo]
                if r < ptr[b + 1]:
                    pos = at[b - lo]
                    positions[r] = pos
                    if gather:
                        out_slot[r] = slot[pos]
                        out_label[r] = label[pos]
                        out_weight[r] = weight[pos]
                    at[b - lo] = nxt[pos]
                    row[b - lo] = r + 1
