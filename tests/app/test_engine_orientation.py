"""The engine keeps a crowd of weak workers the right way round as it applies their labels
entry by entry (core/orientation.py after each step), and writes every slot row again when it
relabels."""

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
        eng.apply(LogEntry(position, "labels", orjson.dumps(body), b""))
        relabelled |= eng.online.relabelled is not None
        if eng.online.relabelled is not None:
            assert eng._all_rows  # every slot row is written again
    assert relabelled
    codes, _ = eng.items.encode([f"i{i}" for i in range(truth.size)])
    right = float(np.mean(eng.shown(codes).argmax(axis=1) == truth))
    assert right > 0.6, right
