"""Seeded synthetic crowdsourcing data drawn from a Dawid-Skene model (vectorised numpy)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    import pandas as pd

I64 = npt.NDArray[np.int64]

GOOD, SPAMMER, SWAPPER = 0, 1, 2
"""Worker kinds stored in :attr:`SyntheticSet.kind`."""


@dataclass(frozen=True, eq=False)
class SyntheticSet:
    """One synthetic answer set: one row per answer in ``items``/``workers``/``labels``.

    ``truth[i]`` is the true class of item ``i``; ``prior`` is the class prior the truths were
    drawn from, ``confusion[w, t, l]`` is P(worker ``w`` answers ``l`` | true class ``t``) and
    ``kind[w]`` is ``GOOD``, ``SPAMMER`` or ``SWAPPER``.
    """

    items: I64
    workers: I64
    labels: I64
    truth: I64
    n_classes: int
    prior: npt.NDArray[np.float64] = field(repr=False)
    confusion: npt.NDArray[np.float64] = field(repr=False)
    kind: npt.NDArray[np.int8] = field(repr=False)

    @property
    def n_items(self) -> int:
        """Number of items (length of ``truth``)."""
        return len(self.truth)

    @property
    def n_workers(self) -> int:
        """Number of workers in the pool (some may have no answers)."""
        return len(self.kind)


def _confusions(
    rng: np.random.Generator, n_workers: int, K: int, spammer_frac: float, swapper_frac: float
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.int8]]:
    """Per-worker KxK confusion matrices (rows = true class, sum to 1) and worker kinds."""
    u = rng.random(n_workers)
    kind = np.full(n_workers, GOOD, dtype=np.int8)
    kind[u < spammer_frac] = SPAMMER
    kind[(u >= spammer_frac) & (u < spammer_frac + swapper_frac)] = SWAPPER

    # Good workers: diagonal ~ U(0.6, 0.9) per (worker, true class); the rest of the row is
    # spread over the other classes with Dirichlet(1) weights.
    eye = np.eye(K, dtype=bool)
    off = rng.gamma(1.0, size=(n_workers, K, K))
    off[:, eye] = 0.0
    off /= off.sum(axis=2, keepdims=True)
    diag = rng.uniform(0.6, 0.9, size=(n_workers, K))
    conf = off * (1.0 - diag)[:, :, None]
    conf[:, eye] = diag

    # Swappers: a good worker whose answers for one random pair of classes (a, b) are swapped,
    # so true a is mostly answered b and vice versa.
    sw = np.flatnonzero(kind == SWAPPER)
    a = rng.integers(0, K, size=len(sw))
    b = (a + rng.integers(1, K, size=len(sw))) % K  # b != a
    col_a = conf[sw, :, a].copy()
    conf[sw, :, a] = conf[sw, :, b]
    conf[sw, :, b] = col_a

    # Spammers: one near-uniform answer distribution, independent of the true class.
    sp = np.flatnonzero(kind == SPAMMER)
    conf[sp] = rng.dirichlet(np.full(K, 20.0), size=len(sp))[:, None, :]
    return conf, kind


def distinct_workers(rng: np.random.Generator, n_items: int, r: int, n_workers: int) -> I64:
    """``n_items x r`` worker ids, distinct within each row, each row a uniform r-subset.

    Robert Floyd's sampling algorithm, vectorised over items (r passes, no rejection loop).
    """
    chosen = np.empty((n_items, r), dtype=np.int64)
    for k, j in enumerate(range(n_workers - r, n_workers)):
        t = rng.integers(0, j + 1, size=n_items)
        taken = (chosen[:, :k] == t[:, None]).any(axis=1)
        chosen[:, k] = np.where(taken, j, t)
    return chosen


def dawid_skene(
    n_items: int = 200_000,
    answers_per_item: int = 5,
    n_workers: int = 2_000,
    n_classes: int = 5,
    seed: int = 0,
    *,
    spammer_frac: float = 0.10,
    swapper_frac: float = 0.15,
) -> SyntheticSet:
    """Draw a Dawid-Skene answer set; the same arguments always give the same arrays.

    True classes come from a non-uniform prior drawn once from Dirichlet(2·1). Each item is
    answered by ``answers_per_item`` distinct workers drawn uniformly from the pool. Workers are
    good (diagonal 0.6-0.9), near-uniform spammers (``spammer_frac``) or good-but-swapping one
    class pair (``swapper_frac``). Answer rows are returned in random order.
    """
    if not 1 <= answers_per_item <= n_workers:
        raise ValueError("need 1 <= answers_per_item <= n_workers")
    if n_classes < 2:
        raise ValueError("need n_classes >= 2")
    rng = np.random.default_rng(seed)
    K = n_classes
    prior = rng.dirichlet(np.full(K, 2.0))
    truth = rng.choice(K, size=n_items, p=prior).astype(np.int64)
    conf, kind = _confusions(rng, n_workers, K, spammer_frac, swapper_frac)

    workers = distinct_workers(rng, n_items, answers_per_item, n_workers).ravel()
    items = np.repeat(np.arange(n_items, dtype=np.int64), answers_per_item)

    # Inverse-CDF sampling from row conf[worker, truth[item]].
    cdf = np.cumsum(conf, axis=2)
    rows = cdf[workers, truth[items]]
    u = rng.random(len(items))
    labels = np.minimum((u[:, None] >= rows).sum(axis=1), K - 1).astype(np.int64)

    perm = rng.permutation(len(items))
    return SyntheticSet(
        items=items[perm],
        workers=workers[perm],
        labels=labels[perm],
        truth=truth,
        n_classes=K,
        prior=prior,
        confusion=conf,
        kind=kind,
    )


def _as_str(ids: I64, n: int) -> npt.NDArray[np.object_]:
    """Map ids in ``[0, n)`` to shared Python str objects (fast: one str per distinct id)."""
    table = np.arange(n).astype(str).astype(object)
    return table[ids]


def to_frame(s: SyntheticSet) -> pd.DataFrame:
    """Answers as a crowd-kit style frame: columns task, worker, label, all str (object dtype)."""
    import pandas as pd  # (only here: the service's benchmarks import this module)

    return pd.DataFrame(
        {
            "task": _as_str(s.items, s.n_items),
            "worker": _as_str(s.workers, s.n_workers),
            "label": _as_str(s.labels, s.n_classes),
        }
    )
