"""crowd-kit 1.4.2 baselines on the shared real datasets.

``python -m bench.peers [DATASET ...] [--methods M ...] [--seed N]`` prints, per dataset, each
method's accuracy on the gold items (percent) and its fit time (seconds), plus a mean row.

All five aggregators are fitted with crowd-kit's default hyperparameters. Only MACE is random
(``random_state``, default 0, set to ``seed``); DawidSkene, OneCoinDawidSkene, GLAD and Wawa are
deterministic (ties go to the first label column, i.e. the smallest label). Their progress bars
are off by default (GLAD ``silent=True``, MACE ``verbose=0``). Labels are handed to crowd-kit as
integer codes of the sorted distinct label strings and mapped back, so any label spelling works
(GLAD uses label values as DataFrame column names) and tie order equals string order.
"""

from __future__ import annotations

import argparse
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bench.datasets import DEFAULT_ROOT, dataset_names

PEER_METHODS: tuple[str, ...] = ("DawidSkene", "OneCoinDawidSkene", "GLAD", "MACE", "Wawa")


_SHORT = {"DawidSkene": "DS", "OneCoinDawidSkene": "1CoinDS"}


def _make(method: str, seed: int) -> Any:
    from crowdkit.aggregation import GLAD, MACE, DawidSkene, OneCoinDawidSkene, Wawa

    if method == "DawidSkene":
        return DawidSkene()
    if method == "OneCoinDawidSkene":
        return OneCoinDawidSkene()
    if method == "GLAD":
        return GLAD()
    if method == "MACE":
        return MACE(random_state=seed)
    if method == "Wawa":
        return Wawa()
    raise ValueError(f"unknown method {method!r}; expected one of {PEER_METHODS}")


def _fit(
    method: str, answers: pd.DataFrame, seed: int
) -> tuple[pd.Series, list[warnings.WarningMessage]]:
    """Fit ``method``; return its labels (original label strings) and the warnings it raised."""
    model = _make(method, seed)
    codes, uniques = pd.factorize(answers["label"], sort=True)
    data = pd.DataFrame(
        {
            "task": answers["task"].to_numpy(),
            "worker": answers["worker"].to_numpy(),
            "label": codes.astype(np.int64),
        }
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        labels = model.fit_predict(data)
    out = pd.Series(
        np.asarray(uniques, dtype=object)[labels.to_numpy(dtype=np.int64)],
        index=labels.index.rename("task"),
        name="agg_label",
    )
    return out, list(caught)


def peer_labels(method: str, answers: pd.DataFrame, seed: int = 0) -> pd.Series:
    """Aggregate ``answers`` (columns task, worker, label) with a crowd-kit method.

    Returns the predicted label (as in ``answers``) per task, indexed by task. Warnings raised
    inside crowd-kit are swallowed.
    """
    return _fit(method, answers, seed)[0]


def accuracy(pred: pd.Series, truth: pd.Series) -> float:
    """Fraction of items with both gold and a (non-null) prediction whose labels match as str.

    NaN if no item has both.
    """
    pred = pred.dropna()
    truth = truth.dropna()
    common = pred.index.intersection(truth.index)
    if len(common) == 0:
        return float("nan")
    p = pred.loc[common].astype(str).to_numpy()
    t = truth.loc[common].astype(str).to_numpy()
    return float(np.mean(p == t))


def load_dataset(name: str, root: Path = DEFAULT_ROOT) -> tuple[pd.DataFrame, pd.Series]:
    """Read ``root/name/answers.csv`` and ``truth.csv`` with every column as str.

    Returns ``(answers, truth)``: answers has columns task, worker, label (repeated
    (task, worker) pairs are kept); truth is the gold label indexed by item (index name
    ``task``, crowd-kit's convention), for the items that have one.
    """
    folder = Path(root) / name
    answers = pd.read_csv(folder / "answers.csv", dtype=str, keep_default_na=False)
    if list(answers.columns) != ["item", "worker", "label"]:
        raise ValueError(f"{folder / 'answers.csv'}: header {list(answers.columns)}")
    answers = answers.rename(columns={"item": "task"})
    gold = pd.read_csv(folder / "truth.csv", dtype=str, keep_default_na=False)
    if list(gold.columns) != ["item", "label"]:
        raise ValueError(f"{folder / 'truth.csv'}: header {list(gold.columns)}")
    truth = pd.Series(
        gold["label"].to_numpy(), index=pd.Index(gold["item"], name="task"), name="true_label"
    )
    return answers, truth


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    fmt = [f"{{:<{w}}}" if i == 0 else f"{{:>{w}}}" for i, w in enumerate(widths)]
    lines = [" ".join(f.format(c) for f, c in zip(fmt, r, strict=True)) for r in [header, *rows]]
    lines.insert(1, " ".join("-" * w for w in widths))
    lines.insert(len(lines) - 1, lines[1])
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Run every method on every dataset and print the accuracy / fit-time table."""
    ap = argparse.ArgumentParser(
        prog="python -m bench.peers", description=(__doc__ or "").split("\n")[0]
    )
    ap.add_argument("datasets", nargs="*", help="dataset names (default: all under the root)")
    ap.add_argument("--methods", nargs="+", default=list(PEER_METHODS), choices=PEER_METHODS)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--root", type=Path, default=DEFAULT_ROOT)
    args = ap.parse_args(argv)
    names = args.datasets or dataset_names(args.root)
    methods: list[str] = args.methods

    t_start = time.perf_counter()
    import crowdkit.aggregation  # noqa: F401  (import once here, not inside the first fit's timer)

    acc: dict[str, dict[str, float]] = {}
    sec: dict[str, dict[str, float]] = {}
    warned: dict[str, Counter[str]] = {m: Counter() for m in methods}
    for name in names:
        answers, truth = load_dataset(name, args.root)
        acc[name], sec[name] = {}, {}
        for m in methods:
            t0 = time.perf_counter()
            pred, caught = _fit(m, answers, args.seed)
            sec[name][m] = time.perf_counter() - t0
            acc[name][m] = accuracy(pred, truth)
            for w in caught:
                warned[m][f"{w.category.__name__}: {str(w.message).splitlines()[0][:90]}"] += 1

    short = [_SHORT.get(m, m) for m in methods]
    header = ["dataset", *(f"{s} %" for s in short), *(f"{s} s" for s in short)]
    rows = [
        [n, *(f"{100 * acc[n][m]:.2f}" for m in methods), *(f"{sec[n][m]:.2f}" for m in methods)]
        for n in names
    ]
    rows.append(
        [
            "mean",
            *(f"{100 * np.mean([acc[n][m] for n in names]):.2f}" for m in methods),
            *(f"{np.mean([sec[n][m] for n in names]):.2f}" for m in methods),
        ]
    )
    print(_table(rows, header))
    print(f"\naccuracy on gold items; fit seconds per method; seed={args.seed}")
    print(f"total wall time {time.perf_counter() - t_start:.1f} s")
    for m in methods:
        for msg, n in warned[m].most_common():
            print(f"  warning ({m}, x{n}): {msg}")


if __name__ == "__main__":
    main()
