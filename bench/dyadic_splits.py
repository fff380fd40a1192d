"""The dyadic benchmark's data and protocol, shared by ``bench.dyadic`` and ``bench.dyadic_peers``:
the shared datasets as (rater, task, label) codes, the random train/test splits both run on,
the best constant's loss, and the reference figures the peers are compared with.
"""

from __future__ import annotations

import csv

import numpy as np

from bench.datasets import DEFAULT_ROOT

ROOT = DEFAULT_ROOT
NOMINAL = ("dog", "face", "product", "duck")
ORDINAL = ("web", "trec2010")
# the table (its author's runs, "same protocol, 5 splits, 0/1 test loss"):
# VW linear, VW lrq, myfm r0, myfm best
REFERENCE = {
    "dog": (0.238, 0.248, 0.242, 0.228),
    "face": (0.246, 0.249, 0.235, 0.233),
    "product": (0.133, 0.137, 0.138, 0.136),
    "duck": (0.217, 0.183, 0.215, 0.181),
}


def load(name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """(worker codes, item codes, label codes, n_classes); labels coded in sorted order."""
    items: dict[str, int] = {}
    workers: dict[str, int] = {}
    with open(ROOT / name / "answers.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    it = np.array([items.setdefault(r["item"], len(items)) for r in rows], dtype=np.int64)
    wk = np.array([workers.setdefault(r["worker"], len(workers)) for r in rows], dtype=np.int64)
    raw = [r["label"] for r in rows]
    try:
        distinct: list[str] = sorted(set(raw), key=float)
    except ValueError:
        distinct = sorted(set(raw))
    code = {v: j for j, v in enumerate(distinct)}
    return wk, it, np.array([code[v] for v in raw], dtype=np.int64), len(distinct)


def constant_loss(y: np.ndarray, tr: np.ndarray, te: np.ndarray, ordinal: bool) -> float:
    if ordinal:
        med = float(np.median(y[tr]))
        return float(np.mean(0.5 * np.abs(y[te] - med)))
    best = np.bincount(y[tr]).argmax()
    return float(np.mean(y[te] != best))


def splits(n: int, n_splits: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    out = []
    for s in range(n_splits):
        perm = np.random.default_rng(seed + s).permutation(n)
        n_tr = n * 15 // 16
        out.append((perm[:n_tr], perm[n_tr:]))
    return out
