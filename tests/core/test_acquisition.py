"""Acquisition scores (docs/active.md, eq. A1-A8): hand-checked values and their invariants."""

from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.acquisition import (
    StoppingRule,
    entropy,
    error_probability,
    labels_to_confidence,
    margin,
    priority,
    reachable,
    select,
    value_of_information,
)
from core.calibration import Calibration


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


def test_voi_priority_breaks_the_ties_one_label_leaves() -> None:
    """At (0.9, 0.1) and (0.85, 0.15) one answer of an 80% worker flips nothing (VOI_1 = 0
    for both); two answers can flip the less certain item sooner, so it comes first."""
    q = np.array([[0.9, 0.1], [0.85, 0.15], [0.99, 0.01]])
    C = symmetric(2, 0.8)
    assert np.all(value_of_information(q, C) == 0)
    p = priority("voi", q, np.zeros(3), C)
    assert p[1] > p[0] > p[2] > 0
    # beyond the tie-break's class limit the entropy still orders them
    q10 = np.full((2, 10), 0.01)
    q10[0, 0], q10[1, 0] = 0.91, 0.91
    q10[1, 1:] = [0.05, 0.04] + [0.0] * 7
    p10 = priority("voi", q10, np.zeros(2), symmetric(10, 0.6))
    assert p10[0] != p10[1]


@pytest.mark.parametrize("policy", ["voi", "uncertainty", "entropy", "margin", "uniform"])
def test_priority_ranks_the_more_uncertain_item_first(policy: str) -> None:
    q = np.array([[0.55, 0.45], [0.97, 0.03]])
    p = priority(policy, q, np.array([1, 4]), symmetric(2, 0.7))  # type: ignore[arg-type]
    assert p[0] > p[1]


def test_priority_rejects_an_unknown_policy() -> None:
    with pytest.raises(ValueError, match="unknown policy"):
        priority("random", np.full((1, 2), 0.5), np.zeros(1), symmetric(2, 0.7))  # type: ignore[arg-type]


def test_labels_to_confidence_hand_checked() -> None:
    """Two classes, a 75% worker: each label adds log 3 = 1.0986 to the log-odds on average
    times D = 0.75 log 3 - 0.25 log 3 = 0.5 log 3 (the KL divergence of the rows)."""
    C = symmetric(2, 0.75)
    q = np.array([[0.5, 0.5], [0.75, 0.25], [0.96, 0.04], [0.2, 0.8]])
    need = labels_to_confidence(q, C, 0.95)
    drift = 0.5 * np.log(3)
    target = np.log(19)
    assert need[0] == np.ceil(target / drift)
    assert need[1] == np.ceil((target - np.log(3)) / drift)
    assert need[2] == 0
    assert need[3] == np.ceil((target - np.log(4)) / drift)
    assert np.all(np.isinf(labels_to_confidence(q[:2], np.full((2, 2), 0.5), 0.95)))  # spammer


@settings(max_examples=40, deadline=None)
@given(
    st.integers(2, 5),
    st.floats(0.55, 0.95),
    st.floats(0.0, 1.0),
    st.sampled_from([0.8, 0.9, 0.95, 0.99]),
)
def test_labels_to_confidence_shrinks_with_confidence_and_worker_accuracy(
    K: int, right: float, lean: float, target: float
) -> None:
    C = symmetric(K, max(right, 1.0 / K + 0.05))
    top = 1.0 / K + lean * (1 - 1.0 / K) * 0.999
    q = np.full((1, K), (1 - top) / (K - 1))
    q[0, 0] = top
    need = labels_to_confidence(q, C, target)[0]
    surer = q.copy()
    surer[0, 0] = top + (1 - top) / 2
    surer[0, 1:] = (1 - surer[0, 0]) / (K - 1)
    assert labels_to_confidence(surer, C, target)[0] <= need
    better = symmetric(K, min(C[0, 0] + 0.04, 0.999))
    assert labels_to_confidence(q, better, target)[0] <= need
    assert (need == 0) == (top >= target)


