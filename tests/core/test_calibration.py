"""Calibrated posteriors (docs/model.md eq. 21-24): the transform, the prequential evidence
the online model gathers, and calibration measured on synthetic crowds."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core import _calibration_kernels, calibration, threads
from core._kernels import EVIDENCE_FULL
from core.batch import BatchEM
from core.blocks import LabelBlocks
from core.calibration import (
    EPS_GRID,
    SLICE_ROWS,
    Calibration,
    choose,
    prequential_evidence,
    prior_eps,
)
from core.evidence import RHO_GRID, evidence_size
from core.nominal import SCALE, NominalConfig, NominalParams
from core.online import OnlineEM
from core.served import (
    batch_calibration,
    held_out_corrections,
    laplace_predictive,
    online_calibration,
    population_pull,
    served_posteriors,
)

from .test_orientation import weak_binary


def _ece(q: np.ndarray, truth: np.ndarray) -> float:
    conf, right = q.max(axis=1), q.argmax(axis=1) == truth
    bins = np.minimum((conf * 10).astype(int), 9)
    return 100 * sum(
        (bins == b).mean() * abs(right[bins == b].mean() - conf[bins == b].mean())
        for b in range(10)
        if np.any(bins == b)
    )


def ambiguous_crowd(
    seed: int, n_items: int = 3000, n_workers: int = 60, per_item: int = 7, hard: float = 0.0
) -> tuple[LabelBlocks, np.ndarray, int]:
    """Workers of accuracy 0.6-0.9 over 3 classes, errors uniform. With ``hard`` > 0, that
    share of items is ambiguous: every worker is right less often there, and most errors go
    to the same decoy class (answers correlated within an item: the regime where
    independent-answer posteriors are overconfident)."""
    rng = np.random.default_rng(seed)
    K = 3
    truth = rng.integers(0, K, n_items)
    decoy = (truth + rng.integers(1, K, n_items)) % K
    ambiguous = rng.random(n_items) < hard
    acc = rng.uniform(0.6, 0.9, n_workers)
    item = np.repeat(np.arange(n_items), per_item)
    worker = np.concatenate([rng.choice(n_workers, per_item, replace=False) for _ in truth])
    right = rng.random(item.size) < np.where(ambiguous[item], 0.6, 1.0) * acc[worker]
    to_decoy = ambiguous[item] & (rng.random(item.size) < 0.8)
    wrong = np.where(to_decoy, decoy[item], (truth[item] + rng.integers(1, K, item.size)) % K)
    label = np.where(right, truth[item], wrong)
    return LabelBlocks.group(item, worker, label, n_blocks=n_items), truth, n_workers


def _fit(blocks: LabelBlocks, n_workers: int, gold: np.ndarray | None = None) -> OnlineEM:
    config = NominalConfig(n_classes=3, n_worker_slots=n_workers, n_items=blocks.n_blocks)
    model = OnlineEM(config)
    model.learn_many(
        blocks, order=np.random.default_rng(0).permutation(blocks.n_blocks), known=gold
    )
    return model


def test_no_correction_serves_the_model_posterior() -> None:
    q = np.random.default_rng(1).dirichlet(np.ones(4), 50)
    out = Calibration().from_posteriors(q, np.full(50, 5.0))
    np.testing.assert_allclose(out, q, rtol=1e-12)


@pytest.mark.parametrize("rows", [50, SLICE_ROWS * 2 + 7])
def test_posteriors_served_in_place_are_those_served_into_a_new_array(rows: int) -> None:
    """``extract`` writes the served posteriors over the pass's (80 MB less at 2M items): every
    slice is read before it is written, in one thread or two."""
    rng = np.random.default_rng(rows)
    q, n = rng.dirichlet(np.ones(5), rows), rng.integers(1, 9, rows).astype(float)
    cal = Calibration(0.5, 0.01)
    expected = cal.from_posteriors(q, n, threads=2)
    assert not np.array_equal(expected, q)
    served = cal.from_posteriors(q, n, threads=2, out=q)
    assert served is q
    np.testing.assert_array_equal(q, expected)


@settings(max_examples=60, deadline=None)
@given(
    rho=st.sampled_from(RHO_GRID.tolist()),
    eps=st.floats(0.0, 0.3),
    seed=st.integers(0, 10_000),
    K=st.integers(2, 8),
)
def test_calibration_keeps_the_most_probable_class_and_sums_to_one(
    rho: float, eps: float, seed: int, K: int
) -> None:
    rng = np.random.default_rng(seed)
    ell = rng.normal(0, 5, (40, K))
    n = rng.integers(0, 30, 40).astype(float)
    log_prior = np.log(rng.dirichlet(np.ones(K)))
    raw = Calibration().from_log_likelihood(ell, n, log_prior)
    out = Calibration(rho, eps).from_log_likelihood(ell, n, log_prior)
    np.testing.assert_allclose(out.sum(axis=1), 1.0, rtol=1e-12)
    assert np.all(out >= 0)
    assert np.array_equal(out.argmax(axis=1), raw.argmax(axis=1))
    # tempering and mixing only ever lower the top probability
    assert np.all(out.max(axis=1) <= raw.max(axis=1) + 1e-12)
    # the service calibrates stored posteriors: the same numbers
    np.testing.assert_allclose(Calibration(rho, eps).from_posteriors(raw, n), out, atol=1e-9)


def learned_one_at_a_time(
    blocks: LabelBlocks, config: NominalConfig
) -> tuple[OnlineEM, np.ndarray]:
    """The model after learning the blocks one at a time, and the evidence of every answer
    scored at the parameters before its item's update."""
    model, expected = OnlineEM(config), np.zeros(evidence_size())
    for b in range(blocks.n_blocks):
        p = model.params
        expected += prequential_evidence(
            blocks.ptr, np.array([b]), np.zeros(blocks.n_blocks, dtype=np.int64),
            blocks.slots, blocks.labels, blocks.weights,
            p.class_logits, p.population, p.worker, float(p.scalars[SCALE]),
        )  # fmt: skip
        model.learn_many(blocks, order=np.array([b]))
    return model, expected


