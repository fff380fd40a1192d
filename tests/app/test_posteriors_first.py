"""Posteriors first: an engine step writes its items, with the applied position, before the
dyadic model learns the step's labels; the dyadic model learns them afterwards, in slices when
the log is drained, and reports how far it has learned; learning later or in slices gives the
same model bit for bit. On each store (Redis: the real server)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.engine import loop as engine_loop
from app.engine.dyadic import DyadicTrainer, settings_for
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
    it, what it carried, the dyadic labels not learned yet at that moment, and the dyadic
    position it wrote."""

    def __init__(self, store: Store, loop: list[EngineLoop]) -> None:
        self._store, self._loop = store, loop
        self.writes: list[tuple[int, bool, int, bool, int, int | None]] = []
        self.globals: list[dict[str, Any]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def write_state(self, project: str, update: StateUpdate) -> None:
        trainer = self._loop[0].engines[project].dyadic
        assert trainer is not None
        was = self._store.applied_position(project)
        queued = trainer.backlog
        self._store.write_state(project, update)
        learned = None if update.dyadic is None else update.dyadic.position
        carried = (len(update.items), update.dyadic is not None)
        self.writes.append((was, update.advance, *carried, queued, learned))
        self.globals.append(orjson.loads(update.globals))


def replayed(store: Store) -> ProjectEngine:
    replay = ProjectEngine(RECORD)
    replay.apply_all(store.read_log("p", 0, 1000))
    return replay


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
    # (a step whose calibration moved also writes the queue scored again in a slice: random
    # answers from six workers tempt a tempering; those writes carry neither items nor rows)
    kept = [k for k, w in enumerate(recorder.writes) if w[2] > 0 or w[3]]
    steps = [recorder.writes[k] for k in kept]
    assert len(steps) == 6  # two writes a step
    for n, (posteriors, dyadic) in enumerate(zip(steps[::2], steps[1::2], strict=True)):
        was, advance, items, has_dyadic, queued, _ = posteriors
        assert was == n and advance and items > 0 and not has_dyadic and queued == 40
        assert dyadic[0] == n + 1  # the applied position moved with the posteriors
        assert not dyadic[1] and dyadic[2] == 0 and dyadic[3] and dyadic[4] == 0
        assert dyadic[5] == n + 1  # learned up to the step's entry
    # the dyadic learning changes no global figure but its own position
    dyadic_writes = [k for k, w in enumerate(recorder.writes) if w[3]]
    for before, dyadic in ((recorder.globals[k - 1], recorder.globals[k]) for k in dyadic_writes):
        posteriors = dict(before)
        assert posteriors.pop("dyadic_position") == dyadic.pop("dyadic_position") - 1
        assert posteriors == dyadic
    assert store.applied_position("p") == store.log_end("p") == 3
    learned, shared, _, _ = store.get_dyadic("p", [], [])
    assert learned == 3
    replay = replayed(store)
    assert replay.dyadic is not None and shared == replay.dyadic.update(3).shared


def test_the_dyadic_model_waits_for_its_kernels_and_then_catches_up(store: Store) -> None:
    """A first start: the service applies labels (posteriors served, applied position moving)
    while the dyadic model's kernels are compiled elsewhere; its labels stay queued, its
    position stays behind, and once they are loaded it learns them all."""
    store.create_project(RECORD)
    ready = False
    loop = EngineLoop(store, refine_passes=0, dyadic_ready=lambda: ready)
    rng = np.random.default_rng(4)
    for _ in range(4):
        store.append("p", "labels", labels_body(rng, 40, 15, 6))
        loop.step()
    assert store.applied_position("p") == 4
    assert store.get_dyadic("p", [], [])[0] == 0
    assert orjson.loads(store.get_params("p", [])[0] or b"")["dyadic_position"] == 0
    assert loop.engines["p"].dyadic_backlog == 160
    assert loop.step() == 0 and loop.dyadic_learned == 0  # still waiting
    ready = True
    loop.run_until_idle()
    assert loop.engines["p"].dyadic_backlog == 0
    learned, shared, _, _ = store.get_dyadic("p", [], [])
    assert learned == 4
    replay = replayed(store)
    assert replay.dyadic is not None and shared == replay.dyadic.update(4).shared


def test_the_dyadic_model_learns_in_slices_and_lags_at_most_its_bound(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Entries keep coming (the log never drained): the dyadic model learns only what passes
    its backlog's bound; drained, a slice a step, its position following the entries it
    finished."""
    monkeypatch.setattr(engine_loop, "DYADIC_BACKLOG", 100)
    monkeypatch.setattr(engine_loop, "DYADIC_SLICE", 30)
    store.create_project(RECORD)
    loop = EngineLoop(store, refine_passes=0, batch_entries=1)  # one entry a step: not drained
    rng = np.random.default_rng(5)
    for _ in range(6):
        store.append("p", "labels", labels_body(rng, 40, 15, 6))
    backlogs, positions = [], []
    for _ in range(6):
        assert loop.step() == 1
        backlogs.append(loop.engines["p"].dyadic_backlog)
        positions.append(store.get_dyadic("p", [], [])[0])
    assert backlogs == [40, 80, 100, 100, 100, 100]  # the bound, not more
    assert positions == [0, 0, 0, 1, 2, 3]  # the entries it learned to the end
    slices = []
    while loop.step() == 0 and loop.dyadic_learned:  # drained: a slice a step
        slices.append((loop.dyadic_learned, store.get_dyadic("p", [], [])[0]))
    assert slices == [(30, 4), (30, 5), (30, 5), (10, 6)]
    _, shared, _, _ = store.get_dyadic("p", [], [])
    replay = replayed(store)
    assert replay.dyadic is not None and shared == replay.dyadic.update(6).shared


class ArrivalsDuringSteps:
    """The store; while a step writes its posteriors, a client appends another block."""

    def __init__(self, store: Store, blocks: list[bytes]) -> None:
        self._store, self.blocks = store, blocks

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def write_state(self, project: str, update: StateUpdate) -> None:
        self._store.write_state(project, update)
        if update.items and self.blocks:
            self._store.append(project, "labels", self.blocks.pop(0))


def test_a_label_waiting_in_the_log_goes_before_the_dyadic_model(store: Store) -> None:
    """Blocks keep arriving while the engine writes posteriors: each step applies the waiting
    block's posteriors and leaves the dyadic learning for when the log is drained."""
    store.create_project(RECORD)
    rng = np.random.default_rng(6)
    arrivals = ArrivalsDuringSteps(store, [labels_body(rng, 40, 15, 6) for _ in range(3)])
    loop = EngineLoop(arrivals, refine_passes=0)  # type: ignore[arg-type]
    store.append("p", "labels", labels_body(rng, 40, 15, 6))
    for step in range(1, 4):
        assert loop.step() == 1 and loop.dyadic_learned == 0  # another block came meanwhile
        assert store.applied_position("p") == step and loop.engines["p"].dyadic_backlog == 40 * step
    assert loop.step() == 1 and loop.dyadic_learned == 160  # drained: it learns them all
    assert store.get_dyadic("p", [], [])[0] == 4


@settings(max_examples=15, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 30), min_size=1, max_size=6),
    slices=st.lists(st.integers(0, 50), min_size=6, max_size=6),
    seed=st.integers(0, 99),
)
def test_learning_the_queued_labels_later_gives_the_same_model(
    sizes: list[int], slices: list[int], seed: int
) -> None:
    """Entries whose labels bring new items and workers (new rows) while earlier labels wait,
    learned in slices that may cut an entry's labels in two."""
    rng = np.random.default_rng(seed)
    bodies = [labels_body(rng, n, items=4 + 6 * k, workers=2 + 3 * k) for k, n in enumerate(sizes)]
    at_once, later = ProjectEngine(RECORD), ProjectEngine(RECORD)
    for position, body in enumerate(bodies, start=1):
        at_once.apply(LogEntry(position, "labels", body, b""))
        at_once.state_update()  # learned at each entry
        later.apply(LogEntry(position, "labels", body, b""))
        later.state_update(dyadic=False)  # posteriors only: the labels stay queued
        if slices[position - 1]:
            later.dyadic_update(slices[position - 1])  # learned a slice at a time
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
        if update.items:
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


