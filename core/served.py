"""What a fitted model serves: calibrated posteriors (docs/model.md, eq. 21-25).

``core.calibration`` has the math on arrays; this module applies it to the online and batch
models' parameters and label blocks.
"""

from __future__ import annotations

import numpy as np

from core import _calibration_kernels, _kernels
from core._softmax_rows import softmax_rows_den
from core.blocks import FloatArray, IntArray, LabelBlocks
from core.calibration import (
    Calibration,
    choose,
    gold_evidence,
    item_log_likelihoods,
    row_slices,
)
from core.nominal import SCALE, NominalConfig, NominalParams, log_softmax
from core.online import OnlineEM
from core.threads import block_ranges, in_threads


def log_likelihoods(params: NominalParams, blocks: LabelBlocks) -> tuple[FloatArray, FloatArray]:
    """(l_i, n_i) per block under ``params``: sum_j h_j log p(l_j | z, s_j) and sum_j h_j."""
    return item_log_likelihoods(
        blocks.ptr, blocks.slots, blocks.labels, blocks.weights,
        params.population, params.worker, float(params.scalars[SCALE]),
    )  # fmt: skip


HELD_OUT_DECIMALS = 4
"""c_i in nats to 1e-4: a posterior moves by at most about 1e-4 of itself (eq. 26)."""


def held_out_corrections(
    params: NominalParams,
    blocks: LabelBlocks,
    fitted: FloatArray,
    worker_prior: float,
    decimals: int | None = HELD_OUT_DECIMALS,
    laplace: bool = False,
    threads: int = 1,
    *,
    population_precision: float,
) -> FloatArray:
    """c_i(z) per block (docs/model.md eq. 26): l_i - c_i is the log-likelihood of block i's
    labels under slot rows, and the population's rows they share, fitted without it (eq.
    26'). ``params`` are a fit to the blocks (batch EM's fixed point or the refined online
    model), ``fitted`` their posteriors, ``worker_prior`` lambda_A, ``population_precision``
    lambda_Gamma (the fit's own, ``NominalConfig.population_precision()``: no default, so that no
    caller scores a project's items under another project's prior). With ``laplace`` (a fit
    at its optimum: batch EM), c_i also takes each label's probability under its row's
    predictive, averaged over the row's Laplace posterior (eq. 27), instead of the row's point
    estimate. Rounded to ``decimals`` places: an item stores
    its c_i with its posterior, and finer differences would not show in any posterior served.
    ``threads`` > 1 splits many blocks among that many threads (bit-identical)."""
    S, K = params.worker.shape[0], params.population.shape[0]
    counts = np.empty((S, K, K))
    _kernels.soft_counts(blocks.ptr, blocks.slots, blocks.labels, blocks.weights, fitted, counts)
    used = np.flatnonzero(counts.sum(axis=(1, 2)) > 0)
    row_of_slot = np.full(S, -1, dtype=np.int64)
    row_of_slot[used] = np.arange(used.size)
    rows = row_of_slot[blocks.slots]
    theta = _row_logits(params, used)
    log_p = log_softmax(theta)
    p = np.exp(log_p)
    totals = counts[used].sum(axis=2)
    excess = np.empty((0, K, K))
    if laplace:
        excess = log_p - np.log(laplace_predictive(theta, totals, worker_prior))
    shared, terms = population_pull(totals, p, worker_prior, population_precision)
    out = np.empty((blocks.n_blocks, K))

    def correct(part: tuple[int, int]) -> None:
        lo, hi = part
        _calibration_kernels.held_out_corrections(
            blocks.ptr[lo : hi + 1], rows, blocks.labels, blocks.weights, fitted[lo:hi], totals,
            p, worker_prior, shared, terms, excess, out[lo:hi],
        )  # fmt: skip

    in_threads(correct, block_ranges(blocks.n_blocks, threads))
    return out if decimals is None else np.round(out, decimals, out=out)


