"""The queue's progress totals, kept as items are rescored, equal a recount over every item."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from app.engine.queue import Progress, QueueSettings, labels_to_finish
from core.acquisition import labels_to_confidence
from core.calibration import Calibration
from tests.core.test_acquisition import symmetric


def recount(finished: np.ndarray, counted: np.ndarray, conf: np.ndarray, to_go: np.ndarray) -> dict:
    done, open_ = finished & counted, ~finished & counted
    total = float(to_go[open_].sum())
    return {
        "done": int(done.sum()),
        "expected_accuracy": float(conf[done].mean()) if done.any() else None,
        "open": int(open_.sum()),
        "labels_to_finish": total if np.isfinite(total) else None,
    }


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 30))
def test_totals_follow_every_rescoring(seed: int, rounds: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 3000))
    p = Progress()
    finished, counted = np.zeros(n, bool), np.zeros(n, bool)
    conf, to_go = np.zeros(n), np.zeros(n)
    for _ in range(rounds):
        codes = rng.choice(n, size=int(rng.integers(0, n + 1)), replace=False)
        f, c = rng.random(codes.size) < 0.4, rng.random(codes.size) < 0.9
        q = rng.random(codes.size)
        need = np.where(rng.random(codes.size) < 0.02, np.inf, rng.integers(0, 9, codes.size))
        p.update(codes, f, c, q, need)
        finished[codes], counted[codes], conf[codes] = f, c, q
        to_go[codes] = np.where(f, 0.0, need)
        got, want = p.report(), recount(finished, counted, conf, to_go)
        assert got["done"] == want["done"] and got["open"] == want["open"]
        assert (got["expected_accuracy"] is None) == (want["expected_accuracy"] is None)
        if want["expected_accuracy"] is not None:
            assert abs(got["expected_accuracy"] - want["expected_accuracy"]) < 1e-9
        if want["labels_to_finish"] is None:
            assert got["labels_to_finish"] is None
        else:
            assert abs(got["labels_to_finish"] - want["labels_to_finish"]) < 1e-6


def test_labels_to_finish_is_infinite_where_the_calibration_keeps_an_item_below_target() -> None:
    """The queue's count (A8 capped) is Wald's where the served confidence can get there, and
    infinite where it cannot: the progress then reports no finite number of labels."""
    C = symmetric(2, 0.75)
    raw = np.array([[0.7, 0.3], [0.99, 0.01]])
    weight = np.array([2.0, 20.0])
    rule = QueueSettings(target_confidence=0.95)
    cal = Calibration(eps=0.0)
    served = cal.from_posteriors(raw, weight)
    wald = labels_to_finish(rule, served, np.array([2, 20]), C, (raw, weight, cal))
    assert np.array_equal(wald, labels_to_confidence(served, C, 0.95))
    capped = Calibration(eps=0.08)
    served = capped.from_posteriors(raw, weight)
    need = labels_to_finish(rule, served, np.array([2, 20]), C, (raw, weight, capped))
    assert np.isinf(need).all()
    with_cap = QueueSettings(target_confidence=0.95, max_labels_per_item=10)
    need = labels_to_finish(with_cap, served, np.array([2, 20]), C, (raw, weight, capped))
    assert need.tolist() == [8.0, 0.0]  # (max_labels_per_item finishes them)


def test_a_budget_bounds_the_labels_left_to_finish() -> None:
    """The budget's end finishes every item: no more labels than it allows are left to
    finish, even where some item could not reach the target."""
    p = Progress()
    codes = np.arange(3)
    p.update(codes, np.zeros(3, bool), np.ones(3, bool), np.full(3, 0.6), np.array([4.0, 5, 6]))
    assert p.report()["labels_to_finish"] == 15.0
    assert p.report(budget_left=7)["labels_to_finish"] == 7.0
    assert p.report(budget_left=100)["labels_to_finish"] == 15.0
    p.update(codes[:1], np.zeros(1, bool), np.ones(1, bool), np.full(1, 0.6), np.array([np.inf]))
    assert p.report()["labels_to_finish"] is None
    assert p.report(budget_left=1)["labels_to_finish"] == 1.0
