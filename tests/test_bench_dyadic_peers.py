"""bench.dyadic_peers' quick path: VW and myfm fit one split of duck and beat the constant."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

pytest.importorskip("vowpalwabbit")
pytest.importorskip("myfm")

from bench.dyadic_peers import COLUMNS, run


def test_quick_path_on_one_split_of_duck(datasets_root: Path) -> None:
    res = run("duck", n_splits=1, seed=0, quick=True)
    assert set(res.rows) == {"constant", *COLUMNS}
    for model, losses in res.rows.items():
        assert len(losses) == 1, model
        assert math.isfinite(losses[0]) and 0.0 <= losses[0] <= 1.0, (model, losses)
    assert res.rows["VW linear"][0] < res.rows["constant"][0]
    assert set(res.chosen) == set(COLUMNS)
