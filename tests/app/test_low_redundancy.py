"""One answer per item: the engine's idle sweeps keep serving what the answers say.

With one answer an item's likelihood sees the parameters only through each worker's answer
frequencies, and the MAP puts every item in one class (docs/model.md, "A limit"): batch EM goes
there. The engine's sweeps must not walk the served model there (docs/model.md, eq. 14: after
a sweep the next revisits count from the re-predicted posteriors), and a refit that would is
declined.
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

    def engine(self, name: str) -> ProjectEngine:
        config = NominalConfig(n_classes=len(self.classes))
        eng = ProjectEngine(ProjectRecord(name, self.classes, config.to_dict(), 0.0))
        eng.apply(self.entry())
        return eng

    def entry(self) -> LogEntry:
        body = {"items": self.items, "workers": self.workers, "labels": self.labels.tolist()}
        return LogEntry(1, "labels", orjson.dumps({**body, "weights": None}), b"")


@pytest.mark.parametrize("name", ["dog", "rte", "web"])
def test_one_answer_per_item_is_served_as_answered_through_quiet_spells(
    datasets_root: Path, name: str
) -> None:
    crowd = OneAnswerEach.of(datasets_root / name)
    eng = crowd.engine(name)
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


def test_a_refit_that_would_put_every_item_in_one_class_is_declined(datasets_root: Path) -> None:
    crowd = OneAnswerEach.of(datasets_root / "dog")
    eng = crowd.engine("dog")
    eng.apply(LogEntry(2, "refine", orjson.dumps({"passes": PASSES}), b""))
    codes, _ = eng.items.encode(crowd.items)
    before = eng.shown(codes).copy()
    eng.apply(LogEntry(3, "refit", b"{}", b""))
    report = eng.last_refit
    assert report is not None and report["position"] == 3 and not report["adopted"]
    assert float(report["agreement"]) < 0.5  # (batch EM alone: 28.7% right, the answers 71.0%)
    assert np.array_equal(eng.shown(codes), before)
    assert orjson.loads(eng.globals_json())["last_refit"] == report


def test_a_refit_on_every_answer_is_adopted(datasets_root: Path) -> None:
    data, _ = load_labelled(datasets_root / "dog")
    body = {
        "items": data.item_ids[data.items].tolist(),
        "workers": data.worker_ids[data.workers].tolist(),
        "labels": data.labels.tolist(),
        "weights": None,
    }
    config = NominalConfig(n_classes=len(data.classes))
    eng = ProjectEngine(ProjectRecord("dog", data.classes, config.to_dict(), 0.0))
    eng.apply(LogEntry(1, "labels", orjson.dumps(body), b""))
    eng.apply(LogEntry(2, "refit", b"{}", b""))
    assert eng.last_refit is not None and eng.last_refit["adopted"]
    assert float(eng.last_refit["agreement"]) > 0.95