def test_online_evidence_is_each_answer_scored_before_its_item_updates() -> None:
    blocks, _, W = ambiguous_crowd(3, n_items=300)
    config = NominalConfig(n_classes=3, n_worker_slots=W, n_items=300)
    model, expected = learned_one_at_a_time(blocks, config)
    assert model.params.evidence is not None
    np.testing.assert_allclose(model.params.evidence, expected, rtol=1e-12)
    # an answer is scored once its item has two before it (with one, every rho predicts alike)
    assert model.params.evidence[-1] == np.maximum(blocks.sizes() - 2, 0).sum()


def test_past_its_first_answers_the_evidence_is_a_sample_with_the_same_mean() -> None:
    """Once EVIDENCE_FULL answers' weight is scored, one arrival in EVIDENCE_EVERY is, each
    score counted that many times: the mean per answer that chooses rho stays that of
    scoring every answer (here weights of 40 pass the threshold after a few hundred items)."""
    blocks, _, W = ambiguous_crowd(3, n_items=3000, hard=0.3)
    heavy = LabelBlocks(blocks.ptr, blocks.slots, blocks.labels, 40.0 * blocks.weights)
    config = NominalConfig(n_classes=3, n_worker_slots=W, n_items=3000)
    model, every = learned_one_at_a_time(heavy, config)  # (``every``: each answer scored)
    sampled = model.params.evidence
    assert sampled is not None and every[-1] > 5 * EVIDENCE_FULL
    assert not np.allclose(sampled, every, rtol=1e-9)  # (it did sample)
    np.testing.assert_allclose(sampled[-1], every[-1], rtol=0.02)
    np.testing.assert_allclose(sampled[:-1] / sampled[-1], every[:-1] / every[-1], rtol=0.05)
    assert choose(sampled) == choose(every)


def test_predictions_and_revisits_gather_no_evidence() -> None:
    blocks, _, W = ambiguous_crowd(4, n_items=200)
    model = _fit(blocks, W)
    assert model.params.evidence is not None
    before = model.params.evidence.copy()
    result = model.predict_many(blocks)
    model.revisit_many(blocks, result)
    assert np.array_equal(model.params.evidence, before)


def test_replay_is_bit_identical_with_the_evidence() -> None:
    blocks, _, W = ambiguous_crowd(5, n_items=300)
    assert _fit(blocks, W).params.equals(_fit(blocks, W).params)


def test_independent_answers_are_barely_tempered_and_stay_calibrated() -> None:
    blocks, truth, W = ambiguous_crowd(6)
    model = _fit(blocks, W)
    cal = online_calibration(model, blocks)
    assert cal.rho <= 0.1
    assert cal.eps == prior_eps()
    served = served_posteriors(model.params, blocks, cal)
    assert _ece(served, truth) <= 3.0


def test_weak_workers_independent_answers_are_served_untempered_by_one_pass() -> None:
    """Workers right 55-65% of the time, 15 answers an item, answers independent: the pass's
    immature first rows make a tempering predict the answers a little better (0.4-0.6
    thousandths of a nat an answer, over 10 nats in all), which eq. 22' does not serve. Served
    at the rho of highest evidence (T = 2.4 at 15 answers) the posteriors are 5-12 points of
    ECE further off (1,400 items: ECE at rho = 0 is 1.6-4.9 over orders)."""
    blocks, truth, _ = weak_binary(0)
    config = NominalConfig(n_classes=2, n_items=float(truth.size), n_worker_slots=512)
    for order in (0, 2):
        model = OnlineEM(config, pooled_twin=True)
        model.learn_many(blocks, order=np.random.default_rng(order).permutation(truth.size))
        model.orient()
        model.settle()
        evidence = model.params.evidence
        assert evidence is not None
        gains = evidence[: RHO_GRID.size] - evidence[0]
        assert gains.max() > 10.0  # more than the prior's odds: a sum alone would temper
        cal = online_calibration(model, blocks)
        assert cal.rho == 0.0
        served = _ece(served_posteriors(model.params, blocks, cal), truth)
        tempered = Calibration(float(RHO_GRID[int(np.argmax(gains))]), 0.0)
        assert served <= 5.0
        assert _ece(served_posteriors(model.params, blocks, tempered), truth) >= served + 5.0


