"""One project's engine: applies its label log, in order, to the core model.

``ProjectEngine`` holds one project's model in memory (parameters, every label per item, each
item's last posterior) and turns log entries into a ``StateUpdate`` for the store. It is a pure
function of the log: replaying the same entries gives bit-identical state (refinement sweeps
and refits are log entries too, so a replay runs them at the same place).

Memory: the hashed model has ``n_worker_slots`` (S) rows of K x K parameters and as many of
statistics, S x K x K floats each (65,536 slots x 256 classes: 34 GB). The engine holds only
the rows of the slots its workers use, in the order they first appear ("rows"); the stored
labels carry their row. Every row is computed exactly as in the S-slot model (the kernels
touch the rows of a block's slots, and the one sum over rows is taken in slot order), so
``model`` (the S-slot view, for tests and tools) is bit-identical to ``core.online.OnlineEM``
fed the same stream.

``app.engine.loop.EngineLoop`` runs every project's engine against a store.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from app.engine.codes import first_seen_codes
from app.engine.dyadic import DyadicSettings, DyadicTrainer
from app.engine.groups import joined_labels, runs
from app.engine.label_lists import LabelLists
from app.engine.queue import Progress, QueueSettings, labels_to_finish
from app.engine.queue import member as queue_member
from app.engine.queue import scores as queue_scores
from app.engine.slot_rows import rows_by_slot
from app.engine.sweeps import Slice, next_slice
from app.engine.untracked import UntrackedList
from app.store.base import LogEntry, ProjectRecord, StateUpdate, nominal_config
from app.store.item_records import ItemWrites, pack, render
from core.batch import into_slots
from core.blocks import FloatArray, IntArray, LabelBlocks, canonical_order
from core.calibration import Calibration
from core.dyadic import DyadicModel
from core.hashing import worker_slot
from core.itemlabels import ItemLabels, grow
from core.nominal import NominalParams, sums_size
from core.online import BlockResult, OnlineEM, statistics_from
from core.pooling import fit_pooled
from core.served import (
    batch_evidence,
    calibration,
    held_out_corrections,
    held_out_posteriors,
)
from core.twin import has_twin

log = logging.getLogger("crowdtally.engine")

# A refit whose labels agree with the served ones on fewer items than this is declined: where
# answers are too few for batch EM's optimum (docs/model.md, "A limit"), the two part ways.
REFIT_MIN_AGREEMENT = 0.85
TIE = 1e-9
"""Probabilities within this share of an item's largest tie with it (``refit_verdict``)."""


_NO_BLOCKS = LabelBlocks(
    np.zeros(1, dtype=np.int64),
    np.zeros(0, dtype=np.int64),
    np.zeros(0, dtype=np.int64),
    np.zeros(0),
)


class NonFiniteModelError(ArithmeticError):
    """The model's parameters or an item's posterior left the finite numbers: nothing of it
    is written, and the project stops at the state it last served (marked failed)."""


class _Codes:
    """Dense codes 0..n-1 for opaque string ids, in order of first appearance."""

    def __init__(self) -> None:
        self.code: dict[str, int] = {}
        self.names: UntrackedList[str] = UntrackedList()

    def encode(self, ids: list[str]) -> tuple[IntArray, list[str]]:
        """Codes of ``ids`` and the ids that were new, in the order they first appear."""
        codes, new = first_seen_codes(self.code, ids)
        self.names.extend(new)
        return codes, new


@dataclass
class ItemView:
    posterior: FloatArray
    n_labels: int


