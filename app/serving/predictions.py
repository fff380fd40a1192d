"""Predicted answers of (worker, item) pairs, from the dyadic rows the engine published.

The API reads only the rows of the pairs asked about (one consistent store read) and runs the
core model over them (``DyadicModel.from_rows``): the same numbers the engine's whole model
gives. A slot the engine never trained is at its initial value, computed, not read.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from app.engine.dyadic import SERVICE_DEFAULTS, DyadicSettings
from app.store.base import Store
from core.dyadic import (
    RATER,
    TASK,
    DyadicConfig,
    DyadicModel,
    dyadic_ids,
    initial_rows,
    runner_up,
)

MAX_PAIRS = 10_000
F64 = npt.NDArray[np.float64]


@dataclass(frozen=True)
class PairPredictions:
    position: int
    labels: npt.NDArray[np.int64]
    scores: F64
    """(n, n_classes)"""
    h_min: F64
    """inf where no weight flips the prediction"""
    trained: npt.NDArray[np.bool_]


def predict_pairs(
    store: Store, project: str, settings: DyadicSettings, workers: list[str], items: list[str]
) -> PairPredictions:
    cfg = settings.config
    r_slots, r_local = np.unique(np.mod(dyadic_ids(workers), cfg.rater_slots), return_inverse=True)
    t_slots, t_local = np.unique(np.mod(dyadic_ids(items), cfg.task_slots), return_inverse=True)
    position, shared, r_rows, t_rows = store.get_dyadic(project, r_slots.tolist(), t_slots.tolist())
    model = DyadicModel.from_rows(
        cfg,
        np.frombuffer(shared) if shared else np.zeros(2 * cfg.n_scorers + 1),
        _rows(cfg, RATER, r_slots, r_rows),
        _rows(cfg, TASK, t_slots, t_rows),
    )
    r_local, t_local = r_local.ravel(), t_local.ravel()
    labels, scores = model.predict(r_local, t_local)
    h_min = model.h_min(r_local, t_local, target=runner_up(scores))  # the scores, not again
    trained = _present(r_rows)[r_local] & _present(t_rows)[t_local]
    return PairPredictions(position, labels, scores, h_min, trained)


def warm_up() -> None:
    """Load the dyadic kernels now, not on the first prediction."""
    cfg = replace(SERVICE_DEFAULTS, n_classes=3, rater_slots=1, task_slots=1)
    model = DyadicModel.from_rows(cfg, np.zeros(2 * cfg.n_scorers + 1), *(
        initial_rows(cfg, table, np.zeros(1, dtype=np.int64)) for table in (RATER, TASK)
    ))  # fmt: skip
    none = np.zeros(1, dtype=np.int64)
    model.predict(none, none)
    model.h_min(none, none)


def _rows(
    cfg: DyadicConfig, table: str, slots: npt.NDArray[np.int64], blobs: list[bytes | None]
) -> F64:
    out = initial_rows(cfg, table, slots)
    for n, b in enumerate(blobs):
        if b is not None:
            out[n] = np.frombuffer(b)
    return out


def _present(blobs: list[bytes | None]) -> npt.NDArray[np.bool_]:
    return np.array([b is not None for b in blobs], dtype=np.bool_)
