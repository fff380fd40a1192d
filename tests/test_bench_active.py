"""The replay bench's h_min policy picks real, unrevealed answers of the items it ranks first."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from app.io.extract import load_labelled
from bench.active import Campaign, hmin


def test_hmin_policy_reveals_unrevealed_real_answers(datasets_root: Path) -> None:
    data, gold = load_labelled(datasets_root / "duck")
    c = Campaign.start_from(data, gold, 0)
    for _ in range(3):
        before = c.revealed.copy()
        items, answers = hmin(c, 5)
        assert answers is not None and items.size == 5 == np.unique(items).size
        remaining, of_item = c.remaining_answers()
        pairs = set(zip(of_item.tolist(), remaining.tolist(), strict=True))
        assert all((i, a) in pairs for i, a in zip(items.tolist(), answers.tolist(), strict=True))
        assert np.all(data.items[answers] == items)
        c.reveal(items, answers)
        assert np.array_equal(
            c.revealed - before, np.isin(np.arange(before.size), items).astype(np.int64)
        )
    assert c._dyadic.config.k == 2  # type: ignore[attr-defined]