def test_the_pace_counts_the_dyadic_learning_the_entries_will_cost(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Push-back projects the wait of the entries not applied from the engine's pace: the
    dyadic model's learning of their labels is in it at its recent rate, also in a step
    that leaves that learning for later (under a sustained load it is taken from them)."""
    learn = DyadicTrainer.catch_up

    def slow(self: DyadicTrainer, limit: int | None = None) -> int:
        learned = learn(self, limit)
        time.sleep(1e-3 * learned)  # 1 ms a label
        return learned

    monkeypatch.setattr(DyadicTrainer, "catch_up", slow)
    store.create_project(RECORD)
    rng = np.random.default_rng(7)
    arrivals = ArrivalsDuringSteps(store, [])
    loop = EngineLoop(arrivals, refine_passes=0)  # type: ignore[arg-type]
    store.append("p", "labels", labels_body(rng, 40, 15, 6))
    assert loop.step() == 1 and loop.dyadic_learned == 40  # drained: learned, 40 ms
    first = loop._entry_s["p"]
    arrivals.blocks.append(labels_body(rng, 40, 15, 6))  # a block comes during the next write
    store.append("p", "labels", labels_body(rng, 40, 15, 6))
    assert loop.step() == 1 and loop.dyadic_learned == 0  # its labels wait...
    assert loop._entry_s["p"] >= 0.7 * first + 0.3 * 0.04  # ...and their 40 ms count


def test_an_idle_engine_scores_its_queue_again_a_slice_a_step_until_whole(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the calibration moved, the queue is scored again a slice a step, the engine going
    on while no entry comes; the store then holds what a whole re-scoring gives."""
    from app.engine import project as engine_project
    from core.calibration import Calibration

    monkeypatch.setattr(engine_project, "QUEUE_SLICE", 300)
    record = ProjectRecord("p", ("a", "b", "c"), NominalConfig(n_classes=3).to_dict(), 1.0)
    store.create_project(record)
    rng = np.random.default_rng(3)
    store.append("p", "labels", labels_body(rng, 6000, 2000, 30), None)
    loop = EngineLoop(store, refine_passes=0)
    loop.run_until_idle(timeout_s=60)
    eng = loop.engines["p"]
    eng._queue_calibration = Calibration(rho=0.9)  # as if the calibration moved from there
    store.append("p", "labels", labels_body(rng, 10, 2000, 30), None)
    loop.step()
    assert eng.queue_rescoring  # (a first slice written after the entry's posteriors)
    loop.run_until_idle(timeout_s=60)
    assert not eng.queue_rescoring
    served = dict(store.read_queue("p", 10_000))
    eng._queue_all = True
    whole = eng.state_update()
    assert served == whole.queue


def _rescoring_engine(
    store: Store, monkeypatch: pytest.MonkeyPatch, batch_entries: int
) -> tuple[EngineLoop, list[StateUpdate]]:
    """An idle engine whose calibration moved (its queue is to be scored again, 300 items a
    slice), and the state writes it makes from then on."""
    from app.engine import project as engine_project
    from core.calibration import Calibration

    monkeypatch.setattr(engine_project, "QUEUE_SLICE", 300)
    record = ProjectRecord("p", ("a", "b", "c"), NominalConfig(n_classes=3).to_dict(), 1.0)
    store.create_project(record)
    store.append("p", "labels", labels_body(np.random.default_rng(3), 6000, 2000, 30), None)
    loop = EngineLoop(store, refine_passes=0, batch_entries=batch_entries)
    loop.run_until_idle(timeout_s=60)
    loop.engines["p"]._queue_calibration = Calibration(rho=0.9)  # as if it moved from there
    writes: list[StateUpdate] = []
    write = store.write_state
    monkeypatch.setattr(store, "write_state", lambda p, u: (writes.append(u), write(p, u))[1])
    return loop, writes


def _scored(update: StateUpdate) -> int:
    return len(update.queue) + len(update.queue_remove)


def test_a_queue_scored_again_takes_its_slices_after_the_posteriors(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step's posteriors are written without the next slice of a queue being scored again:
    the slice follows in a write of its own, over the state just served, the log drained."""
    loop, writes = _rescoring_engine(store, monkeypatch, batch_entries=256)
    store.append("p", "labels", labels_body(np.random.default_rng(4), 10, 2000, 30), None)
    assert loop.step() == 1
    posteriors, slice_ = writes
    assert posteriors.served == 1 and posteriors.position == 2 and _scored(posteriors) <= 10
    assert slice_.served == slice_.position == 2 and _scored(slice_) >= 300


@pytest.mark.parametrize("overdue", [False, True])
def test_a_log_that_never_drains_carries_a_slice_with_the_posteriors_when_overdue(
    store: Store, monkeypatch: pytest.MonkeyPatch, overdue: bool
) -> None:
    """Entries always waiting (each step reads its limit of one): no slice of its own comes,
    so once ``RESCORE_WAIT_S`` passed since the rescoring began, a step's posteriors carry
    one; before that they do not."""
    monkeypatch.setattr(engine_loop, "RESCORE_WAIT_S", 0.0 if overdue else 3600.0)
    loop, writes = _rescoring_engine(store, monkeypatch, batch_entries=1)
    rng = np.random.default_rng(4)
    for _ in range(2):
        store.append("p", "labels", labels_body(rng, 10, 2000, 30), None)
    assert loop.step() == 1  # (the calibration's move found: the rescoring begins)
    assert loop.step() == 1
    first, second = writes
    assert _scored(first) <= 10
    assert (_scored(second) >= 300) if overdue else (_scored(second) <= 10)


def test_a_label_posted_while_the_dyadic_model_learns_waits_for_one_part(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the log drained the dyadic model learns ``DYADIC_PART`` labels at a time and looks
    at the log between parts: an entry posted meanwhile stops it, and its posteriors come
    before the rest of the slice."""
    monkeypatch.setattr(engine_loop, "DYADIC_PART", 10)
    learn, parts = DyadicTrainer.catch_up, []
    rng = np.random.default_rng(5)

    def posting(self: DyadicTrainer, limit: int | None = None) -> int:
        learned = learn(self, limit)
        parts.append(learned)
        if len(parts) == 2:  # during the slice's first part, a block is posted
            store.append("p", "labels", labels_body(rng, 5, 15, 6))
        return learned

    monkeypatch.setattr(DyadicTrainer, "catch_up", posting)
    store.create_project(RECORD)
    loop = EngineLoop(store, refine_passes=0)
    store.append("p", "labels", labels_body(rng, 40, 15, 6))
    assert loop.step() == 1
    eng = loop.engines["p"]
    assert (eng.dyadic_backlog, store.applied_position("p")) == (30, 1)  # one part learned
    assert loop.step() == 1  # the block's posteriors, then the rest, a part at a time
    assert (eng.dyadic_backlog, store.applied_position("p")) == (0, 2)
    assert [n for n in parts if n] == [10, 10, 10, 10, 5]