def test_correlated_answers_are_tempered_into_calibration() -> None:
    blocks, truth, W = ambiguous_crowd(7, hard=0.2)
    model = _fit(blocks, W)
    raw = model.predict_many(blocks).posteriors
    cal = online_calibration(model, blocks)
    served = served_posteriors(model.params, blocks, cal)
    assert cal.rho >= 0.1
    assert _ece(raw, truth) > 6.0  # the independent-answer posterior is overconfident here
    assert _ece(served, truth) < 0.6 * _ece(raw, truth)


def test_gold_items_correct_what_the_answers_cannot_show() -> None:
    blocks, truth, W = ambiguous_crowd(8, hard=0.4)
    gold = np.full(blocks.n_blocks, -1)
    pick = np.random.default_rng(0).choice(blocks.n_blocks, 300, replace=False)
    gold[pick] = truth[pick]
    model = _fit(blocks, W, gold)
    rest = np.setdiff1d(np.arange(blocks.n_blocks), pick)
    without = served_posteriors(model.params, blocks, online_calibration(model, blocks))
    cal = online_calibration(model, blocks, gold)
    served = served_posteriors(model.params, blocks, cal, gold)
    assert np.array_equal(served[pick].argmax(axis=1), truth[pick])
    assert cal.components  # with gold: the posterior mean over (rho, eps), eq. 25
    assert _ece(served[rest], truth[rest]) <= 4.5
    assert _ece(served[rest], truth[rest]) < _ece(without[rest], truth[rest]) - 2.0


def test_gold_items_without_answers_leave_the_calibration_as_it_was() -> None:
    """Honeypots given their gold before anyone answered them (or answered with weight 0)
    say nothing of how often the crowd's consensus is wrong: eps stays where no gold put it,
    and beside real gold items they change nothing."""
    blocks, truth, W = ambiguous_crowd(8, n_items=600, hard=0.3)
    model = _fit(blocks, W)
    n = blocks.n_blocks
    empty = LabelBlocks.group(
        np.r_[np.repeat(np.arange(n), blocks.sizes()), n + 1],
        np.r_[blocks.slots, 0],
        np.r_[blocks.labels, 1],
        np.r_[blocks.weights, 0.0],
        n_blocks=n + 40,
    )  # fmt: skip  (40 more items: none answered but one, whose answer weighs 0)
    gold = np.full(n + 40, -1)
    gold[n:] = np.arange(40) % 3
    alone = online_calibration(model, blocks)
    assert online_calibration(model, empty, gold) == alone
    real = np.full(n + 40, -1)
    real[:50] = truth[:50]
    both = real.copy()
    both[n:] = gold[n:]
    assert online_calibration(model, empty, both) == online_calibration(model, empty, real)


def test_batch_fit_is_served_through_the_same_calibration() -> None:
    blocks, truth, W = ambiguous_crowd(9, hard=0.2)
    config = NominalConfig(n_classes=3, n_items=blocks.n_blocks)
    result, params = BatchEM(config).fit(blocks, W)
    cal = batch_calibration(config, params, blocks, W)
    served = served_posteriors(params, blocks, cal)
    assert cal.rho >= 0.1
    assert np.array_equal(served.argmax(axis=1), result.probas.argmax(axis=1))
    assert _ece(served, truth) < 0.6 * _ece(result.probas, truth)


