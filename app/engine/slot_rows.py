"""Rows of hashed slots (the nominal model's worker slots, the dyadic model's rater and task
slots) as the store keeps them: each row's bytes, by slot."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from core.blocks import IntArray


def rows_by_slot(slots: IntArray, rows: npt.NDArray[np.float64]) -> dict[int, bytes]:
    """``rows[n]``'s bytes under ``slots[n]``, in slot order; each row sliced from one copy
    of the rows in that order (a ``tobytes`` per row cost more than the rest of the write)."""
    order = np.argsort(slots, kind="stable")
    blob = rows[order].tobytes()
    width = rows[0].nbytes if rows.shape[0] else 1
    chunks = [blob[at : at + width] for at in range(0, len(blob), width)]
    return dict(zip(slots[order].tolist(), chunks, strict=True))
