"""Batch EM for the nominal model (the ``nominallabelextract`` analogue), and majority vote.

Batch EM maximises the same objective F = sum_i F_i as the online model, to convergence,
with each worker's own confusion matrix (exact worker indices, no hashing). Results are
shaped like crowd-kit's: ``probas`` (item x class), ``labels``, ``errors`` (worker
confusion), ``priors``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from core import _kernels
from core.blocks import FloatArray, IntArray, LabelBlocks
from core.nominal import NominalConfig, NominalParams


@dataclass(frozen=True)
class AggregationResult:
    """Fitted results, arrays indexed by item code, worker code and class code."""

    probas: FloatArray
    """probas[i, z]: posterior probability that item i is of class z."""
    priors: FloatArray
    """Class prior, shape (K,)."""
    errors: FloatArray | None = None
    """errors[w, z, l]: P(worker w answers l | true class z); None for majority vote."""
    clarity: FloatArray | None = None
    """b_i = log d_i per item when the model has difficulty."""
    objective: list[float] = field(default_factory=list)
    """F after each EM iteration (batch EM only)."""

    @property
    def labels(self) -> IntArray:
        """Most probable class per item (ties go to the lowest class code)."""
        out: IntArray = self.probas.argmax(axis=1)
        return out

    @property
    def n_iter(self) -> int:
        return len(self.objective)


def majority_vote(blocks: LabelBlocks, n_classes: int) -> AggregationResult:
    """Weighted vote shares per item (an item with no labels gets the uniform distribution)."""
    counts = np.zeros((blocks.n_blocks, n_classes))
    item = np.repeat(np.arange(blocks.n_blocks), blocks.sizes())
    np.add.at(counts, (item, blocks.labels), blocks.weights)
    totals = counts.sum(axis=1, keepdims=True)
    probas = np.where(totals > 0, counts / np.where(totals > 0, totals, 1.0), 1.0 / n_classes)
    priors = counts.sum(axis=0) / max(counts.sum(), 1e-300)
    return AggregationResult(probas=probas, priors=priors)


class BatchEM:
    """MAP-EM for the nominal model: E-step exact per item, M-step by Newton per row.

    ``blocks`` hold one block per item whose ``slots`` are exact worker codes 0..W-1.
    """

    def __init__(self, config: NominalConfig, max_iter: int = 200, tol: float = 1e-6) -> None:
        self.config = config
        self.max_iter = max_iter
        self.tol = tol

    def fit(
        self,
        blocks: LabelBlocks,
        n_workers: int,
        progress: Callable[[int, float], None] | None = None,
        known: IntArray | None = None,
    ) -> tuple[AggregationResult, NominalParams]:
        """Run EM from a majority-vote start until F improves by less than tol * |F|.

        ``known[i]`` >= 0 is item i's true class (gold): its posterior is held at that class
        in every E-step, so the M-steps learn the workers' confusions from it.
        """
        cfg, K = self.config, self.config.n_classes
        params = NominalParams(
            class_logits=cfg.class_prior_logits(),
            population=cfg.population_mean(),
            worker=np.zeros((n_workers, K, K)),
        )
        gold = np.flatnonzero(known >= 0) if known is not None else np.zeros(0, dtype=np.int64)
        eye = np.eye(K)
        q = majority_vote(blocks, K).probas
        q[gold] = eye[known[gold]] if known is not None else q[gold]
        clarity = np.zeros(blocks.n_blocks)
        history: list[float] = []
        for it in range(self.max_iter):
            self._m_step(blocks, q, clarity, params)
            q, clarity, f = self._e_step(blocks, params, clarity)
            if known is not None:
                q[gold] = eye[known[gold]]
            history.append(f)
            if progress is not None:
                progress(it + 1, f)
            if it > 0 and abs(history[-1] - history[-2]) < self.tol * abs(history[-1]):
                break
        errors = params.worker_confusion(np.arange(n_workers))
        result = AggregationResult(
            probas=q,
            priors=params.class_priors(),
            errors=errors,
            clarity=clarity if cfg.difficulty else None,
            objective=history,
        )
        return result, params

    def _e_step(
        self, blocks: LabelBlocks, params: NominalParams, clarity: FloatArray
    ) -> tuple[FloatArray, FloatArray, float]:
        cfg, K = self.config, self.config.n_classes
        q = np.empty((blocks.n_blocks, K))
        if cfg.difficulty:
            objective, new_clarity = np.empty(blocks.n_blocks), np.empty(blocks.n_blocks)
            hyper = cfg.hyper_vector()
            _kernels.learn_blocks(
                blocks.ptr, np.arange(blocks.n_blocks), blocks.slots, blocks.labels, blocks.weights,
                np.zeros(blocks.n_blocks, dtype=np.int64), q, clarity, False,
                params.class_logits, cfg.class_prior_logits(), params.population,
                cfg.population_mean(), params.worker, np.zeros((1, K, K)), np.zeros(K * K + K + 3), params.scalars, hyper,
                np.full(blocks.n_blocks, -1, dtype=np.int64), q, new_clarity, objective,
            )  # fmt: skip
            data = float(objective.sum())
            clarity = new_clarity
        else:
            table = np.empty_like(params.worker)
            _kernels.log_confusion_table(params.population, params.worker, table)
            log_pi = params.class_logits - np.logaddexp.reduce(params.class_logits)
            data = float(
                _kernels.estep_table(
                    blocks.ptr, blocks.slots, blocks.labels, blocks.weights, log_pi, table, q
                )
            )
        return q, clarity, data + self._log_prior(params)

    def _log_prior(self, params: NominalParams) -> float:
        cfg = self.config
        return -0.5 * (
            cfg.worker_prior * float(np.sum(params.worker**2))
            + cfg.population_prior * float(np.sum((params.population - cfg.population_mean()) ** 2))
            + cfg.class_prior_strength
            * float(np.sum((params.class_logits - cfg.class_prior_logits()) ** 2))
        )

    def _m_step(
        self, blocks: LabelBlocks, q: FloatArray, clarity: FloatArray, params: NominalParams
    ) -> None:
        """Generalised M-step: Newton on Gamma (rows summed over workers), then on each A_w."""
        cfg = self.config
        grad = np.empty_like(params.worker)
        neg_hess = np.empty((*params.worker.shape, cfg.n_classes))
        counts = None
        if not cfg.difficulty:
            counts = np.empty_like(params.worker)
            _kernels.soft_counts(blocks.ptr, blocks.slots, blocks.labels, blocks.weights, q, counts)

        def derivatives() -> None:
            if counts is not None:
                _kernels.grad_hess_from_counts(
                    counts, params.population, params.worker, grad, neg_hess
                )
            else:
                _kernels.grad_hess_from_labels(
                    blocks.ptr, blocks.slots, blocks.labels, blocks.weights, q, clarity,
                    params.population, params.worker, grad, neg_hess,
                )  # fmt: skip

        derivatives()
        _kernels.newton_population(
            params.population, cfg.population_mean(), grad, neg_hess, cfg.population_prior
        )
        derivatives()
        _kernels.newton_workers(params.worker, grad, neg_hess, cfg.worker_prior)
        self._recentre(params)
        self._class_prior_step(q, params)

    def _recentre(self, params: NominalParams) -> None:
        """Gamma's exact maximiser with every Theta_w = Gamma + A_w held fixed (eq. 13'):
        only the priors change, so Gamma moves to the precision-weighted mean of the Theta_w."""
        cfg = self.config
        lam_a, lam_g, n = cfg.worker_prior, cfg.population_prior, params.worker.shape[0]
        shift = (
            lam_a * params.worker.sum(axis=0) - lam_g * (params.population - cfg.population_mean())
        ) / (lam_a * n + lam_g)
        params.population += shift
        params.worker -= shift

    def _class_prior_step(self, q: FloatArray, params: NominalParams) -> None:
        """Newton steps on gamma_pi: sum_i q_i - n pi - lambda_pi (gamma_pi - m)."""
        lam, mean = self.config.class_prior_strength, self.config.class_prior_logits()
        totals, n = q.sum(axis=0), float(q.shape[0])
        g_pi = params.class_logits
        for _ in range(5):
            pi = np.exp(g_pi - np.logaddexp.reduce(g_pi))
            grad = totals - n * pi - lam * (g_pi - mean)
            neg_hess = n * (np.diag(pi) - np.outer(pi, pi)) + lam * np.eye(pi.size)
            g_pi = g_pi + np.linalg.solve(neg_hess, grad)
        params.class_logits[:] = g_pi


def into_slots(
    params: NominalParams, slots: IntArray, n_labels: FloatArray, n_slots: int, step: float = 0.0
) -> NominalParams:
    """Exact-worker batch parameters mapped into ``n_slots`` hashed slots, for the online
    model: worker w's deviation goes to slot ``slots[w]``; workers sharing a slot are averaged,
    weighted by their label counts ``n_labels``. ``step`` keeps the online step count t."""
    K = params.class_logits.shape[0]
    total = np.zeros(n_slots)
    np.add.at(total, slots, n_labels)
    worker = np.zeros((n_slots, K, K))
    np.add.at(worker, slots, params.worker * n_labels[:, None, None])
    used = total > 0
    worker[used] /= total[used, None, None]
    return NominalParams(
        params.class_logits.copy(), params.population.copy(), worker, np.array([1.0, step])
    )