def test_with_gold_the_served_posterior_is_the_posterior_mean_over_the_grid() -> None:
    rng = np.random.default_rng(3)
    evidence = np.concatenate([rng.normal(-1.0, 0.01, RHO_GRID.size), [100.0]])
    gold = rng.normal(0.0, 2.0, (RHO_GRID.size, EPS_GRID.size))
    cal = choose(evidence, gold, 20)
    rho_prior = np.where(RHO_GRID == 0.0, 0.5, 0.5 / (RHO_GRID.size - 1))
    answers = evidence[:-1] + np.log(rho_prior)  # 100 answers scored: weighed like 50
    score = 0.5 * answers[:, None] + gold
    score = score + 24.0 * np.log1p(-EPS_GRID)[None, :]  # Beta(1, 25) prior
    w = np.exp(score - score.max())
    w /= w.sum()
    q = rng.dirichlet(np.ones(4), 50)
    n = rng.integers(1, 12, 50).astype(float)
    want = sum(
        w[r, e] * Calibration(float(rho), float(eps)).from_posteriors(q, n)
        for r, rho in enumerate(RHO_GRID)
        for e, eps in enumerate(EPS_GRID)
    )
    got = cal.from_posteriors(q, n)
    np.testing.assert_allclose(got, want, atol=2e-3)  # rhos under 1e-3 of the top are left out
    np.testing.assert_allclose(got.sum(axis=1), 1.0)
    assert np.array_equal(got.argmax(axis=1), q.argmax(axis=1))
    assert cal.rho == pytest.approx(float(w.sum(axis=1) @ RHO_GRID), abs=2e-3)
    assert cal.eps == pytest.approx(float(w.sum(axis=0) @ EPS_GRID), abs=2e-3)
    assert Calibration.from_dict(cal.to_dict()) == cal


def test_choose_without_evidence_is_no_tempering() -> None:
    assert choose(None) == Calibration(0.0, prior_eps())
    assert choose(np.zeros(evidence_size())).rho == 0.0


@pytest.mark.parametrize("scored", [1.0, 40.0, 1e6])
def test_a_tempering_must_beat_none_by_its_priors_odds_and_a_gain_per_answer(
    scored: float,
) -> None:
    """Without gold rho is the mode of its posterior (eq. 22): half the prior on 0, the rest
    even over the grid's 8 other values, so a tempering needs log 16 - log 2 = 2.08 nats more
    evidence than none, and (eq. 22') MIN_GAIN_PER_ANSWER nats more for each answer scored."""
    at = int(np.flatnonzero(RHO_GRID == 0.3)[0])
    prior = calibration.log_rho_prior()
    assert prior[0] - prior[at] == pytest.approx(np.log(8.0))
    needed = prior[0] - prior[at] + calibration.MIN_GAIN_PER_ANSWER * scored
    for margin, rho in ((needed - 0.05, 0.0), (needed + 0.05, 0.3)):
        evidence = np.zeros(evidence_size())
        evidence[: RHO_GRID.size] = -5.0 * scored
        evidence[0], evidence[at] = -scored, -scored + margin
        evidence[-1] = scored
        assert choose(evidence) == Calibration(rho, prior_eps())


@pytest.mark.parametrize("K", [2, 5])
def test_zero_weight_answers_score_nothing(K: int) -> None:
    def evidence(slots: list[int], labels: list[int], weights: list[float]) -> np.ndarray:
        return prequential_evidence(
            np.array([0, len(slots)]), np.array([0]), np.zeros(1, dtype=np.int64),
            np.array(slots), np.array(labels) % K, np.array(weights),
            np.zeros(K), 2 * np.eye(K), np.zeros((3, K, K)),
        )  # fmt: skip

    with_zero = evidence([0, 1, 2], [0, 1, 0], [1.0, 0.0, 1.0])
    np.testing.assert_array_equal(with_zero, evidence([0, 2], [0, 0], [1.0, 1.0]))


def test_posteriors_calibrated_in_slices_are_those_calibrated_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rng = np.random.default_rng(3)
    q = rng.dirichlet(np.full(4, 0.3), size=1000)
    q[0] = [1.0, 0.0, 0.0, 0.0]  # an underflowed class
    n = rng.integers(1, 12, size=1000).astype(float)
    cal = Calibration(0.2, 0.03, ((0.6, 0.1, 0.02), (0.4, 0.3, 0.05)))
    whole = cal.from_posteriors(q, n)
    monkeypatch.setattr(calibration, "SLICE_ROWS", 64)  # 16 slices, the last one short
    np.testing.assert_array_equal(cal.from_posteriors(q, n), whole)
    np.testing.assert_array_equal(cal.from_posteriors(q[:1], [n[0]]), whole[:1])
    for k in (2, 3):  # the same slices, shared among threads
        np.testing.assert_array_equal(cal.from_posteriors(q, n, threads=k), whole)


def _row_map(counts: np.ndarray, base: np.ndarray, lam: float) -> np.ndarray:
    """The MAP of one slot row's logits theta = base + a: sum_l N_l log softmax(theta)_l
    - lam/2 |a|^2, by Newton to convergence (eq. 13)."""
    a = np.zeros_like(base)
    for _ in range(100):
        p = np.exp(base + a - np.logaddexp.reduce(base + a))
        grad = counts - counts.sum() * p - lam * a
        hess = counts.sum() * (np.diag(p) - np.outer(p, p)) + lam * np.eye(p.size)
        a = a + np.linalg.solve(hess, grad)
    return base + a


