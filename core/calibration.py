"""Calibrated posteriors: what an item's posterior is served as (docs/model.md, eq. 21-25).

The model's posterior q_i = softmax(log pi + l_i), with l_i(z) = sum_j h_j log p(l_j | z, s_j),
treats an item's answers as independent given its class. Real crowds answer the same item in
correlated ways (a hard item misleads many workers alike), so q_i is overconfident, the more
so the more answers the item has. The served posterior corrects for that with two numbers
per project:

* rho, the intra-item correlation of answers: n correlated answers carry the information of
  n / (1 + rho (n - 1)) independent ones (Kish's design effect), so the item's log posterior
  is tempered by T_i = 1 + rho max(n_i - 1, 0) (eq. 21): q_i^rho is proportional to
  q_i^(1/T_i), which keeps every item's most probable class. rho is learned without gold, by how
  well each new answer is predicted from the answers before it on the same item
  (prequential evidence, eq. 22), online at constant work per label;
* eps, the chance that the crowd's consensus class is not the true one even when the
  answers agree (eq. 23). It cannot be learned from answers alone (any such error looks
  like a class to the answers): it is 0 until gold items show it, through a Beta prior
  (mode 0, mean 0.04). Without gold, the tempering alone bounds the confidence that many
  agreeing answers can give: n answers count as at most 1/rho independent ones.

With gold, a few dozen items leave (rho, eps) uncertain, and the best single pair chosen on
them swings with the sample; the served posterior is then the posterior mean of eq. 21 over
both (eq. 25), a mixture of a few tempered posteriors.

Learning (the E-steps that move the parameters) keeps the untempered q_i: tempering inside
EM lets it drift to degenerate fits. Only what is served, and what decisions read (the
queue's stopping rule, exports, the dashboard), is calibrated.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from core import _calibration_kernels
from core.blocks import CodeArray
from core.evidence import RHO_GRID, evidence_size
from core.nominal import softmax
from core.threads import in_threads

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

EPS_GRID: FloatArray = np.array(
    [0.0, 0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3]
)
"""The consensus-error values searched with gold (eq. 24)."""
EPS_PRIOR = (1.0, 25.0)
"""Beta(a, b) prior of eps: mode 0 (answers alone never argue for it), mean 0.04, worth
about 25 gold items."""
MIN_WEIGHT = 1e-3
"""Tempering values whose posterior weight is below this share of the largest are left out of
the mixture of eq. 25."""
SLICE_ROWS = 1 << 16
"""Items taken at a time by ``row_slices`` (``Calibration.from_posteriors``, and eq. 26 and 28
over many items): their temporaries are a few arrays of this many rows."""
GOLD_WEIGHT_LABELS = 50.0
"""Eq. 24 weighs the prequential evidence like at most this many gold items (a mean per scored
answer times this, once more answers than this are scored): with fewer gold items rho follows
the answers; with more, the gold decides."""
RHO_PRIOR_AT_ZERO = 0.5
"""The prior mass of rho = 0 (answers independent given the class, the model's own
assumption); the rest is spread evenly over the grid's other values (eq. 22). A tempering must
then beat none by log(2 (G - 1)) nats of the answers' evidence (2.08 nats on the 9-value
grid), which a handful of scored answers cannot: on a fresh project's first item, one answer
contradicting two before it weighs 0.17-0.40 nats (2 to 10 classes), three such 0.2-1.2."""
MIN_GAIN_PER_ANSWER = 0.00075
"""A tempering must predict the scored answers better than none by more than this many nats
an answer (eq. 22'; with gold this term is weighed with the rest of the answers' evidence,
like at most GOLD_WEIGHT_LABELS answers). One online pass scores its first answers with
immature rows, whose plug-in predictions are overconfident whatever the crowd: on crowds of
independent answers (one-coin and weak workers) that made a tempering win by 0.36-0.64
thousandths of a nat an answer, 10-17 nats over 26,000 answers, and T_i = 1.7-2.4 at 15
answers an item then flattened calibrated posteriors to 8 points of ECE. Crowds whose answers
are correlated within items gained 0.93-20 thousandths."""


def row_slices(n_rows: int) -> Iterator[slice]:
    """Slices of SLICE_ROWS rows that cover ``n_rows``, in order: row-wise work on many items
    taken a slice at a time keeps its temporaries those of a slice, with the same results."""
    return (slice(lo, lo + SLICE_ROWS) for lo in range(0, n_rows, SLICE_ROWS))


@dataclass(frozen=True)
class Calibration:
    """The two numbers of eq. 21: served = (1 - eps) q^rho + eps (1 - q^rho) / (K - 1), with
    q^rho proportional to q^(1/T).

    With gold, what is served is the posterior mean of eq. 21 over (rho, eps) (eq. 25):
    ``components`` holds (weight, rho, eps) triples, eps the posterior mean of eps given that
    rho; ``rho`` and ``eps`` are then the posterior means. Without components, the one pair."""

    rho: float = 0.0
    eps: float = 0.0
    components: tuple[tuple[float, float, float], ...] = ()

    def temperatures(self, n_labels: npt.ArrayLike) -> FloatArray:
        """T_i = 1 + rho max(n_i - 1, 0) (eq. 21)."""
        return _temperatures(self.rho, n_labels)

    def from_log_likelihood(
        self, log_likelihood: FloatArray, n_labels: npt.ArrayLike, log_prior: FloatArray
    ) -> FloatArray:
        """Served posteriors from l_i (rows) and the items' label weights n_i."""
        logits = log_prior + np.asarray(log_likelihood)
        parts = self.components or ((1.0, self.rho, self.eps),)
        out: FloatArray = sum(
            (
                w * _mix(softmax(logits / _temperatures(r, n_labels)[..., None]), e)
                for w, r, e in parts
            ),
            start=np.zeros_like(logits),
        )
        return out

    def from_posteriors(
        self,
        posteriors: FloatArray,
        n_labels: npt.ArrayLike,
        threads: int = 1,
        out: FloatArray | None = None,
    ) -> FloatArray:
        """Served posteriors from the model's untempered ones (log q_i = log pi + l_i up to a
        constant, which the softmax removes). Exact while no q_i(z) underflows to 0. Rows are
        taken SLICE_ROWS at a time, so the temporaries stay those of a slice a thread; the
        slices are the same whatever ``threads`` (numpy releases the GIL), and so are the
        results, bit for bit. ``out``: where to write them (``posteriors`` itself, when the
        caller needs them no more: a slice is read before it is written)."""
        q = np.asarray(posteriors, dtype=np.float64)
        n = np.broadcast_to(np.asarray(n_labels, dtype=np.float64), q.shape[:-1])
        if q.ndim < 2 or q.shape[0] <= SLICE_ROWS:
            served = self._from_posteriors(q, n)
            if out is None:
                return served
            out[...] = served
            return out
        out = np.empty_like(q) if out is None else out

        def slices(parts: list[slice]) -> None:
            for part in parts:
                out[part] = self._from_posteriors(q[part], n[part])

        every, threads = list(row_slices(q.shape[0])), max(1, threads)
        in_threads(slices, [every[k::threads] for k in range(threads)])
        return out

    def _from_posteriors(self, q: FloatArray, n_labels: FloatArray) -> FloatArray:
        with np.errstate(divide="ignore"):
            log_q = np.log(q)
        log_q = np.where(np.isfinite(log_q), log_q, -1e300)
        return self.from_log_likelihood(log_q, n_labels, np.zeros(q.shape[-1]))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rho": self.rho, "eps": self.eps}
        if self.components:
            out["components"] = [list(c) for c in self.components]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Calibration:
        if not data:
            return cls()
        parts = tuple((float(w), float(r), float(e)) for w, r, e in data.get("components") or ())
        return cls(float(data.get("rho", 0.0)), float(data.get("eps", 0.0)), parts)


