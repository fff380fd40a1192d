"""The calibration report of a project with gold: how its served posteriors score on the
items whose answer is known, each item scored by a calibration fitted without its own gold
(docs/model.md eq. 24, "The calibration report")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from app.serving.nominal import Globals, item_slots, slot_rows
from app.store.base import Store
from core.blocks import FloatArray
from core.calibration import (
    Calibration,
    Reliability,
    cross_fitted,
    item_log_likelihoods,
    reliability,
)
from core.nominal import NominalConfig

FOLDS = 5


@dataclass(frozen=True)
class CalibrationReport:
    calibration: Calibration
    """The calibration the project serves with now (fitted with all its gold)."""
    scores: Reliability
    """Accuracy, ECE, NLL, Brier and bins on the gold items, cross-fitted over FOLDS folds."""
    position: int
    computed_at: float


def calibration_report(store: Store, project: str, config: NominalConfig) -> CalibrationReport:
    """Scan the project's items for gold, score each gold item's served posterior computed
    from its answers alone under the current parameters, calibrated without its own gold."""
    gblob, _ = store.get_params(project, [])
    g = Globals.parse(gblob, config)
    names, labels, gold = [], [], []
    cursor = 0
    while True:
        cursor, page = store.scan_items(project, cursor, 2000)
        for name, blob in page:
            d = orjson.loads(blob)
            if d.get("gold") is not None and d["labels"]:
                names.append(name)
                labels.append(d)
                gold.append(int(d["gold"]))
        if cursor == 0:
            break
    order = np.argsort(names, kind="stable")  # folds by item name: the same on every read
    ell, n = _log_likelihoods([labels[i] for i in order.tolist()], g, store, project, config)
    truth = np.asarray(gold, dtype=np.int64)[order]
    log_prior = g.class_logits - np.logaddexp.reduce(g.class_logits)
    served = cross_fitted(ell, n, log_prior, truth, g.evidence, FOLDS)
    return CalibrationReport(g.calibration, reliability(served, truth), g.position, g.computed_at)


def _log_likelihoods(
    items: list[dict[str, Any]], g: Globals, store: Store, project: str, config: NominalConfig
) -> tuple[FloatArray, FloatArray]:
    """l_i and n_i of each item from its answers, under the slots' current rows."""
    K = config.n_classes
    slot_index: dict[int, int] = {}
    ptr: list[int] = [0]
    local: list[int] = []
    answers: list[int] = []
    weights: list[float] = []
    for d in items:
        slots, idx = item_slots(d, config.n_worker_slots)
        local.extend(slot_index.setdefault(slots[k], len(slot_index)) for k in idx)
        answers.extend(z for _, z, _ in d["labels"])
        weights.extend(x for _, _, x in d["labels"])
        ptr.append(len(answers))
    _, rows = store.get_params(project, list(slot_index))
    ell, n = np.empty((len(items), K)), np.empty(len(items))
    if items:
        ell, n = item_log_likelihoods(
            np.asarray(ptr, dtype=np.int64), np.asarray(local, dtype=np.int64),
            np.asarray(answers, dtype=np.int64), np.asarray(weights, dtype=np.float64),
            g.population, slot_rows(rows, K), float(g.scalars[0]),
        )  # fmt: skip
    return ell, n
