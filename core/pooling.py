"""How strongly batch EM pools the workers toward the population, chosen by the answers.

The worker prior A_s ~ N(0, 1/λ_A) decides how far a worker's confusion may stray from the
population's. One λ_A does not serve every crowd: where each answer carries little signal
(workers right 55-65% of the time) the rows fitted at λ_A = 1 are mostly noise and the model
falls several points below majority vote, while a crowd of spammers and experts needs the
freedom. ``fit_pooled`` fits batch EM at λ_A, 2 λ_A, 4 λ_A, ... (each warm-started from the
last) while the items' held-out log-likelihood rises: each item's answers scored under rows
fitted without it and averaged over their Laplace posterior (docs/model.md eq. 26-28), which
is how well the fit predicts answers it was not fitted to. λ_A itself is the floor: the
search only pools more than the configured prior.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

from core.batch import AggregationResult, BatchEM
from core.blocks import FloatArray, IntArray, LabelBlocks
from core.calibration import row_slices
from core.nominal import NominalConfig, NominalParams
from core.served import held_out_corrections
from core.twin import MAX_POOLING

PROBE_ITERATIONS = 5
"""E-steps of a try at twice the worker prior, from the last fit: fitted to convergence only
when it already predicts the held-out answers better (a fit short of its optimum scores
lower, so a probe errs toward the prior already chosen)."""


class FitWatch(Protocol):
    """Told of each fit ``fit_pooled`` runs (a probe of ``PROBE_ITERATIONS`` E-steps or a fit
    to convergence), before and after it."""

    def start(self, worker_prior: float, probe: bool) -> None: ...

    def end(self, result: AggregationResult, score: float) -> None:
        """``score``: the fit's held-out log-likelihood (eq. 28)."""


@dataclass(frozen=True)
class PooledFit:
    """Batch EM's fit at the chosen worker prior, with its items' held-out corrections."""

    result: AggregationResult
    params: NominalParams
    config: NominalConfig
    """The configuration fitted: the one given, with ``worker_prior`` the λ_A chosen."""
    held_out: FloatArray
    """c_i + m_i of eq. 26-27 per item under ``params`` (rounded as served)."""
    score: float
    """The items' held-out log-likelihood (eq. 28) at that λ_A."""
    tried: tuple[tuple[float, float], ...]
    """(λ_A, held-out log-likelihood) of every fit and probe, in order."""


def held_out_log_likelihood(
    config: NominalConfig, result: AggregationResult, params: NominalParams, held_out: FloatArray
) -> float:
    """Σ_i log Σ_z π_z exp(l_i(z) − c_i(z) − m_i(z)) (eq. 28), taken from the fit's own E-step:
    log Σ_z π_z e^{l_i(z)} summed over the items is its objective less the log prior, and
    q_i(z) = π_z e^{l_i(z)} / Σ_z' π_z' e^{l_i(z')}. A gold item counts its answers and its
    gold class (its posterior is that class)."""
    data = result.objective[-1] - config.log_prior(
        params.class_logits, params.population, params.worker
    )
    item_terms = np.empty(held_out.shape[0])
    for part in row_slices(item_terms.size):
        with np.errstate(divide="ignore"):  # (a class of posterior 0 adds nothing)
            terms = np.log(result.probas[part]) - held_out[part]
        top = terms.max(axis=1)
        item_terms[part] = top + np.log(np.exp(terms - top[:, None]).sum(axis=1))
    score = float(data + np.sum(item_terms))
    return score if np.isfinite(score) else -np.inf  # (never chosen over a finite one)


def fit_pooled(
    config: NominalConfig,
    blocks: LabelBlocks,
    n_workers: int,
    known: IntArray | None = None,
    progress: Callable[[int, float], None] | None = None,
    threads: int = 1,
    watch: FitWatch | None = None,
) -> PooledFit:
    """Batch EM at the worker prior of highest held-out log-likelihood among λ_A, 2 λ_A, ...,
    ``MAX_POOLING`` λ_A, going up while each does better (``progress`` reports each fit's
    iterations, counted from 1, between ``watch``'s calls for that fit; ``threads`` share the
    held-out corrections)."""

    def fit_at(cfg: NominalConfig, probe: bool, start: NominalParams | None) -> PooledFit:
        if watch is not None:
            watch.start(cfg.worker_prior, probe)
        em = BatchEM(cfg, max_iter=PROBE_ITERATIONS) if probe else BatchEM(cfg)
        found = em.fit(blocks, n_workers, progress=progress, known=known, start=start)
        scored = _scored(cfg, blocks, *found, best.tried if start is not None else (), threads)
        if watch is not None:
            watch.end(scored.result, scored.score)
        return scored

    best = fit_at(config, False, None)
    lam = config.worker_prior
    while 2.0 * lam <= MAX_POOLING * config.worker_prior:
        lam *= 2.0
        wider = replace(config, worker_prior=lam)
        tried = fit_at(wider, True, best.params)  # (each fit copies its start)
        if tried.score > best.score:  # a probe that does better is fitted to convergence
            tried = fit_at(wider, False, tried.params)
        if tried.score <= best.score:
            return replace(best, tried=tried.tried)
        best = tried
    return best


def _scored(
    config: NominalConfig,
    blocks: LabelBlocks,
    result: AggregationResult,
    params: NominalParams,
    tried: tuple[tuple[float, float], ...],
    threads: int,
) -> PooledFit:
    lam = config.worker_prior
    held_out = held_out_corrections(
        params, blocks, result.probas, lam, laplace=True, threads=threads,
        population_precision=config.population_precision(),
    )  # fmt: skip
    score = held_out_log_likelihood(config, result, params, held_out)
    return PooledFit(result, params, config, held_out, score, (*tried, (lam, score)))