def _temperatures(rho: float, n_labels: npt.ArrayLike) -> FloatArray:
    n = np.asarray(n_labels, dtype=np.float64)
    out: FloatArray = 1.0 + rho * np.maximum(n - 1.0, 0.0)
    return out


def _mix(q: FloatArray, eps: float) -> FloatArray:
    if eps == 0.0:
        return q
    out: FloatArray = (1.0 - eps) * q + eps * (1.0 - q) / (q.shape[-1] - 1)
    return out


def prior_eps() -> float:
    """The mode of eps's Beta prior with no gold (eq. 23)."""
    a, b = EPS_PRIOR
    return float(EPS_GRID[int(np.argmax(_log_beta(EPS_GRID, a, b)))])


def gold_evidence(
    log_likelihood: FloatArray, n_labels: npt.ArrayLike, log_prior: FloatArray, gold: IntArray
) -> FloatArray:
    """sum over gold items of log served_i(gold_i), for every (rho, eps) of the grids (eq. 24).

    ``log_likelihood`` rows are the gold items' l_i computed from their answers alone."""
    g = np.asarray(gold, dtype=np.int64)
    out = np.zeros((RHO_GRID.size, EPS_GRID.size))
    if g.size == 0:
        return out
    rows = np.arange(g.size)
    K = log_prior.shape[0]
    for r, rho in enumerate(RHO_GRID):
        q = Calibration(float(rho), 0.0).from_log_likelihood(log_likelihood, n_labels, log_prior)
        right = q[rows, g]
        for e, eps in enumerate(EPS_GRID):
            p = (1.0 - eps) * right + eps * (1.0 - right) / (K - 1)
            out[r, e] = float(np.sum(np.log(np.maximum(p, 1e-300))))
    return out


