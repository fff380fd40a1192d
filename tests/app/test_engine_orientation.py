"""The engine keeps a crowd of weak workers the right way round as it applies their labels
entry by entry (core/orientation.py after each step), its kept posteriors relabelled with the
model and every slot row written again; a refit pools weak workers (docs/model.md eq. 28)."""

from __future__ import annotations

import numpy as np
import orjson

from app.engine.project import ProjectEngine
from app.store.base import LogEntry, ProjectRecord
from core.nominal import NominalConfig
from tests.core.test_orientation import weak_binary


def test_the_engine_serves_weak_workers_the_right_way_round() -> None:
    blocks, truth, _ = weak_binary(0)
    config = NominalConfig(n_classes=2)
    eng = ProjectEngine(ProjectRecord("weak", ("a", "b"), config.to_dict(), 0.0))
    items = np.repeat(np.arange(truth.size), blocks.sizes())
    order = np.random.default_rng(5).permutation(truth.size)  # one pass: 28.7% right before
    rows = np.concatenate([np.arange(blocks.ptr[i], blocks.ptr[i + 1]) for i in order])
    relabelled = False
    for position, lo in enumerate(range(0, rows.size, 1000), start=1):
        part = rows[lo : lo + 1000]
        body = {"items": [f"i{i}" for i in items[part]],
                "workers": [f"w{w}" for w in blocks.slots[part]],
                "labels": blocks.labels[part].tolist(), "weights": None}  # fmt: skip
        kept, earlier = eng.q.copy(), eng.items_count
        eng.apply(LogEntry(position, "labels", orjson.dumps(body), b""))
        if (perm := eng.online.relabelled) is not None:
            relabelled = True
            assert eng._all_rows  # every slot row is written again
            others = np.setdiff1d(np.arange(earlier), eng.items.encode(body["items"])[0])
            np.testing.assert_array_equal(eng.q[others], kept[others][:, perm])  # they follow
    assert relabelled
    codes, _ = eng.items.encode([f"i{i}" for i in range(truth.size)])
    right = float(np.mean(eng.shown(codes).argmax(axis=1) == truth))
    assert right > 0.55, right  # (36.5% without the relabelling)


def test_a_refit_pools_weak_workers_and_serves_them_as_majority_vote_would() -> None:
    """A refit chooses its worker prior by the held-out answers (docs/model.md eq. 28): on
    workers right 60-70% of the time with 9 answers an item it pools them hard and serves what
    majority vote would (82.5% right; the online model 79.1%, batch EM at lambda_A = 1
    78.1%)."""
    blocks, truth, votes = weak_binary(1, per_item=9, accuracy_range=(0.6, 0.7))
    config = NominalConfig(n_classes=2)
    eng = ProjectEngine(ProjectRecord("weak", ("a", "b"), config.to_dict(), 0.0))
    items = np.repeat(np.arange(truth.size), blocks.sizes())
    body = {"items": [f"i{i}" for i in items], "workers": [f"w{w}" for w in blocks.slots],
            "labels": blocks.labels.tolist(), "weights": None}  # fmt: skip
    eng.apply(LogEntry(1, "labels", orjson.dumps(body), b""))
    eng.apply(LogEntry(2, "refit", b"{}", b""))
    assert eng.last_refit is not None and eng.last_refit["adopted"]
    assert eng.refit_worker_prior is not None and eng.refit_worker_prior > 4.0
    codes, _ = eng.items.encode([f"i{i}" for i in range(truth.size)])
    right = float(np.mean(eng.shown(codes).argmax(axis=1) == truth))
    assert right > float(np.mean(votes == truth)) - 0.01, right
