"""Blocks of labels that queue up while the engine is busy are learned as one block, as the log
records (``LogEntry.joins``, ``app.engine.groups``): the served state is always that of a
replay of the log, however the engine's steps fell."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.engine.groups import JOIN_CAP, runs
from app.engine.loop import EngineLoop
from app.engine.project import ProjectEngine
from app.store.archive import SnapshotDB
from app.store.base import LogEntry, Store
from app.store.redis_store import RedisStore
from tests.app.test_posteriors_first import RECORD, labels_body
from tests.app.test_snapshots import drain, loop_for, same_state


def entry(position: int, kind: str = "labels", joins: bool = False) -> LogEntry:
    return LogEntry(position, kind, b"{}", b"", 1, joins)  # type: ignore[arg-type]


def cut(entries: list[LogEntry], complete: bool = True) -> list[list[int]]:
    return [[e.position for e in run] for run in runs(entries, complete=complete)]


def test_label_entries_that_joined_are_one_run_and_anything_else_stands_alone() -> None:
    log = [
        entry(1), entry(2, joins=True), entry(3, joins=True),  # one run
        entry(4, "gold", joins=True), entry(5, joins=True),  # gold alone; 5 starts a run
        entry(6, joins=True), entry(7), entry(8, "refine"), entry(9, joins=True),
    ]  # fmt: skip
    assert cut(log) == [[1, 2, 3], [4], [5, 6], [7], [8], [9]]
    # the log may go on past 9 (a read that filled its limit): its run is read again
    assert cut(log, complete=False) == [[1, 2, 3], [4], [5, 6], [7], [8]]
    assert cut(log[:8], complete=False) == cut(log[:8])  # (a refine last: nothing to hold)


def test_a_run_stops_at_its_cap_and_a_full_run_is_not_held_back() -> None:
    log = [entry(1)] + [entry(p, joins=True) for p in range(2, 2 * JOIN_CAP + 2)]
    sizes = [len(r) for r in cut(log, complete=False)]
    assert sizes == [JOIN_CAP, JOIN_CAP]


def test_the_store_records_which_entries_queued_behind_an_unread_one(store: Store) -> None:
    store.join_entries = True  # type: ignore[attr-defined]
    store.create_project(RECORD)
    rng = np.random.default_rng(0)
    for _ in range(3):  # nothing read yet: the second and third queue behind the first
        store.append("p", "labels", labels_body(rng, 10, 5, 3))
    assert [e.joins for e in store.read_log("p", 0, 10)] == [False, True, True]
    assert [e.position for e in store.read_log("p", 0, 2, seal=True)] == [1, 2]
    store.append("p", "labels", labels_body(rng, 10, 5, 3))  # 3 is unread: joins it
    store.read_log("p", 0, 10, seal=True)  # everything read
    store.append("p", "labels", labels_body(rng, 10, 5, 3))  # after the read: starts anew
    assert [e.joins for e in store.read_log("p", 0, 10)] == [False, True, True, True, False]


def test_a_store_that_does_not_join_logs_every_entry_alone(store: Store) -> None:
    store.create_project(RECORD)
    rng = np.random.default_rng(0)
    for _ in range(3):
        store.append("p", "labels", labels_body(rng, 10, 5, 3))
    assert [e.joins for e in store.read_log("p", 0, 10)] == [False] * 3


def served_matches_replay(store: Store, loop: EngineLoop) -> ProjectEngine:
    replay = ProjectEngine(RECORD)
    replay.apply_all(store.read_log("p", 0, 10**6))
    live = loop.engines["p"]
    assert replay.position == live.position == store.applied_position("p")
    same_state(replay, live)
    served = dict(store.scan_items("p", 0, 10**6)[1])
    for name, code in replay.items.code.items():
        want = replay.shown(np.array([code]))[0].tolist()
        assert orjson.loads(served[name])["posterior"] == want, name
    return replay


def test_queued_blocks_are_learned_as_one_and_served_as_a_replay_learns_them(
    store: Store,
) -> None:
    store.join_entries = True  # type: ignore[attr-defined]
    store.create_project(RECORD)
    rng = np.random.default_rng(1)
    bodies = [labels_body(rng, 200, 30, 8) for _ in range(6)]
    for b in bodies:  # all queued before the engine looks: one run
        store.append("p", "labels", b)
    loop = EngineLoop(store, refine_passes=0, batch_entries=2)  # (the run is longer than a read)
    assert loop.step() == 6
    merged = served_matches_replay(store, loop)
    alone = ProjectEngine(RECORD)
    for position, b in enumerate(bodies, start=1):
        alone.apply(LogEntry(position, "labels", b))
    # one block: each item's EM ran once over its new labels, not once per block
    assert not np.array_equal(merged.q[: merged.items_count], alone.q[: alone.items_count])
    assert merged.labels.n_labels == alone.labels.n_labels == 1200


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(plan=st.lists(st.tuples(st.integers(0, 7), st.integers(1, 4)), min_size=1, max_size=8))
@pytest.mark.parametrize("store", ["embedded"], indirect=True)
def test_however_appends_and_steps_interleave_the_served_state_is_the_logs_replay(
    store: Store, plan: list[tuple[int, int]]
) -> None:
    """``plan``: (blocks appended, then the engine's steps) rounds, ``batch_entries`` 3."""
    name = f"p{abs(hash(tuple(plan))) % 10**9}"
    store.join_entries = True  # type: ignore[attr-defined]
    record = RECORD.__class__(name, RECORD.labels, RECORD.config, RECORD.created_at)
    store.create_project(record)
    loop = EngineLoop(store, refine_passes=0, batch_entries=3)
    rng = np.random.default_rng(len(plan))
    for appends, steps in plan:
        for _ in range(appends):
            store.append(name, "labels", labels_body(rng, 30, 12, 5))
        for _ in range(steps):
            loop.step()
    while loop.step():
        pass
    replay = ProjectEngine(record)
    replay.apply_all(store.read_log(name, 0, 10**6))
    same_state(replay, loop.engines[name])
    store.delete_project(name)


def test_the_archive_keeps_which_entries_joined(store: Store, db: SnapshotDB) -> None:
    """Snapshots archive the log in SQL (and trim it on Redis): a replay from the archive cuts
    the log where the live engine did; a Redis rebuilt from SQL logs the entries as they were."""
    store.join_entries = True  # type: ignore[attr-defined]
    store.create_project(RECORD)
    rng = np.random.default_rng(2)
    for _ in range(5):  # queued before the engine looks: one run
        store.append("p", "labels", labels_body(rng, 50, 20, 6))
    loop = loop_for(store, db)
    drain(loop)
    store.append("p", "labels", labels_body(rng, 50, 20, 6))  # after the engine's read: alone
    drain(loop)
    log = store.read_log("p", 0, 100) if store.log_in_sql else db.read_archive("p", 0, 100)
    assert [e.joins for e in log] == [False, True, True, True, True, False]
    replay = ProjectEngine(RECORD)
    replay.apply_all(log)
    same_state(replay, loop.engines["p"])
    if isinstance(store, RedisStore):
        assert store.restore_project(replace(RECORD, name="q"), log, [], len(log))
        assert store.read_log("q", 0, 100) == log  # (positions, tokens and joins)
