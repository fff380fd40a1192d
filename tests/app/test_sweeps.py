"""Refinement sweeps cut into slices (app.engine.sweeps): the slices cover the sweep once;
applied back to back they are the whole sweep bit for bit; labels logged between two slices
are served before the sweep ends; replays and snapshots cut the sweep where the engine did."""

from __future__ import annotations

import numpy as np
import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from app.engine.dyadic import settings_for
from app.engine.loop import DYADIC_SLICE, EngineLoop
from app.engine.project import ProjectEngine
from app.engine.snapshots import capture, encode, restore
from app.engine.sweeps import Slice, next_slice
from app.store.base import LogEntry, ProjectRecord, Store
from tests.app.test_engine import RECORD, label_entries
from tests.conftest import Synthetic


def same(a: ProjectEngine, b: ProjectEngine) -> None:
    n = a.items_count
    assert a.position == b.position and a.model.params.equals(b.model.params)
    for name in ("q", "b", "held_out", "learned"):
        assert np.array_equal(getattr(a, name)[:n], getattr(b, name)[:n]), name
    assert a.refine_due == b.refine_due and a.sweep == b.sweep


@settings(max_examples=200, deadline=None)
@given(
    counts=st.lists(st.integers(0, 40), min_size=0, max_size=30),
    passes=st.integers(0, 4),
    budget=st.integers(1, 300),
)
def test_the_slices_cover_every_unit_once_each_within_its_budget(
    counts: list[int], passes: int, budget: int
) -> None:
    labels = np.array(counts, dtype=np.int64)
    n, start, seen = labels.size, 0, []
    total = (passes + 1) * n
    while start < total:
        cut = next_slice(labels, passes, n, start, budget)
        assert cut.start == start < cut.stop <= total
        cost = sum(max(counts[u % n], 1) for u in range(cut.start, cut.stop))
        assert cost <= budget or cut.stop == start + 1  # (one unit may cost more)
        seen += [(r, i) for r, lo, hi in cut.rounds() for i in range(lo, hi)]
        start = cut.stop
    assert seen == [(r, i) for r in range(passes + 1) for i in range(n)]
    assert next_slice(labels, passes, n, total, budget).stop == total  # (nothing left)


def sliced(eng: ProjectEngine, passes: int, budget: int) -> int:
    """Apply a whole sweep in slices of ``budget`` labels, back to back; how many."""
    count = 0
    while True:
        cut = eng.next_sweep_slice(passes, budget)
        eng.apply(LogEntry(eng.position + 1, "refine", orjson.dumps(cut.to_dict())))
        count += 1
        if eng.sweep is None:
            return count


def test_a_sweep_in_slices_is_the_whole_sweep_bit_for_bit(synthetic: Synthetic) -> None:
    entries = label_entries(synthetic, [4000, 9000])
    whole, cut = ProjectEngine(RECORD), ProjectEngine(RECORD)
    whole.apply_all(entries)
    cut.apply_all(entries)
    whole.apply(LogEntry(len(entries) + 1, "refine", b'{"passes": 3}'))  # as logged before
    assert whole.sweep is None and not whole.refine_due
    assert sliced(cut, 3, 2000) > 20
    cut.position = whole.position  # (the slices took more log positions)
    same(whole, cut)


def test_labels_between_slices_are_applied_and_replays_cut_the_sweep_alike(
    synthetic: Synthetic,
) -> None:
    entries = label_entries(synthetic, [6000, 12000, 13000])
    eng = ProjectEngine(RECORD)
    eng.apply_all(entries[:2])
    log = list(entries[:2])
    late = entries[2:]  # labels logged while the sweep goes on
    snapshot = None
    while True:
        cut = eng.next_sweep_slice(2, 3000)
        log.append(LogEntry(len(log) + 1, "refine", orjson.dumps(cut.to_dict())))
        eng.apply(log[-1])
        if eng.sweep is None:
            break
        if late:
            body = late.pop(0).payload
            log.append(LogEntry(len(log) + 1, "labels", body))
            eng.apply(log[-1])
            assert eng.refine_due  # labels after the sweep began: another sweep is due
            snapshot = encode(capture(eng))  # taken mid-sweep
    assert not late and eng.refine_due
    replay = ProjectEngine(RECORD)
    replay.apply_all(log)
    same(eng, replay)
    assert snapshot is not None
    resumed = restore(RECORD, snapshot)
    assert resumed.sweep is not None  # the restored engine knows where the sweep was
    resumed.apply_all([e for e in log if e.position > resumed.position])
    same(eng, resumed)


