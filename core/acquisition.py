"""Acquisition scores: which items need more ratings (docs/active.md has the math).

All functions are vectorised over items. ``posteriors`` is (n, K), each row an item's
posterior q_i over the true class; a confusion matrix C is (K, K) with rows = true class z,
columns = answer l, rows summing to 1 (``NominalParams.population_confusion()`` for a typical
worker, ``NominalParams.worker_confusion(slots)`` for given workers).

* ``error_probability`` (eq. A1), ``entropy`` (A2), ``margin`` (A3): uncertainty of q_i.
* ``value_of_information`` (A4-A6): the expected drop of the chance that the item's most
  likely label is wrong after ``lookahead`` more labels from a worker with confusion C.
* ``priority``: the queue's ranking, one score per item for a named policy (what the service
  serves and ``bench.active`` replays): VOI with its look-ahead tie-breaks, or an uncertainty.
* ``StoppingRule`` (A7): target confidence, at most so many labels per item, a budget.
* ``labels_to_confidence`` (A8): Wald's estimate of the labels an item still needs;
  ``reachable`` (A8'): whether any number of them gets its served confidence there.
* ``select``: the best-scoring items that are not finished (and, for a worker asking for
  work, that the worker has not labelled yet).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from core._numba import jit

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

MAX_SEQUENCES = 4096
"""``value_of_information`` sums over K^lookahead answer sequences; at most this many."""

Policy = Literal["voi", "lookahead", "uncertainty", "entropy", "margin", "uniform"]

LOOKAHEAD_CLASSES = 6
"""``priority`` uses VOI_2 (K^3 work an item) up to this many classes: ``voi`` to break VOI_1's
ties, ``lookahead`` in max(VOI_1, VOI_2 / 2); with more classes both rank by VOI_1 and entropy."""


def _as_posteriors(posteriors: npt.ArrayLike) -> FloatArray:
    q = np.asarray(posteriors, dtype=np.float64)
    if q.ndim != 2 or q.shape[1] < 2:
        raise ValueError(f"posteriors must be (n, K) with K >= 2, got shape {q.shape}")
    return q


def error_probability(posteriors: npt.ArrayLike) -> FloatArray:
    """(A1) e(q) = 1 - max_z q_z: the chance that the most likely label is wrong."""
    q = _as_posteriors(posteriors)
    out: FloatArray = 1.0 - q.max(axis=1)
    return out


def entropy(posteriors: npt.ArrayLike) -> FloatArray:
    """(A2) H(q) = -sum_z q_z log q_z, in nats (0 log 0 = 0)."""
    q = _as_posteriors(posteriors)
    logs = np.log(np.where(q > 0, q, 1.0))
    out: FloatArray = -(q * logs).sum(axis=1)
    return out


def margin(posteriors: npt.ArrayLike) -> FloatArray:
    """(A3) q_(1) - q_(2): the best class's lead over the runner-up (small = uncertain)."""
    q = _as_posteriors(posteriors)
    top2 = np.partition(q, q.shape[1] - 2, axis=1)[:, -2:]
    out: FloatArray = top2[:, 1] - top2[:, 0]
    return out


