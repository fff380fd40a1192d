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
