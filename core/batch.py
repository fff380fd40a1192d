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
from core.blocks import WEIGHT_BLOCKS, FloatArray, IntArray, LabelBlocks
from core.nominal import NominalConfig, NominalParams, log_softmax
from core.orientation import best_relabelling, relabel


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
    converged: bool = True
    """False when batch EM stopped at its iteration limit before its fixed point."""

    @property
    def labels(self) -> IntArray:
        """Most probable class per item (ties go to the lowest class code)."""
        out: IntArray = self.probas.argmax(axis=1)
        return out

    @property
    def n_iter(self) -> int:
        return len(self.objective)


def majority_vote(blocks: LabelBlocks, n_classes: int) -> AggregationResult:
    """Weighted vote shares per item (an item with no labels gets the uniform distribution).
    Counted ``WEIGHT_BLOCKS`` items at a time, each cell's weights added in label order, and
    shared out in place: no array of a label's item or of every item's shares twice (80 MB
    each at 10M answers)."""
    K = n_classes
    counts = np.empty((blocks.n_blocks, K))
    for lo in range(0, blocks.n_blocks, WEIGHT_BLOCKS):
        ptr = blocks.ptr[lo : lo + WEIGHT_BLOCKS + 1]
        n = ptr.size - 1
        cell = np.repeat(np.arange(n) * K, np.diff(ptr)) + blocks.labels[ptr[0] : ptr[-1]]
        counts[lo : lo + n] = np.bincount(cell, blocks.weights[ptr[0] : ptr[-1]], n * K).reshape(
            n, K
        )
    priors = counts.sum(axis=0) / max(counts.sum(), 1e-300)
    totals = counts.sum(axis=1, keepdims=True)
    empty = totals[:, 0] <= 0
    counts /= np.where(empty[:, None], 1.0, totals)
    counts[empty] = 1.0 / K
    return AggregationResult(probas=counts, priors=priors)