def value_of_information(
    posteriors: npt.ArrayLike,
    confusion: npt.ArrayLike,
    lookahead: int = 1,
    index: npt.ArrayLike | None = None,
) -> FloatArray:
    """Expected reduction of e(q_i) after ``lookahead`` more labels (eq. A4-A6).

    ``confusion`` is one (K, K) matrix for every item (the population's: a typical worker;
    or one worker's own: "where is this worker's answer most informative"), or (m, K, K)
    matrices: with ``index`` (n,), item i uses ``confusion[index[i]]`` (e.g. the worker who
    would answer it); without, m must be n (one matrix per item).

    With one label, VOI_i = sum_l max_z q_iz C_zl - max_z q_iz (A5): at least 0, 0 for a
    certain item and 0 for a spammer (identical rows). With more labels (A6) the sum runs
    over the K^lookahead answer sequences, with the product of their likelihoods.
    Cost O(n K^(lookahead+1) lookahead), one compiled loop.
    """
    q = np.ascontiguousarray(_as_posteriors(posteriors))
    n, K = q.shape
    C = np.asarray(confusion, dtype=np.float64)
    if C.shape == (K, K):
        C = C[None]
        idx = np.zeros(n, dtype=np.int64)
    elif C.ndim == 3 and C.shape[1:] == (K, K) and (index is not None or C.shape[0] == n):
        idx = np.arange(n, dtype=np.int64) if index is None else np.asarray(index, np.int64)
        if idx.shape != (n,) or (n and (idx.min() < 0 or idx.max() >= C.shape[0])):
            raise ValueError(f"index needs one matrix number in 0..{C.shape[0] - 1} per item")
    else:
        raise ValueError(f"confusion must be ({K}, {K}) or (m, {K}, {K}) with an index per item")
    if lookahead < 1 or K**lookahead > MAX_SEQUENCES:
        raise ValueError(f"lookahead must be >= 1 with K^lookahead <= {MAX_SEQUENCES}")
    out: FloatArray = np.empty(n)
    _voi_kernel(q, np.ascontiguousarray(C), idx, lookahead, out)
    return out


@jit
def _voi_kernel(
    q: FloatArray, C: FloatArray, idx: IntArray, lookahead: int, out: FloatArray
) -> None:  # pragma: no cover - compiled
    """out[i] = max(0, sum over answer sequences s of max_z q_iz prod_j C_z,s_j - max_z q_iz)."""
    n, K = q.shape
    seq = np.zeros(lookahead, dtype=np.int64)
    for i in range(n):
        Ci = C[idx[i]]
        best_now = 0.0
        for z in range(K):
            best_now = max(best_now, q[i, z])
        total = 0.0
        seq[:] = 0
        while True:
            best = 0.0
            for z in range(K):
                v = q[i, z]
                for j in range(lookahead):
                    v *= Ci[z, seq[j]]
                best = max(best, v)
            total += best
            j = lookahead - 1  # next sequence, odometer style
            while j >= 0 and seq[j] == K - 1:
                seq[j] = 0
                j -= 1
            if j < 0:
                break
            seq[j] += 1
        out[i] = max(total - best_now, 0.0)


def priority(
    policy: Policy, posteriors: npt.ArrayLike, n_labels: npt.ArrayLike, confusion: npt.ArrayLike
) -> FloatArray:
    """The queue's ranking: higher = label sooner. Items of equal priority are served in the
    order they arrived (the caller keeps that order; ``select`` takes the lower index).

    ``voi``: VOI_1 (A5) under ``confusion``; its ties, which are many (one label cannot flip
    an item at q = (0.9, 0.1)), broken by VOI_2 (A6, up to ``LOOKAHEAD_CLASSES`` classes),
    then by entropy (A2). ``uncertainty``: e(q) (A1); ``entropy``: H(q) (A2); ``margin``:
    the smallest margin (A3) first; ``uniform``: the fewest labels first.
    """
    q = _as_posteriors(posteriors)
    if policy in ("voi", "lookahead"):
        K = q.shape[1]
        C = np.ascontiguousarray(confusion, dtype=np.float64)
        if C.shape != (K, K):
            raise ValueError(f"confusion must be ({K}, {K})")
        out: FloatArray = np.empty(q.shape[0])
        two = K <= LOOKAHEAD_CLASSES
        _voi_priority_kernel(np.ascontiguousarray(q), C, two, policy == "lookahead", out)
        return out
    if policy == "uncertainty":
        return error_probability(q)
    if policy == "entropy":
        return entropy(q)
    if policy == "margin":
        return -margin(q)
    if policy == "uniform":
        return -np.asarray(n_labels, dtype=np.float64)
    raise ValueError(f"unknown policy {policy!r}")


