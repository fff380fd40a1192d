"""Stored posteriors as served: calibrated with the project's calibration, gold items certain."""

from __future__ import annotations

import numpy as np

from app.serving.nominal import Globals, stored_posterior, stored_posteriors
from core.calibration import Calibration
from core.nominal import NominalConfig


def _globals(calibration: Calibration) -> Globals:
    g = Globals.parse(None, NominalConfig(n_classes=3))
    return Globals(g.class_logits, g.population, g.scalars, 1, 0.0, 3, 2, 6, 0, calibration, None)


def test_many_items_are_served_as_each_alone_and_gold_stays_certain() -> None:
    g = _globals(Calibration(0.3, 0.05, ((0.6, 0.3, 0.05), (0.4, 0.1, 0.02))))
    rng = np.random.default_rng(0)
    items = [
        {
            "posterior": rng.dirichlet(np.ones(3)).tolist(),
            "labels": [["w", 0, 1.0]] * int(rng.integers(1, 6)),
            "gold": None,
        }
        for _ in range(20)
    ]
    items[4] = {"posterior": [0.0, 1.0, 0.0], "labels": [["w", 1, 1.0]] * 3, "gold": 1}
    together = stored_posteriors(items, g)
    for k, d in enumerate(items):
        alone = g.calibration.from_posteriors(np.array([d["posterior"]]), [len(d["labels"])])[0]
        expect = d["posterior"] if d["gold"] is not None else alone  # eq. 21, item by item
        np.testing.assert_allclose(together[k], expect, rtol=0, atol=1e-15)
        np.testing.assert_allclose(stored_posterior(d, g), expect, rtol=0, atol=1e-15)
    assert together[4].tolist() == [0.0, 1.0, 0.0]
    assert not np.allclose(together[0], items[0]["posterior"])  # calibrated
    np.testing.assert_allclose(together.sum(axis=1), 1.0)
    assert stored_posteriors([], g).shape == (0, 3)