def _joint_map(counts: np.ndarray, mean: np.ndarray, lam_a: float, lam_g: float) -> np.ndarray:
    """theta = Gamma_z + a at the MAP of one population row and one slot's row together:
    sum_l N_l log softmax(theta)_l - lam_a/2 |a|^2 - lam_g/2 |Gamma_z - mean|^2, by Newton."""
    K = mean.size
    x = np.concatenate([mean, np.zeros(K)])
    for _ in range(100):
        theta = x[:K] + x[K:]
        p = np.exp(theta - np.logaddexp.reduce(theta))
        data = counts - counts.sum() * p
        info = counts.sum() * (np.diag(p) - np.outer(p, p))
        grad = np.concatenate([data - lam_g * (x[:K] - mean), data - lam_a * x[K:]])
        hess = np.block([[info + lam_g * np.eye(K), info], [info, info + lam_a * np.eye(K)]])
        x = x + np.linalg.solve(hess, grad)
    return x


def test_held_out_correction_is_the_derivative_of_refitting_without_the_item() -> None:
    """Eq. 26-26': c_i(z) = h^2 q_i(z) (e_l - p)^T V (e_l - p), V the covariance of the slot's
    row with the population's, is what refitting both rows without item i's label of weight
    h takes from h log p(l | z), to first order in h."""
    rng = np.random.default_rng(3)
    K, n, lam, lam_g, h = 3, 40, 1.0, 0.1, 1e-3
    labels = rng.integers(0, K, n)
    weights = np.ones(n)
    weights[0] = h
    q = rng.dirichlet(np.ones(K), n)
    blocks = LabelBlocks(np.arange(n + 1), np.zeros(n, dtype=np.int64), labels, weights)
    mean = rng.normal(size=(K, K))
    counts = np.zeros((K, K))
    np.add.at(counts, (slice(None), labels), (q * weights[:, None]).T)
    fits = np.array([_joint_map(counts[z], mean[z], lam, lam_g) for z in range(K)])
    population, worker = fits[:, :K], fits[:, K:]
    params = NominalParams(np.zeros(K), population, worker[None])
    corrections = held_out_corrections(
        params, blocks, q, lam, decimals=None, population_precision=lam_g
    )
    alone = held_out_corrections(params, blocks, q, lam, decimals=None, population_precision=1e12)
    for z in range(K):
        without = counts[z].copy()
        without[labels[0]] -= h * q[0, z]
        refit = _joint_map(without, mean[z], lam, lam_g)
        theta, theta_refit = population[z] + worker[z], refit[:K] + refit[K:]
        log_p = theta[labels[0]] - np.logaddexp.reduce(theta)
        log_p_refit = theta_refit[labels[0]] - np.logaddexp.reduce(theta_refit)
        np.testing.assert_allclose(corrections[0, z], h * (log_p - log_p_refit), rtol=1e-2)
        assert corrections[0, z] > 1.2 * alone[0, z]  # the population's share is not small here
    assert np.all(corrections > 0)


def _sparse_symmetric_crowd() -> tuple[LabelBlocks, np.ndarray, int]:
    """3 answers an item over 5 classes from 2,500 workers (most give 1-5 answers) who err
    uniformly: (blocks, truth, workers)."""
    rng = np.random.default_rng(11)
    K, n_items, per_item, n_workers = 5, 3000, 3, 2500
    truth = rng.integers(0, K, n_items)
    acc = rng.uniform(0.35, 0.95, n_workers)
    item = np.repeat(np.arange(n_items), per_item)
    worker = rng.integers(0, n_workers, item.size)
    right = rng.random(item.size) < acc[worker]
    label = np.where(right, truth[item], (truth[item] + rng.integers(1, K, item.size)) % K)
    return LabelBlocks.group(item, worker, label, n_blocks=n_items), truth, n_workers


def test_held_out_scoring_calibrates_batch_em_on_sparse_symmetric_workers() -> None:
    """Most workers give 1-5 answers over 5 classes and err uniformly: batch EM fits each
    worker's few answers and its own posteriors are overconfident; scored without each item's
    pull on its workers (eq. 26), they are much less so (the one Newton step undershoots a
    refit on a worker's one or two answers), with the same labels almost everywhere."""
    blocks, truth, n_workers = _sparse_symmetric_crowd()
    config = NominalConfig(n_classes=5, n_items=blocks.n_blocks)
    result, params = BatchEM(config).fit(blocks, n_workers)
    cal = batch_calibration(config, params, blocks, n_workers)
    plain = served_posteriors(params, blocks, cal)
    held_out = held_out_corrections(
        params, blocks, result.probas, config.worker_prior,
        population_precision=config.population_precision(),
    )  # fmt: skip
    held = served_posteriors(params, blocks, cal, held_out=held_out)
    assert _ece(plain, truth) > 15.0
    assert _ece(held, truth) < _ece(plain, truth) - 4.0
    assert np.mean(held.argmax(axis=1) == plain.argmax(axis=1)) > 0.97


