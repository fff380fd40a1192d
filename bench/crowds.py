"""Crowds for the quality benchmark: the shared real datasets and seeded synthetic regimes.

A :class:`Crowd` holds one answer set as int64 codes (one row per answer), the gold class per
item (-1 where unknown) and, for synthetic crowds, the *oracle*: the exact posterior over each
item's class under the true generating parameters (log prior + the sum of the log-likelihoods
of the item's answers, then a softmax). No method can beat the oracle on average; it is the
limit the benchmark measures against.

Synthetic regimes (``SYNTHETIC``), each seeded and deterministic, 3,000-4,000 items:

* ``ds``: full per-worker confusion matrices (Dirichlet rows around the diagonal);
* ``one_coin``: symmetric workers, p(correct) = a_w, errors uniform over the other classes;
* ``spammers``: good workers mixed with uniform-random spammers, always-the-same-label
  spammers and adversarial workers who systematically answer one wrong class;
* ``sparse``: a long tail of workers (most give at most 5 answers) and a few heavy workers;
* ``difficulty``: GLAD-like, p(correct) = sigmoid(alpha_w * beta_i), some items very hard;
* ``imbalance``: class prior 0.70 / 0.20 / 0.07 / 0.03;
* ``many_classes``: 12 classes, each class confused with a few neighbours only;
* ``sparse_one_coin``: a long tail of sparse symmetric workers, 5 classes, 3 answers an item;
* ``thin``: 2 answers an item from sparse symmetric workers, 4 classes (with fewer than
  three answers an item, the confusions are identified only through the workers);
* ``sparse_many_classes``: sparse symmetric workers over 10 classes, 3 answers an item;
* ``sparse_30_classes``: sparse symmetric workers over 30 classes, 3 answers an item (two
  agreeing answers are strong evidence there: the population must learn that workers beat
  a chance of 1 in 30 by far).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pandas as pd

from bench.datasets import DEFAULT_ROOT

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]

DENSE_MIN = 50
"""A crowd is *dense* when every worker gives at least this many answers."""
SPARSE_MAX = 5
"""A crowd is *mostly sparse* when more than half of its workers give at most this many."""


@dataclass(frozen=True, eq=False)
class Crowd:
    """One answer set: ``item[j]``, ``worker[j]``, ``label[j]`` are the codes of answer j."""

    name: str
    description: str
    item: I64
    worker: I64
    label: I64
    n_items: int
    n_workers: int
    classes: tuple[str, ...]
    gold: I64
    """The gold class code per item, -1 where unknown."""
    worker_names: tuple[str, ...] = field(default=(), repr=False)
    """Original worker ids (what the service hashes into slots); codes as str when empty."""
    oracle: F64 | None = field(default=None, repr=False)
    """(n_items, K) exact posteriors under the true parameters (synthetic crowds only)."""
    answer_loglik: F64 | None = field(default=None, repr=False)
    """(n_answers, K): log p(label_j | true class z) under the true parameters, and
    ``log_prior`` (K,): the oracle posterior of any subset of the answers (synthetic only)."""
    log_prior: F64 | None = field(default=None, repr=False)
    synthetic: bool = False

    @property
    def n_classes(self) -> int:
        return len(self.classes)

    @property
    def n_answers(self) -> int:
        return int(self.item.size)

    def worker_ids(self) -> list[str]:
        """The string id of each worker code (for hashing into the online model's slots)."""
        if self.worker_names:
            return list(self.worker_names)
        return [str(w) for w in range(self.n_workers)]

    def answers_per_worker(self) -> I64:
        return np.bincount(self.worker, minlength=self.n_workers).astype(np.int64)

    @property
    def dense(self) -> bool:
        """Every worker gives at least ``DENSE_MIN`` answers."""
        apw = self.answers_per_worker()
        return bool(apw.size > 0 and apw.min() >= DENSE_MIN)

    @property
    def mostly_sparse(self) -> bool:
        """More than half of the workers give at most ``SPARSE_MAX`` answers."""
        return bool(np.mean(self.answers_per_worker() <= SPARSE_MAX) > 0.5)

    def frame(self) -> pd.DataFrame:
        """Answers as a crowd-kit frame (columns task, worker, label; int codes)."""
        return pd.DataFrame({"task": self.item, "worker": self.worker, "label": self.label})

    def summary(self) -> str:
        apw = self.answers_per_worker()
        return (
            f"{self.n_classes} classes, {self.n_items} items, {self.n_workers} workers, "
            f"{self.n_answers} answers, median {int(np.median(apw))} answers/worker, "
            f"{int(np.sum(self.gold >= 0))} items with gold"
        )


# ---------------------------------------------------------------------------------------
# The shared real datasets


def load_shared(name: str, root: Path = DEFAULT_ROOT) -> Crowd:
    """``root/name/answers.csv`` and ``truth.csv`` as a crowd: items and workers coded in order
    of first appearance, labels coded in sorted (string) order; repeated answers are kept."""
    folder = Path(root) / name
    answers = pd.read_csv(folder / "answers.csv", dtype=str, keep_default_na=False)
    if list(answers.columns) != ["item", "worker", "label"]:
        raise ValueError(f"{folder / 'answers.csv'}: header {list(answers.columns)}")
    truth = pd.read_csv(folder / "truth.csv", dtype=str, keep_default_na=False)
    if list(truth.columns) != ["item", "label"]:
        raise ValueError(f"{folder / 'truth.csv'}: header {list(truth.columns)}")
    item, item_names = pd.factorize(answers["item"], sort=False)
    worker, worker_names = pd.factorize(answers["worker"], sort=False)
    label, classes = pd.factorize(answers["label"], sort=True)
    gold = np.full(len(item_names), -1, dtype=np.int64)
    where = pd.Index(item_names).get_indexer(truth["item"])
    cls = pd.Index(classes).get_indexer(truth["label"])
    if np.any(cls < 0):
        raise ValueError(f"{folder / 'truth.csv'}: gold labels nobody answered")
    seen = where >= 0  # gold for items without answers is dropped
    gold[where[seen]] = cls[seen]
    return Crowd(
        name=name,
        description="shared dataset",
        item=item.astype(np.int64),
        worker=worker.astype(np.int64),
        label=label.astype(np.int64),
        n_items=len(item_names),
        n_workers=len(worker_names),
        classes=tuple(str(c) for c in classes),
        gold=gold,
        worker_names=tuple(str(w) for w in worker_names),
    )


# ---------------------------------------------------------------------------------------
# Synthetic regimes


def _distinct(rng: np.random.Generator, n_items: int, r: int, weights: F64) -> I64:
    """``n_items x r`` worker codes, distinct per row, drawn by successive sampling with
    probabilities proportional to ``weights`` (Gumbel top-r, vectorised in chunks)."""
    log_w = np.log(weights)
    out = np.empty((n_items, r), dtype=np.int64)
    for start in range(0, n_items, 1000):
        stop = min(n_items, start + 1000)
        keys = log_w[None, :] + rng.gumbel(size=(stop - start, weights.size))
        out[start:stop] = np.argpartition(-keys, r - 1, axis=1)[:, :r]
    return out


def _dirichlet_confusions(
    rng: np.random.Generator, n_workers: int, K: int, strength: F64, base: float = 1.0
) -> F64:
    """Confusion matrices (n_workers, K, K): row z ~ Dirichlet(base + strength_w e_z)."""
    alpha = base + strength[:, None, None] * np.eye(K)[None]
    g = rng.gamma(alpha)
    out: F64 = g / g.sum(axis=2, keepdims=True)
    return out


def _draw_labels(rng: np.random.Generator, rows: F64) -> I64:
    """One label per row of probabilities (inverse CDF)."""
    cdf = np.cumsum(rows, axis=1)
    u = rng.random(rows.shape[0]) * cdf[:, -1]
    out: I64 = np.minimum((u[:, None] >= cdf).sum(axis=1), rows.shape[1] - 1).astype(np.int64)
    return out


def _finish(
    rng: np.random.Generator,
    name: str,
    description: str,
    truth: I64,
    item: I64,
    worker: I64,
    label: I64,
    loglik: F64,
    log_prior: F64,
    n_workers: int,
) -> Crowd:
    """The oracle (softmax of log prior + per-item sum of ``loglik[j, z]`` = log p(label_j |
    z, ...)), then the answers in random order."""
    n, K = truth.size, log_prior.size
    logpost = np.tile(log_prior, (n, 1))
    for z in range(K):
        logpost[:, z] += np.bincount(item, weights=loglik[:, z], minlength=n)
    logpost -= logpost.max(axis=1, keepdims=True)
    oracle = np.exp(logpost)
    oracle /= oracle.sum(axis=1, keepdims=True)
    perm = rng.permutation(item.size)
    return Crowd(
        name=name,
        description=description,
        item=item[perm],
        worker=worker[perm],
        label=label[perm],
        n_items=n,
        n_workers=n_workers,
        classes=tuple(str(k) for k in range(K)),
        gold=truth.copy(),
        oracle=oracle,
        answer_loglik=loglik[perm],
        log_prior=log_prior,
        synthetic=True,
    )


def _confusion_crowd(
    rng: np.random.Generator,
    name: str,
    description: str,
    prior: F64,
    conf: F64,
    n_items: int,
    per_item: int,
    weights: F64 | None = None,
) -> Crowd:
    """Items drawn from ``prior``, each answered by ``per_item`` distinct workers (chosen
    uniformly or proportionally to ``weights``) through their confusion ``conf[w, z, :]``."""
    K, W = prior.size, conf.shape[0]
    truth = rng.choice(K, size=n_items, p=prior).astype(np.int64)
    w = np.ones(W) if weights is None else weights
    worker = _distinct(rng, n_items, per_item, w).ravel()
    item = np.repeat(np.arange(n_items, dtype=np.int64), per_item)
    label = _draw_labels(rng, conf[worker, truth[item]])
    loglik = np.log(conf[worker, :, label])  # (answers, K): log p(label | z) for every z
    return _finish(rng, name, description, truth, item, worker, label, loglik, np.log(prior), W)


def synth_ds(seed: int = 0) -> Crowd:
    """Full Dawid-Skene confusions: 3,000 items x 5 answers, 100 workers, 4 classes."""
    rng = np.random.default_rng([seed, 1])
    K, W = 4, 100
    strength = rng.uniform(1.5, 12.0, size=W)  # mean diagonal (1+s)/(K+s): 0.45 .. 0.81
    conf = _dirichlet_confusions(rng, W, K, strength)
    prior = rng.dirichlet(np.full(K, 8.0))
    return _confusion_crowd(
        rng, "syn_ds", "Dawid-Skene confusions (Dirichlet rows)", prior, conf, 3000, 5
    )


def _one_coin_crowd(
    rng: np.random.Generator,
    name: str,
    description: str,
    K: int,
    W: int,
    accuracy: tuple[float, float],
    n_items: int,
    per_item: int,
) -> Crowd:
    """W symmetric workers right with p uniform in ``accuracy``, a uniform class prior."""
    conf = _one_coin_rows(rng.uniform(*accuracy, size=W), K)
    prior = np.full(K, 1.0 / K)
    return _confusion_crowd(rng, name, description, prior, conf, n_items, per_item)


def synth_one_coin(seed: int = 0) -> Crowd:
    """Symmetric workers: 3,000 items x 5 answers, 80 workers, 3 classes, a_w in 0.4..0.95."""
    rng = np.random.default_rng([seed, 2])
    description = "one-coin workers (symmetric errors)"
    return _one_coin_crowd(rng, "syn_one_coin", description, 3, 80, (0.4, 0.95), 3000, 5)


def synth_spammers(seed: int = 0) -> Crowd:
    """3,000 items x 6 answers, 100 workers, 4 classes: 50% good, 15% uniform spammers, 15%
    always-the-same-label, 20% adversarial (true z answered as a fixed wrong class 75%)."""
    rng = np.random.default_rng([seed, 3])
    K, W = 4, 100
    conf = _dirichlet_confusions(rng, W, K, rng.uniform(4.0, 14.0, size=W))
    kind = rng.choice(4, size=W, p=[0.5, 0.15, 0.15, 0.2])
    conf[kind == 1] = 1.0 / K
    same = np.flatnonzero(kind == 2)
    fav = rng.integers(0, K, size=same.size)
    conf[same] = 0.01 / (K - 1)
    conf[same, :, fav] = 0.99
    adv = np.flatnonzero(kind == 3)
    shift = rng.integers(1, K, size=adv.size)  # true z -> (z + shift) % K
    rows = np.arange(K)
    conf[adv] = 0.25 / (K - 1)
    conf[adv[:, None], rows[None, :], (rows[None, :] + shift[:, None]) % K] = 0.75
    prior = rng.dirichlet(np.full(K, 8.0))
    return _confusion_crowd(
        rng,
        "syn_spammers",
        "good, uniform-spam, same-label and adversarial workers",
        prior,
        conf,
        3000,
        6,
    )


def synth_sparse(seed: int = 0) -> Crowd:
    """4,000 items x 5 answers from 2,000 workers with lognormal activity (sigma 1.8): most
    give at most 5 answers, a few give hundreds; Dawid-Skene confusions, 3 classes."""
    rng = np.random.default_rng([seed, 4])
    K, W = 3, 2000
    conf = _dirichlet_confusions(rng, W, K, rng.uniform(1.5, 12.0, size=W))
    activity = rng.lognormal(0.0, 1.8, size=W)
    prior = rng.dirichlet(np.full(K, 8.0))
    return _confusion_crowd(
        rng,
        "syn_sparse",
        "long tail of sparse workers (lognormal activity)",
        prior,
        conf,
        4000,
        5,
        weights=activity,
    )


def synth_difficulty(seed: int = 0) -> Crowd:
    """GLAD-like binary items: p(correct) = sigmoid(alpha_w * beta_i); 3,000 items x 7
    answers, 100 workers with alpha_w = exp(N(0.3, 0.9)); beta_i = exp(N(0.3, 0.5)), 20% hard items with beta_i in 0..0.3."""
    rng = np.random.default_rng([seed, 5])
    K, W, n, r = 2, 100, 3000, 7
    alpha = rng.lognormal(0.3, 0.9, size=W)
    beta = np.exp(rng.normal(0.3, 0.5, size=n))
    hard = rng.random(n) < 0.2
    beta[hard] = rng.uniform(0.0, 0.3, size=int(hard.sum()))
    prior = np.array([0.5, 0.5])
    truth = rng.choice(K, size=n, p=prior).astype(np.int64)
    worker = _distinct(rng, n, r, np.ones(W)).ravel()
    item = np.repeat(np.arange(n, dtype=np.int64), r)
    logit = alpha[worker] * beta[item]
    correct = rng.random(item.size) < 1.0 / (1.0 + np.exp(-logit))
    label = np.where(correct, truth[item], (truth[item] + rng.integers(1, K, item.size)) % K)
    log_right = -np.logaddexp(0.0, -logit)  # log sigmoid
    log_wrong = -np.logaddexp(0.0, logit) - np.log(K - 1)
    loglik = np.where(
        label[:, None] == np.arange(K)[None, :], log_right[:, None], log_wrong[:, None]
    )
    return _finish(
        rng,
        "syn_difficulty",
        "GLAD-like item difficulty (20% very hard items)",
        truth,
        item,
        worker,
        label.astype(np.int64),
        loglik,
        np.log(prior),
        W,
    )


def synth_imbalance(seed: int = 0) -> Crowd:
    """Class prior 0.70/0.20/0.07/0.03; 4,000 items x 5 answers, 120 workers, DS confusions."""
    rng = np.random.default_rng([seed, 6])
    K, W = 4, 120
    conf = _dirichlet_confusions(rng, W, K, rng.uniform(2.0, 12.0, size=W))
    prior = np.array([0.70, 0.20, 0.07, 0.03])
    return _confusion_crowd(
        rng, "syn_imbalance", "class imbalance 0.70/0.20/0.07/0.03", prior, conf, 4000, 5
    )


def synth_many_classes(seed: int = 0) -> Crowd:
    """12 classes on a ring: a worker answers the true class with p in 0.5..0.9 and errs mostly
    to the two neighbouring classes (and a little anywhere); 3,000 items x 5, 100 workers."""
    rng = np.random.default_rng([seed, 7])
    K, W = 12, 100
    acc = rng.uniform(0.5, 0.9, size=W)
    near = rng.dirichlet(np.full(3, 2.0), size=(W, K))  # (left, right, anywhere) per row
    rows = np.arange(K)
    conf = np.empty((W, K, K))
    err = (1.0 - acc)[:, None]
    conf[:] = (err * near[:, :, 2])[:, :, None] / (K - 3)
    conf[:, rows, (rows - 1) % K] = err * near[:, :, 0]
    conf[:, rows, (rows + 1) % K] = err * near[:, :, 1]
    conf[:, rows, rows] = acc[:, None]
    prior = rng.dirichlet(np.full(K, 10.0))
    return _confusion_crowd(
        rng, "syn_many_classes", "12 classes, confusions with neighbours", prior, conf, 3000, 5
    )


def synth_weak(seed: int = 0) -> Crowd:
    """Weak workers and much redundancy: 2,000 binary items x 15 answers from 300 symmetric
    workers right 55-65% of the time (each answer says little; majority vote does well)."""
    rng = np.random.default_rng([seed, 11])
    description = "weak workers (55-65% right), 15 answers an item"
    return _one_coin_crowd(rng, "syn_weak", description, 2, 300, (0.55, 0.65), 2000, 15)


def _one_coin_rows(acc: F64, K: int) -> F64:
    """Symmetric confusions (n_workers, K, K): the true class with p = acc_w, else uniform."""
    conf = np.repeat(((1.0 - acc) / (K - 1))[:, None, None], K, axis=1).repeat(K, axis=2)
    conf[:, np.arange(K), np.arange(K)] = acc[:, None]
    return conf


@dataclass(frozen=True)
class SparseSymmetric:
    """Symmetric workers (p(correct) uniform in ``accuracy``, errors uniform over the other
    classes) with lognormal activity, a uniform class prior."""

    name: str
    stream: int
    """The seed's second word, one per regime."""
    description: str
    n_classes: int
    per_item: int
    n_items: int
    n_workers: int
    sigma: float
    """Of the lognormal activity: most workers give at most 5 answers from about 1.5 up."""
    accuracy: tuple[float, float]

    def __call__(self, seed: int = 0) -> Crowd:
        rng = np.random.default_rng([seed, self.stream])
        K = self.n_classes
        conf = _one_coin_rows(rng.uniform(*self.accuracy, size=self.n_workers), K)
        activity = rng.lognormal(0.0, self.sigma, size=self.n_workers)
        prior = np.full(K, 1.0 / K)
        return _confusion_crowd(
            rng, self.name, self.description, prior, conf, self.n_items, self.per_item, activity
        )


SPARSE_SYMMETRIC = {
    "sparse_one_coin": SparseSymmetric(
        "syn_sparse_one_coin", stream=8,
        description="sparse symmetric workers, 3 answers an item, 5 classes",
        n_classes=5, per_item=3, n_items=3000, n_workers=1500, sigma=1.8, accuracy=(0.35, 0.9),
    ),
    "thin": SparseSymmetric(
        "syn_thin", stream=9,
        description="2 answers an item from sparse symmetric workers, 4 classes",
        n_classes=4, per_item=2, n_items=4000, n_workers=800, sigma=1.5, accuracy=(0.4, 0.9),
    ),
    "sparse_many_classes": SparseSymmetric(
        "syn_sparse_many_classes", stream=10,
        description="sparse symmetric workers, 3 answers an item, 10 classes",
        n_classes=10, per_item=3, n_items=5000, n_workers=2500, sigma=1.8, accuracy=(0.3, 0.9),
    ),
    "sparse_30_classes": SparseSymmetric(
        "syn_sparse_30_classes", stream=12,
        description="sparse symmetric workers, 3 answers an item, 30 classes",
        n_classes=30, per_item=3, n_items=4000, n_workers=1500, sigma=1.5, accuracy=(0.3, 0.9),
    ),
}  # fmt: skip
"""Crowds of sparse symmetric workers by regime name (two thirds of the workers, or more,
give at most 5 answers)."""


SYNTHETIC: dict[str, Callable[[int], Crowd]] = {
    "ds": synth_ds,
    "one_coin": synth_one_coin,
    "spammers": synth_spammers,
    "sparse": synth_sparse,
    "difficulty": synth_difficulty,
    "imbalance": synth_imbalance,
    "many_classes": synth_many_classes,
    "weak": synth_weak,
    **SPARSE_SYMMETRIC,
}
"""Synthetic regimes by short name; each generator takes a seed."""


def synthetic(name: str, seed: int = 0) -> Crowd:
    """The synthetic crowd of regime ``name`` (a key of ``SYNTHETIC``)."""
    if name not in SYNTHETIC:
        raise ValueError(f"unknown synthetic regime {name!r}; expected one of {list(SYNTHETIC)}")
    return SYNTHETIC[name](seed)
