"""Every numba kernel that the service and ``crowdtally extract`` call, compiled into numba's
on-disk cache from ``core`` alone (numpy and numba, no other dependency).

The install runs this (the build backend in ``build_backend/``, in pip's build environment,
before the service's dependencies are installed), so that the first ``crowdtally serve``
loads compiled kernels instead of compiling them. Each kernel is reached through the
functions the service calls, with the same argument types, so the signatures cached are the
ones used: tests/core/test_warmup.py checks that the service's own warm-up and ``extract``
compile nothing more afterwards. ``nominal`` and ``dyadic`` share little: the install runs
them in two processes at once.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from core.acquisition import value_of_information
from core.batch import BatchEM, into_slots
from core.blocks import LabelBlocks
from core.dyadic import RATER, TASK, DyadicConfig, DyadicModel, initial_rows, runner_up
from core.itemlabels import ItemLabels
from core.nominal import NominalConfig, NominalParams
from core.online import BlockResult, OnlineEM, statistics_from
from core.served import calibration, log_likelihoods

_K = 3
_ITEMS = np.array([0, 0, 0, 1, 1, 2, 2, 2, 3], dtype=np.int64)
_WORKERS = np.array([0, 1, 2, 0, 1, 1, 2, 3, 0], dtype=np.int64)
_LABELS = np.array([0, 0, 1, 2, 2, 1, 1, 0, 2], dtype=np.int64)
_N_ITEMS, _N_WORKERS = 4, 4


def _stored() -> ItemLabels:
    stored = ItemLabels()
    stored.add_items(_N_ITEMS)
    weights = np.ones(_LABELS.size)
    stored.append(_ITEMS, _WORKERS, _LABELS, weights, _WORKERS)
    return stored


def nominal(difficulty: bool = True) -> None:
    """The online model's arrivals, revisits, Newton sweeps and reads; batch EM with its
    mapping into slots; the served calibration, its log-likelihoods and the queue's value of
    information (and the same with per-item clarity, as ``extract --difficulty`` runs it)."""
    config = NominalConfig(n_classes=_K, n_worker_slots=16)
    stored = _stored()
    blocks, pos = stored.gather(np.arange(_N_ITEMS, dtype=np.int64))
    known = np.full(_N_ITEMS, -1, dtype=np.int64)
    online = OnlineEM(config)
    empty = BlockResult(np.zeros((_N_ITEMS, _K)), np.ones(_N_ITEMS), np.zeros(_N_ITEMS))
    learned = online.learn_many(
        blocks, previous=empty, n_previous=np.zeros(_N_ITEMS, dtype=np.int64), known=known
    )
    online.revisit_many(blocks, learned, known=known)
    online.learn_many(blocks, order=np.arange(_N_ITEMS, dtype=np.int64), out=learned)
    online.refine(blocks, 2, known=known)
    online.predict_many(blocks, known=known)
    exact = LabelBlocks(blocks.ptr, stored.worker[pos], blocks.labels, blocks.weights)
    fitted, params = BatchEM(config).fit(exact, _N_WORKERS, known=known)
    counts = np.ones(_N_WORKERS)
    mapped = into_slots(params, np.arange(_N_WORKERS, dtype=np.int64), counts, 16, 1.0)
    statistics_from(mapped, blocks, fitted.probas)
    p = online.params
    no_blocks = LabelBlocks.group([], [], [])
    calibration(p, no_blocks, p.evidence)
    gold = np.array([2], dtype=np.int64)
    served = calibration(p, stored.gather(np.array([3], dtype=np.int64))[0], p.evidence, gold)
    served.from_posteriors(learned.posteriors, stored.count[:_N_ITEMS].astype(np.float64))
    log_likelihoods(NominalParams.initial(config), blocks)
    value_of_information(np.full((2, _K), 1.0 / _K), np.eye(_K))
    if difficulty:
        BatchEM(config.with_(difficulty=True)).fit(exact, _N_WORKERS)


def dyadic() -> None:
    """The dyadic model's learning (per label and in sweeps over the stored labels),
    predictions and h_min, nominal and ordinal, on compact tables as the engine holds them."""
    for ordinal in (False, True):
        loss = "quantile" if ordinal else "hinge"
        config = DyadicConfig(_K, loss=loss, ordinal=ordinal, rater_slots=8, task_slots=8)
        model = DyadicModel(config)
        rows = np.arange(_N_WORKERS, dtype=np.int64)
        model.set_rows(RATER, rows, initial_rows(config, RATER, rows))
        model.set_rows(TASK, rows, initial_rows(config, TASK, rows))
        stored = _stored()
        n = stored.n_labels
        model.learn_many(stored.worker[:n], stored.item[:n], stored.label[:n], stored.weight[:n])
        one = np.zeros(1, dtype=np.int64)
        served = DyadicModel.from_rows(
            replace(config, rater_slots=1, task_slots=1),
            model.shared(),
            model.rows(RATER, one),
            model.rows(TASK, one),
        )
        _, scores = served.predict(one, one)
        served.h_min(one, one, target=runner_up(scores))


def everything() -> None:
    """Both halves here, one after the other."""
    nominal()
    dyadic()