def test_many_classes_from_sparse_workers_are_served_calibrated_by_one_pass() -> None:
    """20 classes, 3 answers an item from 1,500 workers of lognormal activity who are right
    30-90% of the time and err uniformly. Two answers that agree are then strong evidence
    (a chance agreement is rare), and the one pass learns so only if each row of Gamma,
    which sees the items of its class alone, takes a step of its own size (eq. 10,
    population_rate x K/2): at 0.04 eta the population's rows ended 38% right where the
    answers were 59% right, and the served posteriors underconfident (mean confidence 0.68
    where 74% were right; ECE 5.8)."""
    rng = np.random.default_rng(5)
    K, n_items, per_item, n_workers = 20, 4000, 3, 1500
    truth = rng.integers(0, K, n_items)
    acc = rng.uniform(0.3, 0.9, n_workers)
    activity = rng.lognormal(0.0, 1.5, n_workers)
    worker = np.concatenate(
        [rng.choice(n_workers, per_item, replace=False, p=activity / activity.sum())
         for _ in range(n_items)]
    )  # fmt: skip
    item = np.repeat(np.arange(n_items), per_item)
    right = rng.random(item.size) < acc[worker]
    label = np.where(right, truth[item], (truth[item] + rng.integers(1, K, item.size)) % K)
    blocks = LabelBlocks.group(item, worker, label, n_blocks=n_items)
    config = NominalConfig(n_classes=K, n_worker_slots=n_workers, n_items=n_items)
    model = OnlineEM(config)
    model.learn_many(blocks, order=np.random.default_rng(0).permutation(n_items))
    served = served_posteriors(model.params, blocks, online_calibration(model, blocks))
    assert np.mean(served.argmax(axis=1) == truth) > 0.72
    assert _ece(served, truth) < 3.0


def test_gold_items_scored_held_out_look_like_the_items_served() -> None:
    """A gold item's answers taught the fit their workers' rows with its class known, so
    scored in-sample they look more right than a served item's; scored without the item's
    own pull (eq. 26, as eq. 24 scores them) the gap shrinks (to 3.8 points from 7.4 here: one
    Newton step undershoots the refit of a worker with a few answers)."""
    blocks, truth, W = ambiguous_crowd(12, n_items=3000, n_workers=600, per_item=3)
    gold = np.full(blocks.n_blocks, -1)
    pick = np.random.default_rng(1).choice(blocks.n_blocks, 600, replace=False)
    gold[pick] = truth[pick]
    config = NominalConfig(n_classes=3, n_items=blocks.n_blocks)
    result, params = BatchEM(config).fit(blocks, W, known=gold)
    held_out = held_out_corrections(
        params, blocks, result.probas, config.worker_prior,
        population_precision=config.population_precision(),
    )  # fmt: skip
    plain = served_posteriors(params, blocks, Calibration())  # answers alone, no gold held
    held = served_posteriors(params, blocks, Calibration(), held_out=held_out)
    rest = np.setdiff1d(np.arange(blocks.n_blocks), pick)
    right = lambda q, ix: float(np.mean(q[ix].argmax(axis=1) == truth[ix]))  # noqa: E731
    assert right(plain, pick) - right(plain, rest) > 0.02
    gap, held_gap = right(plain, pick) - right(plain, rest), right(held, pick) - right(held, rest)
    assert 0.0 <= held_gap < 0.7 * gap


def test_the_populations_share_of_a_pull_is_its_dense_quadratic_form() -> None:
    """Eq. 26': the O(1) term of a label, from ``population_pull``, is
    lam_A^2 x^T G_z x with x = S (e_l - p), S and G_z built as dense matrices."""
    rng = np.random.default_rng(11)
    R, K, lam, lam_g = 6, 5, 1.5, 0.1
    theta = rng.normal(scale=1.5, size=(R, K, K))
    probs = np.exp(theta - np.logaddexp.reduce(theta, axis=2, keepdims=True))
    totals = rng.uniform(0.0, 8.0, size=(R, K))
    totals[0] = 0.0  # a slot row without labels adds nothing to G
    eye = np.eye(K)
    info = lambda r, z: totals[r, z] * (np.diag(probs[r, z]) - np.outer(probs[r, z], probs[r, z]))  # noqa: E731
    S = np.array([[np.linalg.inv(info(r, z) + lam * eye) for z in range(K)] for r in range(R)])
    G = np.array([np.linalg.inv(lam_g * eye + sum(lam * (eye - lam * S[r, z]) for r in range(R)))
                  for z in range(K)])  # fmt: skip
    cov, (gu, ugu, up, beta) = population_pull(totals, probs, lam, lam_g)
    np.testing.assert_allclose(cov, G, rtol=1e-9, atol=1e-12)
    for r in range(R):
        for z in range(K):
            for label in range(K):
                x = S[r, z] @ (eye[label] - probs[r, z])
                want = lam * lam * x @ G[z] @ x
                got = _calibration_kernels._population_pull(
                    label, totals[r, z], probs[r, z], lam, G[z, label, label], gu[r, z],
                    ugu[r, z], up[r, z], beta[r, z],
                )  # fmt: skip
                np.testing.assert_allclose(got, want, rtol=1e-9)