@jit
def _voi_priority_kernel(
    q: FloatArray, C: FloatArray, two: bool, star: bool, out: FloatArray
) -> None:  # pragma: no cover - compiled
    """out[i] = VOI_1 + 1e-3 VOI_2 (if ``two``) + 1e-6 H(q_i), in one pass over item i;
    ``star``: max(VOI_1, VOI_2 / 2) + 1e-6 H(q_i) instead (KG(*), the value per label)."""
    n, K = q.shape
    for i in range(n):
        best_now = 0.0
        h = 0.0
        for z in range(K):
            best_now = max(best_now, q[i, z])
            if q[i, z] > 0:
                h -= q[i, z] * np.log(q[i, z])
        one = 0.0
        for a in range(K):
            best = 0.0
            for z in range(K):
                best = max(best, q[i, z] * C[z, a])
            one += best
        score = max(one - best_now, 0.0)
        if two:
            total = 0.0
            for a in range(K):
                for b in range(K):
                    best = 0.0
                    for z in range(K):
                        best = max(best, q[i, z] * C[z, a] * C[z, b])
                    total += best
            two_labels = max(total - best_now, 0.0)
            score = max(score, two_labels / 2) if star else score + 1e-3 * two_labels
        out[i] = score + 1e-6 * h


def _top_and_drift(q: FloatArray, C: FloatArray) -> tuple[IntArray, FloatArray]:
    """Each item's most likely class z* and A8's drift: the mean move of the log-odds of z*
    against the rest per answer, D(C_{z*.} || r)."""
    n = q.shape[0]
    top = q.argmax(axis=1)
    top_q = q[np.arange(n), top]
    own = C[top]
    r = (q @ C - top_q[:, None] * own) / np.maximum(1.0 - top_q, 1e-300)[:, None]
    log_c = np.log(np.maximum(C, 1e-300))
    drift = np.sum(own * (log_c[top] - np.log(np.maximum(r, 1e-300))), axis=1)
    return top, drift


def labels_to_confidence(
    posteriors: npt.ArrayLike, confusion: npt.ArrayLike, target: float
) -> FloatArray:
    """(A8) Wald's estimate of the labels item i still needs before max_z q_iz >= ``target``,
    from workers with confusion C, if its most likely class z* is the truth.

    Each answer l moves the log-odds of z* against the rest by log(C_{z*l} / r_l), where r is
    the rest's answer distribution (Σ_{z≠z*} q_z C_{zl} / (1 - q_z*)); its mean is the
    Kullback-Leibler divergence D(C_{z*·} || r). The expected number of labels to climb from
    logit(q_z*) to logit(target) is then (Wald, 1945) the distance over that drift, rounded
    up: 0 for an item already there, inf where answers carry no information (D = 0).
    """
    q = _as_posteriors(posteriors)
    C = np.asarray(confusion, dtype=np.float64)
    n, K = q.shape
    if C.shape != (K, K):
        raise ValueError(f"confusion must be ({K}, {K})")
    if not 0.0 < target < 1.0:
        return np.where(q.max(axis=1) >= target, 0.0, np.inf)
    top, drift = _top_and_drift(q, C)
    p = np.clip(q[np.arange(n), top], 1e-12, 1 - 1e-12)
    distance = np.log(target / (1 - target)) - np.log(p / (1 - p))
    with np.errstate(divide="ignore"):
        need = np.where(drift > 1e-12, np.ceil(distance / np.maximum(drift, 1e-12)), np.inf)
    out: FloatArray = np.where(distance <= 0, 0.0, need)
    return out


FAR_LABELS = 1 << 16
"""``reachable`` looks this many agreeing answers ahead: past the tempering's limit."""


def reachable(
    posteriors: npt.ArrayLike,
    label_weight: npt.ArrayLike,
    confusion: npt.ArrayLike,
    target: float,
    served: Callable[[FloatArray, FloatArray], FloatArray],
) -> BoolArray:
    """(A8') Per item: whether any number of answers can bring its served confidence to
    ``target``. ``posteriors`` are the model's own (untempered) q_i, ``label_weight`` n_i,
    ``served(logits, n)`` the project's calibration of untempered log posteriors (docs/model.md
    eq. 21-25; logits, not probabilities: far ahead the other classes' would underflow to 0,
    and tempered they are not). Answers that each
    move the log-odds of the most likely class z* by the drift of A8 (FAR_LABELS of them)
    raise the untempered posterior toward 1, but the served one only toward a limit: the
    tempering divides that log-odds by T_i = 1 + rho (n_i - 1), so it tends to drift / rho,
    and the consensus error caps the confidence at 1 - eps. Where the limit is below the
    target (a crowd that errs together, as the calibration reads it) the item never gets
    there, and A8's count of the labels it needs is infinite, not Wald's."""
    q = _as_posteriors(posteriors)
    n = q.shape[0]
    if not 0.0 < target < 1.0:
        done: BoolArray = q.max(axis=1) >= target  # (as A8: there, or never)
        return done
    top, drift = _top_and_drift(q, np.asarray(confusion, dtype=np.float64))
    rows = np.arange(n)
    logits = np.log(np.maximum(q, 1e-300))
    logits[rows, top] += FAR_LABELS * np.maximum(drift, 0.0)
    weight = np.asarray(label_weight, dtype=np.float64) + FAR_LABELS
    out: BoolArray = served(logits, weight)[rows, top] >= target
    return out


