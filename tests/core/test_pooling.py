"""The worker prior chosen by the items' held-out likelihood (core/pooling.py, docs/model.md
eq. 28): pooled hard where each answer says little, left alone where workers differ."""

from __future__ import annotations

import numpy as np
import pytest

from core.batch import BatchEM
from core.blocks import LabelBlocks
from core.nominal import NominalConfig
from core.pooling import MAX_POOLING, fit_pooled, held_out_log_likelihood
from core.served import held_out_corrections, log_likelihoods, log_prior

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


def test_workers_who_differ_keep_the_configured_prior(synthetic: Synthetic) -> None:
    """Dawid-Skene workers right 55-95% of the time: more pooling predicts held-out answers
    worse, so the fit is batch EM's at lambda_A = 1, to the last bit."""
    blocks = LabelBlocks.group(synthetic.items, synthetic.workers, synthetic.labels)
    config = NominalConfig(n_classes=synthetic.n_classes, n_items=float(blocks.n_blocks))
    fit = fit_pooled(config, blocks, synthetic.confusion.shape[0])
    assert fit.config.worker_prior == 1.0 and len(fit.tried) == 2
    plain, params = BatchEM(config).fit(blocks, synthetic.confusion.shape[0])
    np.testing.assert_array_equal(fit.result.probas, plain.probas)
    held_out = held_out_corrections(params, blocks, plain.probas, 1.0, laplace=True)
    assert fit.score == held_out_log_likelihood(config, plain, params, held_out)


def test_the_held_out_likelihood_is_the_items_answers_scored_without_their_pull(
    synthetic: Synthetic,
) -> None:
    """Eq. 28 from the E-step's objective equals the log-sum-exp of log pi + l_i - c_i."""
    blocks = LabelBlocks.group(synthetic.items, synthetic.workers, synthetic.labels)
    config = NominalConfig(n_classes=synthetic.n_classes, n_items=float(blocks.n_blocks))
    result, params = BatchEM(config).fit(blocks, synthetic.confusion.shape[0])
    held_out = held_out_corrections(params, blocks, result.probas, 1.0, laplace=True)
    ell, _ = log_likelihoods(params, blocks)
    joint = log_prior(params)[None, :] + ell - held_out
    direct = float(np.sum(np.logaddexp.reduce(joint, axis=1)))
    assert held_out_log_likelihood(config, result, params, held_out) == pytest.approx(direct)