def test_held_out_correction_follows_a_refit_of_a_worker_with_few_answers() -> None:
    """For a worker with a few answers, taking one answer out moves its rows a lot: the step
    with the row's curvature without that answer (the cavity, eq. 26) stays close to refitting
    the row without it (q-weighted over the classes: within 15% for 1 to 5 answers here, where
    the full row's curvature is 36% off)."""
    rng = np.random.default_rng(7)
    K, lam = 4, 1.0
    for n in (1, 2, 3, 5):
        labels = rng.integers(0, K, n)
        q = rng.dirichlet(np.full(K, 0.3), n)
        blocks = LabelBlocks(np.arange(n + 1), np.zeros(n, dtype=np.int64), labels, np.ones(n))
        population = rng.normal(size=(K, K)) + 2.0 * np.eye(K)
        counts = np.zeros((K, K))
        np.add.at(counts, (slice(None), labels), q.T)
        theta = np.array([_row_map(counts[z], population[z], lam) for z in range(K)])
        params = NominalParams(np.zeros(K), population, (theta - population)[None])
        # the population held, as a crowd's is while one worker's rows move (no eq. 26' term)
        corrections = held_out_corrections(
            params, blocks, q, lam, decimals=None, population_precision=1e12
        )
        for i in range(n):
            exact = 0.0
            for z in range(K):
                without = counts[z].copy()
                without[labels[i]] -= q[i, z]
                refit = _row_map(without, population[z], lam)
                drop = theta[z, labels[i]] - np.logaddexp.reduce(theta[z])
                drop -= refit[labels[i]] - np.logaddexp.reduce(refit)
                exact += q[i, z] * drop
            np.testing.assert_allclose(q[i] @ corrections[i], exact, rtol=0.2)


def _random_rows(rng: np.random.Generator, rows: int, K: int) -> tuple[np.ndarray, ...]:
    """Row logits theta (rows, K, K), their weights C and D's eigendecompositions."""
    theta = rng.normal(scale=2.0, size=(rows, K, K))
    p = np.exp(theta - np.logaddexp.reduce(theta, axis=2, keepdims=True))
    curvature, vectors = np.linalg.eigh(
        p[..., :, None] * np.eye(K) - p[..., :, None] * p[..., None, :]
    )
    totals = rng.uniform(0.5, 6.0, size=(rows, K))
    return theta, totals, curvature, vectors


@pytest.mark.parametrize("K", [2, 3, 5])
def test_laplace_predictive_is_the_mean_over_the_rows_laplace_posterior(K: int) -> None:
    """Eq. 27 (unscented) against Monte Carlo over N(theta, (C D + lambda I)^-1): within 0.05
    of each probability for rows fitted to a few answers, and a distribution flatter than
    the point estimate's (its largest probability lower)."""
    rng = np.random.default_rng(K)
    lam = 1.0
    theta, totals, curvature, vectors = _random_rows(rng, 20, K)
    got = laplace_predictive(theta, totals, lam)
    sigma = 1.0 / np.sqrt(totals[..., None] * curvature + lam)
    draws = theta[None] + np.einsum(
        "uzmk,suzk->suzm", vectors, rng.standard_normal((4000, *theta.shape)) * sigma
    )
    mc = np.exp(draws - np.logaddexp.reduce(draws, axis=3, keepdims=True)).mean(axis=0)
    np.testing.assert_allclose(got.sum(axis=2), 1.0, atol=1e-12)
    assert np.abs(got - mc).max() < 0.05
    point = np.exp(theta - np.logaddexp.reduce(theta, axis=2, keepdims=True))
    assert np.all(got.max(axis=2) < point.max(axis=2))
    many = laplace_predictive(theta, totals * 1e8, lam)  # certain rows
    np.testing.assert_allclose(many, point, atol=1e-3)


