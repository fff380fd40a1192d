"""The engine's dyadic model: what label a given worker would give a given item.

``DyadicTrainer`` trains one project's ``core.dyadic.DyadicModel`` on the project's label
stream, inside ``ProjectEngine``: each label once as it arrives (in log order), plus a pass
over every stored label at refinement sweeps while labels have had fewer than ``passes``
passes on average. Both are functions of the log, so replay is deterministic. The rows of the
slots an entry touched are published with the engine's state; the API predicts from the rows
of the pairs it is asked about (app/serving/predictions.py), never from whole tables.

Posteriors first: ``learn`` only queues the labels, with the log position of their entry, and
they are learned in the same order later: a slice at a time (``catch_up(limit)``, which the
engine loop calls when the log is drained or the queue is long), or all at once by a call that
needs the whole model (``update()``, ``sweep``, ``capture``). So the engine writes an entry's
posteriors before the dyadic model learns its labels, and the model may lag behind the
posteriors, reporting how far it has learned (``learned_through``). Queued labels use rows
already assigned, a new slot's row starts from its initial values whenever it is added, and
the kernel learns one label after another, so learning later or in slices gives the same
model, bit for bit.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from app.engine.codes import first_seen_codes
from app.engine.slot_rows import rows_by_slot
from app.store.base import DyadicUpdate
from core.blocks import CodeArray, IntArray
from core.dyadic import RATER, TASK, DyadicConfig, DyadicModel, dyadic_ids, initial_rows
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
    """A project's dyadic model, fed by ``ProjectEngine`` with dense worker and item codes.

    The model over the hashed slots is held compactly: each slot in use (a worker's or an
    item's) gets a row of ``model`` in order of first use, initialised as that slot would be
    in the whole table (``initial_rows``), so memory follows the workers and items a project
    has, not its slot counts, and learning is the same as on the whole tables."""

    def __init__(self, settings: DyadicSettings) -> None:
        self.settings = settings
        self._raters, self._tasks = _SlotRows(), _SlotRows()
        self.model = _compact(settings.config, 0, 0)
        self.rater_rows = np.empty(0, dtype=np.int64)  # per worker code: its row
        self.task_rows = np.empty(0, dtype=np.int64)  # per item code
        self.n_raters = 0
        self.n_tasks = 0
        self.examples = 0
        """Labels given to the model, sweeps included, queued ones too (the sweep rule's
        counter: a function of the log position alone, whenever they are learned)."""
        self._queued: deque[_Queued] = deque()
        self.backlog = 0
        """Labels given to ``learn`` and not learned yet."""
        self._swept = 0
        """Of those, how many are the last sweep's or came before them (``sweep_backlog``)."""
        self._dirty_raters: list[IntArray] = []  # rows
        self._dirty_tasks: list[IntArray] = []

    @property
    def config(self) -> DyadicConfig:
        return self.settings.config

    def add_workers(self, names: list[str]) -> None:
        rows = self._rows_for(RATER, names)
        self.rater_rows, self.n_raters = _append(self.rater_rows, self.n_raters, rows)

    def add_items(self, names: list[str]) -> None:
        rows = self._rows_for(TASK, names)
        self.task_rows, self.n_tasks = _append(self.task_rows, self.n_tasks, rows)

    def _rows_for(self, table: str, names: list[str]) -> IntArray:
        """The rows of new names' slots; slots used for the first time get fresh rows."""
        if not names:
            return np.empty(0, dtype=np.int64)
        c = self.config
        slots = np.mod(dyadic_ids(names), c.rater_slots if table == RATER else c.task_slots)
        index = self._raters if table == RATER else self._tasks
        rows, new = index.assign(slots)
        if new.size:
            self._fit(self._raters.n, self._tasks.n)
            self.model.set_rows(table, new, initial_rows(c, table, index.slots[new]))
        return rows

    def _fit(self, n_raters: int, n_tasks: int) -> None:
        """Grow the compact model's tables (doubling) to hold this many rows."""
        m = self.model.config
        if n_raters <= m.rater_slots and n_tasks <= m.task_slots:
            return
        r = m.rater_slots if n_raters <= m.rater_slots else max(n_raters, 2 * m.rater_slots)
        t = m.task_slots if n_tasks <= m.task_slots else max(n_tasks, 2 * m.task_slots)
        self.model = self.model.with_room(r, t)  # (``_rows_for`` sets the rows it gives out)

    def learn(
        self,
        worker_codes: CodeArray,
        item_codes: CodeArray,
        labels: CodeArray,
        weights: npt.NDArray[np.float64],
        position: int = 0,
    ) -> None:
        """Queue one update per label, in the given (log) order; ``position``: the log entry's.
        Codes of any integer type; the labels are queued as int64 (the learning kernel is
        compiled for that one type: the label table's int32 codes as well as an entry's)."""
        raters, tasks = self.rater_rows[worker_codes], self.task_rows[item_codes]
        queued = np.asarray(labels, dtype=np.int64)
        self._queued.append(_Queued(position, raters, tasks, queued, weights))
        self.examples += labels.size
        self.backlog += labels.size

    def catch_up(self, limit: int | None = None) -> int:
        """Learn the queued labels in order: all of them, or the oldest ``limit``; returns how
        many it learned."""
        todo = self.backlog if limit is None else min(limit, self.backlog)
        left = todo
        while left > 0:
            head = self._queued[0]
            if head.labels.size > left:  # learn its first labels, queue the rest
                self._queued[0], head = head.split(left)
            else:
                self._queued.popleft()
            self.model.learn_many(head.raters, head.tasks, head.labels, head.weights)
            self._dirty_raters.append(head.raters)  # (made unique once, when published)
            self._dirty_tasks.append(head.tasks)
            left -= head.labels.size
        self.backlog -= todo
        self._swept = max(self._swept - todo, 0)
        return todo

    @property
    def sweep_backlog(self) -> int:
        """Queued labels up to the end of the last sweep's: a sweep queues every stored label
        at once, and these are learned a slice at a time (the queue's bound leaves them out)."""
        return self._swept

    @property
    def unpublished(self) -> bool:
        """Labels queued, or rows changed since the last ``update``."""
        return bool(self.backlog or self._dirty_raters or self._dirty_tasks)

    def learned_through(self, position: int) -> int:
        """The log position up to which every label is learned, ``position`` being the
        engine's (all of them learned)."""
        return self._queued[0].position - 1 if self._queued else position

    def wants_sweep(self, stored: ItemLabels) -> bool:
        """Labels have had fewer than ``passes`` passes on average (queued ones counted)."""
        return stored.n_labels > 0 and self.examples < self.settings.passes * stored.n_labels

    def sweep(self, stored: ItemLabels, position: int) -> bool:
        """A pass over every stored label, in stored order, if ``wants_sweep`` (True then):
        queued behind the labels waiting, and learned with them, a slice at a time, never in
        the step that applies the sweep's entry (at ``position``)."""
        n = stored.n_labels
        if not self.wants_sweep(stored):
            return False
        self.learn(
            stored.worker[:n], stored.item[:n], stored.label[:n], stored.weight[:n], position
        )
        self._swept = self.backlog
        return True

    def mark_all_dirty(self) -> None:
        self._dirty_raters = [np.arange(self._raters.n, dtype=np.int64)]
        self._dirty_tasks = [np.arange(self._tasks.n, dtype=np.int64)]

    def update(self, position: int, limit: int | None = None) -> DyadicUpdate:
        """The rows changed since the last call, by slot (and the shared parameters), once
        the queued labels are learned (all, or the oldest ``limit``); ``position``: the
        engine's."""
        self.catch_up(limit)
        raters = self._published(RATER, self._raters, self._dirty_raters)
        tasks = self._published(TASK, self._tasks, self._dirty_tasks)
        self._dirty_raters, self._dirty_tasks = [], []
        shared = self.model.shared().tobytes()
        return DyadicUpdate(raters, tasks, shared, self.learned_through(position))

    def _published(self, table: str, index: _SlotRows, dirty: list[IntArray]) -> dict[int, bytes]:
        if not dirty:
            return {}
        rows = np.unique(np.concatenate(dirty))
        return rows_by_slot(index.slots[rows], self.model.rows(table, rows))

    def hashed_model(self) -> DyadicModel:
        """The model over every hashed slot, as the API's rows describe it (allocates the
        whole tables: for checks and comparisons, not for serving)."""
        self.catch_up()
        full = DyadicModel(self.config)
        for table, index in ((RATER, self._raters), (TASK, self._tasks)):
            rows = np.arange(index.n, dtype=np.int64)
            full.set_rows(table, index.slots[rows], self.model.rows(table, rows))
        full.set_shared(self.model.shared())
        return full

    # ------------------------------------------------------------------ snapshots
    def capture(self) -> DyadicCapture:
        """Copies of the learned state and the queued labels as they are (plain copies: the
        engine thread's stall). Nothing is learned here: a snapshot taken while the model
        lags keeps its queue, and the restored model learns it as this one will."""
        return DyadicCapture(
            self.model.config,
            self.model.arrays(),
            self._raters.slots[: self._raters.n].copy(),
            self._tasks.slots[: self._tasks.n].copy(),
            self.examples,
            tuple(self._queued),
            self._swept,
        )

    def restore(self, arrays: Any) -> None:
        """The inverse of ``capture``, once the engine has re-added workers and items by name
        (which gives every slot its row again)."""
        row_now: list[IntArray] = []  # per table: the row now of each row then
        for table, index, slots, rows in (
            (RATER, self._raters, arrays["dyadic_rater_slots"], arrays["dyadic_rater_rows"]),
            (TASK, self._tasks, arrays["dyadic_task_slots"], arrays["dyadic_task_rows"]),
        ):
            at, _ = index.assign(np.asarray(slots, dtype=np.int64))
            self._fit(self._raters.n, self._tasks.n)
            self.model.set_rows(table, at, np.asarray(rows, dtype=np.float64))
            row_now.append(at)
        self.model.set_shared(np.asarray(arrays["dyadic_shared"], dtype=np.float64))
        self.examples = int(arrays["dyadic_examples"][0])
        if "dyadic_queue_runs" in arrays:  # (older snapshots: learned through their position)
            self._restore_queue(arrays, *row_now)

    def _restore_queue(self, arrays: Any, rater_row: IntArray, task_row: IntArray) -> None:
        """The queued labels of ``DyadicCapture.pack``, each on its rows as restored."""
        raters = rater_row[np.asarray(arrays["dyadic_queue_raters"], dtype=np.int64)]
        tasks = task_row[np.asarray(arrays["dyadic_queue_tasks"], dtype=np.int64)]
        labels = np.asarray(arrays["dyadic_queue_labels"], dtype=np.int64)
        weights = np.asarray(arrays["dyadic_queue_weights"], dtype=np.float64)
        runs = np.asarray(arrays["dyadic_queue_runs"], dtype=np.int64).reshape(-1, 2)
        ends = np.cumsum(runs[:, 1]).tolist()
        starts = [0, *ends[:-1]] if ends else []
        for position, lo, hi in zip(runs[:, 0].tolist(), starts, ends, strict=True):
            self._queued.append(
                _Queued(position, raters[lo:hi], tasks[lo:hi], labels[lo:hi], weights[lo:hi])
            )
        self.backlog = int(ends[-1]) if ends else 0
        self._swept = int(arrays["dyadic_queue_swept"][0]) if "dyadic_queue_swept" in arrays else 0


class _SlotRows:
    """One table's hashed slots in use, each given a row of the compact model in order of
    first use."""

    def __init__(self) -> None:
        self._row_of: dict[int, int] = {}
        self.slots = np.empty(0, dtype=np.int64)  # the slot of each row

    @property
    def n(self) -> int:
        return len(self._row_of)

    def assign(self, slots: IntArray) -> tuple[IntArray, IntArray]:
        """The row of each of ``slots`` (once per new worker or item, not per label) and the
        rows given out by this call: slots seen for the first time get the next rows, in
        the order they first appear."""
        first = self.n
        rows, new = first_seen_codes(self._row_of, slots.tolist())
        if new:
            if self.n > self.slots.size:
                self.slots = grow(self.slots, max(self.n, 2 * self.slots.size, 64), -1)
            self.slots[first : self.n] = new
        return rows, np.arange(first, self.n, dtype=np.int64)


@dataclass(frozen=True)
class _Queued:
    """Labels of one log entry waiting to be learned (rows, not codes)."""

    position: int
    raters: IntArray
    tasks: IntArray
    labels: IntArray
    weights: npt.NDArray[np.float64]

    def split(self, n: int) -> tuple[_Queued, _Queued]:
        """(the labels after the first ``n``, the first ``n``)."""
        p, r, t, y, w = self.position, self.raters, self.tasks, self.labels, self.weights
        return _Queued(p, r[n:], t[n:], y[n:], w[n:]), _Queued(p, r[:n], t[:n], y[:n], w[:n])


def _compact(config: DyadicConfig, raters: int, tasks: int) -> DyadicModel:
    """A model with room for this many rows per table (at least 64)."""
    return DyadicModel(replace(config, rater_slots=max(raters, 64), task_slots=max(tasks, 64)))


@dataclass
class DyadicCapture:
    config: DyadicConfig
    """The compact model's: its tables have a row per slot in use (and room to spare)."""
    tables: dict[str, npt.NDArray[np.float64]]
    rater_slots: IntArray
    """The slot of each rater row in use."""
    task_slots: IntArray
    examples: int
    queued: tuple[_Queued, ...] = ()
    """The labels not learned yet, in order (their arrays are never written to)."""
    swept: int = 0
    """``DyadicTrainer.sweep_backlog``."""

    def pack(self) -> dict[str, npt.NDArray[Any]]:
        """The snapshot's arrays: the rows of the slots in use (the rest is the initial model)
        and the queued labels, each with its rater's and task's row (in the order of the
        slots above)."""
        model = DyadicModel.from_arrays(self.config, self.tables)
        r = np.arange(self.rater_slots.size, dtype=np.int64)
        t = np.arange(self.task_slots.size, dtype=np.int64)
        q = self.queued
        return {
            "dyadic_rater_slots": self.rater_slots,
            "dyadic_rater_rows": model.rows(RATER, r),
            "dyadic_task_slots": self.task_slots,
            "dyadic_task_rows": model.rows(TASK, t),
            "dyadic_shared": model.shared(),
            "dyadic_examples": np.array([self.examples], dtype=np.int64),
            "dyadic_queue_raters": _joined([x.raters for x in q], np.int64),  # (rows)
            "dyadic_queue_tasks": _joined([x.tasks for x in q], np.int64),
            "dyadic_queue_labels": _joined([x.labels for x in q], np.int64),
            "dyadic_queue_weights": _joined([x.weights for x in q], np.float64),
            "dyadic_queue_swept": np.array([self.swept], dtype=np.int64),
            "dyadic_queue_runs": np.array(
                [(x.position, x.labels.size) for x in q], dtype=np.int64
            ).reshape(-1, 2),
        }


def _joined(parts: list[npt.NDArray[Any]], dtype: type) -> npt.NDArray[Any]:
    return np.concatenate(parts).astype(dtype, copy=False) if parts else np.empty(0, dtype)


def _append(codes: IntArray, n: int, rows: IntArray) -> tuple[IntArray, int]:
    if not rows.size:
        return codes, n
    need = n + rows.size
    if need > codes.size:
        codes = grow(codes, max(need, 2 * codes.size, 1024), 0)
    codes[n:need] = rows
    return codes, need


def settings_for(n_classes: int, **fields: Any) -> DyadicSettings:
    """Settings for a project of ``n_classes`` labels (the API's defaults filled in)."""
    passes = int(fields.pop("passes", DEFAULT_PASSES))
    base = ORDINAL_DEFAULTS if fields.get("ordinal") else SERVICE_DEFAULTS
    given = {name: v for name, v in fields.items() if v is not None}
    return DyadicSettings(replace(base, n_classes=n_classes, **given), passes)
