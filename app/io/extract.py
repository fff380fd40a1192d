"""The ``crowdtally extract`` job: encode a triples file, run online or batch EM, report."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TextIO

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from app.io.codes import AnswerCodes, read_codes
from app.io.input import MAX_CLASSES, TRUTH_HEADER_HINT, InputError, label_order
from app.io.triples import answer_line, truth_rows
from core.batch import AggregationResult, into_slots
from core.blocks import FloatArray, IntArray, LabelBlocks
from core.calibration import Calibration, choose, reliability
from core.hashing import collision_report, worker_slots
from core.nominal import LaterPasses, NominalConfig, NominalParams
from core.online import BlockResult, OnlineEM
from core.pooling import PROBE_ITERATIONS, PooledFit, fit_pooled
from core.served import batch_evidence, held_out_fit, held_out_posteriors


@dataclass(frozen=True)
class Encoded:
    """A triples file as int codes; items are numbered in order of first appearance, workers
    in the sorted order of their ids."""

    classes: tuple[str, ...]
    item_names: pa.Array
    worker_names: pa.Array
    items: npt.NDArray[np.integer]
    workers: npt.NDArray[np.integer]
    labels: npt.NDArray[np.integer]
    weights: FloatArray
    """One per answer (a read-only broadcast 1.0 when the file has no weight column)."""

    @property
    def n_items(self) -> int:
        return len(self.item_names)

    @property
    def n_workers(self) -> int:
        return len(self.worker_names)

    def names(self) -> Encoded:
        """The classes and ids without the answers (their codes dropped: once grouped into
        blocks, an online run needs only the names, and 10M answers' codes are 120 MB)."""
        none = np.empty(0, dtype=np.int32)
        return Encoded(self.classes, self.item_names, self.worker_names, none, none, none,
                       np.empty(0))  # fmt: skip

    @cached_property
    def item_ids(self) -> npt.NDArray[np.str_]:
        return np.asarray(self.item_names.to_numpy(zero_copy_only=False), dtype=np.str_)

    @cached_property
    def worker_ids(self) -> npt.NDArray[np.str_]:
        return np.asarray(self.worker_names.to_numpy(zero_copy_only=False), dtype=np.str_)


def resolve_classes(
    label_names: list[str],
    names: list[str] | None,
    n_labels: int | None,
    path: str,
    *,
    n_labels_flag: str = "--n-labels",
) -> tuple[str, ...]:
    """The class names, in order: given (``--labels``), K of them (``--n-labels K``), or as
    seen in the data (``label_names``, the distinct labels of the file; integers sorted
    numerically, anything else as text).

    ``--n-labels K`` (the seed's ``--n_labels``) says how many classes there are. Labels that
    are all class indices 0..K-1 keep their index (a class nobody answered still counts);
    otherwise the file must hold exactly K distinct labels, numbered in sorted order as
    without the flag (adult2's G, P, R, X are classes 0..3), which is also the order of
    ``--priorz``. ``n_labels_flag`` is the flag as the user typed it, for the errors."""
    seen = label_order(label_names)
    for flag, k in (("--labels", len(names or ())), (n_labels_flag, n_labels or 0)):
        if k > MAX_CLASSES:
            raise InputError(flag, None, f"{k} classes: at most {MAX_CLASSES}")
    if names is not None:
        if len(set(names)) != len(names):
            raise InputError("--labels", None, "a label name is given twice")
        if len(names) < 2:
            raise InputError("--labels", None, f"needs at least 2 class names, got {names}")
        if n_labels is not None and n_labels != len(names):
            raise InputError("--labels", None, f"{len(names)} names but {n_labels_flag} {n_labels}")
        return tuple(names)
    if n_labels is not None:
        if n_labels < 2:
            raise InputError(n_labels_flag, None, f"needs at least 2 classes, got {n_labels}")
        indices = tuple(str(k) for k in range(n_labels))
        if set(seen) <= set(indices):
            return indices
        if len(seen) == n_labels:
            return tuple(seen)
        shown = ", ".join(seen[:10]) + (", ..." if len(seen) > 10 else "")
        raise InputError(
            n_labels_flag, None,
            f"{n_labels} classes, but {path} has {len(seen)} distinct labels ({shown}), not all "
            f"class indices 0..{n_labels - 1}; name the classes with --labels",
        )  # fmt: skip
    if len(seen) < 2:
        raise InputError(
            path, None, f"only one distinct label ({seen}); give --labels or --n-labels"
        )
    if len(seen) > MAX_CLASSES:
        raise InputError(path, None, f"{len(seen)} distinct labels: at most {MAX_CLASSES} classes")
    return tuple(seen)


def encode(answers: AnswerCodes, classes: tuple[str, ...], path: str) -> Encoded:
    """The answers with class codes; an answer outside ``classes`` is an error naming its line."""
    lookup = {name: k for k, name in enumerate(classes)}
    names = answers.label_names.to_pylist()
    code_of_name = np.array([lookup.get(n, -1) for n in names], dtype=np.int32)
    labels = code_of_name[answers.labels]
    if np.any(labels < 0):
        bad = int(np.argmax(labels < 0))
        raise InputError(
            path,
            answer_line(path, bad),
            f"label {names[answers.labels[bad]]!r} is not one of {list(classes)}",
        )
    return Encoded(
        classes=classes,
        item_names=answers.item_names,
        worker_names=answers.worker_names,
        items=answers.items,
        workers=answers.workers,
        labels=labels,
        weights=np.broadcast_to(1.0, labels.shape) if answers.weights is None else answers.weights,
    )


def truth_codes(rows: list[tuple[int, str, str]], data: Encoded, path: str) -> IntArray:
    """Gold class code per item (-1 where unknown) from ``truth_rows``. Gold outside the
    classes is an error naming its line."""
    lookup = {name: k for k, name in enumerate(data.classes)}
    bad = [(line, label) for line, _, label in rows if label not in lookup]
    if bad:
        line, label = bad[0]
        labels = [label for _, _, label in rows]
        # (a first line read as a gold label: column names that are not item,label)
        hint = TRUTH_HEADER_HINT if line == rows[0][0] == 1 and labels.count(label) == 1 else ""
        others = f" ({len(bad)} rows in all)" if len(bad) > 1 else ""
        raise InputError(path, line, f"gold label {label!r} is not among the classes "
                         f"{list(data.classes)}{others}{hint}")  # fmt: skip
    gold_items = pa.array([item for _, item, _ in rows], pa.string())
    gold_codes = np.array([lookup[label] for _, _, label in rows] + [-1], dtype=np.int64)
    where = pc.fill_null(pc.index_in(data.item_names, value_set=gold_items), -1).to_numpy()
    out: IntArray = gold_codes[where]  # -1 picks the last entry: no gold
    if not np.any(out >= 0):  # (an accuracy of nothing: the wrong file, or its items renamed)
        raise InputError(path, None, f"none of its {len(rows)} items is among the answers' items")
    return out


def unanswered_gold_warning(rows: list[tuple[int, str, str]], gold: IntArray) -> str | None:
    """A warning when some of the truth file's items have no answers (they are not scored)."""
    missing = len(rows) - int(np.count_nonzero(gold >= 0))
    if missing == 0:
        return None
    return (f"warning: {missing} of the {len(rows)} items with gold have no answers: "
            "they are not scored")  # fmt: skip


def load_labelled(folder: Path) -> tuple[Encoded, IntArray]:
    """A shared-dataset folder (answers.csv, truth.csv): encoded answers and gold codes per item."""
    answers = read_codes(folder / "answers.csv")
    classes = resolve_classes(answers.label_names.to_pylist(), None, None, str(folder))
    data = encode(answers, classes, str(folder))
    truth = folder / "truth.csv"
    return data, truth_codes(truth_rows(truth), data, str(truth))


def hashed_blocks(data: Encoded, config: NominalConfig) -> LabelBlocks:
    """One block per item, workers hashed into the model's slots (the online model's input)."""
    slots = worker_slots(data.worker_names.to_pylist(), config.n_worker_slots).astype(np.int32)
    return LabelBlocks.group(  # (int32 slots, as the file's codes: one grouping kernel to compile)
        data.items, slots[data.workers], data.labels, data.weights, n_blocks=data.n_items
    )


def exact_blocks(data: Encoded) -> LabelBlocks:
    """One block per item with exact worker codes (batch EM's input)."""
    return LabelBlocks.group(
        data.items, data.workers, data.labels, data.weights, n_blocks=data.n_items
    )


def accuracy(predicted: IntArray, gold: IntArray) -> tuple[float, int]:
    has = gold >= 0
    n = int(has.sum())
    return (float(np.mean(predicted[has] == gold[has])) if n else float("nan")), n


def gold_report(posteriors: FloatArray, gold: IntArray, raw: bool) -> str:
    """Accuracy on the items with gold, then how well the posteriors' probabilities match it:
    the top label's calibration error (ECE, 10 equal-width bins), the gold class's mean
    negative log-likelihood and the Brier score."""
    acc, n = accuracy(posteriors.argmax(axis=1), gold)
    line = f"accuracy {acc:.4f} on {n} items with gold"
    if n == 0:
        return line
    has = gold >= 0
    r = reliability(posteriors[has], gold[has])
    which = "the model's own posteriors" if raw else "calibrated posteriors, as served"
    return (
        f"{line}\ncalibration on them: ECE {r.ece:.2f} points, NLL {r.nll:.4f} nats, "
        f"Brier {r.brier:.4f} ({which})"
    )


# ---------------------------------------------------------------------------------------
# Progressive validation table, in the seed's (vowpal wabbit's) style.


class ProgressTable:
    """Rows at doubling example counters: average F_i per rating so far, and since last row."""

    HEADER = (
        "average F   since last     example   current   current   current\n"
        "per rating  row            counter     label   predict   ratings"
    )

    def __init__(self, out: TextIO, classes: tuple[str, ...]) -> None:
        self.out, self.classes = out, classes
        self.total = self.since = 0.0
        self.count = self.since_count = 0
        self.next_row = 1
        self.printed_at = 0
        print(self.HEADER, file=out)

    def add(self, f_per_rating: FloatArray, gold: int, predicted: int, ratings: int) -> None:
        """Account for items processed in order (a chunk ending at most at the next row);
        ``gold``, ``predicted`` and ``ratings`` are the chunk's last item's, which a row shows."""
        self.total += float(f_per_rating.sum())
        self.since += float(f_per_rating.sum())
        self.count += f_per_rating.size
        self.since_count += f_per_rating.size
        if self.count >= self.next_row:
            self._row(gold, predicted, ratings)
            self.next_row *= 2

    def finish(self, gold: int, predicted: int, ratings: int) -> None:
        if self.count > self.printed_at:
            self._row(gold, predicted, ratings)

    def _row(self, gold: int, predicted: int, ratings: int) -> None:
        label = self.classes[gold] if gold >= 0 else "-1"
        print(
            f"{self.total / self.count:<11.6f} {self.since / max(self.since_count, 1):<11.6f} "
            f"{self.count:>10d} {label:>9.9} {self.classes[predicted]:>9.9} {ratings:>9d}",
            file=self.out,
        )
        self.since = 0.0
        self.since_count = 0
        self.printed_at = self.count

    @property
    def average(self) -> float:
        return self.total / self.count if self.count else float("nan")


def doubling_chunks(n: int, start: int = 0) -> Iterator[tuple[int, int]]:
    """[lo, hi) ranges whose ends land on the table's counters 1, 2, 4, ... (offset by start)."""
    lo, edge = 0, 1
    while edge <= start:
        edge *= 2
    while lo < n:
        hi = min(n, edge - start)
        yield lo, hi
        lo = hi
        edge *= 2


def slot_row_blocks(
    data: Encoded, config: NominalConfig, also: IntArray | None = None
) -> tuple[IntArray, LabelBlocks]:
    """The worker slots in use, by the answers' workers or in ``also`` (ascending), and one
    block per item with each answer's worker as its slot's row among them. A model over those
    rows learns every row as the model over all the slots learns its slot (the kernels touch
    the slots of a block's labels, the prior's shrinkage and a rescale reach every row, and
    the rows keep the slots' order, so the blocks' canonical order is the same), without a
    K x K table for each of the others (65,536 by default: 5 GB at 100 classes). Every worker
    of the file has an answer, so the slots are found per worker, not per answer."""
    slots = worker_slots(data.worker_names.to_pylist(), config.n_worker_slots)
    used = np.unique(slots) if also is None else np.union1d(slots, also)
    rows = np.searchsorted(used, slots).astype(np.int32)  # (int32, as the file's other codes)
    blocks = LabelBlocks.group(
        data.items, rows[data.workers], data.labels, data.weights, n_blocks=data.n_items
    )
    return used, blocks


def rows_of(params: NominalParams, slots: IntArray, used: IntArray) -> NominalParams:
    """``params``, whose worker table holds the rows of ``slots`` (every other row 0), over
    the rows of the slots ``used`` (which include ``slots``): no label counted yet."""
    worker = np.zeros((used.size, *params.worker.shape[1:]))
    worker[np.searchsorted(used, slots)] = params.worker
    return NominalParams(
        params.class_logits, params.population, worker, params.scalars,
        np.zeros_like(worker), params.sums, params.evidence,
    )  # fmt: skip


@dataclass
class OnlineRun:
    model: OnlineEM
    blocks: LabelBlocks
    final: BlockResult
    seconds: float
    table_average: float
    used: IntArray | None = None
    """The slots the model's rows stand for, ascending (None: the model has every slot)."""

    def served(self, refined: bool, reuse: bool = False) -> tuple[FloatArray, Calibration]:
        """The posteriors the service serves for these answers (calibrated, no gold). After
        later passes (``refined``) the parameters are fitted to every item, and each item is
        scored without its own pull on its workers' rows (docs/model.md eq. 26), as the
        service serves it after its refinement sweeps. ``reuse``: written over the pass's
        posteriors, which the caller needs no more (80 MB less at 2M items of 5 classes)."""
        q, params = self.final.posteriors, self.model.params
        if refined:
            config = self.model.config
            q = held_out_fit(
                params, self.blocks, q, config.worker_prior, threads=2,
                population_precision=config.population_precision(),
            )  # fmt: skip
        return served(q, self.blocks, params.evidence, out=q if refined or reuse else None)


def online_blocks(
    data: Encoded,
    config: NominalConfig,
    params: NominalParams | None,
    params_slots: IntArray | None,
) -> tuple[IntArray | None, LabelBlocks]:
    """The online model's blocks of ``data`` and the worker slots their rows stand for: the
    slots in use (and a model file's, ``params_slots``), or None for a model of every slot
    (``params`` from a model file of the first format)."""
    if params is None or params_slots is not None:
        return slot_row_blocks(data, config, params_slots)
    return None, hashed_blocks(data, config)


def run_online(
    blocks: LabelBlocks,
    used: IntArray | None,
    classes: tuple[str, ...],
    config: NominalConfig,
    params: NominalParams | None,
    passes: int,
    shuffle_seed: int | None,
    gold: IntArray | None,
    test_only: bool,
    out: TextIO,
    later: LaterPasses = LaterPasses.revisit,
    params_slots: IntArray | None = None,
) -> OnlineRun:
    """Stream items (file order, or shuffled per pass) through the online model; with
    ``later`` = newton, passes 2..N are trust-region Newton sweeps over all items.
    ``blocks`` and ``used``: ``online_blocks``. ``params_slots``: ``params``' worker table
    holds the rows of these slots only (a model file's, ``SavedModel.slots``); the model then
    holds those and the answers' slots (without them, ``params`` has every slot). ``gold``:
    each item's gold class code or -1, shown in the progress table (None: no gold)."""
    if used is None:  # (a model file of the first format: every slot)
        model = OnlineEM(config, params)
    else:  # a table for the slots in use only (a model file's rows among them)
        rows = None
        if params is not None:
            assert params_slots is not None, "a model file's rows come with their slots"
            rows = rows_of(params, params_slots, used)
        fresh = rows is None and not test_only  # a new model chooses its pooling (eq. 29)
        model = OnlineEM(config.with_(n_worker_slots=max(used.size, 1)), rows, pooled_twin=fresh)
    model.load_kernels(blocks)  # before timing
    rng = np.random.default_rng(shuffle_seed)
    table = ProgressTable(out, classes)
    K = config.n_classes
    result = BlockResult(
        np.empty((blocks.n_blocks, K)), np.empty(blocks.n_blocks), np.empty(blocks.n_blocks)
    )
    seconds = 0.0
    newton = later is LaterPasses.newton and not test_only
    for n_pass in range(1 if newton else passes):
        order = (
            rng.permutation(blocks.n_blocks)
            if shuffle_seed is not None
            else np.arange(blocks.n_blocks)
        )
        t0 = time.perf_counter()  # one call per pass; the table is read from its results
        if test_only:
            model.predict_many(blocks, order=order, out=result)
        elif n_pass == 0:
            model.learn_many(blocks, order=order, out=result)
            if (perm := model.orient()) is not None:  # the pass's end (core/orientation.py)
                result.posteriors[:] = result.posteriors[:, perm]
            if (kept := model.settle()) is not None:  # the pooled twin's (core/twin.py)
                result = kept
        else:  # later passes revisit items whose labels are all counted (eq. 14-16)
            model.revisit_many(blocks, result, order=order, out=result)
        seconds += time.perf_counter() - t0
        for lo, hi in doubling_chunks(order.size, table.count):
            chunk, last = order[lo:hi], int(order[hi - 1])
            per_rating = np.maximum(blocks.total_weight(chunk), 1e-300)
            table.add(result.objective[chunk] / per_rating, *_shown(last, blocks, result, gold))
        if order.size:
            table.finish(*_shown(int(order[-1]), blocks, result, gold))
        if n_pass == 0 and model.settled:
            print(twin_line(model), file=out)
    if newton and passes > 1:  # refine answers the posteriors under its final parameters
        print("Newton sweep   F (log posterior)", file=out)
        t0 = time.perf_counter()
        final = model.refine(
            blocks, passes - 1, progress=lambda n, f: print(f"{n:>12}   {f:.6f}", file=out)
        )
        seconds += time.perf_counter() - t0
    else:  # (into the pass's arrays, read by now: 96 MB less at 2M items)
        final = model.predict_many(blocks, order=order, out=result, threads=2)
    return OnlineRun(model, blocks, final, seconds, table.average, used)


def _shown(
    block: int, blocks: LabelBlocks, result: BlockResult, gold: IntArray | None
) -> tuple[int, int, int]:
    """What a row of the progress table shows of an item: its gold class code (-1: none),
    the class predicted and its number of answers."""
    label = int(gold[block]) if gold is not None else -1
    ratings = int(blocks.ptr[block + 1] - blocks.ptr[block])
    return label, int(result.posteriors[block].argmax()), ratings


def served(
    posteriors: FloatArray,
    blocks: LabelBlocks,
    evidence: FloatArray | None,
    out: FloatArray | None = None,
) -> tuple[FloatArray, Calibration]:
    """The model's ``posteriors`` calibrated as the service serves them (docs/model.md eq.
    21-23, without gold), the tempering chosen by the prequential ``evidence``; and that
    calibration. ``out``: where to write them (``posteriors`` itself, if no longer needed)."""
    cal = choose(evidence)
    return cal.from_posteriors(posteriors, blocks.total_weight(), threads=2, out=out), cal


def calibration_line(cal: Calibration) -> str:
    """What the calibration of eq. 21 did, in one line (its rho and eps, named for what they
    mean: ``--rho`` is the step size's decay)."""
    counted = (
        f"they count as at most {1.0 / cal.rho:.3g} independent ones"
        if cal.rho > 0
        else "they count as independent"
    )
    return (
        f"posteriors calibrated: an item's answers correlated at {cal.rho:g} ({counted}), "
        f"consensus error {cal.eps:g}"
    )


@dataclass(frozen=True)
class BatchRun:
    result: AggregationResult
    params: NominalParams
    blocks: LabelBlocks
    seconds: float
    corrections: FloatArray
    """Each item's held-out correction under the fit (docs/model.md eq. 26-27)."""
    config: NominalConfig
    """The configuration fitted, its worker prior the one the held-out answers chose."""
    beside: tuple[FloatArray, IntArray] | None = None
    """``one_pass`` at the configured worker prior, when it ran beside the fit."""

    def one_pass(self, config: NominalConfig) -> tuple[FloatArray, IntArray]:
        """One online pass over the same answers at the fit's worker prior: the tempering's
        evidence for this fit, and each item's label as the pass learned it (the pass run
        beside the fit serves when the configured prior was kept)."""
        if self.beside is not None and self.config.worker_prior == config.worker_prior:
            return self.beside
        return one_pass_labels(self.config, self.blocks, self.params.worker.shape[0])

    def held_out(self) -> FloatArray:
        """The fit's posteriors, each item scored without its own pull on its workers' rows
        and under the rows' Laplace predictives (docs/model.md eq. 26 and 27)."""
        return held_out_posteriors(self.result.probas, self.corrections)

    def agreement_line(self, one_pass: IntArray, posteriors: FloatArray) -> str:
        """How often the labels of this fit's ``posteriors`` (as written) agree with those of
        one online pass (``one_pass``: its labels)."""
        has = self.blocks.sizes() > 0
        same = posteriors.argmax(axis=1)[has] == one_pass[has]
        share = float(same.mean()) if same.size else float("nan")
        return (
            f"labels agree with one online pass over the same answers on {share:.1%} of the items"
        )


def one_answer_warning(data: Encoded) -> str | None:
    """A warning when most items have one answer: batch EM's optimum can then put every item
    in one class (docs/model.md, "A limit: batch EM on one answer per item")."""
    counts = np.bincount(data.items, minlength=data.n_items)
    answered = counts[counts > 0]
    share = float(np.mean(answered == 1)) if answered.size else 0.0
    if share <= 0.5:
        return None
    return (
        f"warning: {share:.0%} of the items have one answer; there batch EM can put every "
        'item in one class (docs/model.md, "A limit"): compare with online mode (no --batch)'
    )


def run_batch(
    blocks: LabelBlocks, n_workers: int, config: NominalConfig, out: TextIO, one_pass: bool = False
) -> BatchRun:
    """Batch EM on ``exact_blocks`` (of ``n_workers`` workers), printing F at doubling
    iterations; with ``one_pass``, the online pass that gives the fit its tempering's evidence
    (``BatchRun.one_pass``) runs in a second thread meanwhile: both are compiled loops that
    release the GIL, so on two cores the pass costs no wall time."""
    table = FitTable(out)
    with ThreadPoolExecutor(max_workers=1) as second:
        pending = second.submit(one_pass_labels, config, blocks, n_workers) if one_pass else None
        t0 = time.perf_counter()
        fit = fit_pooled(
            config, blocks, n_workers, progress=table.iteration, threads=2, watch=table
        )
        seconds = time.perf_counter() - t0
        print(pooling_line(fit), file=out)
        beside = pending.result() if pending is not None else None
    return BatchRun(fit.result, fit.params, blocks, seconds, fit.held_out, fit.config, beside)


def one_pass_labels(
    config: NominalConfig, blocks: LabelBlocks, n_workers: int
) -> tuple[FloatArray, IntArray]:
    """``batch_evidence``: the tempering's evidence, and each item's label as the pass learned
    it (its posteriors are not kept: 80 MB at 2M items of 5 classes, held through the fit)."""
    evidence, posteriors = batch_evidence(config, blocks, n_workers)
    labels: IntArray = posteriors.argmax(axis=1)
    return evidence, labels


class FitTable:
    """Each of batch EM's fits (``fit_pooled``) as a table: which worker prior, F at doubling
    iterations, and how it ended."""

    def __init__(self, out: TextIO) -> None:
        self.out, self.shown = out, 1

    def start(self, worker_prior: float, probe: bool) -> None:
        what = f"a probe of {PROBE_ITERATIONS} iterations" if probe else "to convergence"
        print(f"worker prior lambda_A = {worker_prior:g}, {what}", file=self.out)
        print("iteration   F (log posterior)", file=self.out)
        self.shown = 1

    def iteration(self, it: int, f: float) -> None:
        if it >= self.shown:
            print(f"{it:>9d}   {f:.6f}", file=self.out)
            self.shown *= 2

    def end(self, result: AggregationResult, score: float) -> None:
        if result.converged:
            how = "converged"
        elif result.n_iter <= PROBE_ITERATIONS:
            how = "probe"
        else:
            how = f"stopped at the iteration limit ({result.n_iter}), not converged"
        print(f"{result.n_iter:>9d}   {result.objective[-1]:.6f}   ({how}; held-out log-likelihood "
              f"{score:.4f})", file=self.out)  # fmt: skip


def pooling_line(fit: PooledFit) -> str:
    """The worker prior the held-out answers chose (docs/model.md eq. 28), and those tried."""
    tried = ", ".join(f"{lam:g}" for lam, _ in fit.tried)
    return f"worker prior lambda_A = {fit.config.worker_prior:g}, chosen by the held-out answers (tried {tried})"


def twin_line(model: OnlineEM) -> str:
    """The worker prior the pass kept (docs/model.md eq. 29), with each model's score."""
    scores = ", ".join(f"{lam:g}: {'-' if e is None else f'{e:.4f}'}" for lam, e in model.settled)
    return (
        f"worker prior lambda_A = {model.config.worker_prior:g}, chosen by how well each "
        f"predicted the answers before learning them (nats an answer at {scores})"
    )


def slot_params_from_batch(
    params: NominalParams, blocks: LabelBlocks, worker_names: pa.Array, config: NominalConfig
) -> tuple[NominalParams, IntArray]:
    """Map exact-worker batch parameters (fitted to ``exact_blocks``) into hashed slots
    (colliding workers averaged by labels): the rows of the slots the workers fall in,
    ascending, and those slots (a row for each of the 65,536 slots was 5.2 GB at 100 classes)."""
    slots = worker_slots(worker_names.to_pylist(), config.n_worker_slots)
    used, rows = np.unique(slots, return_inverse=True)
    n_labels = np.bincount(blocks.slots, minlength=len(worker_names)).astype(np.float64)
    return into_slots(params, rows, n_labels, used.size), used.astype(np.int64)


def collision_line(data: Encoded, n_slots: int) -> str:
    return str(collision_report(worker_slots(data.worker_names.to_pylist(), n_slots), n_slots))
