"""bench.calibration_limits: the perfectly-calibrated floor, VB Dawid-Skene, the best (rho, eps)."""

from __future__ import annotations

import numpy as np

from bench import calibration_limits as cl
from bench.crowds import synthetic


def test_floor_is_zero_for_certain_posteriors_and_positive_for_finite_sets() -> None:
    sure = np.eye(3)[np.array([0, 1, 2, 1])]
    assert cl.perfect_floor(sure, draws=5) == 0.0
    q = np.random.default_rng(0).dirichlet(np.ones(3), size=200)
    floor = cl.perfect_floor(q, draws=50)
    assert 1.0 < floor < 15.0  # 200 items in 10 bins: a calibrated model still shows a few points
    assert cl.perfect_floor(np.repeat(q, 20, axis=0), draws=20) < floor  # shrinks with n


def test_pooled_strength_follows_how_alike_workers_are() -> None:
    mean = np.array([[0.8, 0.2], [0.2, 0.8]])
    alike = np.tile(100.0 * mean, (30, 1, 1))  # every worker's rows exactly the crowd's
    spread = np.stack([np.diag([100.0, 100.0]) if w % 2 else 100.0 - np.diag([100.0, 100.0])
                       for w in range(30)])  # fmt: skip
    assert cl.pooled_strength(alike, mean) == max(cl.STRENGTHS)
    assert cl.pooled_strength(spread, mean) == min(cl.STRENGTHS)


def test_vb_dawid_skene_recovers_a_dawid_skene_crowd() -> None:
    crowd = synthetic("ds")
    q, strength = cl.vb_dawid_skene(crowd)
    np.testing.assert_allclose(q.sum(axis=1), 1.0)
    acc = float(np.mean(q.argmax(axis=1) == crowd.gold))
    assert crowd.oracle is not None
    oracle = float(np.mean(crowd.oracle.argmax(axis=1) == crowd.gold))
    assert acc >= oracle - 0.02
    assert strength in cl.STRENGTHS


def test_limits_on_a_synthetic_crowd() -> None:
    row = cl.limits(synthetic("one_coin"), draws=20)
    assert row.n_scored == 3000
    assert row.best_ece <= row.served_ece + 1e-9  # the grid contains a choice at least as good
    assert 0.0 < row.floor < 3.0
    assert "syn_one_coin" in cl.table([row])


def test_a_consensus_twin_has_the_same_answers_and_other_gold_on_its_share() -> None:
    crowd = synthetic("ds")
    twin = cl.consensus_twin(crowd, 0.3)
    for name in ("item", "worker", "label"):
        assert np.array_equal(getattr(twin, name), getattr(crowd, name))
    has = crowd.gold >= 0
    moved = twin.gold[has] != crowd.gold[has]
    assert abs(moved.mean() - 0.3) < 0.01 and np.all(twin.gold[has] >= 0)
    # one served posterior for both (the answers are the same): calibrated on the crowd, far
    # off on its twin
    text = cl.twins_table(crowd, [0.3])
    ece_crowd, ece_twin = (float(line.split()[-6]) for line in text.splitlines()[2:4])
    assert ece_crowd < 3.0 and ece_twin > 20.0
