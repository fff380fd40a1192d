"""Each item's served label list, ``[[worker, label, weight], ...]``, encoded to JSON once per
label.

An item's labels only grow (``core.itemlabels.ItemLabels`` is append-only), so the store keeps
every item's list already encoded (``app.store.item_records``; on Redis, from the engine's
copy) and the engine sends, on each write, only the labels that arrived since: an update of an
item with n labels costs O(new labels), not O(n). An item this engine has not written yet (or
since ``forget``) gets its whole list, which replaces the stored one (left by an engine before
this one). The bytes are
those ``orjson.dumps`` gives for the whole list, and every touched item's text is made by one
compiled pass and one join over all of them, not a join per item.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import orjson

from app.store.item_records import WHOLE
from core._numba import jit
from core.blocks import IntArray
from core.itemlabels import ItemLabels, grow

_PREFIX = np.array([WHOLE, b","], dtype=object)  # before an item's rows: its whole list, or more
_NUL = b"\0"  # after each item's rows: no JSON text holds a NUL (orjson escapes it)
Bytes = npt.NDArray[np.uint8]


class LabelLists:
    """What of a project's items' label lists (dense codes 0..n-1) this engine has written."""

    def __init__(self) -> None:
        self._count = np.zeros(0, dtype=np.int64)  # labels written per item
        self._worker_text: Bytes = np.empty(0, dtype=np.uint8)  # each worker's id as JSON
        self._worker_end = np.zeros(1, dtype=np.int64)  # worker w's: [end[w], end[w + 1])

    def texts(self, codes: IntArray, labels: ItemLabels, workers: Sequence[str]) -> list[bytes]:
        """For each item in ``codes`` (distinct): the text to put in its stored label list
        (``app.store.item_records.ItemWrites.labels``), counted as written."""
        self._make_room(int(codes.max()) + 1 if codes.size else 0)
        done = self._count[codes]
        texts = self.encode(codes, done, labels, workers)
        self._count[codes] = labels.count[codes]
        return texts

    def forget(self) -> None:
        """Count nothing as written: the next text of every item is its whole list (after a
        write that failed, or state built and not written)."""
        self._count[:] = 0

    def encode(
        self, codes: IntArray, done: IntArray, labels: ItemLabels, workers: Sequence[str]
    ) -> list[bytes]:
        """Each item's labels after its first ``done``: ``WHOLE`` and every row where ``done``
        is 0, else a comma and the new rows (nothing where none came)."""
        if not codes.size:
            return []
        ptr, positions = labels.positions(codes)
        sizes = np.diff(ptr)
        # the labels after the first ``done`` of each item's chain (arrival order)
        rank = np.arange(positions.size) - np.repeat(ptr[:-1], sizes)
        new = positions[rank >= np.repeat(done, sizes)]
        self._know_workers(workers)
        # each distinct weight written once, as orjson writes it (numbers hold no comma)
        weights, weight_of = np.unique(labels.weight[new], return_inverse=True)
        weight_texts = orjson.dumps(weights.tolist())[1:-1].split(b",") if weights.size else []
        weight_end = np.concatenate(([0], np.cumsum([len(t) for t in weight_texts])))
        text = _rows(
            labels.worker[new], labels.label[new], weight_of.ravel().astype(np.int64),
            self._worker_text, self._worker_end,
            np.frombuffer(b"".join(weight_texts), dtype=np.uint8), weight_end.astype(np.int64),
            (sizes - done).astype(np.int64),
        )  # fmt: skip
        # per item: its prefix (none where nothing came), its rows, a NUL; all joined at
        # once, then split back into the items' texts
        prefix = _PREFIX[(done > 0).astype(np.intp)]
        prefix[(done > 0) & (sizes == done)] = b""
        parts = np.empty((codes.size, 3), dtype=object)
        parts[:, 0] = prefix
        parts[:, 1] = text.tobytes().split(_NUL)[:-1]
        parts[:, 2] = _NUL
        return b"".join(parts.ravel().tolist()).split(_NUL)[:-1]

    def _make_room(self, n_items: int) -> None:
        if n_items > self._count.size:
            self._count = grow(self._count, max(n_items, 2 * self._count.size), 0)

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
