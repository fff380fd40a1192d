"""The engine's dyadic model: what label a given worker would give a given item (issue 5).

``DyadicTrainer`` trains one project's ``core.dyadic.DyadicModel`` on the project's label
stream, inside ``ProjectEngine``: each label once as it arrives (in log order), plus a pass
over every stored label at refinement sweeps while labels have had fewer than ``passes``
passes on average. Both are functions of the log, so replay is deterministic. The rows of the
slots an entry touched are published with the engine's state; the API predicts from the rows
of the pairs it is asked about (app/serving/predictions.py), never from whole tables.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from app.store.base import DyadicUpdate
from core.blocks import IntArray
from core.dyadic import RATER, TASK, DyadicConfig, DyadicModel, dyadic_ids
from core.itemlabels import ItemLabels, grow

# The service's defaults (docs/predictions.md), chosen on validation parts held out of the
# training parts of dog, face, product and duck (one learning rate for all): hinge loss keeps
# h_min in closed form (about 25x faster than logistic loss with l2, whose h_min is found on
# the integrated flow), so the boundary listing stays interactive.
SERVICE_DEFAULTS = DyadicConfig(k=2, loss="hinge", l2=0.2, eta=0.3, dyadic_rate=1.0)
# Ordinal labels (τ-quantile loss), chosen the same way on web and trec2010 (l2 = 0.2 cost
# 0.03 in validation 0.5-quantile loss there).
ORDINAL_DEFAULTS = DyadicConfig(
    k=1, loss="quantile", ordinal=True, l2=0.05, eta=0.5, dyadic_rate=1.0
)
DEFAULT_PASSES = 30


@dataclass(frozen=True)
class DyadicSettings:
    """A project's dyadic model: its core config and how many passes each label gets."""

    config: DyadicConfig
    passes: int = DEFAULT_PASSES

    def to_dict(self) -> dict[str, Any]:
        return {"passes": self.passes, **self.config.to_dict()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DyadicSettings:
        d = dict(d)
        passes = int(d.pop("passes", DEFAULT_PASSES))
        return cls(DyadicConfig.from_dict(d), passes)  # stored: complete, whatever the defaults

    @classmethod
    def of(cls, project_config: dict[str, Any]) -> DyadicSettings | None:
        """The settings stored with a project (None: the project has no dyadic model)."""
        d = project_config.get("dyadic")
        return None if d is None else cls.from_dict(d)


class DyadicTrainer:
    """A project's dyadic model, fed by ``ProjectEngine`` with dense worker and item codes."""

    def __init__(self, settings: DyadicSettings) -> None:
        self.settings = settings
        self.model = DyadicModel(settings.config)
        self.rater_ids = np.empty(0, dtype=np.int64)  # per worker code: its dyadic id
        self.task_ids = np.empty(0, dtype=np.int64)  # per item code
        self.n_raters = 0
        self.n_tasks = 0
        self.examples = 0  # labels learned, sweeps included (the sweep rule's counter)
        self.rater_touched = np.zeros(settings.config.rater_slots, dtype=np.bool_)
        self.task_touched = np.zeros(settings.config.task_slots, dtype=np.bool_)
        self._dirty_raters: list[IntArray] = []
        self._dirty_tasks: list[IntArray] = []

    @property
    def config(self) -> DyadicConfig:
        return self.settings.config

    def add_workers(self, names: list[str]) -> None:
        self.rater_ids, self.n_raters = _append(self.rater_ids, self.n_raters, names)

    def add_items(self, names: list[str]) -> None:
        self.task_ids, self.n_tasks = _append(self.task_ids, self.n_tasks, names)

    def learn(
        self,
        worker_codes: IntArray,
        item_codes: IntArray,
        labels: IntArray,
        weights: npt.NDArray[np.float64],
    ) -> None:
        """One update per label, in the given (log) order."""
        raters, tasks = self.rater_ids[worker_codes], self.task_ids[item_codes]
        self.model.learn_many(raters, tasks, labels, weights)
        self.examples += labels.size
        self._touch(raters, tasks)

    def wants_sweep(self, stored: ItemLabels) -> bool:
        """Labels have had fewer than ``passes`` passes on average."""
        return stored.n_labels > 0 and self.examples < self.settings.passes * stored.n_labels

    def sweep(self, stored: ItemLabels) -> bool:
        """A pass over every stored label, in stored order, if ``wants_sweep``; True if it ran."""
        n = stored.n_labels
        if not self.wants_sweep(stored):
            return False
        self.learn(stored.worker[:n], stored.item[:n], stored.label[:n], stored.weight[:n])
        return True

    def _touch(self, raters: IntArray, tasks: IntArray) -> None:
        r = np.unique(np.mod(raters, self.config.rater_slots))
        t = np.unique(np.mod(tasks, self.config.task_slots))
        self.rater_touched[r] = True
        self.task_touched[t] = True
        self._dirty_raters.append(r)
        self._dirty_tasks.append(t)

    def mark_all_dirty(self) -> None:
        self._dirty_raters = [np.flatnonzero(self.rater_touched)]
        self._dirty_tasks = [np.flatnonzero(self.task_touched)]

    def update(self) -> DyadicUpdate:
        """The rows changed since the last call (and the shared parameters)."""
        raters = _rows(self.model, RATER, self._dirty_raters)
        tasks = _rows(self.model, TASK, self._dirty_tasks)
        self._dirty_raters, self._dirty_tasks = [], []
        return DyadicUpdate(raters, tasks, self.model.shared().tobytes())

    # ------------------------------------------------------------------ snapshots
    def capture(self) -> DyadicCapture:
        """Copies of the learned state (plain copies: the engine thread's stall)."""
        return DyadicCapture(
            self.config,
            self.model.arrays(),
            self.rater_touched.copy(),
            self.task_touched.copy(),
            self.examples,
        )

    def restore(self, arrays: Any) -> None:
        """The inverse of ``capture`` (the engine re-adds workers and items by name)."""
        r, t = arrays["dyadic_rater_slots"], arrays["dyadic_task_slots"]
        self.model.set_rows(RATER, r, arrays["dyadic_rater_rows"])
        self.model.set_rows(TASK, t, arrays["dyadic_task_rows"])
        self.model.set_shared(arrays["dyadic_shared"])
        self.rater_touched[r] = True
        self.task_touched[t] = True
        self.examples = int(arrays["dyadic_examples"][0])


@dataclass
class DyadicCapture:
    config: DyadicConfig
    tables: dict[str, npt.NDArray[np.float64]]
    rater_touched: npt.NDArray[np.bool_]
    task_touched: npt.NDArray[np.bool_]
    examples: int

    def pack(self) -> dict[str, npt.NDArray[Any]]:
        """The snapshot's arrays: only touched rows (the rest is the initial model)."""
        model = DyadicModel.from_arrays(self.config, self.tables)
        r, t = np.flatnonzero(self.rater_touched), np.flatnonzero(self.task_touched)
        return {
            "dyadic_rater_slots": r,
            "dyadic_rater_rows": model.rows(RATER, r),
            "dyadic_task_slots": t,
            "dyadic_task_rows": model.rows(TASK, t),
            "dyadic_shared": model.shared(),
            "dyadic_examples": np.array([self.examples], dtype=np.int64),
        }


def _append(ids: IntArray, n: int, names: list[str]) -> tuple[IntArray, int]:
    if not names:
        return ids, n
    need = n + len(names)
    if need > ids.size:
        ids = grow(ids, max(need, 2 * ids.size, 1024), 0)
    ids[n:need] = dyadic_ids(names)
    return ids, need


def _rows(model: DyadicModel, table: str, dirty: list[IntArray]) -> dict[int, bytes]:
    if not dirty:
        return {}
    slots = np.unique(np.concatenate(dirty))
    rows = model.rows(table, slots)
    return {s: rows[n].tobytes() for n, s in enumerate(slots.tolist())}


def settings_for(n_classes: int, **fields: Any) -> DyadicSettings:
    """Settings for a project of ``n_classes`` labels (the API's defaults filled in)."""
    passes = int(fields.pop("passes", DEFAULT_PASSES))
    base = ORDINAL_DEFAULTS if fields.get("ordinal") else SERVICE_DEFAULTS
    given = {name: v for name, v in fields.items() if v is not None}
    return DyadicSettings(replace(base, n_classes=n_classes, **given), passes)
