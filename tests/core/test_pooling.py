"""The worker prior chosen by the items' held-out likelihood (core/pooling.py, docs/model.md
eq. 28): pooled hard where each answer says little, left alone where workers differ."""

from __future__ import annotations

import numpy as np
import pytest

from core.batch import AggregationResult, BatchEM
from core.blocks import LabelBlocks
from core.calibration import SLICE_ROWS
from core.nominal import NominalConfig, NominalParams
from core.pooling import MAX_POOLING, fit_pooled, held_out_log_likelihood
from core.served import held_out_corrections, held_out_posteriors, log_likelihoods, log_prior

from ..conftest import Synthetic
from .test_orientation import weak_binary


def test_weak_workers_are_pooled_until_majority_vote_is_matched() -> None:
    """At lambda_A = 1 batch EM was 69.1% right here, majority vote 78.4%."""
    blocks, truth, votes = weak_binary(0)
    config = NominalConfig(n_classes=2, n_items=float(truth.size))
    fit = fit_pooled(config, blocks, 300)
    assert fit.config.worker_prior > 4.0
    lams, scores = zip(*fit.tried, strict=True)
    assert list(lams) == [2.0**k for k in range(len(lams))] and max(lams) <= MAX_POOLING
    assert fit.score == max(scores)  # the fit kept is the best one tried
    right = np.mean(fit.result.probas.argmax(axis=1) == truth)
    assert right > np.mean(votes == truth) - 0.02, right


def test_each_fit_is_watched_and_says_whether_it_converged() -> None:
    """extract --batch printed "(converged)" after a fit stopped by its iteration limit, and
    a table whose iterations ran on from one fit into the next."""
    blocks, truth, _ = weak_binary(0)
    config = NominalConfig(n_classes=2, n_items=float(truth.size))
    seen: list[tuple[str, float | int, bool]] = []

    class Watch:
        def start(self, worker_prior: float, probe: bool) -> None:
            seen.append(("start", worker_prior, probe))

        def end(self, result: AggregationResult, score: float) -> None:
            seen.append(("end", result.n_iter, result.converged))

    fit = fit_pooled(config, blocks, 300, watch=Watch())
    starts = [(lam, probe) for what, lam, probe in seen if what == "start"]
    assert [what for what, *_ in seen] == ["start", "end"] * len(starts)
    assert starts[0] == (1.0, False) and all(probe for _, probe in starts[1::2])
    assert len(fit.tried) == len(starts) - sum(not probe for _, probe in starts[1:])
    ends = [(n, converged) for what, n, converged in seen if what == "end"]
    assert ends[0][1] and all(n <= 5 for n, _ in ends[1::2])
    limited, _ = BatchEM(config, max_iter=3).fit(blocks, 300)
    assert limited.n_iter == 3 and not limited.converged


def test_workers_who_differ_keep_the_configured_prior(synthetic: Synthetic) -> None:
    """Dawid-Skene workers right 55-95% of the time: more pooling predicts held-out answers
    worse, so the fit is batch EM's at lambda_A = 1, to the last bit."""
    blocks = LabelBlocks.group(synthetic.items, synthetic.workers, synthetic.labels)
    config = NominalConfig(n_classes=synthetic.n_classes, n_items=float(blocks.n_blocks))
    fit = fit_pooled(config, blocks, synthetic.confusion.shape[0])
    assert fit.config.worker_prior == 1.0 and len(fit.tried) == 2
    plain, params = BatchEM(config).fit(blocks, synthetic.confusion.shape[0])
    np.testing.assert_array_equal(fit.result.probas, plain.probas)
    held_out = held_out_corrections(
        params,
        blocks,
        plain.probas,
        1.0,
        laplace=True,
        population_precision=config.population_precision(),
    )
    assert fit.score == held_out_log_likelihood(config, plain, params, held_out)


def test_the_held_out_likelihood_is_the_items_answers_scored_without_their_pull(
    synthetic: Synthetic,
) -> None:
    """Eq. 28 from the E-step's objective equals the log-sum-exp of log pi + l_i - c_i."""
    blocks = LabelBlocks.group(synthetic.items, synthetic.workers, synthetic.labels)
    config = NominalConfig(n_classes=synthetic.n_classes, n_items=float(blocks.n_blocks))
    result, params = BatchEM(config).fit(blocks, synthetic.confusion.shape[0])
    held_out = held_out_corrections(
        params,
        blocks,
        result.probas,
        1.0,
        laplace=True,
        population_precision=config.population_precision(),
    )
    ell, _ = log_likelihoods(params, blocks)
    joint = log_prior(params)[None, :] + ell - held_out
    direct = float(np.sum(np.logaddexp.reduce(joint, axis=1)))
    assert held_out_log_likelihood(config, result, params, held_out) == pytest.approx(direct)


def test_held_out_scores_and_posteriors_taken_by_slices_are_those_of_all_rows_at_once() -> None:
    """Eq. 26 and 28 over many items are taken a slice of rows at a time (their temporaries
    were 400 MB at 2M items): the same numbers as the whole arrays give, slice ends included."""
    rng = np.random.default_rng(3)
    n, K = 2 * SLICE_ROWS + 11, 4
    probas = rng.dirichlet(np.ones(K), n)
    probas[5, 1] = 0.0  # (a class of probability 0 stays at 0)
    corrections = rng.normal(0.0, 0.3, (n, K))
    corrections[SLICE_ROWS - 1 : SLICE_ROWS + 2] = 0.0  # rows without a correction
    logits = np.log(np.where(probas > 0, probas, 1.0)) - corrections
    held = np.where(probas > 0, np.exp(logits - logits.max(axis=1, keepdims=True)), 0.0)
    expected = held / held.sum(axis=1, keepdims=True)
    expected[SLICE_ROWS - 1 : SLICE_ROWS + 2] = probas[SLICE_ROWS - 1 : SLICE_ROWS + 2]
    np.testing.assert_allclose(held_out_posteriors(probas, corrections), expected, rtol=1e-12)

    config = NominalConfig(n_classes=K)
    params = NominalParams(config.class_prior_logits(), config.population_mean(),
                           np.zeros((1, K, K)))  # fmt: skip
    result = AggregationResult(probas, np.full(K, 1 / K), np.zeros((1, K, K)), None, [-1.0])
    data = -1.0 - config.log_prior(params.class_logits, params.population, params.worker)
    with np.errstate(divide="ignore"):
        terms = np.log(probas) - corrections
    top = terms.max(axis=1)
    whole = data + np.sum(top + np.log(np.exp(terms - top[:, None]).sum(axis=1)))
    assert held_out_log_likelihood(config, result, params, corrections) == pytest.approx(
        whole, rel=1e-12
    )