@pytest.mark.parametrize("K", [2, 3, 10, 40])
def test_the_laplace_directions_are_a_square_root_of_the_rows_covariance(K: int) -> None:
    """Eq. 27's sigma points theta +- sqrt(K) L e_k: the L of ``laplace_root`` (a diagonal
    minus rank one inverted by Sherman-Morrison) is a square root of the row's Laplace
    covariance (C D + lambda I)^-1, without answers and with up to 1e6 of them; without
    spread the predictive is the point estimate."""
    rng = np.random.default_rng(K)
    theta = rng.normal(scale=2.0, size=K)
    p = np.exp(theta - np.logaddexp.reduce(theta))
    inv_root, v = np.empty(K), np.empty(K)
    for c, lam in ((0.0, 1.0), (3.0, 1.0), (250.0, 0.5), (1e6, 1.0)):
        gamma = _calibration_kernels.laplace_root(p, c, lam, inv_root, v)
        root = np.diag(inv_root) + gamma * np.outer(v, p * inv_root)  # column k: L e_k
        want = np.linalg.inv(c * (np.diag(p) - np.outer(p, p)) + lam * np.eye(K))
        np.testing.assert_allclose(root @ root.T, want, rtol=1e-9, atol=1e-12)
    got = laplace_predictive(theta[None], np.array([0.0]), 1e12)[0]  # no spread: the point
    np.testing.assert_allclose(got, p, atol=1e-9)


def test_corrections_in_threads_are_bit_identical(monkeypatch: pytest.MonkeyPatch) -> None:
    """Many blocks are split among threads (``crowdtally extract``'s served posteriors): each
    block's c_i is the one a single thread gives, to the bit, with and without eq. 27."""
    blocks, _, W = ambiguous_crowd(5, n_items=300, n_workers=40, per_item=3)
    config = NominalConfig(n_classes=3, n_items=blocks.n_blocks)
    result, params = BatchEM(config).fit(blocks, W)
    lam, q, prior = config.worker_prior, result.probas, config.population_precision()
    monkeypatch.setattr(threads, "PARALLEL_FROM", 10)
    for laplace in (False, True):
        one = held_out_corrections(
            params, blocks, q, lam, decimals=None, laplace=laplace, population_precision=prior
        )
        for n in (2, 3):
            split = held_out_corrections(
                params, blocks, q, lam, decimals=None, laplace=laplace, threads=n,
                population_precision=prior,
            )  # fmt: skip
            assert np.array_equal(split, one), (laplace, n)


def test_the_laplace_term_adds_each_labels_log_probability_lost_to_the_predictive() -> None:
    """With ``laplace``, c_i gains sum_j h_j (log p(l_j | z, s_j) - log p~(l_j | z, s_j)), p~
    eq. 27's predictive of the label's slot row, computed here label by label."""
    blocks, _, W = ambiguous_crowd(5, n_items=400, n_workers=80, per_item=3)
    config = NominalConfig(n_classes=3, n_items=blocks.n_blocks)
    result, params = BatchEM(config).fit(blocks, W)
    lam, q, prior = config.worker_prior, result.probas, config.population_precision()
    plain = held_out_corrections(params, blocks, q, lam, decimals=None, population_precision=prior)
    both = held_out_corrections(
        params, blocks, q, lam, decimals=None, laplace=True, population_precision=prior
    )
    counts = np.zeros((W, 3, 3))
    for b in range(blocks.n_blocks):
        for j in range(blocks.ptr[b], blocks.ptr[b + 1]):
            counts[blocks.slots[j], :, blocks.labels[j]] += blocks.weights[j] * q[b]
    theta = params.population[None] + params.scalars[SCALE] * params.worker
    p = np.exp(theta - np.logaddexp.reduce(theta, axis=2, keepdims=True))
    predictive = laplace_predictive(theta, counts.sum(axis=2), lam)
    lost = np.log(p) - np.log(predictive)
    want = np.zeros_like(plain)
    for b in range(blocks.n_blocks):
        for j in range(blocks.ptr[b], blocks.ptr[b + 1]):
            want[b] += blocks.weights[j] * lost[blocks.slots[j], :, blocks.labels[j]]
    np.testing.assert_allclose(both - plain, want, atol=1e-10)
    assert np.abs(want).max() > 0.1  # (not a vanishing term)


def test_laplace_predictives_calibrate_batch_em_on_sparse_symmetric_workers() -> None:
    """Eq. 26 leaves batch EM on a crowd of sparse symmetric workers overconfident: a worker
    with a few answers has rows fitted to them; averaged over each row's Laplace posterior
    (eq. 27) the served posteriors are much better calibrated, with the same labels almost
    everywhere."""
    blocks, truth, n_workers = _sparse_symmetric_crowd()
    config = NominalConfig(n_classes=5, n_items=blocks.n_blocks)
    result, params = BatchEM(config).fit(blocks, n_workers)
    lam, prior = config.worker_prior, config.population_precision()
    cal = batch_calibration(config, params, blocks, n_workers)
    held = held_out_corrections(params, blocks, result.probas, lam, population_precision=prior)
    both = held_out_corrections(
        params, blocks, result.probas, lam, laplace=True, population_precision=prior
    )
    held_out = served_posteriors(params, blocks, cal, held_out=held)
    laplace = served_posteriors(params, blocks, cal, held_out=both)
    assert _ece(laplace, truth) < _ece(held_out, truth) - 2.0
    assert np.mean(laplace.argmax(axis=1) == held_out.argmax(axis=1)) > 0.97
