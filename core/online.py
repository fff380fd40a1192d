"""Online EM for nominal labels (``nominalonlineextract``, seed 004).

For each block of one item's labels: maximise F_i over q_i (and the item's clarity) with
the global parameters fixed, then step the worker and global parameters along grad F_i
with eta_t = eta_0 (tau_0 + t)^-rho. When an item's labels come in several arrivals, the
later ones step along the *change* of the item's contribution, so that every label counts
once (docs/model.md, "Items that arrive in pieces").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from core import _kernels
from core.batch import BatchEM
from core.blocks import FloatArray, IntArray, LabelBlocks
from core.evidence import RHO_GRID, evidence_size
from core.newton import newton_passes
from core.nominal import SCALE, STEP, NominalConfig, NominalParams, sums_size
from core.orientation import best_relabelling, check_points, relabel
from core.threads import block_ranges, in_threads
from core.twin import (
    evidence_per_answer,
    has_twin,
    pooled,
    twin_due,
    twin_predicts_better,
)


@dataclass(frozen=True)
class BlockResult:
    """Per-block outputs, indexed like the blocks."""

    posteriors: FloatArray
    """q_i: the posterior over the true class, shape (n_blocks, K)."""
    clarity: FloatArray
    """b_i = log d_i (0 when the model has no difficulty)."""
    objective: FloatArray
    """F_i evaluated before the parameter update (progressive validation)."""


class OnlineEM:
    """The online nominal model: ``learn_many`` updates it, ``predict_many`` only reads it."""

    def __init__(
        self, config: NominalConfig, params: NominalParams | None = None, pooled_twin: bool = False
    ) -> None:
        self.config = config
        self.params = params if params is not None else NominalParams.initial(config)
        self._hyper = config.hyper_vector()
        self._class_mean = config.class_prior_logits()
        self._population_mean = config.population_mean()
        self._check_params()
        twin = pooled_twin and has_twin(config.n_classes)
        self.twin = OnlineEM(pooled(config), self.params.copy()) if twin else None
        """The pooled twin (docs/model.md eq. 29; with ``pooled_twin``, at most
        MAX_TWIN_CLASSES classes): the same model at MAX_POOLING times the worker prior,
        learning the same labels until ``settle`` keeps the one whose answers were predicted
        better."""
        self.twin_out: BlockResult | None = None
        """The twin's results of the last learning call (rows as ``out``'s), while it lives."""
        self.twin_relabelled: IntArray | None = None
        """The twin's relabelling in the last learning call or ``orient``: a caller that keeps
        the twin's posteriors (``twin_previous``) permutes them."""
        self.took_twin = False
        """The last learning call settled on the twin: the caller's kept twin posteriors are
        now the model's (``twin_relabelled`` applied first, then ``relabelled``)."""
        self.settled: tuple[tuple[float, float | None], ...] = ()
        """(worker prior, evidence per answer) of the model, then of the twin, once settled
        (the kept one is ``config.worker_prior``'s)."""

    def _check_params(self) -> None:
        K, S = self.config.n_classes, self.config.n_worker_slots
        p = self.params
        if (
            p.class_logits.shape != (K,)
            or p.population.shape != (K, K)
            or p.worker.shape != (S, K, K)
            or (p.counts is not None and p.counts.shape != (S, K, K))
            or (p.sums is not None and p.sums.shape != (sums_size(K),))
        ):
            raise ValueError(
                f"parameters do not fit the configuration (K={K}, S={S}): class_logits "
                f"{p.class_logits.shape}, population {p.population.shape}, worker {p.worker.shape}"
            )

    def learn_many(
        self,
        blocks: LabelBlocks,
        order: npt.ArrayLike | None = None,
        previous: BlockResult | None = None,
        n_previous: npt.ArrayLike | None = None,
        out: BlockResult | None = None,
        known: npt.ArrayLike | None = None,
        twin_previous: BlockResult | None = None,
    ) -> BlockResult:
        """Learn from the blocks listed in ``order`` (default: all, as given), in that order.

        ``n_previous[b]`` labels at the head of block b (in its canonical order) were learned
        in an earlier arrival of the same item, whose result is ``previous`` (row b).
        Results go to the rows of ``out`` (allocated when None) named by ``order``; ``out``
        may be ``previous`` itself.

        A block whose labels were all learned before (``n_previous[b]`` = its size) is a
        *revisit*: its statistics are refreshed and its slots, the population and the class
        prior step toward the MAP optimum (docs/model.md, eq. 14-16). Passes after the first
        should be revisits (``revisit_many``): they then converge toward batch EM's optimum.

        ``known[b]`` >= 0 is the true class of block b's item (gold): its posterior is fixed
        to that class, so its labels teach the workers' confusions without doubt.

        While the model has its pooled twin, the twin learns the same blocks from its own
        earlier results ``twin_previous`` (its posteriors of the items, as ``previous`` is the
        model's); ``previous`` without them drops the twin, the model kept (eq. 29).
        """
        return self._run(
            blocks, order, previous, n_previous, out, update=True, known=known,
            twin_previous=twin_previous,
        )  # fmt: skip

    def revisit_many(
        self,
        blocks: LabelBlocks,
        previous: BlockResult,
        order: npt.ArrayLike | None = None,
        out: BlockResult | None = None,
        known: npt.ArrayLike | None = None,
        twin_previous: BlockResult | None = None,
    ) -> BlockResult:
        """Another pass over items already learned: every label counted, ``previous`` their
        latest results (``learn_many`` with ``n_previous`` = the block sizes)."""
        return self._run(
            blocks, order, previous, blocks.sizes(), out, update=True, known=known,
            twin_previous=twin_previous,
        )  # fmt: skip

    def refine(
        self,
        blocks: LabelBlocks,
        passes: int,
        known: npt.ArrayLike | None = None,
        method: Literal["newton", "squarem"] = "newton",
        progress: Callable[[int, float], None] | None = None,
    ) -> BlockResult:
        """``passes`` sweeps over every item already learned that move the parameters toward
        batch EM's optimum on the hashed slots, warm-started from the current parameters.
        ``newton`` (docs/model.md, "Later passes by trust-region Newton"): each sweep takes the
        E-step at the best of a few trust-region Newton steps (eq. 17-20). ``squarem``
        ("Accelerated later passes"; measured, not adopted): each sweep is one E-step and batch
        EM's M-step (12-13'), combined by SQUAREM (13''). The statistics
        are then rebuilt (eq. 14) from the items' posteriors under the new parameters, which
        are returned, so later arrivals and revisits continue from them (``progress(sweep, F)``
        reports F after each Newton sweep): ``blocks`` must hold
        every learned item with all its labels. Deterministic, independent of block order.
        Not for models with ``difficulty`` (no sufficient statistics; use ``revisit_many``).
        """
        nb, K = blocks.n_blocks, self.config.n_classes
        self._check_codes(blocks)
        known_a = _known_codes(known, nb, K)
        if self.config.difficulty:
            raise ValueError("refine needs a model without difficulty; use revisit_many")
        p = self.params
        sizes = blocks.sizes()
        has = np.flatnonzero(sizes > 0)  # blocks without labels are not items (eq. 14)
        if has.size and passes > 0:
            ptr = np.concatenate([[0], np.cumsum(sizes[has])]).astype(np.int64)
            used, compact = np.unique(blocks.slots, return_inverse=True)
            items = LabelBlocks(ptr, compact.astype(np.int64), blocks.labels, blocks.weights)
            start = NominalParams(p.class_logits, p.population, p.worker[used], p.scalars)
            if method == "newton":
                fitted = newton_passes(
                    self.config, items, start, passes, known_a[has], progress
                ).params
                n_passes = passes
            else:
                fitted, n_passes = BatchEM(self.config, max_iter=passes).improve(
                    items, used.size, start, known_a[has]
                )
            p.worker *= p.scalars[SCALE]  # materialise A = scale * stored, then scale = 1
            p.scalars[SCALE] = 1.0
            p.worker[used] = fitted.worker
            p.population[:] = fitted.population
            p.class_logits[:] = fitted.class_logits
            p.scalars[STEP] += float(n_passes * has.size)  # t counts every block, as revisits
        result = self.predict_many(blocks, known=known_a)
        statistics_from(p, blocks, result.posteriors)
        return result

    def load_kernels(self, blocks: LabelBlocks) -> None:
        """Load (or compile) the learning and the prediction kernels for ``blocks`` now, so
        that a timed call does not; the model is left as it was."""
        end = int(blocks.ptr[min(1, blocks.n_blocks)])  # (the first block alone: its outputs
        first = LabelBlocks(  # and the codes' checks cost one block's, not every block's)
            blocks.ptr[:2], blocks.slots[:end], blocks.labels[:end], blocks.weights[:end]
        )
        none = np.zeros(0, dtype=np.int64)
        self.predict_many(first, order=none)
        self.learn_many(first, order=none)

    def predict_many(
        self,
        blocks: LabelBlocks,
        order: npt.ArrayLike | None = None,
        out: BlockResult | None = None,
        known: npt.ArrayLike | None = None,
        threads: int = 1,
    ) -> BlockResult:
        """Posteriors under the current parameters, which are left unchanged. With
        ``threads`` > 1, a long ``order`` is split among that many threads (each item's
        posterior is computed as by one: the results are bit-identical)."""
        return self._run(blocks, order, None, None, out, update=False, known=known, threads=threads)

    def _run(
        self,
        blocks: LabelBlocks,
        order: npt.ArrayLike | None,
        previous: BlockResult | None,
        n_previous: npt.ArrayLike | None,
        out: BlockResult | None,
        update: bool,
        known: npt.ArrayLike | None = None,
        threads: int = 1,
        twin_previous: BlockResult | None = None,
    ) -> BlockResult:
        nb, K = blocks.n_blocks, self.config.n_classes
        self._check_codes(blocks)
        order_a = (
            np.arange(nb, dtype=np.int64) if order is None else np.asarray(order, dtype=np.int64)
        )
        if order_a.size and (order_a.min() < 0 or order_a.max() >= nb):
            raise ValueError(f"order must list block numbers in 0..{nb - 1}")
        if previous is not None:
            n_old: IntArray = np.asarray(n_previous, dtype=np.int64)
            if n_old.shape != (nb,) or np.any(n_old > blocks.sizes()) or np.any(n_old < 0):
                raise ValueError("n_previous needs one count per block, between 0 and its size")
        if out is None:
            out = BlockResult(np.empty((nb, K)), np.empty(nb), np.empty(nb))
        elif (
            out.posteriors.shape != (nb, K)
            or out.clarity.shape != (nb,)
            or out.objective.shape != (nb,)
        ):
            raise ValueError("out does not have one row per block")
        p = self.params
        if not update and not self.config.difficulty:  # each slot row's softmax once
            known_a = NO_GOLD if known is None else _known_codes(known, nb, K)

            def predict(part: IntArray) -> None:
                _kernels.predict_blocks(
                    blocks.ptr, part, blocks.slots, blocks.labels, blocks.weights,
                    p.class_logits, p.population, p.worker, p.scalars[SCALE], known_a,
                    out.posteriors, out.clarity, out.objective,
                )  # fmt: skip

            ranges = block_ranges(order_a.size, threads)
            in_threads(predict, [order_a[lo:hi] for lo, hi in ranges])
            return out
        known_a = _known_codes(known, nb, K)
        if previous is None:  # a first arrival of every block: one row stands for all
            q_old, b_old = np.full((1, K), 1.0 / K), np.zeros(1)
            n_old = np.zeros(1, dtype=np.int64)
        else:
            q_old, b_old = previous.posteriors, previous.clarity
        self.relabelled = self.twin_relabelled = None
        self.took_twin = False
        if update and self.twin is not None and previous is not None and twin_previous is None:
            self.drop_twin()  # (its own earlier posteriors are not known)
        twin = self.twin if update else None
        tq_old, tb_old = q_old, b_old
        twin_out = None
        if twin is not None:
            twin_out = self.twin_out = BlockResult(
                np.empty_like(out.posteriors),
                np.empty_like(out.clarity),
                np.empty_like(out.objective),
            )
            if previous is not None and twin_previous is not None:
                tq_old, tb_old = twin_previous.posteriors, twin_previous.clarity
        checks = check_points(int(p.scalars[STEP]), order_a.size) if update else []
        ends = checks if checks and checks[-1] == order_a.size else [*checks, order_a.size]
        checked = set(checks)
        done = 0
        for end in ends:
            part = order_a[done:end]
            self._learn(blocks, part, n_old, q_old, b_old, update, known_a, out)
            if twin is not None and twin_out is not None:
                twin._learn(blocks, part, n_old, tq_old, tb_old, update, known_a, twin_out)
            done = end
            perm = self._orient(known_a[part]) if end in checked else None
            if twin is not None and twin_out is not None and end in checked:
                if (twin_perm := twin._orient(known_a[part])) is not None:
                    tq_old = _follow(twin_perm, order_a, end, twin_out, tq_old)
                    self.twin_relabelled = _compose(self.twin_relabelled, twin_perm)
                if twin_due(p):
                    twin = None
                    if self._settle():  # the twin's results so far are the call's
                        done_rows = order_a[:end]
                        out.posteriors[done_rows] = twin_out.posteriors[done_rows]
                        out.clarity[done_rows] = twin_out.clarity[done_rows]
                        out.objective[done_rows] = twin_out.objective[done_rows]
                        q_old, b_old, p = tq_old, tb_old, self.params
                        perm, self.relabelled, self.took_twin = None, None, True
            if perm is None:
                continue
            # the whole state is relabelled: what this call learned, and the earlier
            # posteriors of the items it has still to learn (a copy: the caller's stay)
            q_old = _follow(perm, order_a, end, out, q_old)
            self.relabelled = _compose(self.relabelled, perm)
        if self.relabelled is not None and np.array_equal(self.relabelled, np.arange(K)):
            self.relabelled = None  # (relabelled and back)
        return out

    def _learn(
        self,
        blocks: LabelBlocks,
        part: IntArray,
        n_old: IntArray,
        q_old: FloatArray,
        b_old: FloatArray,
        update: bool,
        known: IntArray,
        out: BlockResult,
    ) -> None:
        p = self.params
        if p.counts is None or p.sums is None:
            p.counts, p.sums = statistics_for(p)
        if p.evidence is None:
            p.evidence = np.zeros(evidence_size())
        _kernels.learn_blocks(
            blocks.ptr, part, blocks.slots, blocks.labels, blocks.weights,
            n_old, q_old, b_old, update,
            p.class_logits, self._class_mean, p.population, self._population_mean,
            p.worker, p.counts, p.sums, p.scalars, self._hyper, known,
            out.posteriors, out.clarity, out.objective, RHO_GRID, p.evidence,
        )  # fmt: skip

    def settle(self) -> BlockResult | None:
        """Keep the model or its pooled twin, whichever predicted the answers better before it
        learned them (eq. 29), and drop the other: at a pass's end (``crowdtally extract``),
        after ``orient``. Returns the twin's results of the last learning call when the twin
        is kept (its ``out``, with the rows of the blocks the call learned replaced: the
        caller's must be replaced by them), else None."""
        twin_out = self.twin_out
        return twin_out if self._settle() else None

    def _settle(self) -> bool:
        twin, self.twin, self.twin_out = self.twin, None, None
        if twin is None:
            return False
        self.settled = tuple(
            (m.config.worker_prior, evidence_per_answer(m.params)) for m in (self, twin)
        )
        if not twin_predicts_better(self.params, twin.params):
            return False
        self._exchange(twin)  # (the model's state goes to the twin, which is dropped)
        return True

    def lead(self) -> bool:
        """Exchange the model and its twin, both kept, when the twin predicted the answers
        better (eq. 29: the service's refinement sweeps, which serve the model in the lead;
        the caller exchanges the posteriors it keeps of each)."""
        twin = self.twin
        if twin is None or not twin_predicts_better(self.params, twin.params):
            return False
        self._exchange(twin)
        self.twin_out = None  # (the caller's copies of both are exchanged)
        return True

    def drop_twin(self) -> None:
        """Learn on without the twin, the model kept (e.g. its pooling chosen otherwise)."""
        self.twin = self.twin_out = None

    def _exchange(self, other: OnlineEM) -> None:
        """Change models (configuration and parameters) with ``other``."""
        for name in ("config", "params", "_hyper", "_class_mean", "_population_mean"):
            mine = getattr(self, name)
            setattr(self, name, getattr(other, name))
            setattr(other, name, mine)

    def orient(self, anchored: bool = False) -> IntArray | None:
        """Check the labelling now, as at the check points of a learning call (a pass's end:
        ``crowdtally extract``, a refinement sweep's start), and relabel when the priors prefer
        another (core/orientation.py). Returns the relabelling, which the caller's kept
        posteriors must follow; nothing where the model learned gold (``anchored``). The twin
        is checked too: its last call's results follow, and ``twin_relabelled`` says how."""
        self.twin_relabelled = None
        if anchored:
            return None
        if self.twin is not None:
            self.twin_relabelled = self.twin._orient(np.zeros(0, dtype=np.int64))
            if self.twin_relabelled is not None and self.twin_out is not None:
                rows = self.twin_out.posteriors
                rows[:] = rows[:, self.twin_relabelled]
        return self._orient(np.zeros(0, dtype=np.int64))

    def _orient(self, known: IntArray) -> IntArray | None:
        """Relabel the latent classes when the priors prefer another labelling (the answers'
        likelihood does not change: core/orientation.py); not after gold, which anchors them
        and whose likelihood would change."""
        if np.any(known >= 0):
            return None
        perm = best_relabelling(self.params, self.config)
        if perm is not None:
            relabel(self.params, perm)
        return perm

    def _check_codes(self, blocks: LabelBlocks) -> None:
        if blocks.n_labels == 0:
            return
        if blocks.labels.min() < 0 or blocks.labels.max() >= self.config.n_classes:
            raise ValueError(f"labels must be class codes in 0..{self.config.n_classes - 1}")
        if blocks.slots.min() < 0 or blocks.slots.max() >= self.config.n_worker_slots:
            raise ValueError(f"slots must be in 0..{self.config.n_worker_slots - 1}")
        if not np.all(np.isfinite(blocks.weights)) or blocks.weights.min() < 0:
            raise ValueError("weights must be finite and >= 0")