class ProjectEngine:
    """One project's model state, advanced one log entry at a time."""

    def __init__(self, record: ProjectRecord) -> None:
        self.record = record
        self.classes = record.labels
        self.config = nominal_config(record)
        self.K = self.config.n_classes
        # the hashed model over the rows of the slots in use (see the module's docstring)
        self.online = OnlineEM(self.config.with_(n_worker_slots=1), pooled_twin=True)
        self.slot_of_row = np.full(1, -1, dtype=np.int64)  # hashed slot of each row
        self.n_rows = 0
        self._row_of_slot: dict[int, int] = {}
        self.items = _Codes()
        self.workers = _Codes()
        self.labels = ItemLabels()
        self.label_lists = LabelLists()  # the served label lists, encoded once per label
        self._written_lists: dict[str, bytearray] = {}  # (ItemWrites.written)
        self._members: UntrackedList[str] = UntrackedList()  # the queue member of each item
        self.q = np.empty((0, self.K))  # EM's posteriors (what the statistics count, eq. 14)
        self.held_out = np.empty((0, self.K))  # c_i of eq. 26 since the last sweep or refit
        self.b = np.empty(0)
        # the pooled twin's posteriors (docs/model.md eq. 29), while it learns beside the model
        self.twin_q = np.empty((0, self.K))
        self.twin_b = np.empty(0)
        self.learned = np.empty(0, dtype=np.int64)  # labels already counted per item
        self.weight = np.empty(0)  # label weight per item (n_i of the calibration, eq. 21)
        self.calibration = Calibration()
        self.n_gold = 0  # (items with gold, as of the last calibration)
        self._queue_calibration = Calibration()  # the one the whole queue was last scored with
        self.gold = np.empty(0, dtype=np.int64)  # gold class per item, -1 if none
        self.worker_slot = np.empty(0, dtype=np.int64)
        self.worker_row = np.empty(0, dtype=np.int64)  # the row of each worker's slot
        self.worker_labels = np.empty(0, dtype=np.int64)
        self.worker_gold_seen = np.empty(0, dtype=np.int64)
        self.worker_gold_right = np.empty(0, dtype=np.int64)
        self.position = 0
        self.computed_at = time.time()
        self.queue_settings = QueueSettings()
        self.progress = Progress()
        self.em_iterations = 0  # batch EM iterations run by refits (a metric)
        self.last_refit: dict[str, object] | None = None  # the last refit's report (RefitReport)
        self.refit_worker_prior: float | None = None  # lambda_A of the adopted refit (eq. 28)
        self.refine_due = False  # labels or gold applied since the last refinement sweep began
        self.sweep: Slice | None = None  # the sweep in progress: its next unit is ``stop``
        self._queue_all = True
        self._rescore_from: int | None = None  # the next item of a re-scoring in slices
        self._budget_spent = False
        self._dirty_items: set[int] = set()
        self._dirty_workers: set[int] = set()
        self._dirty_rows: set[int] = set()
        self._all_rows = False
        dyadic = DyadicSettings.of(record.config)
        self.dyadic = DyadicTrainer(dyadic) if dyadic is not None else None

    # ---------------------------------------------------------------- applying entries
    def apply_all(self, entries: Sequence[LogEntry]) -> None:
        """Apply a log's entries, to its end, cut into runs as the engine cuts them."""
        for run in runs(entries, complete=True):
            self.apply_run(run)

    def apply(self, entry: LogEntry) -> None:
        self.apply_run((entry,))

    def apply_run(self, run: Sequence[LogEntry]) -> None:
        """Apply one run of ``app.engine.groups.runs``: one entry, or label entries that
        joined, learned as one block of labels (the first entry's position for the dyadic
        model's queue)."""
        first = run[0]
        if first.position != self.position + 1:
            raise RuntimeError(
                f"log entry {first.position} applied after {self.position}: the log has a gap"
            )
        if first.kind == "labels":
            body, keep = joined_labels(run)
            self._apply_labels(body, keep, first.position)
            self.refine_due = True
        elif len(run) > 1:
            raise RuntimeError(f"entries {first.position}-{run[-1].position}: not one run")
        else:
            self._apply_other(first)
        self.position = run[-1].position
        self.computed_at = time.time()

    def _apply_other(self, entry: LogEntry) -> None:
        """Any entry but labels."""
        body = orjson.loads(entry.payload)
        if entry.kind == "gold":
            self._apply_gold(body)
            self.refine_due = True
        elif entry.kind == "refine":
            self._apply_slice(Slice.of(body, self.items_count))
        elif entry.kind == "dyadic":  # an idle sweep of the dyadic model over every label
            if self.dyadic is not None:
                self.dyadic.sweep(self.labels, entry.position)
        elif entry.kind == "refit":
            self._refit(entry.position)
        elif entry.kind == "items":  # registered before any label: they enter the queue
            codes, new = self.items.encode([str(x) for x in body["items"]])
            self._grow_items(len(new))
            self._dirty_items.update(codes.tolist())
        elif entry.kind == "settings":
            self.queue_settings = QueueSettings(**body["queue"])
            self._queue_all = True
        # "snapshot" changes nothing: the engine loop snapshots the state it reaches

    def _apply_labels(self, body: dict[str, Any], keep: bytes, position: int) -> None:
        items = body["items"]
        workers = body["workers"]
        labels = np.asarray(body["labels"], dtype=np.int64)
        weights = np.asarray(body["weights"] or np.ones(labels.size), dtype=np.float64)
        if keep and b"0" in keep:
            mask = np.frombuffer(keep, dtype=np.uint8) == ord("1")
            items = [x for x, m in zip(items, mask, strict=True) if m]
            workers = [x for x, m in zip(workers, mask, strict=True) if m]
            labels, weights = labels[mask], weights[mask]
        if not labels.size:
            return
        item_codes, new_items = self.items.encode(items)
        worker_codes, new_workers = self.workers.encode(workers)
        self._grow_items(len(new_items))
        self._grow_workers(new_workers)
        slots = self.worker_slot[worker_codes]
        rows = self.worker_row[worker_codes]
        # One block per distinct item, in first-appearance order within the entry.
        touched, first, local = np.unique(item_codes, return_index=True, return_inverse=True)
        arrival = np.argsort(first, kind="stable")
        rank = np.empty_like(arrival)
        rank[arrival] = np.arange(arrival.size)
        touched = touched[arrival]
        # Each arrival is appended in canonical order (by slot, not by row), so replays and
        # re-orderings of a block's labels give bit-identical sums.
        order = canonical_order(rank[local.ravel()], slots, labels, weights)
        self.labels.append(
            item_codes[order], rows[order], labels[order], weights[order], worker_codes[order]
        )
        np.add.at(self.worker_labels, worker_codes, 1)
        np.add.at(self.weight, item_codes[order], weights[order])  # in the stored order
        gold = self.gold[item_codes]
        has_gold = gold >= 0
        np.add.at(self.worker_gold_seen, worker_codes[has_gold], 1)
        np.add.at(self.worker_gold_right, worker_codes[has_gold & (gold == labels)], 1)
        self._learn(touched)
        self._dirty_workers.update(worker_codes.tolist())
        if self.dyadic is not None:  # in the block's own order: what a worker answered, as sent
            self.dyadic.learn(worker_codes, item_codes, labels, weights, position)

    def _learn(self, touched: IntArray) -> None:
        blocks = self._relearn(touched, self.learned[touched])
        self.held_out[touched] = 0.0
        self.learned[touched] = blocks.sizes()
        self._dirty_items.update(touched.tolist())

    def _relearn(self, items: IntArray, n_previous: IntArray | None = None) -> LabelBlocks:
        """The items' EM again, over all their labels, from their latest results:
        ``n_previous`` labels of each already counted (None: all of them, a revisit). Notes
        the slot rows it moved; returns the items' blocks."""
        blocks, _ = self.labels.gather(items)
        previous = BlockResult(self.q[items], self.b[items], np.zeros(items.size))
        twin = (
            BlockResult(self.twin_q[items], self.twin_b[items], np.zeros(items.size))
            if self.online.twin is not None
            else None
        )
        counted = blocks.sizes() if n_previous is None else n_previous
        scale_before = self.online.params.scalars[0]
        result = self.online.learn_many(
            blocks, previous=previous, n_previous=counted, known=self.gold[items],
            twin_previous=twin,
        )  # fmt: skip
        self._follow_twin()
        if self.online.relabelled is not None:
            self._relabel(self.online.relabelled)
        self.q[items] = result.posteriors
        self.b[items] = result.clarity
        if self.online.twin_out is not None:
            self.twin_q[items] = self.online.twin_out.posteriors
            self.twin_b[items] = self.online.twin_out.clarity
        self._dirty_rows.update(np.flatnonzero(np.bincount(blocks.slots)).tolist())  # (no sort)
        if self.online.params.scalars[0] > scale_before:  # rescaled: every row changed
            self._all_rows = True
        return blocks

    def _follow_twin(self) -> None:
        """The twin's kept posteriors follow its relabelling; where the model settled on the
        twin (eq. 29), they become the model's, and every item and slot row is served anew."""
        n = self.items_count
        if (perm := self.online.twin_relabelled) is not None:
            self.twin_q[:n] = self.twin_q[:n, perm]
        if self.online.took_twin:
            self._exchange_twin()
        if self.online.twin is None:  # (settled: the twin's arrays are not needed)
            self.twin_q, self.twin_b = np.empty((0, self.K)), np.empty(0)

    def _exchange_twin(self) -> None:
        """The model's and the twin's posteriors change places (the twin leads, or is kept)."""
        n = self.items_count
        log.debug("%s: the pooled twin leads (worker prior %g)", self.record.name,
                 self.online.config.worker_prior)  # fmt: skip
        self.q, self.twin_q = self.twin_q, self.q  # (grown together: the same capacity)
        self.b, self.twin_b = self.twin_b, self.b
        self.held_out[:n] = 0.0  # (the corrections were the other model's)
        self._serve_model_anew()

    def _relabel(self, perm: IntArray) -> None:
        """The model's latent classes were relabelled (core/orientation.py): every kept
        posterior and held-out correction follows, and every slot row is written again."""
        log.warning("%s: latent classes relabelled %s", self.record.name, perm.tolist())
        n = self.items_count
        self.q[:n] = self.q[:n, perm]
        self.held_out[:n] = self.held_out[:n, perm]
        self._serve_model_anew()

    def _serve_model_anew(self) -> None:
        """The model moved as a whole (relabelled, exchanged with its twin, refitted): the
        next ``state_update`` carries every item and every used slot row."""
        self._dirty_items.update(range(self.items_count))
        self._all_rows = True

    def _apply_gold(self, body: dict[str, list[object]]) -> None:
        items = [str(x) for x in body["items"]]
        codes = np.asarray(body["labels"], dtype=np.int64)
        item_codes, new_items = self.items.encode(items)
        self._grow_items(len(new_items))
        for i, g in zip(item_codes.tolist(), codes.tolist(), strict=True):
            blocks, pos = self.labels.gather(np.array([i]))
            w = self.labels.worker[pos]
            if self.gold[i] >= 0:  # replace an earlier gold answer
                np.add.at(self.worker_gold_seen, w, -1)
                np.add.at(self.worker_gold_right, w[blocks.labels == self.gold[i]], -1)
            self.gold[i] = g
            np.add.at(self.worker_gold_seen, w, 1)
            np.add.at(self.worker_gold_right, w[blocks.labels == g], 1)
            self._dirty_workers.update(w.tolist())
            self._dirty_items.add(i)
        # Items already learned are revisited with their posterior fixed at the gold class:
        # the change of their contribution moves the workers (each label still counted once).
        learned = np.unique(item_codes[self.learned[item_codes] > 0])
        if learned.size:
            self._relearn(learned)
            self.held_out[learned] = 0.0

    # ---------------------------------------------------------------- refinement sweeps
    def _apply_slice(self, cut: Slice) -> None:
        """Units [start, stop) of a refinement sweep (``app.engine.sweeps``): revisit passes
        over items, then the round that serves them."""
        if cut.start == 0:
            self.refine_due = False  # labels from here on make another sweep due
            anchored = bool(np.any(self.gold[: self.items_count] >= 0))
            if (perm := self.online.orient(anchored)) is not None:  # (core/orientation.py)
                self._relabel(perm)
            self._follow_twin()
            if self.online.lead():  # the model that predicted the answers better (eq. 29)
                self._exchange_twin()
        for round_, lo, hi in cut.rounds():
            if round_ < cut.passes:
                self._revisit(np.arange(lo, hi, dtype=np.int64))
                continue
            # The serving round: eq. 26 takes every item's statistics, so its first unit
            # serves all the sweep's items at once; the round's slices then write them out.
            if lo == 0:
                self._serve_refined(np.arange(cut.items, dtype=np.int64))
            self._dirty_items.update(range(lo, hi))
        self.sweep = None if cut.last else cut

    def next_sweep_slice(self, passes: int, budget: int) -> Slice:
        """The next slice of the sweep in progress, or the first of a new sweep of ``passes``
        passes over the items there are: about ``budget`` labels' work."""
        at = self.sweep or Slice(passes, self.items_count, 0, 0)
        return next_slice(self.labels.count, at.passes, at.items, at.stop, budget)

    def _revisit(self, items: IntArray) -> None:
        """One more pass over these items, each label already counted (docs/model.md)."""
        self.learned[items] = self._relearn(items).sizes()

    def _serve_refined(self, items: IntArray) -> None:
        """The items 0..n-1 re-predicted under the swept parameters, each held out (eq. 26).
        Their next revisit counts from there while the statistics keep the sweep's own
        posteriors: a lag that keeps sweeps over one answer an item out of the MAP's one-class
        optimum (docs/model.md, eq. 14)."""
        blocks, _ = self.labels.gather(items)
        result = self.online.predict_many(blocks, known=self.gold[items])
        self.q[items] = result.posteriors
        self.b[items] = result.clarity
        self._hold_out(blocks)

    def _hold_out(self, blocks: LabelBlocks, refit_prior: float | None = None) -> None:
        """After a sweep or a refit the parameters are fitted to every item (``blocks``, the
        items 0..n-1): each item is served as scored by slot rows fitted without it
        (docs/model.md eq. 26; after a refit, batch EM's optimum at its worker prior
        ``refit_prior``, under the rows' Laplace predictives too, eq. 27), until its next
        labels."""
        n = blocks.n_blocks
        if n:
            params, laplace = self.online.params, refit_prior is not None
            lam = self.online.config.worker_prior if refit_prior is None else refit_prior
            self.held_out[:n] = held_out_corrections(
                params, blocks, self.q[:n], lam, laplace=laplace,
                population_precision=self.online.config.population_precision(),
            )  # fmt: skip

    def shown(self, codes: IntArray) -> FloatArray:
        """The posteriors served (before calibration) of the items ``codes``: EM's, each
        scored without its own pull on its workers' rows since the last sweep (eq. 26)."""
        return held_out_posteriors(self.q[codes], self.held_out[codes])

    def refit_verdict(self, fitted: FloatArray, position: int) -> dict[str, object]:
        """The report of a refit at ``position`` whose posteriors are ``fitted`` (by item
        code): the share of the answered items on which it keeps the served label, and whether
        that reaches REFIT_MIN_AGREEMENT (adopted) or not (declined, the served model kept).
        Classes within TIE of an item's top probability tie: either label keeps it (on
        symmetric answers, which of two equal posteriors rounds higher is not a verdict)."""
        n = self.items_count
        answered = self.weight[:n] > 0
        served = self.shown(np.arange(n, dtype=np.int64))[answered]
        fit = fitted[:n][answered]
        same = _among_top(fit, served.argmax(axis=1)) | _among_top(served, fit.argmax(axis=1))
        agreement = float(same.mean()) if same.size else 1.0
        adopted = agreement >= REFIT_MIN_AGREEMENT
        return {"position": position, "adopted": adopted, "agreement": agreement}

    def _refit(self, position: int) -> None:
        """Batch EM over every stored label (exact workers), mapped into the hashed slots;
        declined, the served model kept, when its labels agree with the served ones on fewer
        than REFIT_MIN_AGREEMENT of the items (docs/model.md, "A limit")."""
        n, nw = self.items_count, len(self.workers.names)
        if n == 0:
            return
        blocks, pos = self.labels.gather(np.arange(n, dtype=np.int64))
        exact = LabelBlocks(blocks.ptr, self.labels.worker[pos], blocks.labels, blocks.weights)
        fit = fit_pooled(self.config, exact, nw, known=self.gold[:n])  # lambda_A by eq. 28
        fitted, params = fit.result, fit.params
        self.em_iterations += fitted.n_iter
        self.last_refit = self.refit_verdict(fitted.probas, position)
        if not self.last_refit["adopted"]:
            return
        counts = self.worker_labels[:nw].astype(np.float64)
        step = float(self.online.params.scalars[1])
        capacity = self.slot_of_row.size
        mapped = into_slots(params, self.worker_row[:nw], counts, capacity, step)
        statistics_from(mapped, blocks, fitted.probas)  # later revisits continue from them
        # the worker table's sum over the rows in slot order, as over the S slots
        by_slot = np.argsort(self.slot_of_row[: self.n_rows], kind="stable")
        assert mapped.sums is not None
        mapped.sums[: self.K * self.K] = mapped.worker[by_slot].sum(axis=0).ravel()
        if fit.config.worker_prior == self.online.config.worker_prior:  # the stream's (eq. 22)
            mapped.evidence = self.online.params.evidence
        else:  # one pass's at the prior chosen (eq. 28), as for batch EM in extract
            mapped.evidence = batch_evidence(fit.config, exact, nw, self.gold[:n])[0]
        self.online.params = mapped
        self.online.drop_twin()  # (the refit chose the pooling, eq. 28)
        self._follow_twin()
        self.q[:n] = fitted.probas
        self.b[:n] = np.log(fitted.clarity) if fitted.clarity is not None else 0.0
        self.refit_worker_prior = fit.config.worker_prior
        self._hold_out(blocks, refit_prior=self.refit_worker_prior)
        self._serve_model_anew()

    # ---------------------------------------------------------------- growing arrays
    def wants_dyadic_sweep(self) -> bool:
        return self.dyadic is not None and self.dyadic.wants_sweep(self.labels)

    @property
    def items_count(self) -> int:
        return len(self.items.names)

    def _grow_items(self, n_new: int) -> None:
        if not n_new:
            return
        self.labels.add_items(n_new)
        n = self.items_count
        if self.dyadic is not None:
            self.dyadic.add_items(self.items.names[n - n_new :])
        twin = self.online.twin is not None
        if n > self.q.shape[0]:  # (grown with zeros: the new items' rows are set below)
            cap = max(n, 2 * self.q.shape[0], 1024)
            self.q, self.held_out = grow(self.q, cap, 0), grow(self.held_out, cap, 0)
            self.b, self.learned = grow(self.b, cap, 0), grow(self.learned, cap, 0)
            self.weight, self.gold = grow(self.weight, cap, 0), grow(self.gold, cap, 0)
            if twin:
                self.twin_q, self.twin_b = grow(self.twin_q, cap, 0), grow(self.twin_b, cap, 0)
        new = slice(n - n_new, n)
        self.q[new], self.held_out[new], self.b[new] = 1.0 / self.K, 0.0, 0.0
        self.learned[new], self.weight[new], self.gold[new] = 0, 0.0, -1
        if twin:
            self.twin_q[new], self.twin_b[new] = 1.0 / self.K, 0.0

    def _grow_workers(self, new: list[str]) -> None:
        if not new:
            return
        n = len(self.workers.names)
        if n > self.worker_slot.size:
            cap = max(n, 2 * self.worker_slot.size, 1024)
            self.worker_slot = grow(self.worker_slot, cap, 0)
            self.worker_labels = grow(self.worker_labels, cap, 0)
            self.worker_gold_seen = grow(self.worker_gold_seen, cap, 0)
            self.worker_gold_right = grow(self.worker_gold_right, cap, 0)
        if n > self.worker_row.size:
            self.worker_row = grow(self.worker_row, self.worker_slot.size, 0)
        S = self.config.n_worker_slots
        slots = [worker_slot(w, S) for w in new]
        self.worker_slot[n - len(new) : n] = slots
        self.worker_row[n - len(new) : n] = self._rows_for(slots)
        if self.dyadic is not None:
            self.dyadic.add_workers(new)

    # ---------------------------------------------------------------- the rows in use
    def _rows_for(self, slots: list[int]) -> IntArray:
        """The rows of these slots; slots seen for the first time get the next rows."""
        rows, new = first_seen_codes(self._row_of_slot, slots)
        if new:
            first, self.n_rows = self.n_rows, len(self._row_of_slot)
            self._fit_rows()
            self.slot_of_row[first : self.n_rows] = new
        return rows

    def _fit_rows(self) -> None:
        """Room in the parameter tables for every row (doubling until they fit: amortised
        copies, the capacities rows added one at a time would reach)."""
        capacity = self.slot_of_row.size
        if self.n_rows <= capacity:
            return
        while capacity < self.n_rows:
            capacity *= 2
        capacity = min(capacity, self.config.n_worker_slots)
        for model in self._models():
            p = model.params
            assert p.counts is not None
            p.worker, p.counts = _grow_rows(p.worker, capacity), _grow_rows(p.counts, capacity)
            model.config = model.config.with_(n_worker_slots=capacity)
        self.slot_of_row = grow(self.slot_of_row, capacity, -1)

    def _models(self) -> list[OnlineEM]:
        """The model and, while it learns, its pooled twin."""
        return [self.online] if self.online.twin is None else [self.online, self.online.twin]

    def rows_of(self, slots: IntArray) -> IntArray:
        """The rows of slots already held (vectorised; e.g. a snapshot's labels)."""
        held = self.slot_of_row[: self.n_rows]
        by_slot = np.argsort(held, kind="stable")
        found: IntArray = by_slot[np.searchsorted(held[by_slot], slots)]
        return found

    def load_rows(
        self,
        slots: IntArray,
        params: NominalParams,
        worker_prior: float,
        twin: tuple[NominalParams, float] | None = None,
    ) -> None:
        """Take ``params`` (at ``worker_prior``) whose worker and count tables hold the rows of
        ``slots`` (in that order; a snapshot's), and the pooled twin's, or none (settled),
        before any worker is known."""
        assert self.n_rows == 0, "rows are loaded into a fresh engine"
        self._row_of_slot = {int(s): r for r, s in enumerate(slots.tolist())}
        self.n_rows = len(self._row_of_slot)
        capacity = max(self.n_rows, 1)
        self.slot_of_row = np.full(capacity, -1, dtype=np.int64)
        self.slot_of_row[: self.n_rows] = slots
        config = self.config.with_(n_worker_slots=capacity)
        self.online = OnlineEM(config.with_(worker_prior=worker_prior), _rows(params, capacity))
        if twin is not None:
            twin_params, twin_prior = twin
            self.online.twin = OnlineEM(
                config.with_(worker_prior=twin_prior), _rows(twin_params, capacity)
            )

    @property
    def model(self) -> OnlineEM:
        """The hashed model over all S slots, as ``core.online.OnlineEM`` holds it: a copy that
        allocates 2 S K^2 floats (tests and tools; the engine itself uses ``online``)."""
        p, n = self.online.params, self.n_rows
        assert p.counts is not None
        S, K = self.config.n_worker_slots, self.K
        worker, counts = np.zeros((S, K, K)), np.zeros((S, K, K))
        held = self.slot_of_row[:n]
        worker[held], counts[held] = p.worker[:n], p.counts[:n]
        full = NominalParams(
            p.class_logits.copy(), p.population.copy(), worker, p.scalars.copy(), counts,
            None if p.sums is None else p.sums.copy(),
            None if p.evidence is None else p.evidence.copy(),
        )  # fmt: skip
        return OnlineEM(self.online.config.with_(n_worker_slots=S), full)

    # ---------------------------------------------------------------- serving
    @property
    def queue_rescoring(self) -> bool:
        """The queue is being scored again in slices (the calibration moved): the next
        ``state_update`` carries a slice, whether or not labels came."""
        return self._rescore_from is not None

    def mark_all_dirty(self) -> None:
        """Make the next ``state_update`` carry every item, worker and used slot."""
        self._serve_model_anew()
        self._dirty_workers.update(range(len(self.workers.names)))
        if self.dyadic is not None:
            self.dyadic.mark_all_dirty()

    def not_written(self, served: bool = False) -> None:
        """The last ``state_update`` was not written: the next one sends each item's label
        list whole and, unless the store already holds what it carried (``served``: written
        by another engine, which this one replays up to), every item, worker and slot again
        (the store failed)."""
        self.label_lists.forget()
        if not served:
            self.mark_all_dirty()

    def state_update(self, dyadic: bool = True, rescore: bool = True) -> StateUpdate:
        """What changed since the last call, ready for ``Store.write_state``; with ``dyadic``
        False, without the dyadic model's rows (its queued labels stay queued:
        ``dyadic_update`` learns them and gives its rows), else with every label learned; with
        ``rescore`` False, without the next slice of a queue being scored again (the items
        whose labels changed are scored all the same)."""
        changed = self._changed_rows()
        dirty = np.array(sorted(self._dirty_items), dtype=np.int64)
        self._check_finite(dirty, changed)
        rows = rows_by_slot(self.slot_of_row[changed], self.online.params.worker[changed])
        self.calibration = self._calibrate()
        if _moved(self.calibration, self._queue_calibration):
            # every queued item's served posterior moved: scored again a slice a step
            self._queue_calibration, self._rescore_from = self.calibration, 0
        shown = self.shown(dirty)  # (once: the items and the queue both serve it)
        items = self.item_writes(dirty, shown)
        queue, queue_remove, replace = self._queue_update(dirty, shown, rescore)
        workers = self.workers_json(np.array(sorted(self._dirty_workers), dtype=np.int64))
        self._dirty_items.clear()
        self._dirty_workers.clear()
        self._dirty_rows.clear()
        self._all_rows = False
        settings = orjson.dumps(self.queue_settings.to_dict())
        rows_of_dyadic = (
            self.dyadic.update(self.position) if self.dyadic is not None and dyadic else None
        )
        return StateUpdate(
            self.position, self.globals_json(), rows, items, workers, queue, queue_remove, settings,
            rows_of_dyadic, queue_replace=replace,
        )  # fmt: skip

    def _changed_rows(self) -> IntArray:
        """The rows of the worker slots changed since the last update (all after a rescale)."""
        if self._all_rows:
            return np.arange(self.n_rows, dtype=np.int64)
        return np.fromiter(self._dirty_rows, np.int64, len(self._dirty_rows))

    def _check_finite(self, items: IntArray, rows: IntArray) -> None:
        """Raise ``NonFiniteModelError`` unless the global parameters, the changed slot rows
        and the changed items' posteriors are finite (settings whose steps overflow, as a
        project saved before ``core.nominal.MAX_FIRST_STEP`` may have)."""
        p = self.online.params
        parts = {
            "class logits": p.class_logits, "population matrix": p.population,
            "step scale": p.scalars, "worker rows": p.worker[rows],
            "item posteriors": self.q[items], "item clarities": self.b[items],
        }  # fmt: skip
        bad = [name for name, values in parts.items() if not np.isfinite(values).all()]
        if bad:
            raise NonFiniteModelError(
                f"after log entry {self.position} the model's {', '.join(bad)} are not finite "
                "numbers (its hyperparameters' first step eta0 tau0^-rho x max(1, "
                "population_rate K/2, class_rate) is too large for these answers); the state "
                "before it stays served"
            )

    @property
    def dyadic_backlog(self) -> int:
        """Labels applied to the posteriors that the dyadic model has not learned yet."""
        return self.dyadic.backlog if self.dyadic is not None else 0

    @property
    def dyadic_sweep_backlog(self) -> int:
        """Of ``dyadic_backlog``, the labels up to the end of the last dyadic sweep's."""
        return self.dyadic.sweep_backlog if self.dyadic is not None else 0

    @property
    def dyadic_unpublished(self) -> bool:
        """The dyadic model has labels to learn or rows to write (after a sweep, say)."""
        return self.dyadic is not None and self.dyadic.unpublished

    def dyadic_learn(self, limit: int) -> int:
        """The dyadic model learns up to ``limit`` queued labels, oldest first; how many."""
        assert self.dyadic is not None, "a project without a dyadic model"
        return self.dyadic.catch_up(limit)

    def dyadic_update(self, limit: int | None = None) -> StateUpdate:
        """The dyadic model's rows changed since the last update, once it has learned the
        queued labels (all, or the oldest ``limit``): a write of those rows alone, after the
        posteriors at this position were written (``advance`` False; the globals again, with
        the position the dyadic model has now learned up to)."""
        assert self.dyadic is not None, "a project without a dyadic model"
        dyadic = self.dyadic.update(self.position, limit)
        return StateUpdate(self.position, self.globals_json(), dyadic=dyadic, advance=False)

    def _queue_update(
        self, dirty: IntArray, shown: FloatArray, rescore: bool = True
    ) -> tuple[dict[str, float], list[str], bool]:
        """Scores of the items whose posterior or label count changed, the finished ones among
        them, and whether that is every item (when the settings, the budget, the calibration or
        a sweep changed everything, or the engine just started): the queue is then replaced."""
        used = self.labels.n_labels
        spent = self.queue_settings.budget is not None and used >= self.queue_settings.budget
        if spent != self._budget_spent:
            self._budget_spent, self._queue_all = spent, True
        replace = self._queue_all
        codes = np.arange(self.items_count, dtype=np.int64) if replace else dirty
        self._queue_all = False
        if replace:
            self._queue_calibration, self._rescore_from = self.calibration, None
        elif self._rescore_from is not None and rescore:
            start = self._rescore_from
            stop = min(start + QUEUE_SLICE, self.items_count)
            codes = np.union1d(dirty, np.arange(start, stop, dtype=np.int64))
            self._rescore_from = stop if stop < self.items_count else None
        if not codes.size:
            return {}, [], replace
        pop = self.online.params.population
        confusion = np.exp(pop - pop.max(axis=1, keepdims=True))
        confusion /= confusion.sum(axis=1, keepdims=True)
        if codes.size != dirty.size:  # (``shown``: the dirty items')
            shown = self.shown(codes)
        served = self.calibration.from_posteriors(shown, self.weight[codes])
        count, gold = self.labels.count[codes], self.gold[codes]
        s = queue_scores(self.queue_settings, served, count, gold, used, confusion)
        keep = np.isfinite(s)
        model = (shown, self.weight[codes], self.calibration)
        to_go = labels_to_finish(self.queue_settings, served, count, confusion, model)
        self.progress.update(codes, ~keep, gold < 0, served.max(axis=1), to_go)
        members = self._queue_members()
        queue = dict(zip(members.take(codes[keep]), s[keep].tolist(), strict=True))
        return queue, members.take(codes[~keep]), replace

    def _queue_members(self) -> UntrackedList[str]:
        """Every item's queue member (by item code), made once per item."""
        members, done = self._members, len(self._members)
        members.extend(
            queue_member(i, name) for i, name in enumerate(self.items.names[done:], done)
        )
        return members

    def _calibrate(self) -> Calibration:
        """The served posteriors' calibration (docs/model.md eq. 24), a function of the
        parameters, their prequential evidence and the gold items' answers."""
        n = self.items_count
        gold_items = np.flatnonzero(self.gold[:n] >= 0)
        self.n_gold = int(gold_items.size)
        if not gold_items.size:
            return calibration(self.online.params, _NO_BLOCKS, self.online.params.evidence)
        blocks, _ = self.labels.gather(gold_items)
        p, held_out = self.online.params, self.held_out[gold_items]
        return calibration(p, blocks, p.evidence, self.gold[gold_items], held_out)

    def globals_json(self) -> bytes:
        p = self.online.params
        return orjson.dumps(
            {
                "class_logits": p.class_logits.tolist(),
                "population": p.population.tolist(),
                "scalars": p.scalars.tolist(),
                "position": self.position,
                "computed_at": self.computed_at,
                "n_items": self.items_count,
                "n_workers": len(self.workers.names),
                "n_labels": self.labels.n_labels,
                "em_iterations": self.em_iterations,
                "last_refit": self.last_refit,
                "calibration": self.calibration.to_dict(),
                "n_gold": self.n_gold,
                "evidence": (p.evidence if p.evidence is not None else np.zeros(0)).tolist(),
                "dyadic_examples": self.dyadic.examples if self.dyadic is not None else 0,
                "dyadic_position": (
                    self.dyadic.learned_through(self.position) if self.dyadic is not None else None
                ),
                "queue": self.progress.report(
                    self.queue_settings.rule().remaining_budget(self.labels.n_labels)
                ),
            }
        )

    def item_writes(self, codes: IntArray, shown: FloatArray | None = None) -> ItemWrites:
        """The served state of the items ``codes`` (distinct; the engine's write path): their
        records and their label lists' new text (``LabelLists``), counted as written.
        ``shown``: ``shown(codes)``, if already at hand."""
        if not codes.size:
            return ItemWrites()
        texts = self.label_lists.texts(codes, self.labels, self.workers.names)
        names = self.items.names.take(codes)
        return ItemWrites(names, self._records(codes, shown), texts, self._written_lists)

    def item_json(self, i: int) -> bytes:
        """Item ``i``'s JSON as a store renders it (nothing counted as written)."""
        return self.items_json(np.array([i], dtype=np.int64))[0]

    def items_json(self, codes: IntArray) -> list[bytes]:
        """The items' JSON as a store renders it, in the order of ``codes``."""
        whole = self.label_lists.encode(
            codes, np.zeros(codes.size, np.int64), self.labels, self.workers.names
        )
        return render(self._records(codes, None), whole)

    def _records(self, codes: IntArray, shown: FloatArray | None) -> list[bytes]:
        gold = self.gold[codes]
        posterior = np.where(
            gold[:, None] >= 0,
            np.eye(self.K)[np.maximum(gold, 0)],
            self.shown(codes) if shown is None else shown,
        )
        return pack(
            posterior, self.b[codes], gold, self.held_out[codes], self.position, self.computed_at,
            self.labels.count[codes], self.weight[codes],
        )  # fmt: skip

    def worker_json(self, w: int) -> bytes:
        return self.workers_json(np.array([w], dtype=np.int64))[self.workers.names[w]]

    def workers_json(self, codes: IntArray) -> dict[str, bytes]:
        """Each worker's record as JSON, the bytes orjson writes for it, each in a buffer of
        its own size (the embedded store keeps them as they are: ``StateUpdate.workers``)."""
        return dict(
            zip(
                self.workers.names.take(codes),
                map(
                    _WORKER_JSON.__mod__,
                    zip(
                        self.worker_slot[codes].tolist(),
                        self.worker_labels[codes].tolist(),
                        self.worker_gold_seen[codes].tolist(),
                        self.worker_gold_right[codes].tolist(),
                        strict=True,
                    ),
                ),
                strict=True,
            )
        )


