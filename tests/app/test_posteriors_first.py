"""Posteriors first: an engine step writes its items before the dyadic model learns the step's
labels, then the dyadic rows with the applied position; learning later gives the same model
bit for bit. On each store (Redis: the real server)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from app.engine.dyadic import settings_for
from app.engine.loop import EngineLoop
from app.engine.project import ProjectEngine
from app.store.base import LogEntry, ProjectRecord, StateUpdate, Store
from core.nominal import NominalConfig

CONFIG = {**NominalConfig(n_classes=3).to_dict(), "dyadic": settings_for(3).to_dict()}
RECORD = ProjectRecord("p", ("a", "b", "c"), CONFIG, 1.0)


def labels_body(rng: np.random.Generator, n: int, items: int, workers: int) -> bytes:
    return orjson.dumps({
        "items": [f"i{v}" for v in rng.integers(0, items, n).tolist()],
        "workers": [f"w{v}" for v in rng.integers(0, workers, n).tolist()],
        "labels": rng.integers(0, 3, n).tolist(),
        "weights": None,
    })  # fmt: skip


class Recorder:
    """The store, noting each state write: the applied position before it, whether it moved
    it, what it carried, and the dyadic labels not learned yet at that moment."""

    def __init__(self, store: Store, loop: list[EngineLoop]) -> None:
        self._store, self._loop = store, loop
        self.writes: list[tuple[int, bool, int, bool, int]] = []
        self.globals: list[bytes] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def write_state(self, project: str, update: StateUpdate) -> None:
        trainer = self._loop[0].engines[project].dyadic
        assert trainer is not None
        was = self._store.applied_position(project)
        queued = trainer.queued
        self._store.write_state(project, update)
        carried = (len(update.items), update.dyadic is not None)
        self.writes.append((was, update.advance, *carried, queued))
        self.globals.append(update.globals)


def test_a_step_serves_its_posteriors_before_the_dyadic_model_learns(store: Store) -> None:
    store.create_project(RECORD)
    holder: list[EngineLoop] = []
    recorder = Recorder(store, holder)
    loop = EngineLoop(recorder, refine_passes=0)  # type: ignore[arg-type]
    holder.append(loop)
    rng = np.random.default_rng(3)
    for _ in range(3):
        store.append("p", "labels", labels_body(rng, 40, 15, 6))
        loop.step()
    steps = recorder.writes
    assert len(steps) == 6  # two writes a step
    for posteriors, dyadic in zip(steps[::2], steps[1::2], strict=True):
        was, advance, items, has_dyadic, queued = posteriors
        assert not advance and items > 0 and not has_dyadic and queued == 40
        assert dyadic[0] == was  # the applied position did not move with the posteriors
        assert dyadic[1] and dyadic[2] == 0 and dyadic[3] and dyadic[4] == 0
    # the dyadic learning changes no global figure: both writes of a step carry the same
    assert recorder.globals[::2] == recorder.globals[1::2]
    assert store.applied_position("p") == store.log_end("p") == 3
    _, shared, _, _ = store.get_dyadic("p", [], [])
    replay = ProjectEngine(RECORD)
    for entry in store.read_log("p", 0, 100):
        replay.apply(entry)
    assert replay.dyadic is not None and shared == replay.dyadic.update().shared


@settings(max_examples=15, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 30), min_size=1, max_size=6),
    learn_after=st.lists(st.booleans(), min_size=6, max_size=6),
    seed=st.integers(0, 99),
)
def test_learning_the_queued_labels_later_gives_the_same_model(
    sizes: list[int], learn_after: list[bool], seed: int
) -> None:
    """Entries whose labels bring new items and workers (new rows) while earlier labels wait."""
    rng = np.random.default_rng(seed)
    bodies = [labels_body(rng, n, items=4 + 6 * k, workers=2 + 3 * k) for k, n in enumerate(sizes)]
    at_once, later = ProjectEngine(RECORD), ProjectEngine(RECORD)
    for position, body in enumerate(bodies, start=1):
        at_once.apply(LogEntry(position, "labels", body, b""))
        at_once.state_update()  # learned at each entry
        later.apply(LogEntry(position, "labels", body, b""))
        if learn_after[position - 1]:
            later.state_update(dyadic=False)  # posteriors only: the labels stay queued
    assert at_once.dyadic is not None and later.dyadic is not None
    assert later.dyadic.examples == at_once.dyadic.examples
    ours = later.dyadic.hashed_model().arrays()
    for name, arr in at_once.dyadic.hashed_model().arrays().items():
        assert np.array_equal(arr, ours[name]), name


class SlowPosteriors:
    """The store, its posterior writes (the first of a step) taking 50 ms."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def write_state(self, project: str, update: StateUpdate) -> None:
        if not update.advance:
            time.sleep(0.05)
        self._store.write_state(project, update)


def test_the_pace_push_back_projects_from_counts_the_whole_step(store: Store) -> None:
    """Posterior write, dyadic learning and all: the seconds per entry the store is given."""
    store.create_project(RECORD)
    loop = EngineLoop(SlowPosteriors(store), refine_passes=0)  # type: ignore[arg-type]
    store.append("p", "labels", labels_body(np.random.default_rng(1), 40, 15, 6))
    assert loop.step() == 1
    rng = np.random.default_rng(2)
    for _ in range(10):  # waiting: at 50 ms or more each, at least 0.5 s of lag projected
        store.append("p", "labels", labels_body(rng, 40, 15, 6))
    assert store.lag_seconds("p") >= 0.5
