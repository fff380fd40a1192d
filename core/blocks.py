"""Int-coding of opaque ids and grouping of labels into per-item blocks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from core._numba import jit

IntArray = npt.NDArray[np.int64]
CodeArray = npt.NDArray[np.integer[Any]]
"""Slot and label codes: taken of any width, held by blocks as int32 (4 bytes an answer)."""
CODE_MAX = int(np.iinfo(np.int32).max)
WEIGHT_BLOCKS = 1 << 16
"""Blocks whose labels are summed at a time by work over every block (``LabelBlocks.total_weight``,
``core.batch.majority_vote``): a block number for each label is made for a slice only."""
FloatArray = npt.NDArray[np.float64]


def factorize(values: npt.ArrayLike) -> tuple[IntArray, npt.NDArray[np.str_]]:
    """Codes 0..n-1 of each value and the sorted distinct values (deterministic)."""
    uniques, codes = np.unique(np.asarray(values, dtype=np.str_), return_inverse=True)
    return codes.astype(np.int64).ravel(), uniques


@dataclass(frozen=True)
class LabelBlocks:
    """Labels grouped by block (one item, or one arrival of an item's labels).

    Block ``b`` owns entries ``ptr[b]:ptr[b+1]``. Inside a block, labels are in a canonical
    order (slot, label, weight) so that a block's result never depends on the order its
    labels came in, to the last bit.
    """

    ptr: IntArray
    slots: CodeArray
    labels: CodeArray
    weights: FloatArray

    def __post_init__(self) -> None:
        # One dtype and layout for every caller (int32 codes from a file, views): the kernels
        # are compiled once per argument type, and a second type costs seconds of compiling.
        for name, dtype in (("ptr", np.int64), ("slots", np.int32), ("labels", np.int32)):
            given = np.asarray(getattr(self, name))
            narrowed = dtype is np.int32 and given.dtype != np.int32 and given.size > 0
            if narrowed and (given.max() > CODE_MAX or given.min() < 0):  # (a cast would wrap)
                raise ValueError(f"{name} codes must lie in 0..{CODE_MAX}")
            object.__setattr__(self, name, np.ascontiguousarray(given, dtype))
        object.__setattr__(self, "weights", np.ascontiguousarray(self.weights, np.float64))

    @property
    def n_blocks(self) -> int:
        return int(self.ptr.size - 1)

    @property
    def n_labels(self) -> int:
        return int(self.slots.size)

    def sizes(self) -> IntArray:
        return np.diff(self.ptr)

    def total_weight(self, which: IntArray | None = None) -> FloatArray:
        """Sum of importance weights per block (0 for a block without labels), each block's
        weights added in order; of the blocks ``which`` (default: all), in that order. Taken
        ``WEIGHT_BLOCKS`` blocks at a time: a block number for every label at once was 8
        bytes an answer (80 MB at 10M answers)."""
        n = self.n_blocks if which is None else len(which)
        out: FloatArray = np.empty(n)
        for lo in range(0, n, WEIGHT_BLOCKS):
            hi = min(lo + WEIGHT_BLOCKS, n)
            part = np.arange(lo, hi) if which is None else np.asarray(which[lo:hi])
            starts, sizes = self.ptr[part], self.ptr[part + 1] - self.ptr[part]
            block_of = np.repeat(np.arange(hi - lo), sizes)
            label = np.arange(block_of.size) + np.repeat(starts - (np.cumsum(sizes) - sizes), sizes)
            out[lo:hi] = np.bincount(block_of, self.weights[label], hi - lo)
        return out

    @classmethod
    def group(
        cls,
        block: npt.ArrayLike,
        slots: npt.ArrayLike,
        labels: npt.ArrayLike,
        weights: npt.ArrayLike | None = None,
        n_blocks: int | None = None,
    ) -> LabelBlocks:
        """Group labels by their block code (0..n_blocks-1); empty blocks are allowed."""
        block_a, slots_a, labels_a = _codes(block), _codes(slots), _codes(labels)
        weights_a = (
            np.ones(block_a.size) if weights is None else np.asarray(weights, dtype=np.float64)
        )
        if not (block_a.shape == slots_a.shape == labels_a.shape == weights_a.shape):
            raise ValueError("block, slots, labels and weights must have one entry per label")
        if block_a.size and block_a.min() < 0:
            raise ValueError("block codes must be >= 0")
        n = int(block_a.max()) + 1 if block_a.size else 0
        n_blocks = n if n_blocks is None else n_blocks
        if n > n_blocks:
            raise ValueError(f"block code {n - 1} out of range for {n_blocks} blocks")
        if block_a.size >= LARGE:
            equal = float(weights_a[0]) if weights_a.size else 1.0
            ptr, s, z, w, _ = _grouped(
                block_a, slots_a, labels_a, _kernel_weights(weights_a), equal, np.int64(n_blocks),
                False,
            )  # fmt: skip
            return cls(ptr, s, z, w)
        block_a, slots_a, labels_a = (
            a.astype(np.int64, copy=False) for a in (block_a, slots_a, labels_a)
        )
        order = canonical_order(block_a, slots_a, labels_a, weights_a)
        ptr = np.zeros(n_blocks + 1, dtype=np.int64)
        np.cumsum(np.bincount(block_a, minlength=n_blocks), out=ptr[1:])
        return cls(ptr, slots_a[order], labels_a[order], weights_a[order])


def _codes(values: npt.ArrayLike) -> npt.NDArray[np.int32] | IntArray:
    """Int codes as the grouping kernel takes them: a file's int32 codes (items, workers,
    labels) as they are (a conversion of 10M of them costs about 0.15 s), anything else as
    int64."""
    a = np.asarray(values)
    if a.dtype == np.int32 and a.flags.c_contiguous:
        return a
    return np.asarray(a, dtype=np.int64)


LARGE = 1 << 16
"""From this many labels on, ``LabelBlocks.group`` and ``canonical_order`` sort in a compiled
kernel (``_grouped``: a counting sort by block, then each block by itself), linear in the
labels where numpy's argsort of 10M keys takes about 1.3 s; below, numpy's sort (the engine's
entries: no kernel to compile at start). Both give the same blocks."""


def canonical_order(
    block: IntArray, slots: IntArray, labels: IntArray, weights: FloatArray
) -> IntArray:
    """The stable sort by (block, slot, label, weight)."""
    if block.size >= LARGE and block.min() >= 0:
        order: IntArray = _grouped(
            block, slots, labels, _kernel_weights(weights), 1.0, np.int64(block.max() + 1), True
        )[4]
        return order
    if block.size and np.all(weights == weights[0]):  # one int64 key (4x faster than lexsort)
        n_slots, n_labels = int(slots.max()) + 1, int(labels.max()) + 1
        if (
            (int(block.max()) + 1) * n_slots * n_labels < 2**62
            and slots.min() >= 0
            and labels.min() >= 0
        ):
            key = (block * n_slots + slots) * n_labels + labels
            out = np.argsort(key, kind="stable")
            return out
    return np.lexsort((weights, labels, slots, block))


_NO_WEIGHTS = np.zeros(0)


def _kernel_weights(weights: FloatArray) -> FloatArray:
    """``weights`` as the sort kernel takes them, so that it has one signature to compile:
    empty when they are all equal (they break no tie then; a file without weights passes a
    read-only broadcast of 1.0), else a writable contiguous array of native float64."""
    if weights.size and weights.strides == (0,):
        return _NO_WEIGHTS
    if weights.dtype == np.float64 and weights.flags.c_contiguous and weights.flags.writeable:
        return weights
    return np.array(weights, dtype=np.float64)


@jit
def _grouped(block, slots, labels, weights, equal, n_blocks, with_order):  # type: ignore[no-untyped-def]
    """The labels grouped by block and sorted by (slot, label, weight) in each block, ties in
    input order: returns ptr, the sorted slots, labels and weights (``equal`` where ``weights``
    is empty: all equal) and, ``with_order``, the permutation (sorted position p holds input
    label order[p]; else empty).

    A counting sort by block carries each label's fields along (a sequential read, one write
    per field), so that each block is then sorted where it lies, its fields contiguous: an
    insertion sort for short blocks, a bottom-up merge sort of positions for long ones (both
    stable)."""
    n = block.size
    ptr = np.zeros(n_blocks + 1, dtype=np.int64)
    for i in range(n):
        ptr[block[i] + 1] += 1
    for b in range(n_blocks):
        ptr[b + 1] += ptr[b]
    fill = ptr[:-1].copy()
    s_out = np.empty(n, dtype=np.int32)
    l_out = np.empty(n, dtype=np.int32)
    w_out = np.empty(n, dtype=np.float64)
    w_out[:] = equal
    order = np.empty(n if with_order else 0, dtype=np.int64)
    weighted = weights.size > 0
    for i in range(n):
        at = fill[block[i]]
        fill[block[i]] = at + 1
        s_out[at] = slots[i]
        l_out[at] = labels[i]
        if weighted:
            w_out[at] = weights[i]
        if with_order:
            order[at] = i
    position = np.empty(0, dtype=np.int64)
    scratch = np.empty(0, dtype=np.int64)
    for b in range(n_blocks):
        lo, hi = ptr[b], ptr[b + 1]
        if hi - lo <= 32:
            _insertion_sort(lo, hi, s_out, l_out, w_out, order)
        else:
            if position.size < hi - lo:
                position = np.empty(hi - lo, dtype=np.int64)
                scratch = np.empty(hi - lo, dtype=np.int64)
            _merge_sort(lo, hi, position, scratch, s_out, l_out, w_out, order)
    return ptr, s_out, l_out, w_out, order


@jit
def _key_before(s, z, w, s2, z2, w2):  # type: ignore[no-untyped-def]
    """(s, z, w) sorts strictly before (s2, z2, w2)."""
    if s != s2:
        return s < s2
    if z != z2:
        return z < z2
    return w < w2


@jit
def _before(i, j, slots, labels, weights):  # type: ignore[no-untyped-def]
    """Label i sorts strictly before label j."""
    return _key_before(slots[i], labels[i], weights[i], slots[j], labels[j], weights[j])


@jit
def _insertion_sort(lo, hi, slots, labels, weights, order):  # type: ignore[no-untyped-def]
    """(``order`` moves along unless it is empty.)"""
    ordered = order.size > 0
    for k in range(lo + 1, hi):
        s, z, w = slots[k], labels[k], weights[k]
        i = order[k] if ordered else 0
        m = k - 1
        while m >= lo and _key_before(s, z, w, slots[m], labels[m], weights[m]):
            slots[m + 1], labels[m + 1], weights[m + 1] = slots[m], labels[m], weights[m]
            if ordered:
                order[m + 1] = order[m]
            m -= 1
        slots[m + 1], labels[m + 1], weights[m + 1] = s, z, w
        if ordered:
            order[m + 1] = i


@jit
def _move(lo, n, position, scratch, field):  # type: ignore[no-untyped-def]
    """field[lo + k] = field[position[k]] for k < n, through ``scratch``."""
    for k in range(n):
        scratch[k] = field[position[k]]
    for k in range(n):
        field[lo + k] = scratch[k]


@jit
def _merge_sort(lo, hi, position, scratch, slots, labels, weights, order):  # type: ignore[no-untyped-def]
    """Sorts the positions lo..hi-1 by their fields (stable), then moves the fields."""
    n = hi - lo
    for k in range(n):
        position[k] = lo + k
    width = 1
    while width < n:
        for a in range(0, n, 2 * width):
            mid, end = min(a + width, n), min(a + 2 * width, n)
            i, j, k = a, mid, 0
            while i < mid and j < end:  # the left one on ties: stable
                if _before(position[j], position[i], slots, labels, weights):
                    scratch[k] = position[j]
                    j += 1
                else:
                    scratch[k] = position[i]
                    i += 1
                k += 1
            while i < mid:
                scratch[k] = position[i]
                i += 1
                k += 1
            while j < end:
                scratch[k] = position[j]
                j += 1
                k += 1
            for m in range(k):
                position[a + m] = scratch[m]
        width *= 2
    _move(lo, n, position, scratch, slots)
    _move(lo, n, position, scratch, labels)
    if order.size > 0:  # (an order asked for)
        _move(lo, n, position, scratch, order)
    moved = np.empty(n)
    for k in range(n):
        moved[k] = weights[position[k]]
    for k in range(n):
        weights[lo + k] = moved[k]