def choose(
    evidence: FloatArray | None, gold: FloatArray | None = None, n_gold: int = 0
) -> Calibration:
    """Eq. 22-25 over the grids. rho's score is its prior (``log_rho_prior``) plus the
    prequential evidence E(rho) in nats, less MIN_GAIN_PER_ANSWER for each answer scored when
    rho > 0 (eq. 22'); without gold the rho of highest score is served, with
    eps at its prior's mode. With gold that score is weighed like at most GOLD_WEIGHT_LABELS
    gold items (times min(1, GOLD_WEIGHT_LABELS / weight scored)), the gold items' likelihood
    and eps's Beta prior are added, and the posterior mean over the grid is served (eq. 25)."""
    G = RHO_GRID.size
    answers = log_rho_prior()
    scored = 0.0
    if evidence is not None and evidence[G] > 0:
        scored = float(evidence[G])
        answers = answers + evidence[:G] - MIN_GAIN_PER_ANSWER * scored * (RHO_GRID > 0.0)
    a, b = EPS_PRIOR
    log_eps = _log_beta(EPS_GRID, a, b)
    if gold is None or n_gold <= 0:
        return Calibration(float(RHO_GRID[int(np.argmax(answers))]), prior_eps())
    weight = min(1.0, GOLD_WEIGHT_LABELS / scored) if scored > 0 else 1.0
    return posterior_mean(weight * answers[:, None] + log_eps[None, :] + gold)


def log_rho_prior() -> FloatArray:
    """log of rho's prior over RHO_GRID: RHO_PRIOR_AT_ZERO at 0, the rest shared evenly."""
    rest = (1.0 - RHO_PRIOR_AT_ZERO) / (RHO_GRID.size - 1)
    out: FloatArray = np.log(np.where(RHO_GRID == 0.0, RHO_PRIOR_AT_ZERO, rest))
    return out


def posterior_mean(score: FloatArray) -> Calibration:
    """Eq. 25: the mixture of eq. 21 over the grid with weights proportional to exp(score).
    The served posterior is linear in eps, so each rho's eps is averaged into one component;
    rhos of weight below MIN_WEIGHT are left out (the rest renormalised)."""
    w = np.exp(score - score.max())
    w /= w.sum()
    w_rho = w.sum(axis=1)
    keep = w_rho >= MIN_WEIGHT * w_rho.max()
    eps_given_rho = (w[keep] @ EPS_GRID) / w_rho[keep]
    weights = w_rho[keep] / w_rho[keep].sum()
    parts = tuple(
        (float(x), float(r), float(e))
        for x, r, e in zip(weights, RHO_GRID[keep], eps_given_rho, strict=True)
    )
    rho = float(sum(x * r for x, r, _ in parts))
    eps = float(sum(x * e for x, _, e in parts))
    return Calibration(rho, eps, parts)


@dataclass(frozen=True)
class Reliability:
    """How well posteriors match known answers: the top label's accuracy, its expected
    calibration error (points; equal-width confidence bins), the mean negative log-likelihood
    of the known class and the Brier score, with the bins themselves."""

    n: int
    accuracy: float
    ece: float
    nll: float
    brier: float
    bin_edges: FloatArray
    bin_counts: IntArray
    bin_confidence: FloatArray
    """Mean top-label confidence per bin (NaN where empty)."""
    bin_accuracy: FloatArray
    """Share of items whose top label is the known one, per bin (NaN where empty)."""


