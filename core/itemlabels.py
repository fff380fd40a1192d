"""Every label seen so far, kept per item in arrival order, for re-running an item's EM.

Labels for one item trickle in over hours. Each arrival is appended (its labels in the
canonical order of ``LabelBlocks.group``) to a flat append-only table; a per-item chain links
each label to the item's label before it. ``gather`` builds, for any set of items, the blocks
that ``OnlineEM.learn_many`` expects: the labels already learned at the head, the new ones
after.

Every row is final once written (the chain points backwards), so the table grows without a
stall: once it is three quarters full, a thread copies its rows into a table of twice the rows
while labels keep coming, the appends after it keep that copy whole, and the append that needs
the room moves to it.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import numpy.typing as npt

from core._numba import jit
from core.blocks import FloatArray, IntArray, LabelBlocks

COLUMNS = ("item", "slot", "label", "weight", "worker", "prev")
"""The table's columns, one row per label."""


class ItemLabels:
    """Append-only labels with a per-item chain; items are dense codes 0..n_items-1."""

    def __init__(self, capacity: int = 1024, item_capacity: int = 1024) -> None:
        self.n_labels = 0
        self.n_items = 0
        # item, slot, label and worker codes as int32, as blocks hold slots and labels (32
        # bytes a label with the weight and the chain, where int64 codes made it 48)
        self.item = np.empty(capacity, dtype=np.int32)
        self.slot = np.empty(capacity, dtype=np.int32)
        self.label = np.empty(capacity, dtype=np.int32)
        self.weight = np.empty(capacity, dtype=np.float64)
        self.worker = np.empty(capacity, dtype=np.int32)
        self.prev = np.empty(capacity, dtype=np.int64)  # the item's label before (-1: none)
        self.last = np.full(item_capacity, -1, dtype=np.int64)
        self.count = np.zeros(item_capacity, dtype=np.int64)
        self._larger: LargerTable | None = None

    def add_items(self, n: int) -> None:
        """Make room for ``n`` more items (codes n_items..n_items+n-1)."""
        need = self.n_items + n
        if need > self.last.size:
            cap = max(need, 2 * self.last.size)
            self.last = grow(self.last, cap, 0)
            self.count = grow(self.count, cap, 0)
        self.last[self.n_items : need] = -1
        self.count[self.n_items : need] = 0
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
            self._move(need)
        lo = self.n_labels
        self.item[lo:need] = items
        self.slot[lo:need] = slots
        self.label[lo:need] = labels
        self.weight[lo:need] = weights
        self.worker[lo:need] = workers
        _link(lo, need, self.item, self.prev, self.last, self.count)
        self.n_labels = need
        if self._larger is not None:
            self._larger.keep_up(self)
        elif 4 * need > 3 * self.item.size:  # three quarters full
            self._larger = LargerTable(self, 2 * self.item.size)

    def let_go(self) -> None:
        """For a table no longer used: the larger one a thread may be filling is given up once
        the thread ends (until then it holds those columns, which a heap trimmed meanwhile
        would keep: a deleted project's memory would not all go back)."""
        larger, self._larger = self._larger, None
        if larger is not None:
            larger.wait()

    def _move(self, need: int) -> None:
        """Move to a table with room for ``need`` labels: the one a thread has been filling
        when it is large enough (the rows written since it began are copied now), else one
        made here (a copy of every row)."""
        larger, self._larger = self._larger, None
        columns = larger.finish(self, need) if larger is not None else None
        if columns is None:
            cap = max(need, 2 * self.item.size)
            columns = {name: extend(getattr(self, name), cap) for name in COLUMNS}
        for name, column in columns.items():
            setattr(self, name, column)

    def gather(self, items: IntArray) -> tuple[LabelBlocks, IntArray]:
        """Blocks holding all labels of ``items`` (one block each, arrival order) and the
        position in the table of every gathered label (the columns read as the chains are
        walked: 0.9 + 1.9 ms apart, 80,000 labels of 800 items)."""
        ptr = self._ptr(items)
        n = int(ptr[-1])
        positions, slots = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int32)
        labels, weights = np.empty(n, dtype=np.int32), np.empty(n)  # (as blocks hold them)
        columns = (self.slot, self.label, self.weight, slots, labels, weights)
        _walk(items, ptr, self.last, self.prev, positions, True, *columns)
        return LabelBlocks(ptr, slots, labels, weights), positions

    def positions(self, items: IntArray) -> tuple[IntArray, IntArray]:
        """Where each item's labels are in the table, arrival order: item b's are
        ``positions[ptr[b]:ptr[b + 1]]``."""
        ptr = self._ptr(items)
        positions = np.empty(int(ptr[-1]), dtype=np.int64)
        codes, floats = np.empty(0, dtype=np.int32), np.empty(0)
        columns = (codes, codes, floats, codes, codes, floats)  # (not read: no columns gathered)
        _walk(items, ptr, self.last, self.prev, positions, False, *columns)
        return ptr, positions

    def _ptr(self, items: IntArray) -> IntArray:
        ptr = np.zeros(items.size + 1, dtype=np.int64)
        np.cumsum(self.count[items], out=ptr[1:])
        return ptr


