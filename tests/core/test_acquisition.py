"""Acquisition scores (docs/active.md, eq. A1-A7): hand-checked values and their invariants."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from core.acquisition import (
    StoppingRule,
    entropy,
    error_probability,
    margin,
    select,
    value_of_information,
)


def symmetric(K: int, right: float) -> np.ndarray:
    """A worker who is right with probability ``right``, wrong answers spread evenly."""
    C = np.full((K, K), (1 - right) / (K - 1))
    np.fill_diagonal(C, right)
    return C


def brute_force_voi(q: np.ndarray, C: np.ndarray, n: int) -> float:
    """Enumerate every answer sequence, update the posterior by Bayes, average the error."""
    K = q.size
    after = 0.0
    for seq in itertools.product(range(K), repeat=n):
        joint = q * np.prod(C[:, list(seq)], axis=1)
        p_seq = joint.sum()
        after += p_seq * (1 - (joint / p_seq).max())
    return (1 - q.max()) - after


def test_uncertainty_scores_hand_checked() -> None:
    q = np.array([[1.0, 0.0, 0.0], [0.5, 0.3, 0.2], [1 / 3, 1 / 3, 1 / 3]])
    assert error_probability(q) == pytest.approx([0.0, 0.5, 2 / 3])
    assert entropy(q) == pytest.approx(
        [0.0, -(0.5 * np.log(0.5) + 0.3 * np.log(0.3) + 0.2 * np.log(0.2)), np.log(3)]
    )
    assert margin(q) == pytest.approx([1.0, 0.2, 0.0])


def test_voi_is_zero_for_a_certain_item_and_larger_for_an_uncertain_one() -> None:
    C = symmetric(2, 0.8)
    q = np.array([[1.0, 0.0], [0.6, 0.4], [0.5, 0.5]])
    v = value_of_information(q, C)
    assert v[0] == 0.0
    assert 0 < v[1] < v[2]
    # Hand check for q = (0.5, 0.5): after one label the posterior is (0.8, 0.2) either way,
    # so the error falls from 0.5 to 0.2.
    assert v[2] == pytest.approx(0.3)


def test_voi_matches_bayes_by_enumeration() -> None:
    rng = np.random.default_rng(0)
    for K, n in [(2, 1), (3, 1), (3, 2), (4, 3)]:
        q = rng.dirichlet(np.ones(K), size=5)
        C = rng.dirichlet(np.ones(K), size=K) + 2 * np.eye(K)
        C /= C.sum(axis=1, keepdims=True)
        got = value_of_information(q, C, lookahead=n)
        want = [brute_force_voi(row, C, n) for row in q]
        assert got == pytest.approx(want, abs=1e-12)
        assert np.all(got >= 0)


def test_voi_is_zero_for_a_spammer_and_grows_with_accuracy() -> None:
    q = np.array([[0.5, 0.3, 0.2], [0.4, 0.35, 0.25]])
    spammer = np.tile([0.7, 0.2, 0.1], (3, 1))  # answers the same whatever the truth
    assert value_of_information(q, spammer) == pytest.approx([0.0, 0.0], abs=1e-15)
    assert value_of_information(q, spammer, lookahead=3) == pytest.approx([0.0, 0.0], abs=1e-15)
    scores = [value_of_information(q, symmetric(3, r))[1] for r in (0.5, 0.7, 0.9, 1.0)]
    assert scores == sorted(scores) and scores[0] < scores[-1]
    assert scores[-1] == pytest.approx(1 - 0.4)  # a perfect worker removes all the doubt


def test_voi_per_item_confusions_equal_the_shared_one_row_by_row() -> None:
    rng = np.random.default_rng(1)
    q = rng.dirichlet(np.ones(3), size=4)
    confs = np.stack([symmetric(3, r) for r in (0.4, 0.6, 0.8, 0.95)])
    per_item = value_of_information(q, confs)
    one_by_one = [value_of_information(q[i : i + 1], confs[i])[0] for i in range(4)]
    assert per_item == pytest.approx(one_by_one)


def test_one_label_that_cannot_flip_the_answer_has_no_value_but_two_may() -> None:
    # The myopic VOI's blind spot, and why the look-ahead exists: at q = (0.9, 0.1) one
    # label from an 80% worker never changes the most likely class; two disagreeing can.
    C = symmetric(2, 0.8)
    q = np.array([[0.9, 0.1]])
    assert value_of_information(q, C)[0] == pytest.approx(0.0, abs=1e-15)
    assert value_of_information(q, C, lookahead=3)[0] > 0


def test_voi_rejects_bad_shapes() -> None:
    with pytest.raises(ValueError):
        value_of_information(np.full((2, 3), 1 / 3), np.eye(2))
    with pytest.raises(ValueError):
        value_of_information(np.full((2, 3), 1 / 3), np.eye(3), lookahead=0)
    with pytest.raises(ValueError):
        entropy(np.ones(3))


def test_stopping_rule() -> None:
    q = np.array([[0.97, 0.03], [0.6, 0.4], [0.5, 0.5]])
    n = np.array([2, 5, 1])
    rule = StoppingRule(target_confidence=0.95, max_labels_per_item=5)
    assert rule.finished(q, n).tolist() == [True, True, False]
    assert StoppingRule(0.95).finished(q, n).tolist() == [True, False, False]
    with_budget = StoppingRule(0.95, budget=10)
    assert with_budget.finished(q, n, labels_used=9).tolist() == [True, False, False]
    assert with_budget.finished(q, n, labels_used=10).all()
    assert with_budget.remaining_budget(7) == 3 and StoppingRule().remaining_budget(7) is None
    with pytest.raises(ValueError):
        StoppingRule(target_confidence=0.0)


def test_select_best_first_skipping_finished_and_seen() -> None:
    scores = np.array([0.1, 0.9, 0.5, 0.9, np.nan, 0.7])
    finished = np.array([False, False, False, False, False, True])
    assert select(scores, finished, limit=3).tolist() == [1, 3, 2]  # tie -> lower index
    assert select(scores, finished, limit=10).tolist() == [1, 3, 2, 0]  # nan, finished left out
    assert select(scores, finished, np.array([1]), limit=2).tolist() == [3, 2]
    seen = np.zeros(6, dtype=bool)
    seen[3] = True
    assert select(scores, finished, seen, limit=2).tolist() == [1, 2]
    assert select(scores, np.ones(6, dtype=bool), limit=2).size == 0
    assert select(scores, finished, limit=0).size == 0


def test_select_ties_at_the_cut_keep_the_lowest_indices() -> None:
    scores = np.array([1.0, 0.5, 0.5, 0.5, 2.0])
    assert select(scores, np.zeros(5, dtype=bool), limit=3).tolist() == [4, 0, 1]


def test_voi_with_an_index_picks_each_items_matrix() -> None:
    # The service's case: a few workers' matrices, many (item, worker) pairs.
    rng = np.random.default_rng(2)
    q = rng.dirichlet(np.ones(3), size=6)
    confs = np.stack([symmetric(3, r) for r in (0.34, 0.7, 0.9)])
    which = np.array([2, 0, 1, 1, 2, 0])
    for n in (1, 2):
        got = value_of_information(q, confs, lookahead=n, index=which)
        assert got == pytest.approx(value_of_information(q, confs[which], lookahead=n))
    with pytest.raises(ValueError):
        value_of_information(q, confs, index=np.array([0, 1, 2, 3, 0, 0]))
    with pytest.raises(ValueError):
        value_of_information(q, confs)  # 3 matrices for 6 items and no index