def reliability(posteriors: FloatArray, truth: IntArray, n_bins: int = 10) -> Reliability:
    """``Reliability`` of ``posteriors`` (n, K) against ``truth`` (n,)."""
    q = np.asarray(posteriors, dtype=np.float64)
    t = np.asarray(truth, dtype=np.int64)
    edges = np.round(np.linspace(0.0, 1.0, n_bins + 1), 12)
    if t.size == 0:
        nan = np.full(n_bins, np.nan)
        return Reliability(0, np.nan, np.nan, np.nan, np.nan, edges,
                           np.zeros(n_bins, dtype=np.int64), nan, nan.copy())  # fmt: skip
    conf, right = q.max(axis=1), (q.argmax(axis=1) == t).astype(np.float64)
    b = np.minimum((conf * n_bins).astype(np.int64), n_bins - 1)
    counts = np.bincount(b, minlength=n_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_conf = np.bincount(b, conf, n_bins) / counts
        mean_right = np.bincount(b, right, n_bins) / counts
    has = counts > 0
    ece = 100.0 * float(np.sum(counts[has] / t.size * np.abs(mean_right[has] - mean_conf[has])))
    rows = np.arange(t.size)
    nll = float(-np.mean(np.log(np.clip(q[rows, t], 1e-12, 1.0))))
    onehot = np.zeros_like(q)
    onehot[rows, t] = 1.0
    brier = float(np.mean(np.sum((q - onehot) ** 2, axis=1)))
    return Reliability(
        int(t.size), float(right.mean()), ece, nll, brier, edges, counts, mean_conf, mean_right
    )


def cross_fitted(
    log_likelihood: FloatArray,
    n_labels: FloatArray,
    log_prior: FloatArray,
    gold: IntArray,
    evidence: FloatArray | None,
    folds: int = 5,
) -> FloatArray:
    """Served posteriors of gold items, each calibrated without its own gold (eq. 24 on the
    other folds; item k is in fold k mod ``folds``), from its answers alone: an honest score
    of the calibration on the project's own gold."""
    n = gold.size
    out = np.empty((n, log_prior.shape[0]))
    fold = np.arange(n) % max(folds, 1)
    for f in range(max(folds, 1)):
        held, rest = fold == f, fold != f
        if not held.any():
            continue
        g = gold_evidence(log_likelihood[rest], n_labels[rest], log_prior, gold[rest])
        cal = choose(evidence, g, int(rest.sum()))
        out[held] = cal.from_log_likelihood(log_likelihood[held], n_labels[held], log_prior)
    return out


def item_log_likelihoods(
    ptr: IntArray,
    slots: CodeArray,
    labels: CodeArray,
    weights: FloatArray,
    population: FloatArray,
    worker: FloatArray,
    scale: float = 1.0,
) -> tuple[FloatArray, FloatArray]:
    """(l_i, n_i) per block: the log-likelihood of each class and the label weight."""
    nb, K = ptr.size - 1, population.shape[0]
    ell, n = np.empty((nb, K)), np.empty(nb)
    _calibration_kernels.item_log_likelihoods(
        ptr, slots, labels, weights, population, worker, scale, ell, n
    )
    return ell, n


def prequential_evidence(
    ptr: IntArray,
    order: IntArray,
    n_old: IntArray,
    slots: CodeArray,
    labels: CodeArray,
    weights: FloatArray,
    class_logits: FloatArray,
    population: FloatArray,
    worker: FloatArray,
    scale: float = 1.0,
) -> FloatArray:
    """Eq. 22 for the blocks of ``order`` at fixed parameters (the online model accumulates
    the same sums as it learns, each block under the parameters before its update)."""
    evidence = np.zeros(evidence_size())
    log_prior = class_logits - _logsumexp(class_logits)
    codes = (np.ascontiguousarray(a, dtype=np.int32) for a in (slots, labels))  # (as blocks')
    _calibration_kernels.prequential_blocks(
        ptr, order, n_old, *codes, weights, log_prior, population, worker, scale,
        RHO_GRID, evidence,
    )  # fmt: skip
    return evidence


def _log_beta(x: FloatArray, a: float, b: float) -> FloatArray:
    """log of the Beta(a, b) density up to a constant (a power of 1 contributes nothing)."""

    def term(power: float, base: FloatArray) -> FloatArray:
        if power == 0.0:
            return np.zeros_like(base)
        with np.errstate(divide="ignore"):
            out: FloatArray = power * np.log(base)
        return out

    total: FloatArray = term(a - 1.0, x) + term(b - 1.0, 1.0 - x)
    return total


def _logsumexp(x: FloatArray) -> float:
    m = float(np.max(x))
    return m + float(np.log(np.sum(np.exp(x - m))))