def held_out_fit(
    params: NominalParams,
    blocks: LabelBlocks,
    fitted: FloatArray,
    worker_prior: float,
    laplace: bool = False,
    threads: int = 1,
    *,
    population_precision: float,
) -> FloatArray:
    """The fit's own posteriors ``fitted``, each block scored without its own pull on its
    workers' rows (eq. 26; and with ``laplace`` under the rows' Laplace predictives, eq. 27):
    ``held_out_posteriors`` of ``held_out_corrections``."""
    corrections = held_out_corrections(
        params, blocks, fitted, worker_prior, laplace=laplace, threads=threads,
        population_precision=population_precision,
    )  # fmt: skip
    return held_out_posteriors(fitted, corrections)


def population_pull(
    totals: FloatArray, probs: FloatArray, worker_prior: float, population_precision: float
) -> tuple[FloatArray, tuple[FloatArray, FloatArray, FloatArray, FloatArray]]:
    """G_z, the population row Gamma_z's posterior covariance (eq. 26'), (K, K, K), and per
    slot row what a label's term needs of it: (G_z u, u^T G_z u, u^T p, beta), with S = (C D +
    lambda_A I)^-1 = diag(1/a) + beta u u^T the row's covariance, a = C p + lambda_A,
    u = p / a, beta = C / den. G_z^-1 is lambda_Gamma I plus each slot row's
    lambda_A (I - lambda_A S), taken as diag(lambda_A C p / a) - lambda_A^2 beta u u^T (no
    cancellation for rows of few labels); the sums over rows are matrix products (BLAS)."""
    lam, K = float(worker_prior), probs.shape[-1]
    den = np.empty(totals.size)
    softmax_rows_den(
        np.ascontiguousarray(totals, dtype=np.float64).ravel(),
        np.ascontiguousarray(probs, dtype=np.float64).reshape(-1, K), lam, den,
    )  # fmt: skip
    beta = totals / den.reshape(totals.shape)
    cov = np.empty((K, K, K))
    gu, ugu, up = np.empty_like(probs), np.empty_like(totals), np.empty_like(totals)
    diagonal = np.arange(K)
    for z in range(K):  # one class at a time: no (rows, K, K) temporaries
        c, p = totals[:, z, None], probs[:, z]
        a = c * p + lam
        u = p / a
        precision = -np.matmul((u * (lam * lam * beta[:, z, None])).T, u)
        precision[diagonal, diagonal] += (lam * c * p / a).sum(axis=0) + population_precision
        cov[z] = np.linalg.inv(precision)
        gu[:, z] = u @ cov[z]  # G symmetric
        ugu[:, z] = (u * gu[:, z]).sum(axis=1)
        up[:, z] = (u * p).sum(axis=1)
    return cov, (gu, ugu, up, beta)


def laplace_predictive(theta: FloatArray, totals: FloatArray, worker_prior: float) -> FloatArray:
    """Eq. 27: E[softmax(theta_sz + e)] for e ~ N(0, (C_sz D + lambda_A I)^-1), the row's
    Laplace posterior, by the unscented transform along a square root of its covariance
    (``core._calibration_kernels.laplace_predictive_rows``: O(K^2) a row). ``theta`` (..., K),
    ``totals`` C its leading shape."""
    K = theta.shape[-1]
    rows = np.ascontiguousarray(theta, dtype=np.float64).reshape(-1, K)
    weights = np.ascontiguousarray(totals, dtype=np.float64).reshape(-1)
    out = np.empty_like(rows)
    _calibration_kernels.laplace_predictive_rows(rows, weights, float(worker_prior), out)
    return out.reshape(theta.shape)


def _row_logits(params: NominalParams, used: IntArray) -> FloatArray:
    """theta of slot rows ``used``: population plus the scaled deviation, (rows, K, K)."""
    out: FloatArray = params.population[None] + float(params.scalars[SCALE]) * params.worker[used]
    return out


def held_out_posteriors(posteriors: FloatArray, corrections: FloatArray) -> FloatArray:
    """Posteriors q_i(z) with their labels' log-likelihoods lowered by c_i(z) (eq. 26); rows
    without a correction are returned as they are."""
    out = posteriors.copy()
    for part in row_slices(out.shape[0]):  # (all rows at once: 400 MB at 2M items, 5 classes)
        rows = part.start + np.flatnonzero(np.any(corrections[part] != 0.0, axis=1))
        if rows.size:
            with np.errstate(divide="ignore"):  # a class of probability 0 stays at 0
                logits = np.log(posteriors[rows]) - corrections[rows]
            held = np.exp(logits - logits.max(axis=1, keepdims=True))
            out[rows] = held / held.sum(axis=1, keepdims=True)
    return out


