"""Rows of hashed slots as the store keeps them."""

from __future__ import annotations

import numpy as np

from app.engine.slot_rows import rows_by_slot


def test_each_rows_bytes_under_its_slot_in_slot_order() -> None:
    rng = np.random.default_rng(0)
    slots = rng.permutation(50)[:20]
    rows = rng.normal(size=(20, 3, 3))
    got = rows_by_slot(slots, rows)
    assert list(got) == sorted(slots.tolist())
    assert got == {int(s): r.tobytes() for s, r in zip(slots, rows, strict=True)}
    assert rows_by_slot(slots[:0], rows[:0]) == {}
