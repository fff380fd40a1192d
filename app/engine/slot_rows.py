"""Rows of hashed slots (the nominal model's worker slots, the dyadic model's rater and task
slots) as the store keeps them: each row's bytes, by slot."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from app.store.item_records import as_bytes
from core.blocks import IntArray


def rows_by_slot(slots: IntArray, rows: npt.NDArray[np.float64]) -> dict[int, bytes]:
    """``rows[n]``'s bytes under ``slots[n]``, in slot order: one copy of the rows in that
    order, each row a ``bytes`` of its own size (``as_bytes``)."""
    order = np.argsort(slots, kind="stable")
    return dict(zip(slots[order].tolist(), as_bytes(rows[order]), strict=True))
