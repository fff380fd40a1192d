"""Each item's served label list, ``[[worker, label, weight], ...]``, encoded to JSON once per
label.

An item's labels only grow (``core.itemlabels.ItemLabels`` is append-only), so the engine
keeps every item's list already encoded and, on each write, encodes only the labels that
arrived since: an update of an item with n labels costs O(new labels), not O(n). The bytes
are those ``orjson.dumps`` gives for the whole list.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import orjson

from core.blocks import IntArray
from core.itemlabels import ItemLabels, grow

_EMPTY = b"[]"


class LabelLists:
    """The encoded label lists of a project's items (dense codes 0..n-1), grown on demand."""

    def __init__(self) -> None:
        self._encoded: list[bytes] = []  # an item's list, as JSON
        self._count = np.zeros(0, dtype=np.int64)  # labels encoded per item

    def of(self, codes: IntArray, labels: ItemLabels, workers: Sequence[str]) -> list[bytes]:
        """The label list of each item in ``codes``, as JSON (an array each)."""
        self._make_room(int(codes.max()) + 1 if codes.size else 0)
        self._encode_new(codes, labels, workers)
        encoded = self._encoded
        return [encoded[i] for i in codes.tolist()]

    def _make_room(self, n_items: int) -> None:
        if n_items > self._count.size:
            self._count = grow(self._count, max(n_items, 2 * self._count.size), 0)
            self._encoded.extend([_EMPTY] * (self._count.size - len(self._encoded)))

    def _encode_new(self, codes: IntArray, labels: ItemLabels, workers: Sequence[str]) -> None:
        done = self._count[codes]
        stale = np.flatnonzero(labels.count[codes] > done)
        if not stale.size:
            return
        items = np.unique(codes[stale])  # (a code asked twice is encoded once)
        done = self._count[items]
        ptr, positions = labels.positions(items)
        sizes = np.diff(ptr)
        # the labels after the first ``done`` of each item's chain (arrival order)
        rank = np.arange(positions.size) - np.repeat(ptr[:-1], sizes)
        new = positions[rank >= np.repeat(done, sizes)]
        rows = list(
            zip(
                [workers[w] for w in labels.worker[new].tolist()],
                labels.label[new].tolist(),
                labels.weight[new].tolist(),
                strict=True,
            )
        )
        bounds = np.concatenate(([0], np.cumsum(sizes - done))).tolist()
        encoded = self._encoded
        for n, i in enumerate(items.tolist()):
            tail = orjson.dumps(rows[bounds[n] : bounds[n + 1]])
            # (a copy: orjson's own output sits in a buffer of at least 4 KiB)
            encoded[i] = (
                bytes(memoryview(tail))
                if encoded[i] == _EMPTY
                else encoded[i][:-1] + b"," + tail[1:]
            )
        self._count[items] = labels.count[items]
