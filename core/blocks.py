"""Int-coding of opaque ids and grouping of labels into per-item blocks."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from core._numba import jit

IntArray = npt.NDArray[np.int64]
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
    slots: IntArray
    labels: IntArray
    weights: FloatArray

    def __post_init__(self) -> None:
        # One dtype and layout for every caller (int32 codes from a file, views): the kernels
        # are compiled once per argument type, and a second type costs seconds of compiling.
        for name, dtype in (("ptr", np.int64), ("slots", np.int64), ("labels", np.int64)):
            object.__setattr__(self, name, np.ascontiguousarray(getattr(self, name), dtype))
        object.__setattr__(self, "weights", np.ascontiguousarray(self.weights, np.float64))

    @property
    def n_blocks(self) -> int:
        return int(self.ptr.size - 1)

    @property
    def n_labels(self) -> int:
        return int(self.slots.size)

    def sizes(self) -> IntArray:
        return np.diff(self.ptr)

    def total_weight(self) -> FloatArray:
        """Sum of importance weights per block (0 for a block without labels)."""
        block_of = np.repeat(np.arange(self.n_blocks), self.sizes())
        out: FloatArray = np.bincount(block_of, self.weights, self.n_blocks).astype(np.float64)
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
        block_a = np.asarray(block, dtype=np.int64)
        slots_a = np.asarray(slots, dtype=np.int64)
        labels_a = np.asarray(labels, dtype=np.int64)
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
        order = canonical_order(block_a, slots_a, labels_a, weights_a)
        ptr = np.zeros(n_blocks + 1, dtype=np.int64)
        np.cumsum(np.bincount(block_a, minlength=n_blocks), out=ptr[1:])
        return cls(ptr, slots_a[order], labels_a[order], weights_a[order])


LARGE = 1 << 16
"""From this many labels on, ``canonical_order`` sorts in a compiled kernel (a counting sort
by block, then each block by itself), linear in the labels where numpy's argsort of 10M keys
takes about 1.3 s; below, numpy's sort (the engine's entries: no kernel to compile at start).
Both give the same permutation."""


def canonical_order(
    block: IntArray, slots: IntArray, labels: IntArray, weights: FloatArray
) -> IntArray:
    """The stable sort by (block, slot, label, weight)."""
    if block.size >= LARGE and block.min() >= 0:
        out: IntArray = _grouped_order(
            block, slots, labels, _kernel_weights(weights), np.int64(block.max() + 1)
        )
        return out
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
def _grouped_order(block, slots, labels, weights, n_blocks):  # type: ignore[no-untyped-def]
    """Counting sort by block (stable), then each block's labels by (slot, label, weight):
    insertion sort for short blocks, a bottom-up merge sort for long ones (both stable)."""
    n = block.size
    start = np.zeros(n_blocks + 1, dtype=np.int64)
    for i in range(n):
        start[block[i] + 1] += 1
    for b in range(n_blocks):
        start[b + 1] += start[b]
    fill = start[:-1].copy()
    order = np.empty(n, dtype=np.int64)
    for i in range(n):
        order[fill[block[i]]] = i
        fill[block[i]] += 1
    scratch = np.empty(0, dtype=np.int64)
    for b in range(n_blocks):
        lo, hi = start[b], start[b + 1]
        if hi - lo <= 32:
            _insertion_sort(order, lo, hi, slots, labels, weights)
        else:
            if scratch.size < hi - lo:
                scratch = np.empty(hi - lo, dtype=np.int64)
            _merge_sort(order, lo, hi, scratch, slots, labels, weights)
    return order


@jit
def _before(i, j, slots, labels, weights):  # type: ignore[no-untyped-def]
    """Label i sorts strictly before label j."""
    if slots[i] != slots[j]:
        return slots[i] < slots[j]
    if labels[i] != labels[j]:
        return labels[i] < labels[j]
    return weights.size > 0 and weights[i] < weights[j]  # (no weights: all equal)


@jit
def _insertion_sort(order, lo, hi, slots, labels, weights):  # type: ignore[no-untyped-def]
    for k in range(lo + 1, hi):
        x = order[k]
        m = k - 1
        while m >= lo and _before(x, order[m], slots, labels, weights):
            order[m + 1] = order[m]
            m -= 1
        order[m + 1] = x


@jit
def _merge_sort(order, lo, hi, scratch, slots, labels, weights):  # type: ignore[no-untyped-def]
    n = hi - lo
    width = 1
    while width < n:
        for a in range(lo, hi, 2 * width):
            mid, end = min(a + width, hi), min(a + 2 * width, hi)
            i, j, k = a, mid, 0
            while i < mid and j < end:  # the left one on ties: stable
                if _before(order[j], order[i], slots, labels, weights):
                    scratch[k] = order[j]
                    j += 1
                else:
                    scratch[k] = order[i]
                    i += 1
                k += 1
            while i < mid:
                scratch[k] = order[i]
                i += 1
                k += 1
            while j < end:
                scratch[k] = order[j]
                j += 1
                k += 1
            for m in range(k):
                order[a + m] = scratch[m]
        width *= 2