class LargerTable:
    """The columns of a table of ``capacity`` rows. A thread copies the rows ``table`` holds
    (rows that never change; numpy copies them without the GIL, so the labels' appends go on
    meanwhile), then the rows appended meanwhile, until fewer than CAUGHT_UP are left; from
    then on each append copies its own rows too (``keep_up``), and the append that needs the
    room moves to the columns (``finish``). Copying every row when the room ran out held the
    engine's step for 60-120 ms at 2-4M labels."""

    CAUGHT_UP = 8192

    def __init__(self, table: ItemLabels, capacity: int) -> None:
        self.copied = 0
        self.columns: dict[str, npt.NDArray[Any]] | None = None
        sources = {name: getattr(table, name) for name in COLUMNS}
        self._thread = threading.Thread(
            target=self._fill, args=(table, sources, capacity), name="label-table", daemon=True
        )
        self._thread.start()

    def _fill(self, table: ItemLabels, sources: dict[str, npt.NDArray[Any]], capacity: int) -> None:
        columns = {name: np.empty(capacity, dtype=c.dtype) for name, c in sources.items()}
        while True:
            rows = table.n_labels  # (rows below it are written)
            self._copy_rows(columns, sources, rows)
            if table.n_labels - rows < self.CAUGHT_UP:
                self.columns = columns
                return

    def wait(self) -> None:
        """Until the thread's copy has ended."""
        self._thread.join()

    def keep_up(self, table: ItemLabels) -> None:
        """Copy the rows ``table`` appended since, once the thread is done."""
        if self.columns is not None and not self._thread.is_alive():
            self._copy(table)

    def finish(self, table: ItemLabels, need: int) -> dict[str, npt.NDArray[Any]] | None:
        """The columns holding all of ``table``'s rows, grown further if ``need`` labels do
        not fit; None if the thread failed (memory ran out)."""
        self.wait()
        if self.columns is None:
            return None
        self._copy(table)
        hi = table.n_labels
        return {
            name: c if c.size >= need else extend(c[:hi], max(need, 2 * c.size))
            for name, c in self.columns.items()
        }

    def _copy(self, table: ItemLabels) -> None:
        assert self.columns is not None
        self._copy_rows(self.columns, {n: getattr(table, n) for n in COLUMNS}, table.n_labels)

    def _copy_rows(
        self, columns: dict[str, npt.NDArray[Any]], sources: dict[str, npt.NDArray[Any]], hi: int
    ) -> None:
        """The rows from ``copied`` to ``hi`` of each source column into ``columns``."""
        lo = self.copied
        for name, column in columns.items():
            column[lo:hi] = sources[name][lo:hi]
        self.copied = hi


def grow(a: npt.NDArray[Any], cap: int, fill: float) -> npt.NDArray[Any]:
    """A copy of ``a`` with ``cap`` rows, the new rows set to ``fill``. Zero rows cost
    nothing until they are written (the kernel maps zeroed pages as they are first touched),
    so a table of rows that are set as they come into use grows best with ``fill`` 0."""
    shape = (cap, *a.shape[1:])
    out = np.zeros(shape, dtype=a.dtype) if fill == 0 else np.full(shape, fill, dtype=a.dtype)
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
def _link(lo, hi, item, prev, last, count):  # type: ignore[no-untyped-def]
    for pos in range(lo, hi):
        i = item[pos]
        prev[pos] = last[i]
        last[i] = pos
        count[i] += 1


# Chains are walked _LANES at a time, one step of each in turn: a step waits on a load from
# anywhere in the table, and the steps of different chains do not wait on one another, so the
# processor overlaps their cache misses (one chain at a time waits on one miss after another).
_LANES = 16


@jit
def _walk(  # type: ignore[no-untyped-def]
    items, ptr, last, prev, positions, gather, slot, label, weight, out_slot, out_label, out_weight
):
    """Each item's chain into ``positions``, from its last label back to its first; with
    ``gather``, each label's slot, label and weight too, read at the position just found."""
    at = np.empty(_LANES, dtype=np.int64)  # the next position of each lane's chain
    row = np.empty(_LANES, dtype=np.int64)  # where it goes in ``positions``
    for lo in range(0, items.size, _LANES):
        hi = min(lo + _LANES, items.size)
        longest = 0
        for b in range(lo, hi):
            at[b - lo] = last[items[b]]
            row[b - lo] = ptr[b + 1] - 1
            longest = max(longest, ptr[b + 1] - ptr[b])
        for _ in range(longest):
            for b in range(lo, hi):
                r = row[b - lo]
                if r >= ptr[b]:
                    pos = at[b - lo]
                    positions[r] = pos
                    if gather:
                        out_slot[r] = slot[pos]
                        out_label[r] = label[pos]
                        out_weight[r] = weight[pos]
                    at[b - lo] = prev[pos]
                    row[b - lo] = r - 1