@dataclass(frozen=True)
class StoppingRule:
    """A project's stopping rule (eq. A7): an item is finished once its most likely label is
    at least ``target_confidence`` probable, or it has ``max_labels_per_item`` labels; every
    item is finished once ``budget`` labels have been spent (None: no such limit)."""

    target_confidence: float = 0.95
    max_labels_per_item: int | None = None
    budget: int | None = None

    def __post_init__(self) -> None:
        if not 0.0 < self.target_confidence <= 1.0:
            raise ValueError("target_confidence must be in (0, 1]")
        if self.max_labels_per_item is not None and self.max_labels_per_item < 1:
            raise ValueError("max_labels_per_item must be >= 1")
        if self.budget is not None and self.budget < 0:
            raise ValueError("budget must be >= 0")

    def finished(
        self, posteriors: npt.ArrayLike, n_labels: npt.ArrayLike, labels_used: int = 0
    ) -> BoolArray:
        """Per item: needs no more labels. ``labels_used``: labels spent so far on the project."""
        q = _as_posteriors(posteriors)
        n = np.asarray(n_labels)
        if n.shape != (q.shape[0],):
            raise ValueError("n_labels needs one count per item")
        if self.budget is not None and labels_used >= self.budget:
            return np.ones(q.shape[0], dtype=np.bool_)
        done: BoolArray = q.max(axis=1) >= self.target_confidence
        if self.max_labels_per_item is not None:
            done |= n >= self.max_labels_per_item
        return done

    def remaining_budget(self, labels_used: int) -> int | None:
        """Labels left to spend (None without a budget)."""
        return None if self.budget is None else max(self.budget - labels_used, 0)


def select(
    scores: npt.ArrayLike,
    finished: npt.ArrayLike,
    already_labelled_by_worker: npt.ArrayLike | None = None,
    limit: int = 1,
) -> IntArray:
    """Indices of at most ``limit`` items with the highest scores, best first.

    Skips finished items, items with a non-finite score, and (for a worker asking for work)
    items in ``already_labelled_by_worker`` (a boolean mask over items, or item indices).
    Ties go to the lower index, so the choice is deterministic.
    """
    s = np.asarray(scores, dtype=np.float64)
    done = np.asarray(finished, dtype=np.bool_)
    if s.ndim != 1 or done.shape != s.shape:
        raise ValueError("scores and finished need one entry per item")
    ok = ~done & np.isfinite(s)
    if already_labelled_by_worker is not None:
        seen = np.asarray(already_labelled_by_worker)
        if seen.dtype == np.bool_:
            if seen.shape != s.shape:
                raise ValueError("already_labelled_by_worker mask needs one entry per item")
            ok &= ~seen
        else:
            ok[seen.astype(np.int64)] = False
    candidates = np.flatnonzero(ok)
    if limit <= 0 or candidates.size == 0:
        return np.zeros(0, dtype=np.int64)
    cs = s[candidates]
    if candidates.size > limit:
        # The limit-th best score; keep everything above it and the lowest-index ties at it.
        kth = np.partition(-cs, limit - 1)[limit - 1]
        keep = -cs <= kth
        candidates, cs = candidates[keep], cs[keep]
    order = np.lexsort((candidates, -cs))[:limit]
    out: IntArray = candidates[order].astype(np.int64)
    return out
