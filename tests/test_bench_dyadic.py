"""bench.dyadic: the validated-k row is one of the dyadic rows, chosen on validation parts,
and the target check reads the same-split peers."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from bench import dyadic


def _args(**changes: object) -> argparse.Namespace:
    base = dict(
        loss="logistic", reduction="oaa", adaptive=False, l2=0.05, l2_linear=0.0,
        dyadic_rate=3.0, seed=0, splits=2, passes=3, etas=[0.1, 0.5], one_pass=False,
    )  # fmt: skip
    base.update(changes)
    return argparse.Namespace(**base)


def test_validated_k_is_a_dyadic_row(datasets_root: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    rows = dyadic.run("duck", _args())
    assert set(rows) == {"constant", "linear", "dyadic k=1", "dyadic k=2", "dyadic k=3",
                         "dyadic (val. k)"}  # fmt: skip
    printed = capsys.readouterr().out
    chosen = int(printed.split(" by validation")[0].rsplit("k=", 1)[1])
    assert rows["dyadic (val. k)"] == rows[f"dyadic k={chosen}"]
    assert all(len(v) == 2 and all(0.0 <= x <= 1.0 for x in v) for v in rows.values())
    assert np.mean(rows["dyadic (val. k)"]) < np.mean(rows["constant"])


def test_check_targets_against_same_split_peers(capsys) -> None:  # type: ignore[no-untyped-def]
    ours = {"linear": [0.22, 0.22], "dyadic k=1": [0.21, 0.21], "dyadic k=2": [0.20, 0.20],
            "dyadic k=3": [0.23, 0.23], "dyadic (val. k)": [0.20, 0.20]}  # fmt: skip
    peers = {"VW linear": [0.23, 0.23], "VW lrq": [0.21, 0.21], "myfm best": [0.19, 0.19]}
    assert dyadic.check_targets("duck", ours, peers)
    assert "worst k: 0.230" in capsys.readouterr().out
    assert not dyadic.check_targets("duck", ours, {**peers, "VW lrq": [0.199, 0.199]})
    assert not dyadic.check_targets("duck", ours, {**peers, "myfm best": [0.185, 0.185]})
    worse = {**ours, "dyadic (val. k)": [0.226, 0.226]}
    far = {"VW linear": [0.3, 0.3], "VW lrq": [0.3, 0.3], "myfm best": [0.3, 0.3]}
    assert dyadic.check_targets("duck", ours, far)
    assert not dyadic.check_targets("duck", worse, far)  # worse than linear + 0.005