def _follow(
    perm: IntArray, order: IntArray, end: int, out: BlockResult, q_old: FloatArray
) -> FloatArray:
    """A relabelling at ``end`` of a call's ``order``: the results so far follow it, and so do
    the earlier posteriors of the items still to come (returned: a copy, the caller's stay)."""
    out.posteriors[order[:end]] = out.posteriors[order[:end]][:, perm]
    if q_old.shape[0] > 1:
        q_old = q_old.copy()
        q_old[order[end:]] = q_old[order[end:]][:, perm]
    return q_old


def _compose(before: IntArray | None, perm: IntArray) -> IntArray:
    """``before`` then ``perm`` (new class z = old class ``result[z]``)."""
    return perm if before is None else before[perm]


NO_GOLD = np.zeros(0, dtype=np.int64)
"""``predict_blocks``' gold codes for a pass without gold: none (8 bytes an item less)."""


def _known_codes(known: npt.ArrayLike | None, n_blocks: int, n_classes: int) -> IntArray:
    """``known`` as one class code (or -1: not gold) per block, checked; all -1 when None."""
    known_a: IntArray = (
        np.full(n_blocks, -1, dtype=np.int64)
        if known is None
        else np.asarray(known, dtype=np.int64)
    )
    if known_a.shape != (n_blocks,) or known_a.max(initial=-1) >= n_classes:
        raise ValueError(f"known needs one class code (or -1) per block, below {n_classes}")
    return known_a