def test_a_label_posted_during_a_sweep_is_served_before_the_sweep_ends(
    store: Store, synthetic: Synthetic
) -> None:
    store.create_project(RECORD)
    for e in label_entries(synthetic, [5000, 10000]):
        store.append("p", "labels", e.payload)
    loop = EngineLoop(store, refine_passes=3, refine_idle_s=0.0)
    for _ in range(500):  # until the sweep's first slice is applied
        loop.step()
        eng = loop.engines.get("p")
        if eng is not None and eng.sweep is not None:
            break
    else:
        raise AssertionError("the engine never had a sweep in progress")
    body = {"items": ["fresh"], "workers": ["worker-1"], "labels": [2], "weights": None}
    store.append("p", "labels", orjson.dumps(body))
    steps = 0
    while store.get_item("p", "fresh") is None:
        loop.step()
        steps += 1
    assert eng.sweep is not None and steps <= 2  # served between two slices of the sweep
    cut = eng.sweep
    assert isinstance(cut, Slice) and 0 < cut.stop < cut.units
    loop.run_until_idle(timeout_s=60)
    assert eng.sweep is None and not eng.refine_due  # the sweep ended, and another after it
    refines = [orjson.loads(e.payload) for e in store.read_log("p", 0, 1000) if e.kind == "refine"]
    assert [r["from"] for r in refines].count(0) == 2  # (the label came after the first began)


def test_a_dyadic_sweep_queues_its_labels_to_be_learned_a_slice_at_a_time(
    store: Store, synthetic: Synthetic
) -> None:
    """A `dyadic` entry queues every stored label instead of learning them in the step that
    applies it; the queue's bound leaves them out, and they are learned DYADIC_SLICE at a time
    while the log is drained, to the model a replay learns."""
    dyadic = settings_for(len(RECORD.labels), passes=2).to_dict()
    record = ProjectRecord("p", RECORD.labels, {**RECORD.config, "dyadic": dyadic}, 1.0)
    store.create_project(record)
    for e in label_entries(synthetic, [5000, 10000]):
        store.append("p", "labels", e.payload)
    loop = EngineLoop(store, refine_passes=1, refine_idle_s=0.0)
    backlogs = []
    for _ in range(2000):
        loop.step()
        eng = loop.engines.get("p")
        if eng is not None and eng.dyadic_sweep_backlog:
            backlogs.append(eng.dyadic_backlog)
        if backlogs and not eng.dyadic_sweep_backlog:  # type: ignore[union-attr]
            break
    # queued whole (the step that applied it learned one slice at most), then a slice a step
    assert backlogs and backlogs[0] >= synthetic.items.size - DYADIC_SLICE
    steps = np.diff(backlogs)
    assert steps.size >= 2 and np.all(-steps <= DYADIC_SLICE)
    loop.run_until_idle(timeout_s=60)
    assert eng is not None and eng.dyadic is not None and eng.dyadic_backlog == 0
    assert eng.dyadic.examples == 2 * eng.labels.n_labels  # (arrival, then one sweep)
    replay = ProjectEngine(record)
    replay.apply_all(store.read_log("p", 0, 10_000))
    assert replay.dyadic is not None
    ours, theirs = eng.dyadic.hashed_model().arrays(), replay.dyadic.hashed_model().arrays()
    assert all(np.array_equal(v, theirs[k]) for k, v in ours.items())
