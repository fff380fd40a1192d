"""Batch EM: it stops at the fixed point of its EM map (SQUAREM only gets there sooner)."""

from __future__ import annotations

import numpy as np
import pytest

from core.batch import BatchEM, majority_vote
from core.blocks import LabelBlocks
from core.nominal import NominalConfig, NominalParams

from ..conftest import Synthetic


def plain_em(
    cfg: NominalConfig, blocks: LabelBlocks, n_workers: int, iterations: int
) -> tuple[NominalParams, np.ndarray, float]:
    """The unaccelerated EM map (M-step then E-step) from the same majority-vote start."""
    K = cfg.n_classes
    em = BatchEM(cfg)
    params = NominalParams(
        cfg.class_prior_logits(), cfg.population_mean(), np.zeros((n_workers, K, K))
    )
    q, clarity, f = majority_vote(blocks, K).probas, np.zeros(blocks.n_blocks), -np.inf
    for _ in range(iterations):
        em._m_step(blocks, q, clarity, params)
        q, clarity, f = em._e_step(blocks, params, clarity)
    return params, q, f


def sparse_blocks(data: Synthetic, per_item: int) -> LabelBlocks:
    """Only the first ``per_item`` labels of each item: a sparse set where EM is slow."""
    rank = np.zeros(data.items.size, dtype=np.int64)
    order = np.argsort(data.items, kind="stable")
    starts = np.searchsorted(data.items[order], data.items[order])
    rank[order] = np.arange(data.items.size) - starts
    keep = rank < per_item
    return LabelBlocks.group(data.items[keep], data.workers[keep], data.labels[keep])


def test_batch_em_reaches_the_fixed_point_of_plain_em(synthetic: Synthetic) -> None:
    cfg = NominalConfig(n_classes=3, n_worker_slots=40, n_items=3000.0)
    blocks = sparse_blocks(synthetic, 2)
    fitted, params = BatchEM(cfg, tol=1e-9).fit(blocks, n_workers=40)
    reference, q_ref, f_ref = plain_em(cfg, blocks, 40, 3000)
    assert fitted.n_iter < 300
    assert fitted.objective[-1] == pytest.approx(f_ref, abs=1e-6)
    np.testing.assert_allclose(params.worker, reference.worker, atol=1e-5)
    np.testing.assert_allclose(params.population, reference.population, atol=1e-5)
    np.testing.assert_allclose(fitted.probas, q_ref, atol=1e-6)
    # one more EM iteration from the result moves nothing
    again, q_again = params.copy(), fitted.probas.copy()
    em = BatchEM(cfg)
    em._m_step(blocks, q_again, np.zeros(blocks.n_blocks), again)
    assert np.max(np.abs(again.worker - params.worker)) < 1e-8
    # the posteriors and the last F are those of the returned parameters
    q_check, _, f_check = em._e_step(blocks, params, np.zeros(blocks.n_blocks))
    np.testing.assert_allclose(q_check, fitted.probas, atol=1e-12)
    assert f_check == pytest.approx(fitted.objective[-1], abs=1e-9)


def test_with_gold_batch_em_reaches_its_fixed_point_in_few_e_steps(synthetic: Synthetic) -> None:
    # F counts a gold item as log p(D_i, z*), the objective EM with known classes ascends; with
    # log p(D_i) SQUAREM's monotonicity test rejected its steps: 1,001 E-steps (the cap) here.
    cfg = NominalConfig(n_classes=3, n_worker_slots=40, n_items=3000.0)
    blocks = sparse_blocks(synthetic, 2)
    known = np.full(blocks.n_blocks, -1)
    known[::20] = synthetic.truth[::20]
    fitted, params = BatchEM(cfg, tol=1e-9).fit(blocks, n_workers=40, known=known)
    assert fitted.n_iter < 100
    assert np.all(fitted.probas[known >= 0].argmax(axis=1) == known[known >= 0])
    again, em = params.copy(), BatchEM(cfg)  # one more EM iteration moves nothing
    em._m_step(blocks, fitted.probas.copy(), np.zeros(blocks.n_blocks), again)
    assert np.max(np.abs(again.worker - params.worker)) < 1e-7
    _, _, f = em._e_step(blocks, params, np.zeros(blocks.n_blocks), known)
    assert f == pytest.approx(fitted.objective[-1], abs=1e-9)