def test_labels_to_confidence_is_near_the_simulated_number() -> None:
    """Simulate answers of the worker the model assumes, the truth the most likely class,
    Bayes' rule after each; the mean number of labels until the target is reached is within
    one label (plus 25%) of Wald's estimate (which ignores the overshoot of the last step)."""
    rng = np.random.default_rng(0)
    for K, right, start, target in [(2, 0.7, 0.6, 0.95), (3, 0.8, 0.5, 0.9), (4, 0.65, 0.4, 0.95)]:
        C = symmetric(K, right)
        q0 = np.full(K, (1 - start) / (K - 1))
        q0[0] = start
        counts = []
        for _ in range(400):
            q, n = q0.copy(), 0
            while q.max() < target and n < 1000:
                q = q * C[:, rng.choice(K, p=C[0])]
                q /= q.sum()
                n += 1
            counts.append(n)
        wald = labels_to_confidence(q0[None], C, target)[0]
        assert abs(np.mean(counts) - wald) <= 1 + 0.25 * wald, (K, np.mean(counts), wald)


def test_reachable_reads_the_ceiling_the_served_calibration_puts_on_confidence() -> None:
    """(A8') Untempered answers always get there; a consensus error eps caps the served
    confidence at 1 - eps; a tempering rho at the limit drift / rho of the log-odds."""
    C = symmetric(3, 0.8)
    q = np.array([[0.5, 0.3, 0.2], [0.9, 0.05, 0.05], [0.34, 0.33, 0.33]])
    n = np.array([3.0, 8.0, 1.0])

    def plain(logits: np.ndarray, n: np.ndarray) -> np.ndarray:
        return Calibration().from_log_likelihood(logits, n, np.zeros(3))

    assert reachable(q, n, C, 0.95, plain).all()
    for eps, target, expected in ((0.06, 0.95, False), (0.06, 0.93, True), (0.04, 0.95, True)):
        cal = Calibration(eps=eps)
        served = functools.partial(cal.from_log_likelihood, log_prior=np.zeros(3))
        assert (reachable(q, n, C, target, served) == expected).all(), (eps, target)
    rest = (C[1] + C[2]) / 2  # the other classes' answers (A8: equal posteriors)
    drift = float(np.sum(C[0] * np.log(C[0] / rest)))
    limit = 1.0 / (1.0 + 2.0 * np.exp(-drift / 0.5))  # the tempered odds' limit, rho = 0.5
    for target, expected in ((limit - 0.02, True), (limit + 0.02, False)):
        served = functools.partial(Calibration(rho=0.5).from_log_likelihood, log_prior=np.zeros(3))
        got = reachable(q[1:2], n[1:2], C, target, served)
        assert got[0] == expected, (target, limit)
    assert not reachable(q, n, np.full((3, 3), 1 / 3), 0.95, plain).any()  # spammers


def test_lookahead_priority_is_the_value_per_label_of_one_or_two_labels() -> None:
    """KG(*) (Frazier & Powell 2010): max(VOI_1, VOI_2 / 2), so an item one label cannot
    flip but two can is valued at what two labels give, per label."""
    rng = np.random.default_rng(0)
    for K in (2, 3, 5):
        q = rng.dirichlet(np.ones(K), size=50)
        C = rng.dirichlet(np.ones(K), size=K) * 0.4 + 0.6 * np.eye(K)
        one = value_of_information(q, C)
        two = value_of_information(q, C, lookahead=2)
        want = np.maximum(one, two / 2) + 1e-6 * entropy(q)
        assert np.allclose(priority("lookahead", q, np.zeros(50), C), want, rtol=0, atol=1e-12)
    q = np.array([[0.8, 0.2]])  # one answer of a 75% worker cannot flip it, two can
    C = symmetric(2, 0.75)
    assert value_of_information(q, C)[0] == 0
    assert value_of_information(q, C, lookahead=2)[0] == pytest.approx(0.0625)
    assert priority("lookahead", q, np.zeros(1), C)[0] == pytest.approx(0.03125, abs=1e-6)
    assert priority("voi", q, np.zeros(1), C)[0] == pytest.approx(6.25e-5, abs=1e-6)
