"""The served items' JSON, many items at once.

Each item's bytes are those ``orjson.dumps`` gives for its dict ``{"posterior", "clarity",
"labels", "gold", "held_out", "position", "computed_at"}``, assembled from one orjson call per
column rather than one per item: the engine writes every item a step touched, and the call
per item was the largest part of building a step's update. The label lists come open (without
their closing bracket, as ``LabelLists`` keeps them), so that a list is never copied to be
closed.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import orjson

from core.blocks import FloatArray, IntArray

_NULL = b"null"


def items_json(
    posterior: FloatArray,
    clarity: FloatArray,
    open_labels: Sequence[bytes],
    gold: IntArray,
    held_out: FloatArray,
    position: int,
    computed_at: float,
) -> list[bytes]:
    """One JSON object per row: ``open_labels`` each item's label list encoded, without its
    closing ``]``; ``gold`` -1 for none, a ``held_out`` row of zeros for none."""
    if not len(open_labels):
        return []
    held = np.any(held_out != 0.0, axis=1)
    corrections = [_NULL] * held.size
    for i, row in zip(np.flatnonzero(held).tolist(), rows(held_out[held]), strict=True):
        corrections[i] = row
    tail = b',"position":%b,"computed_at":%b}' % (orjson.dumps(position), orjson.dumps(computed_at))
    return [
        b'{"posterior":%b,"clarity":%b,"labels":%b],"gold":%b,"held_out":%b%b'
        % (p, c, l, g, h, tail)
        for p, c, l, g, h in zip(
            rows(posterior),
            numbers(clarity.tolist()),
            open_labels,
            numbers([g if g >= 0 else None for g in gold.tolist()]),
            corrections,
            strict=True,
        )
    ]


def rows(matrix: FloatArray) -> list[bytes]:
    """Each row of a 2-D float array as orjson writes it, from one call: numbers hold no
    ``],[``, so the whole array's text splits into its rows. (orjson writes a float64 array
    as it writes the same numbers as Python floats, without making them.)"""
    if not matrix.shape[0]:
        return []
    array = np.ascontiguousarray(matrix, dtype=np.float64)
    text = orjson.dumps(array, option=orjson.OPT_SERIALIZE_NUMPY)
    return [b"[%b]" % row for row in text[2:-2].split(b"],[")]


def numbers(values: list[float] | list[int | None]) -> list[bytes]:
    """Each number (or null) as orjson writes it, from one call."""
    return orjson.dumps(values)[1:-1].split(b",") if values else []