def test_a_loose_relative_objective_test_would_stop_far_from_it(synthetic: Synthetic) -> None:
    # Why the stopping rule is on the parameters: where EM crawls, F changes by less than
    # 1e-6 |F| per iteration long before the parameters settle.
    cfg = NominalConfig(n_classes=3, n_worker_slots=40, n_items=3000.0)
    blocks = sparse_blocks(synthetic, 2)
    _, params = BatchEM(cfg, tol=1e-9).fit(blocks, n_workers=40)
    em, K = BatchEM(cfg), 3
    early = NominalParams(cfg.class_prior_logits(), cfg.population_mean(), np.zeros((40, K, K)))
    q, f_prev = majority_vote(blocks, K).probas, -np.inf
    for _ in range(3000):
        em._m_step(blocks, q, np.zeros(blocks.n_blocks), early)
        q, _, f = em._e_step(blocks, early, np.zeros(blocks.n_blocks))
        if abs(f - f_prev) < 1e-6 * abs(f):
            break
        f_prev = f
    assert np.max(np.abs(early.worker - params.worker)) > 1e-3


def test_batch_em_with_difficulty_converges(synthetic: Synthetic) -> None:
    cfg = NominalConfig(n_classes=3, n_worker_slots=40, n_items=3000.0, difficulty=True)
    blocks = LabelBlocks.group(synthetic.items, synthetic.workers, synthetic.labels)
    fitted, _ = BatchEM(cfg).fit(blocks, n_workers=40)
    assert fitted.n_iter < 1000
    assert fitted.clarity is not None and np.all(np.isfinite(fitted.clarity))
    assert np.mean(fitted.labels == synthetic.truth) > 0.9
    assert fitted.objective[-1] >= max(fitted.objective[:2])


def test_max_iter_bounds_the_e_steps(synthetic: Synthetic) -> None:
    cfg = NominalConfig(n_classes=3, n_worker_slots=40, n_items=3000.0)
    blocks = sparse_blocks(synthetic, 2)
    for max_iter in (1, 2, 3, 7):
        fitted, _ = BatchEM(cfg, max_iter=max_iter, tol=0.0).fit(blocks, n_workers=40)
        assert fitted.n_iter <= max_iter + 1
        assert np.all(np.isfinite(fitted.probas))


def test_majority_vote_by_slices_counts_as_one_pass_over_every_label(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Items counted a slice at a time, each cell's weights in label order, shared out in
    place: the shares and priors of one np.add.at over every label, bit for bit, empty items
    uniform."""
    import core.batch as batch

    monkeypatch.setattr(batch, "WEIGHT_BLOCKS", 7)
    rng = np.random.default_rng(4)
    item = np.sort(rng.integers(0, 40, 300))
    item[item == 13] = 14  # (item 13 has no labels)
    blocks = LabelBlocks.group(item, rng.integers(0, 9, 300), rng.integers(0, 3, 300),
                               rng.uniform(0.1, 2.0, 300), n_blocks=41)  # fmt: skip
    counts = np.zeros((41, 3))
    np.add.at(counts, (np.repeat(np.arange(41), blocks.sizes()), blocks.labels), blocks.weights)
    totals = counts.sum(axis=1, keepdims=True)
    want = np.where(totals > 0, counts / np.where(totals > 0, totals, 1.0), 1.0 / 3)
    got = majority_vote(blocks, 3)
    assert np.array_equal(got.probas, want)
    assert np.array_equal(got.priors, counts.sum(axis=0) / counts.sum())
    assert got.probas[13].tolist() == [1 / 3] * 3 and got.probas[40].tolist() == [1 / 3] * 3


def test_a_warm_start_takes_no_majority_vote(
    synthetic: Synthetic, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fit from given parameters starts from their E-step: no vote over every item is
    counted for it (the pooling's probes, 80 MB of shares at 2M items)."""
    import core.batch as batch

    cfg, n_workers = NominalConfig(n_classes=3), synthetic.confusion.shape[0]
    blocks = LabelBlocks.group(synthetic.items, synthetic.workers, synthetic.labels)
    _, params = BatchEM(cfg).fit(blocks, n_workers)

    def refused(*_: object) -> None:
        raise AssertionError("a warm start counted a majority vote")

    monkeypatch.setattr(batch, "majority_vote", refused)
    again, _ = BatchEM(cfg, max_iter=4).fit(blocks, n_workers, start=params)
    assert again.n_iter > 0 and np.isfinite(again.probas).all()
