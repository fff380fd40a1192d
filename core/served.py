"""What a fitted model serves: calibrated posteriors (docs/model.md, eq. 21-25).

``core.calibration`` has the math on arrays; this module applies it to the online and batch
models' parameters and label blocks.
"""

from __future__ import annotations

import numpy as np

from core.blocks import FloatArray, IntArray, LabelBlocks
from core.calibration import Calibration, choose, gold_evidence, item_log_likelihoods
from core.nominal import SCALE, NominalConfig, NominalParams
from core.online import OnlineEM


def log_likelihoods(params: NominalParams, blocks: LabelBlocks) -> tuple[FloatArray, FloatArray]:
    """(l_i, n_i) per block under ``params``: sum_j h_j log p(l_j | z, s_j) and sum_j h_j."""
    return item_log_likelihoods(
        blocks.ptr, blocks.slots, blocks.labels, blocks.weights,
        params.population, params.worker, float(params.scalars[SCALE]),
    )  # fmt: skip


def log_prior(params: NominalParams) -> FloatArray:
    """log pi, the class prior of ``params``."""
    out: FloatArray = params.class_logits - np.logaddexp.reduce(params.class_logits)
    return out


def calibration(
    params: NominalParams,
    blocks: LabelBlocks,
    evidence: FloatArray | None,
    gold: IntArray | None = None,
) -> Calibration:
    """Eq. 24: rho from the prequential ``evidence``; eps from its prior and the gold items
    among ``blocks`` (``gold[b]`` >= 0), each scored from its answers alone."""
    if gold is None or not np.any(gold >= 0):
        return choose(evidence)
    has = np.flatnonzero(gold >= 0)
    ell, n = log_likelihoods(params, subset(blocks, has))
    return choose(evidence, gold_evidence(ell, n, log_prior(params), gold[has]), int(has.size))


def online_calibration(
    model: OnlineEM, blocks: LabelBlocks, gold: IntArray | None = None
) -> Calibration:
    """``calibration`` with the evidence the online model gathered while it learned."""
    return calibration(model.params, blocks, model.params.evidence, gold)


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
) -> Calibration:
    """``calibration`` of a batch EM fit, with ``batch_evidence``."""
    return calibration(params, blocks, batch_evidence(config, blocks, n_workers, gold)[0], gold)


def served_posteriors(
    params: NominalParams,
    blocks: LabelBlocks,
    cal: Calibration,
    gold: IntArray | None = None,
) -> FloatArray:
    """Eq. 21 for every block under ``params``; a gold item (``gold[b]`` >= 0) is certain."""
    ell, n = log_likelihoods(params, blocks)
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