def log_prior(params: NominalParams) -> FloatArray:
    """log pi, the class prior of ``params``."""
    return log_softmax(params.class_logits)


def calibration(
    params: NominalParams,
    blocks: LabelBlocks,
    evidence: FloatArray | None,
    gold: IntArray | None = None,
    held_out: FloatArray | None = None,
) -> Calibration:
    """Eq. 24: rho from the prequential ``evidence``; eps from its prior and the gold items
    among ``blocks`` (``gold[b]`` >= 0), each scored from its answers alone, as the other
    items are served: without its own pull when ``held_out`` has the blocks' c_i (eq. 26).
    A gold item without answers (a honeypot not yet labelled, or labels of weight 0) counts
    for nothing: its "consensus" would be the class prior, which says nothing of how often the
    crowd's consensus is wrong."""
    if gold is None or not np.any(gold >= 0):
        return choose(evidence)
    has = np.flatnonzero(gold >= 0)
    has = has[blocks.total_weight(has) > 0]
    if not has.size:
        return choose(evidence)
    ell, n = log_likelihoods(params, subset(blocks, has))
    if held_out is not None:
        ell -= held_out[has]
    return choose(evidence, gold_evidence(ell, n, log_prior(params), gold[has]), int(has.size))


def online_calibration(
    model: OnlineEM,
    blocks: LabelBlocks,
    gold: IntArray | None = None,
    held_out: FloatArray | None = None,
) -> Calibration:
    """``calibration`` with the evidence the online model gathered while it learned."""
    return calibration(model.params, blocks, model.params.evidence, gold, held_out)


def batch_evidence(
    config: NominalConfig, blocks: LabelBlocks, n_workers: int, gold: IntArray | None = None
) -> tuple[FloatArray, FloatArray]:
    """The prequential evidence (eq. 22) for a batch EM fit. It scores each answer before the
    model has seen it, which a fit on every answer cannot do: it comes from one online pass
    over ``blocks`` in their order, with exact workers. Also each block's posterior as that
    pass learned it."""
    online = OnlineEM(config.with_(n_worker_slots=max(n_workers, 1)))
    learned = online.learn_many(blocks, known=gold)
    assert online.params.evidence is not None  # learn_many keeps it
    return online.params.evidence, learned.posteriors


def batch_calibration(
    config: NominalConfig,
    params: NominalParams,
    blocks: LabelBlocks,
    n_workers: int,
    gold: IntArray | None = None,
    held_out: FloatArray | None = None,
) -> Calibration:
    """``calibration`` of a batch EM fit, with ``batch_evidence``."""
    evidence = batch_evidence(config, blocks, n_workers, gold)[0]
    return calibration(params, blocks, evidence, gold, held_out)


def served_posteriors(
    params: NominalParams,
    blocks: LabelBlocks,
    cal: Calibration,
    gold: IntArray | None = None,
    held_out: FloatArray | None = None,
) -> FloatArray:
    """Eq. 21 for every block under ``params``; a gold item (``gold[b]`` >= 0) is certain.
    ``held_out``: the blocks' c_i when ``params`` were fitted to them (batch EM, refinement
    sweeps; ``held_out_corrections``): each block is then scored without its own pull on the
    slots it shares (eq. 26)."""
    ell, n = log_likelihoods(params, blocks)
    if held_out is not None:
        ell -= held_out
    out = cal.from_log_likelihood(ell, n, log_prior(params))
    if gold is not None:
        has = gold >= 0
        out[has] = np.eye(out.shape[1])[gold[has]]
    return out


def subset(blocks: LabelBlocks, which: IntArray) -> LabelBlocks:
    """The blocks ``which``, in that order."""
    sizes = blocks.sizes()[which]
    ptr = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    starts = np.repeat(blocks.ptr[:-1][which] - ptr[:-1], sizes)
    take = (np.arange(int(ptr[-1])) + starts).astype(np.int64)
    return LabelBlocks(ptr, blocks.slots[take], blocks.labels[take], blocks.weights[take])
