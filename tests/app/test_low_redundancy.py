"""One answer per item: the engine's idle sweeps keep serving what the answers say.

With one answer an item's likelihood sees the parameters only through each worker's answer
frequencies, and the MAP puts every item in one class (docs/model.md, "A limit"): batch EM goes
there. The engine's sweeps must not walk the served model there (docs/model.md, eq. 14: after
a sweep the next revisits count from the re-predicted posteriors).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson
import pytest

from app.engine.project import ProjectEngine
from app.io.extract import load_labelled
from app.settings import Settings
from app.store.base import LogEntry, ProjectRecord
from core.nominal import NominalConfig

QUIET_SPELLS = 10  # refine entries, each what the engine logs after a quiet spell
PASSES: int = Settings.model_fields["refine_passes"].default  # a sweep's passes


@dataclass(frozen=True)
class OneAnswerEach:
    """One answer of each item of a shared dataset, drawn at random (seed 0)."""

    items: list[str]
    workers: list[str]
    labels: np.ndarray
    gold: np.ndarray  # each item's gold code, in the same order (-1: none)
    classes: tuple[str, ...]

    @classmethod
    def of(cls, folder: Path) -> OneAnswerEach:
        data, gold = load_labelled(folder)
        shuffled = np.random.default_rng(0).permutation(data.items.size)
        _, first = np.unique(data.items[shuffled], return_index=True)
        first = shuffled[first]
        return cls(
            data.item_ids[data.items[first]].tolist(),
            data.worker_ids[data.workers[first]].tolist(),
            data.labels[first],
            gold[data.items[first]],
            data.classes,
        )

    def entry(self) -> LogEntry:
        body = {"items": self.items, "workers": self.workers, "labels": self.labels.tolist()}
        return LogEntry(1, "labels", orjson.dumps({**body, "weights": None}), b"")


@pytest.mark.parametrize("name", ["dog", "rte", "web"])
def test_one_answer_per_item_is_served_as_answered_through_quiet_spells(
    datasets_root: Path, name: str
) -> None:
    crowd = OneAnswerEach.of(datasets_root / name)
    config = NominalConfig(n_classes=len(crowd.classes))
    eng = ProjectEngine(ProjectRecord(name, crowd.classes, config.to_dict(), 0.0))
    eng.apply(crowd.entry())
    for position in range(2, QUIET_SPELLS + 2):
        eng.apply(LogEntry(position, "refine", orjson.dumps({"passes": PASSES}), b""))
    codes, _ = eng.items.encode(crowd.items)
    served = eng.shown(codes).argmax(axis=1)
    gold, answers = crowd.gold, crowd.labels
    scored = gold >= 0
    as_answered = float(np.mean(answers[scored] == gold[scored]))
    accuracy = float(np.mean(served[scored] == gold[scored]))
    assert accuracy >= as_answered - 0.02, (name, accuracy, as_answered)
    assert np.mean(served == answers) >= 0.95  # the answers themselves, not one class