class BatchEM:
    """MAP-EM for the nominal model: E-step exact per item, M-step by Newton per row.

    ``blocks`` hold one block per item whose ``slots`` are exact worker codes 0..W-1.
    """

    def __init__(self, config: NominalConfig, max_iter: int = 1000, tol: float = 1e-6) -> None:
        self.config = config
        self.max_iter = max_iter
        self.tol = tol

    def fit(
        self,
        blocks: LabelBlocks,
        n_workers: int,
        progress: Callable[[int, float], None] | None = None,
        known: IntArray | None = None,
        start: NominalParams | None = None,
    ) -> tuple[AggregationResult, NominalParams]:
        """Run EM from a majority-vote start to its fixed point, accelerated by SQUAREM.

        Converged when one EM iteration moves no parameter (logit) by more than ``tol``;
        ``max_iter`` bounds the EM iterations (E-steps). ``known[i]`` >= 0 is item i's true
        class (gold): its posterior is held at that class in every E-step, so the M-steps
        learn the workers' confusions from it. ``start`` (worker table of shape
        (n_workers, K, K), A = scale * stored) replaces the majority-vote start: the first
        E-step is taken at those parameters (a warm start, e.g. from the online model).
        """
        result, params, _ = self._run(blocks, n_workers, progress, known, start)
        perm = best_relabelling(params, self.config)
        if perm is not None:  # the fixed point of another labelling (core/orientation.py)
            flipped = params.copy()
            relabel(flipped, perm)
            again, there, _ = self._run(blocks, n_workers, progress, known, flipped)
            if again.objective[-1] > result.objective[-1]:
                return again, there
        return result, params

    def improve(
        self,
        blocks: LabelBlocks,
        n_workers: int,
        start: NominalParams,
        known: IntArray | None = None,
    ) -> tuple[NominalParams, int]:
        """At most ``max_iter`` EM iterations (E-step over every item, then the M-step),
        combined by SQUAREM as in ``fit``, from ``start`` instead of majority vote. Returns the
        parameters after the last accepted M-step (no E-step taken there) and the number of
        E-steps run."""
        result, _, mapped = self._run(blocks, n_workers, None, known, start)
        return mapped, result.n_iter

    def _run(
        self,
        blocks: LabelBlocks,
        n_workers: int,
        progress: Callable[[int, float], None] | None,
        known: IntArray | None,
        start: NominalParams | None,
    ) -> tuple[AggregationResult, NominalParams, NominalParams]:
        """fit's loop; also returns the last accepted EM map output (the parameters after
        the last M-step, whose E-step was not taken)."""
        cfg, K = self.config, self.config.n_classes
        params = NominalParams(
            class_logits=cfg.class_prior_logits(),
            population=cfg.population_mean(),
            worker=np.zeros((n_workers, K, K)),
        )
        if start is not None:
            if start.worker.shape != (n_workers, K, K):
                raise ValueError(f"start needs a worker table of shape {(n_workers, K, K)}")
            params = NominalParams(
                start.class_logits.copy(),
                start.population.copy(),
                start.scalars[0] * start.worker,
            )
        known_codes = (
            np.full(blocks.n_blocks, -1, dtype=np.int64)
            if known is None
            else np.asarray(known, dtype=np.int64)
        )
        gold = np.flatnonzero(known_codes >= 0)
        if start is None or self.max_iter < 1:
            q = majority_vote(blocks, K).probas
            q[gold] = np.eye(K)[known_codes[gold]]
        else:  # (a warm start's first E-step gives the posteriors: no vote to start from)
            q = np.zeros((0, K))
        clarity = np.zeros(blocks.n_blocks)
        history: list[float] = []
        if start is None:
            self._m_step(blocks, q, clarity, params)
        layout = _Layout(params, clarity if cfg.difficulty else None)

        def em(x: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray, float]:
            """One EM iteration from the packed state x: E-step at x (its posteriors and F),
            then the M-step; returns (the next state, q, clarity, F(x))."""
            p, b = layout.unpack(x, clarity)
            q, b, f = self._e_step(blocks, p, b, known_codes)
            if not np.isfinite(f):  # an extrapolation too far: no M-step from there
                history.append(f)
                return x, q, b, f
            history.append(f)
            if progress is not None:
                progress(len(history), f)
            self._m_step(blocks, q, b, p)
            return layout.pack(p, b), q, b, f

        x0 = layout.pack(params, clarity)
        # the latest accepted state whose E-step we have: (state, q, clarity, F)
        fit: tuple[FloatArray, FloatArray, FloatArray, float] = (x0, q, clarity, -np.inf)
        del q  # (held by ``fit`` alone: freed with it, 80 MB at 2M items of 5 classes)
        mapped = x0  # the latest accepted EM map output
        max_step = 1.0
        converged = False
        while len(history) < self.max_iter:
            # SQUAREM (Varadhan & Roland 2008, scheme S3): two EM iterations x0 -> x1 -> x2,
            # a step along them of length -alpha >= 1, then one EM iteration from there. The
            # step is halved back toward the plain EM point x2 until F does not decrease.
            # (an E-step's posteriors are held by ``fit`` alone: at most two sets, the fit's
            # and the one being computed, exist at once, 80 MB each at 2M items of 5 classes)
            step = em(x0)
            x1, fit, mapped = step[0], (x0, step[1], step[2], step[3]), step[0]
            del step
            if _max_abs(x1 - x0) < self.tol:
                converged = True
                break
            if len(history) >= self.max_iter:
                break
            step = em(x1)
            x2, fit, mapped = step[0], (x1, step[1], step[2], step[3]), step[0]
            f1 = step[3]
            del step
            if _max_abs(x2 - x1) < self.tol:
                converged = True
                break
            r, v = x1 - x0, x2 - 2.0 * x1 + x0
            norm_v = float(np.linalg.norm(v))
            alpha = min(-float(np.linalg.norm(r)) / norm_v, -1.0) if norm_v > 0 else -1.0
            if alpha <= -max_step:  # the step length cap grows while steps hit it
                alpha, max_step = -max_step, _STEP_GROWTH * max_step
            x0 = x2
            while alpha < -1.0 and len(history) < self.max_iter:
                x_try = x1 - r - 2.0 * alpha * r + alpha * alpha * v
                step = em(x_try)
                x_next, f_try = step[0], step[3]
                if np.isfinite(f_try) and f_try >= f1:
                    x0, fit, mapped = x_next, (x_try, step[1], step[2], f_try), x_next
                    del step
                    break
                del step
                alpha = min((alpha - 1.0) / 2.0, -1.0)
        params, _ = layout.unpack(fit[0], clarity)
        q_fit, b_fit = fit[1], fit[2]
        if history and history[-1] != fit[3]:  # stopped by max_iter after a rejected step
            history.append(fit[3])
        errors = params.worker_confusion(np.arange(n_workers))
        result = AggregationResult(
            probas=q_fit,
            priors=params.class_priors(),
            errors=errors,
            clarity=b_fit if cfg.difficulty else None,
            objective=history,
            converged=converged,
        )
        return result, params, layout.unpack(mapped, clarity)[0]

    def _e_step(
        self,
        blocks: LabelBlocks,
        params: NominalParams,
        clarity: FloatArray,
        known: IntArray | None = None,
    ) -> tuple[FloatArray, FloatArray, float]:
        """Posteriors, clarities and F at ``params``. A gold item (``known`` >= 0) has its
        posterior held at its class, and counts log p(D_i, z*) in F, the objective whose ascent EM with known classes is: with
        log p(D_i) instead, SQUAREM's test that F did not decrease rejected good steps and
        a fit with gold took hundreds of E-steps."""
        cfg, K = self.config, self.config.n_classes
        q = np.empty((blocks.n_blocks, K))
        if known is None:
            known = np.full(blocks.n_blocks, -1, dtype=np.int64)
        if cfg.difficulty:
            objective, new_clarity = np.empty(blocks.n_blocks), np.empty(blocks.n_blocks)
            hyper = cfg.hyper_vector()
            _kernels.learn_blocks(
                blocks.ptr, np.arange(blocks.n_blocks), blocks.slots, blocks.labels, blocks.weights,
                np.zeros(blocks.n_blocks, dtype=np.int64), q, clarity, False,
                params.class_logits, cfg.class_prior_logits(), params.population,
                cfg.population_mean(), params.worker, np.zeros((1, K, K)), np.zeros(K * K + K + 3), params.scalars, hyper,
                known, q, new_clarity, objective,
                np.zeros(0), np.zeros(1),
            )  # fmt: skip
            data = float(objective.sum())
            clarity = new_clarity
        else:
            table = np.empty_like(params.worker)
            _kernels.log_confusion_table(params.population, params.worker, table)
            log_pi = log_softmax(params.class_logits)
            total = np.empty(1)
            _kernels.estep_tables(
                blocks.ptr, blocks.slots, blocks.labels, blocks.weights,
                known, log_pi[None], table[None], q[None], total,
            )  # fmt: skip
            data = float(total[0])
        return (
            q,
            clarity,
            data + cfg.log_prior(params.class_logits, params.population, params.worker),
        )

    def _m_step(
        self, blocks: LabelBlocks, q: FloatArray, clarity: FloatArray, params: NominalParams
    ) -> None:
        """Generalised M-step: Newton on Gamma (rows summed over workers), then on each A_w."""
        cfg = self.config
        if not cfg.difficulty:  # each row's Newton system from its soft counts, solved in O(K)
            counts = np.empty_like(params.worker)
            _kernels.soft_counts(blocks.ptr, blocks.slots, blocks.labels, blocks.weights, q, counts)
            _kernels.newton_population_from_counts(
                counts, params.population, params.worker, cfg.population_mean(),
                cfg.population_precision(),
            )  # fmt: skip
            _kernels.newton_workers_from_counts(
                counts, params.population, params.worker, cfg.worker_prior
            )
        else:
            grad = np.empty_like(params.worker)
            neg_hess = np.empty((*params.worker.shape, cfg.n_classes))

            def derivatives() -> None:
                _kernels.grad_hess_from_labels(
                    blocks.ptr, blocks.slots, blocks.labels, blocks.weights, q, clarity,
                    params.population, params.worker, grad, neg_hess,
                )  # fmt: skip

            derivatives()
            _kernels.newton_population(
                params.population, cfg.population_mean(), grad, neg_hess, cfg.population_precision()
            )
            derivatives()
            _kernels.newton_workers(params.worker, grad, neg_hess, cfg.worker_prior)
        self._recentre(params)
        self._class_prior_step(q, params)

    def _recentre(self, params: NominalParams) -> None:
        """Gamma's exact maximiser with every Theta_w = Gamma + A_w held fixed (eq. 13'):
        only the priors change, so Gamma moves to the precision-weighted mean of the Theta_w."""
        cfg = self.config
        lam_a, lam_g, n = cfg.worker_prior, cfg.population_precision(), params.worker.shape[0]
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
            pi = np.exp(log_softmax(g_pi))
            grad = totals - n * pi - lam * (g_pi - mean)
            neg_hess = n * (np.diag(pi) - np.outer(pi, pi)) + lam * np.eye(pi.size)
            g_pi = g_pi + np.linalg.solve(neg_hess, grad)
        params.class_logits[:] = g_pi