_WORKER_JSON = b'{"slot":%d,"n_labels":%d,"gold_seen":%d,"gold_right":%d}'
"""A worker's record (its fields are integers): ``bytes % (slot, n_labels, gold_seen,
gold_right)`` gives orjson's bytes for the dict, without orjson's 4 KiB buffer per value."""


def _rows(params: NominalParams, capacity: int) -> NominalParams:
    """``params`` with their worker and count tables grown to ``capacity`` rows."""
    assert params.counts is not None
    params.worker = _grow_rows(params.worker, capacity)
    params.counts = _grow_rows(params.counts, capacity)
    return params


def _grow_rows(table: FloatArray, rows: int) -> FloatArray:
    """``table`` (rows, K, K) with zero rows added up to ``rows``."""
    if table.shape[0] >= rows:
        return table
    out: FloatArray = np.zeros((rows, *table.shape[1:]))
    out[: table.shape[0]] = table
    return out


def nominal_slot_bytes(n_classes: int) -> int:
    """A worker slot's share of the nominal model's tables (and its twin's): 16 K^2 bytes, or
    32 K^2 with the twin."""
    return (2 if has_twin(n_classes) else 1) * 16 * n_classes * n_classes


def model_bytes(record: ProjectRecord) -> int:
    """The most memory a project's models may hold: the nominal model's worker and count
    tables once every slot is in use (2 S K^2 floats, twice while a pooled twin learns beside
    the model: at most 16 classes, core/twin.py), and the dyadic model's hashed tables
    once every slot is in use. Labels, items and workers come on top, as they arrive."""
    nominal = nominal_config(record)
    K = nominal.n_classes
    total = nominal_slot_bytes(K) * nominal.n_worker_slots + sums_size(K) * 8
    dyadic = DyadicSettings.of(record.config)
    if dyadic is not None:
        c = dyadic.config
        one = DyadicModel(replace(c, rater_slots=1, task_slots=1))  # one row of each table
        rater = sum(a.nbytes for a in (one.A, one.WR, one.GWR, one.GA))
        task = sum(a.nbytes for a in (one.B, one.WT, one.GWT, one.GB))
        total += c.rater_slots * (rater + 1) + c.task_slots * (task + 1)  # (+ touched flags)
    return total


