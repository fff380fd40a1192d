"""Each item's served label list, ``[[worker, label, weight], ...]``, encoded to JSON once per
label.

An item's labels only grow (``core.itemlabels.ItemLabels`` is append-only), so the engine
keeps every item's list already encoded and, on each write, encodes only the labels that
arrived since: an update of an item with n labels costs O(new labels) of Python, not O(n).
The bytes are those ``orjson.dumps`` gives for the whole list, kept open (without the closing
``]``), so that new rows are appended without taking the bracket off, and every touched
item's list is made by one join over all of them, not a join per item.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import orjson

from app.engine.untracked import UntrackedList
from core._numba import jit
from core.blocks import IntArray
from core.itemlabels import ItemLabels, grow

_OPEN = b"["  # an item without labels, its list opened
_SEPARATOR = np.array([b"", b","], dtype=object)  # before an item's new rows: none, or a comma
_NUL = b"\0"  # after each item's rows: no JSON text holds a NUL (orjson escapes it)
Bytes = npt.NDArray[np.uint8]


class LabelLists:
    """The encoded label lists of a project's items (dense codes 0..n-1), grown on demand."""

    def __init__(self) -> None:
        self._encoded: UntrackedList[bytes] = UntrackedList()  # an item's list, as JSON
        self._count = np.zeros(0, dtype=np.int64)  # labels encoded per item
        self._worker_text: Bytes = np.empty(0, dtype=np.uint8)  # each worker's id as JSON
        self._worker_end = np.zeros(1, dtype=np.int64)  # worker w's: [end[w], end[w + 1])

    def open_lists(
        self, codes: IntArray, labels: ItemLabels, workers: Sequence[str]
    ) -> list[bytes]:
        """The label list of each item in ``codes``, as JSON without its closing ``]``."""
        self._make_room(int(codes.max()) + 1 if codes.size else 0)
        self._encode_new(codes, labels, workers)
        return self._encoded.take(codes)

    def _make_room(self, n_items: int) -> None:
        if n_items > self._count.size:
            self._count = grow(self._count, max(n_items, 2 * self._count.size), 0)
            self._encoded.extend([_OPEN] * (self._count.size - len(self._encoded)))

    def _know_workers(self, workers: Sequence[str]) -> None:
        """Each worker's id encoded once, when first met."""
        known = self._worker_end.size - 1
        if len(workers) == known:
            return
        texts = [orjson.dumps(w) for w in workers[known:]]
        ends = self._worker_end[-1] + np.cumsum([len(t) for t in texts])
        self._worker_text = np.concatenate(
            [self._worker_text, np.frombuffer(b"".join(texts), dtype=np.uint8)]
        )
        self._worker_end = np.concatenate([self._worker_end, ends])

    def _encode_new(self, codes: IntArray, labels: ItemLabels, workers: Sequence[str]) -> None:
        done = self._count[codes]
        stale = np.flatnonzero(labels.count[codes] > done)
        if not stale.size:
            return
        items = codes[stale]
        if items.size > 1 and not np.all(items[1:] > items[:-1]):
            items = np.unique(items)  # (a code asked twice is encoded once)
        done = self._count[items]
        ptr, positions = labels.positions(items)
        sizes = np.diff(ptr)
        # the labels after the first ``done`` of each item's chain (arrival order)
        rank = np.arange(positions.size) - np.repeat(ptr[:-1], sizes)
        new = positions[rank >= np.repeat(done, sizes)]
        self._know_workers(workers)
        # each distinct weight written once, as orjson writes it (numbers hold no comma)
        weights, weight_of = np.unique(labels.weight[new], return_inverse=True)
        weight_texts = orjson.dumps(weights.tolist())[1:-1].split(b",")
        weight_end = np.concatenate(([0], np.cumsum([len(t) for t in weight_texts])))
        text = _rows(
            labels.worker[new], labels.label[new], weight_of.ravel().astype(np.int64),
            self._worker_text, self._worker_end,
            np.frombuffer(b"".join(weight_texts), dtype=np.uint8), weight_end.astype(np.int64),
            (sizes - done).astype(np.int64),
        )  # fmt: skip
        # per item: its list so far, a comma if it had rows, its new rows, a NUL; all joined
        # at once, then split back into the items' lists
        parts = np.empty((items.size, 4), dtype=object)
        parts[:, 0] = self._encoded.take(items)
        parts[:, 1] = _SEPARATOR[(done > 0).astype(np.intp)]
        parts[:, 2] = text.tobytes().split(_NUL)[:-1]
        parts[:, 3] = _NUL
        self._encoded.put(items, b"".join(parts.ravel().tolist()).split(_NUL)[:-1])
        self._count[items] = labels.count[items]


@jit
def _width(n):  # type: ignore[no-untyped-def]
    """How many decimal digits n >= 0 has."""
    count = 1
    while n >= 10:
        n //= 10
        count += 1
    return count


@jit
def _copy(src, lo, hi, out, at):  # type: ignore[no-untyped-def]
    """out[at:] = src[lo:hi]; the new end."""
    for k in range(lo, hi):
        out[at] = src[k]
        at += 1
    return at


@jit
def _rows(worker, label, weight, worker_text, worker_end, weight_text, weight_end, per_item):  # type: ignore[no-untyped-def]
    """The rows ``["worker",label,weight]`` of each item's new labels, comma-separated, each
    item's followed by a NUL byte (0), back to back: the bytes orjson gives for the same rows
    (the ids and weights are orjson's own text; a label is a class code >= 0)."""
    n = worker.size
    size = 0
    for j in range(n):
        w, u = worker[j], weight[j]
        size += worker_end[w + 1] - worker_end[w] + _width(label[j]) + weight_end[u + 1]
        size += 4 - weight_end[u]  # the brackets and the two commas inside a row
    size += n  # after each row, a comma or (after an item's last) the NUL
    for m in range(per_item.size):
        if per_item[m] == 0:
            size += 1  # (an item without rows: its NUL alone)
    text = np.empty(size, dtype=np.uint8)
    at = 0
    j = 0
    for m in range(per_item.size):
        for r in range(per_item[m]):
            if r > 0:
                text[at] = 44  # ,
                at += 1
            text[at] = 91  # [
            at += 1
            w = worker[j]
            at = _copy(worker_text, worker_end[w], worker_end[w + 1], text, at)
            text[at] = 44
            at += 1
            z = label[j]
            width = _width(z)
            for k in range(width - 1, -1, -1):
                text[at + k] = 48 + z % 10
                z //= 10
            at += width
            text[at] = 44
            at += 1
            u = weight[j]
            at = _copy(weight_text, weight_end[u], weight_end[u + 1], text, at)
            text[at] = 93  # ]
            at += 1
            j += 1
        text[at] = 0
        at += 1
    if at != size:
        raise AssertionError("the rows' size was miscounted")
    return text