# SQUAREM's cap on -alpha starts at 1 and grows by this factor (R SQUAREM's ``mstep``)
_STEP_GROWTH = 4.0


def _max_abs(x: FloatArray) -> float:
    return float(np.max(np.abs(x))) if x.size else 0.0


class _Layout:
    """The EM state (gamma_pi, Gamma, A and, with difficulty, every b_i) as one vector."""

    def __init__(self, params: NominalParams, clarity: FloatArray | None) -> None:
        self.shapes = [params.class_logits.shape, params.population.shape, params.worker.shape]
        self.with_clarity = clarity is not None
        if clarity is not None:
            self.shapes.append(clarity.shape)
        self.ends = np.cumsum([int(np.prod(s)) for s in self.shapes])

    def pack(self, params: NominalParams, clarity: FloatArray) -> FloatArray:
        parts = [params.class_logits.ravel(), params.population.ravel(), params.worker.ravel()]
        if self.with_clarity:
            parts.append(clarity)
        return np.concatenate(parts)

    def unpack(self, x: FloatArray, clarity: FloatArray) -> tuple[NominalParams, FloatArray]:
        """Parameters (copies) and the clarity (``clarity`` itself without difficulty)."""
        pieces = np.split(x, self.ends[:-1])
        params = NominalParams(
            pieces[0].reshape(self.shapes[0]).copy(),
            pieces[1].reshape(self.shapes[1]).copy(),
            pieces[2].reshape(self.shapes[2]).copy(),
        )
        return params, (pieces[3].copy() if self.with_clarity else clarity)


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