def statistics_for(params: NominalParams) -> tuple[FloatArray, FloatArray]:
    """Empty statistics for parameters that came without them (e.g. mapped from batch EM):
    no counted labels; the worker-table sum is that of the given table."""
    K = params.class_logits.shape[0]
    sums = np.zeros(sums_size(K))
    sums[: K * K] = params.worker.sum(axis=0).ravel()
    return np.zeros_like(params.worker), sums


def statistics_from(params: NominalParams, blocks: LabelBlocks, posteriors: FloatArray) -> None:
    """Set ``params.counts`` and ``params.sums`` to those of every label in ``blocks`` counted
    once under its item's posterior (eq. 14), as if the online model had learned them all;
    e.g. after parameters from batch EM are swapped in. Blocks with no labels are not items."""
    K = params.class_logits.shape[0]
    sizes = blocks.sizes()
    counts = np.zeros_like(params.worker)
    item_of = np.repeat(np.arange(blocks.n_blocks), sizes)
    weighted = blocks.weights[:, None] * posteriors[item_of]  # (labels, K)
    for z in range(K):
        np.add.at(counts[:, z, :], (blocks.slots, blocks.labels), weighted[:, z])
    sums = np.zeros(sums_size(K))
    sums[: K * K] = params.worker.sum(axis=0).ravel()
    has = sizes > 0
    sums[K * K : K * K + K] = posteriors[has].sum(axis=0)
    sums[K * K + K] = float(has.sum())
    sums[K * K + K + 1] = float(blocks.weights[blocks.weights > 0].sum())
    sums[K * K + K + 2] = float(np.unique(blocks.slots[blocks.weights > 0]).size)
    sums[K * K + K + 3] = float(np.count_nonzero(blocks.weights > 0))
    span = _kernels.LOG_WEIGHT_SPAN  # (each weight's log clipped as the kernels count it)
    sums[K * K + K + 4] = float(
        np.clip(np.log(blocks.weights[blocks.weights > 0]), -span, span).sum()
    )
    params.counts, params.sums = counts, sums