QUEUE_SLICE = 16_384
"""Items scored again a step, beside those whose labels changed, once the calibration moved:
scoring and writing the whole queue in one step held every posterior back (450-500 ms on a
400,000-item project); a slice costs about 10 ms, and the queue is whole again after
items / QUEUE_SLICE steps (the engine takes them while idle too)."""

QUEUE_RHO_TOLERANCE, QUEUE_EPS_TOLERANCE = 0.002, 0.0005
"""How far the calibration's rho and epsilon (eq. 21; with gold, their posterior means, eq. 25)
may move before every queued item is scored again. With gold they move a little at every
step, and scoring the whole queue each step cost 86 ms of a 104 ms step on 60,000 items (21
ms without gold); items whose labels changed are scored with the current calibration
anyway. Moved by these, an item with 10 answers at 95% moves by about 0.2 point."""


def _among_top(posteriors: FloatArray, labels: IntArray) -> npt.NDArray[np.bool_]:
    """Whether each row's ``labels`` class ties with its most probable one (within TIE)."""
    rows = np.arange(labels.size)
    out: npt.NDArray[np.bool_] = posteriors[rows, labels] >= posteriors.max(axis=1) * (1.0 - TIE)
    return out


def _moved(now: Calibration, then: Calibration) -> bool:
    """The calibration moved enough since ``then`` for the whole queue to be scored again
    (without gold it moves only in steps of the rho grid: always)."""
    if now == then:
        return False
    if not now.components and not then.components:
        return True
    return (
        abs(now.rho - then.rho) > QUEUE_RHO_TOLERANCE
        or abs(now.eps - then.eps) > QUEUE_EPS_TOLERANCE
    )
