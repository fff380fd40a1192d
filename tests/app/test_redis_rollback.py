"""Redis gone back in time: restarted from an AOF that missed its last second (``appendfsync
everysec``). The engine held, and SQL snapshotted, entries the log then no longer had; clients
retry the blocks whose answers they lost, with the same label ids.

Checked: every label the clients retried is applied exactly once, nothing is applied twice,
the engine's position is never ahead of the log, and the served state is that of a fresh
replay of the log (archive and live log).

The test starts its own ``redis-server --appendonly yes --appendfsync everysec`` on a free port
in a temporary folder. The rollback: the AOF's size is taken mid-stream (once Redis has
written what it acknowledged), Redis is SIGKILLed later, the AOF cut back to that size, and
Redis started on it.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import numpy as np
import orjson
import pytest
import redis

from app.engine.loop import EngineLoop
from app.engine.project import ProjectEngine
from app.engine.snapshots import Snapshotter
from app.store.archive import SnapshotDB
from app.store.base import LogEntry, ProjectRecord, StateUpdate
from app.store.redis_store import RedisStore
from app.store.sql import sql_engine, upgrade
from app.testing import free_port
from core.nominal import NominalConfig
from tests.app.conftest import start_redis

RECORD = ProjectRecord("p", ("a", "b", "c"), NominalConfig(n_classes=3).to_dict(), 1.0)


def aof_file(folder: Path) -> Path:
    """The AOF Redis appends to (Redis 7: the ``incr`` part in ``appendonlydir``)."""
    found = sorted((folder / "appendonlydir").glob("*.incr.aof"))
    assert len(found) == 1, found
    return found[0]


class RedisWithAof:
    """A private redis-server with AOF everysec, which can be rolled back to an earlier AOF."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.port = folder, free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] = start_redis(self.port, folder)

    def aof_size(self) -> int:
        """The AOF's size once Redis has written what it acknowledged: while a background
        fsync is slow (a loaded machine), everysec postpones the write, up to 2 s, and replies
        go out before it."""
        with redis.Redis.from_url(self.url) as r:
            deadline = time.monotonic() + 5
            while int(r.info("persistence")["aof_buffer_length"]) and time.monotonic() < deadline:
                time.sleep(0.01)
        return aof_file(self.folder).stat().st_size

    def crash(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def restart_truncated(self, size: int) -> None:
        """SIGKILL Redis, cut its AOF back to ``size`` bytes, start it on that."""
        self.crash()
        os.truncate(aof_file(self.folder), size)
        self.proc = start_redis(self.port, self.folder)

    def close(self) -> None:
        self.crash()


def block(n: int, rng: np.random.Generator, size: int = 100) -> tuple[bytes, list[str | None]]:
    ids: list[str | None] = [f"b{n}-{k}" for k in range(size)]
    body = {
        "items": [f"i{v}" for v in rng.integers(0, 150, size).tolist()],
        "workers": [f"w{v}" for v in rng.integers(0, 20, size).tolist()],
        "labels": rng.integers(0, 3, size).tolist(),
        "weights": None,
        "ids": ids,
    }
    return orjson.dumps(body), ids


@contextmanager
def redis_and_sql(
    tmp_path: Path, join_entries: bool
) -> Iterator[tuple[RedisWithAof, SnapshotDB, RedisStore]]:
    """A private Redis with its AOF, a SQLite snapshot database, and the store on both."""
    redis_ = RedisWithAof(tmp_path)
    url = f"sqlite:///{tmp_path / 'snapshots.sqlite3'}"
    upgrade(url)
    db = SnapshotDB(sql_engine(url))
    store = RedisStore(redis_.url, "rb", join_entries=join_entries)
    try:
        yield redis_, db, store
    finally:
        store.close()
        db.close()
        redis_.close()


def label_ids(blocks: list[tuple[bytes, list[str | None]]]) -> set[str]:
    """Every label id of ``blocks`` (what must be in the log once)."""
    return {i for _, ids in blocks for i in ids if i is not None}


def whole_log(
    store: RedisStore, db: SnapshotDB, project: str = "p", end: int | None = None
) -> list[LogEntry]:
    """Every entry up to ``end`` (the log end when None, read first), from the live log and
    the archive. Read in that order while a snapshotter may be archiving and trimming: an
    entry trimmed after the live log was read was archived before it was trimmed, so the
    archive read next holds it."""
    end = store.log_end(project) if end is None else end
    live = store.read_log(project, 0, 10**7)
    by_position = {e.position: e for e in db.read_archive(project, 0, 10**7)}
    for e in live:
        assert by_position.setdefault(e.position, e) == e, "the archive disagrees with the log"
    return [by_position[p] for p in sorted(by_position) if p <= end]


def check_against_replay(
    store: RedisStore,
    db: SnapshotDB,
    held: ProjectEngine | None,
    want_ids: set[str],
    project: str = "p",
) -> ProjectEngine:
    """The log holds every wanted id exactly once; the served state and the engine's memory
    (``held``, when in this process) are those of a fresh replay of the log."""
    end = store.log_end(project)
    log = whole_log(store, db, project, end=end)
    assert [e.position for e in log] == list(range(1, end + 1))
    applied: list[str] = []
    for e in log:
        if e.kind == "labels":
            ids = orjson.loads(e.payload)["ids"]
            applied += [i for i, k in zip(ids, e.keep, strict=True) if k == ord("1")]
    assert len(applied) == len(set(applied)), "a label was applied twice"
    assert set(applied) == want_ids, "an acknowledged (and retried) label is missing"
    replay = ProjectEngine(store.get_project(project))  # type: ignore[arg-type]
    replay.apply_all(log)
    assert replay.labels.n_labels == len(want_ids)
    assert replay.position == store.applied_position(project)
    served = dict(store.scan_items(project, 0, 10**7)[1])
    assert len(served) == replay.items_count
    for name, code in replay.items.code.items():
        item = orjson.loads(served[name])
        assert item["posterior"] == replay.shown(np.array([code]))[0].tolist(), name
        assert item["labels"] == orjson.loads(replay.item_json(code))["labels"], name
    if held is not None:
        assert held.position == replay.position
        assert held.labels.n_labels == replay.labels.n_labels
        for name, code in replay.items.code.items():
            assert held.q[held.items.code[name]].tolist() == replay.q[code].tolist(), name
    return replay


@pytest.mark.parametrize(
    "engine, schedule",
    [("running", "snapshots"), ("restarted", "snapshots"), ("running", "archives"),
     ("restarted", "archives")],
)  # fmt: skip
def test_redis_rolled_back_under_the_engine(tmp_path: Path, engine: str, schedule: str) -> None:
    """``schedule``: a snapshot at every step, or (snapshots resting: their share of the time)
    the log archived to SQL and trimmed at every step without one, past the latest snapshot."""
    # (joined entries: the first 15 blocks queue, one run)
    with redis_and_sql(tmp_path, join_entries=True) as (redis_, db, store):
        rng = np.random.default_rng(3)
        blocks = [block(n, rng) for n in range(40)]

        def new_loop() -> EngineLoop:
            if schedule == "snapshots":
                snap = Snapshotter(db, store, interval_s=0.0, keep=3, time_share=None)
            else:  # (every block's 100 labels due for the archive, no snapshot after the first)
                snap = Snapshotter(db, store, interval_s=3600, every_labels=100, time_share=1e-6)
            return EngineLoop(store, refine_passes=0, snapshotter=snap, batch_entries=4)

        def drain(lp: EngineLoop) -> None:
            lp.run_until_idle()
            assert lp.snapshotter is not None
            lp.snapshotter.wait()
            lp.step()  # the snapshot of the last entries, once the one before is written
            lp.snapshotter.wait()

        store.create_project(RECORD)
        loop = new_loop()
        for body, ids in blocks[:15]:
            assert store.append("p", "labels", body, ids).accepted == 100
        drain(loop)
        cut = redis_.aof_size()  # what Redis will come back with
        acked = {}
        for n in range(15, 30):
            acked[n] = store.append("p", "labels", *blocks[n])
            loop.step()  # the engine applies, writes state, snapshots (interval 0) as it goes
        drain(loop)
        assert loop.engines["p"].position == 30 and store.applied_position("p") == 30
        assert db.archived_position("p") == 30  # SQL holds what Redis will lose
        latest = max(p for _, p, _ in db.anchors("p"))
        assert latest == 30 if schedule == "snapshots" else latest <= 15

        redis_.restart_truncated(cut)
        assert store.log_end("p") == 15  # blocks 15..29 were acknowledged, and are lost
        assert store.applied_position("p") <= 15
        if engine == "restarted":
            loop.snapshotter.close()  # type: ignore[union-attr]
            loop = new_loop()
        # Other clients post new blocks first; then those that lost answers retry what they
        # saw acknowledged last (same ids; all of it, to be safe); the engine steps between.
        for n in [*range(30, 35), *range(10, 30), *range(35, 40)]:
            r = store.append("p", "labels", *blocks[n])
            assert (r.accepted, r.duplicates) == ((0, 100) if n < 15 else (100, 0)), n
            loop.step()
        drain(loop)
        assert loop.rewinds + loop.snapshotter.rewinds >= 1  # type: ignore[union-attr]
        assert store.log_end("p") == 40
        want = label_ids(blocks)
        replay = check_against_replay(store, db, loop.engines["p"], want)
        assert sum(e.joins for e in whole_log(store, db, "p", end=40)) >= 14
        # A later restart of the engine restores a snapshot of this log and agrees too.
        loop.snapshotter.close()  # type: ignore[union-attr]
        again = new_loop()
        drain(again)
        assert again.engines["p"].position == replay.position
        check_against_replay(store, db, again.engines["p"], want)
        again.snapshotter.close()  # type: ignore[union-attr]


def test_redis_rolled_back_past_state_writes_only(tmp_path: Path) -> None:
    """The AOF kept the entries but lost the engine's state writes after them: the engine's
    position still holds in the log, but what it served since is gone and must be written
    again (else items the later blocks do not touch keep a stale posterior)."""
    with redis_and_sql(tmp_path, join_entries=False) as (redis_, db, store):
        rng = np.random.default_rng(4)
        blocks = [block(n, rng) for n in range(22)]
        snap = Snapshotter(db, store, interval_s=3600.0)
        loop = EngineLoop(store, refine_passes=0, snapshotter=snap, batch_entries=4)
        try:
            store.create_project(RECORD)
            for body, ids in blocks[:10]:
                store.append("p", "labels", body, ids)
            loop.run_until_idle()
            for body, ids in blocks[10:20]:
                store.append("p", "labels", body, ids)
            cut = redis_.aof_size()  # the entries are in, the state written for them is not
            loop.run_until_idle()
            assert store.applied_position("p") == 20
            redis_.restart_truncated(cut)
            assert (store.log_end("p"), store.applied_position("p")) == (20, 10)
            for body, ids in blocks[20:]:  # two more blocks: most items are not touched again
                assert store.append("p", "labels", body, ids).accepted == 100
                loop.step()
            loop.run_until_idle()
            want = label_ids(blocks)
            check_against_replay(store, db, loop.engines["p"], want)
            assert loop.rewinds >= 1
        finally:
            snap.close()


def test_running_until_idle_reloads_a_project_dropped_at_a_rewind(tmp_path: Path) -> None:
    """The step that finds the log rewound drops the project and applies nothing: the engine
    is not idle then, it has the project to restore and its log to replay."""
    redis_ = RedisWithAof(tmp_path)
    store = RedisStore(redis_.url, "rb")
    rng = np.random.default_rng(6)
    blocks = [block(n, rng) for n in range(14)]
    loop = EngineLoop(store, refine_passes=0)
    try:
        store.create_project(RECORD)
        for body, ids in blocks[:10]:
            store.append("p", "labels", body, ids)
        loop.run_until_idle()
        cut = redis_.aof_size()
        for body, ids in blocks[10:12]:
            store.append("p", "labels", body, ids)
        loop.run_until_idle()
        redis_.restart_truncated(cut)
        for body, ids in blocks[12:]:
            store.append("p", "labels", body, ids)
        loop.run_until_idle()
        assert loop.rewinds == 1 and loop.engines["p"].position == 12
    finally:
        store.close()
        redis_.close()


@pytest.mark.parametrize("held", ["snapshot", "memory"])
def test_redis_rolled_back_past_the_engines_last_read(tmp_path: Path, held: str) -> None:
    """The AOF kept ten queued entries but lost the engine's read of them (its seal) and its
    state write: an entry posted next joins them in the log (``LogEntry.joins``), as one run
    with them. The engine applied those ten as a run of their own; restoring that state (a
    snapshot taken at their end, or the engine's memory after its write failed) would serve
    what no replay of the log gives. It restores from before the lost read instead."""
    with redis_and_sql(tmp_path, join_entries=True) as (redis_, db, store):
        rng = np.random.default_rng(4)
        blocks = [block(n, rng) for n in range(22)]
        snap = Snapshotter(
            db, store, interval_s=0.0 if held == "snapshot" else 3600.0, time_share=None
        )
        loop = EngineLoop(store, refine_passes=0, snapshotter=snap, batch_entries=64)
        try:
            store.create_project(RECORD)
            for body, ids in blocks[:10]:
                store.append("p", "labels", body, ids)
            loop.run_until_idle()
            snap.wait()
            for body, ids in blocks[10:20]:
                store.append("p", "labels", body, ids)
            cut = redis_.aof_size()  # the entries are in; the engine's read of them is not
            if held == "snapshot":
                loop.run_until_idle()
                snap.wait()
                assert max(p for _, p, _ in db.anchors("p")) == 20
                redis_.restart_truncated(cut)
            else:
                write = store.write_state

                def crash_first(project: str, update: StateUpdate) -> None:
                    redis_.crash()  # Redis dies between the engine's read and its write
                    write(project, update)

                store.write_state = crash_first  # type: ignore[method-assign]
                with pytest.raises(redis.ConnectionError):
                    loop.step()
                store.write_state = write  # type: ignore[method-assign]
                assert loop.engines["p"].position == 20
                redis_.restart_truncated(cut)
            assert (store.log_end("p"), store.applied_position("p")) == (20, 10)
            for body, ids in blocks[20:]:
                assert store.append("p", "labels", body, ids).accepted == 100
                loop.step()
            loop.run_until_idle()
            log = whole_log(store, db)
            assert log[10].joins is False and all(e.joins for e in log[11:21])  # 11-21: one run
            want = label_ids(blocks)
            check_against_replay(store, db, loop.engines["p"], want)
            assert loop.rewinds >= 1
        finally:
            snap.close()


def test_a_state_write_lost_with_redis_is_written_again_without_new_labels(tmp_path: Path) -> None:
    """Redis dies under the engine's state write and comes back with everything before it
    (the entries, the engine's read of them): the log is then quiet at the engine's position,
    and the state it could not write is written at its next step all the same (it was left
    unwritten until the next label came)."""
    with redis_and_sql(tmp_path, join_entries=True) as (redis_, db, store):
        rng = np.random.default_rng(5)
        blocks = [block(n, rng) for n in range(13)]
        loop = EngineLoop(store, refine_passes=0)
        store.create_project(RECORD)
        for body, ids in blocks[:10]:
            store.append("p", "labels", body, ids)
        loop.run_until_idle()
        for body, ids in blocks[10:]:
            store.append("p", "labels", body, ids)
        write, kept = store.write_state, []

        def crash_first(project: str, update: StateUpdate) -> None:
            kept.append(redis_.aof_size())  # all but the write: Redis comes back with it
            redis_.crash()
            write(project, update)

        store.write_state = crash_first  # type: ignore[method-assign]
        with pytest.raises(redis.ConnectionError):
            loop.step()
        store.write_state = write  # type: ignore[method-assign]
        redis_.restart_truncated(kept[0])
        assert (store.log_end("p"), store.applied_position("p")) == (13, 10)
        loop.run_until_idle()
        assert store.applied_position("p") == 13
        want = label_ids(blocks)
        check_against_replay(store, db, loop.engines["p"], want)


def test_archived_entries_of_a_lost_history_are_dropped_without_a_stale_snapshot(
    tmp_path: Path,
) -> None:
    """Two roll-backs: after the first, no snapshot is left past the log's start but the
    archive is kept up to where the log was trimmed; the second goes back before that, and the
    blocks posted again are logged at those positions anew. No snapshot is stale then, so the
    archive's entries of the lost history were kept, and read in place of the log's."""
    with redis_and_sql(tmp_path, join_entries=True) as (redis_, db, store):
        rng = np.random.default_rng(8)
        blocks = [block(n, rng) for n in range(9)]
        store.create_project(replace(RECORD, created_at=time.time()))  # (no snapshot due)

        def loop_with(interval_s: float) -> EngineLoop:
            snap = Snapshotter(db, store, interval_s=interval_s, keep=1, time_share=None)
            return EngineLoop(store, refine_passes=0, snapshotter=snap)

        def post(numbers: range, lp: EngineLoop) -> None:
            for n in numbers:
                store.append("p", "labels", *blocks[n])
                lp.step()
            lp.run_until_idle()
            assert lp.snapshotter is not None
            lp.snapshotter.wait()
            lp.step()  # (the snapshot of the last entry, archived, the log trimmed)
            lp.snapshotter.wait()

        loop = loop_with(0.0)
        post(range(3), loop)
        early = redis_.aof_size()  # entries 1-3 archived, the log trimmed past them
        post(range(3, 8), loop)
        later = redis_.aof_size()  # 4-8 archived and trimmed
        post(range(8, 9), loop)  # a snapshot at 9 (keep=1: the only one)
        assert loop.snapshotter is not None
        loop.snapshotter.close()
        redis_.restart_truncated(later)  # the snapshot at 9 is stale; the archive kept to 8
        loop = loop_with(3600.0)
        loop.run_until_idle()
        assert db.anchors("p") == [] and loop.engines["p"].position == 8
        redis_.restart_truncated(early)
        for n in range(3, 9):  # posted again, at positions 4-9 anew
            assert store.append("p", "labels", *blocks[n]).accepted == 100
        loop.run_until_idle(timeout_s=20)  # (it rewound for ever, each replay reading them)
        want = label_ids(blocks)
        check_against_replay(store, db, loop.engines["p"], want)
        assert loop.snapshotter is not None
        loop.snapshotter.close()


def test_a_load_keeps_archived_entries_the_log_still_holds(tmp_path: Path) -> None:
    """An engine of a pool archives entries with its snapshot, then trims them from Redis.
    Another engine loading meanwhile, from an older snapshot, found them past its snapshot and
    the log's trim, and dropped them; the late trim then took them from Redis too: lost."""
    with redis_and_sql(tmp_path, join_entries=True) as (_, db, store):
        rng = np.random.default_rng(9)
        blocks = [block(n, rng) for n in range(8)]
        store.create_project(replace(RECORD, created_at=time.time()))
        snap = Snapshotter(db, store, interval_s=0.0, time_share=None)
        loop = EngineLoop(store, refine_passes=0, snapshotter=snap)
        for n in range(4):
            store.append("p", "labels", *blocks[n])
        loop.run_until_idle()
        snap.wait()  # a snapshot at 4, the log trimmed to it
        trim, late = store.trim, []
        store.trim = lambda *args, **kw: late.append((args, kw))  # type: ignore[method-assign]
        for n in range(4, 8):
            store.append("p", "labels", *blocks[n])
        loop.run_until_idle()
        snap.wait()  # a snapshot at 8 archived 5-8; its trim comes later
        snap.close()
        store.trim = trim  # type: ignore[method-assign]
        newest = db.anchors("p")[0]
        assert newest[1] == 8 and late
        db.delete(newest[0])  # (this engine's snapshot not seen yet by the other one)
        other = Snapshotter(db, store, interval_s=3600.0)
        other.load(store.get_project("p"))  # type: ignore[arg-type]
        args, kw = late[-1]
        store.trim(*args, **kw)  # the first engine's trim, late
        loop = EngineLoop(store, refine_passes=0, snapshotter=other)
        loop.run_until_idle()
        want = label_ids(blocks)
        check_against_replay(store, db, loop.engines["p"], want)
        other.close()


def test_a_read_that_starts_in_the_archive_goes_on_in_the_live_log(tmp_path: Path) -> None:
    """The archive can end inside a run of joined entries (a load keeps the archived entries
    the live log holds): a read that stopped at the archive's end let the engine take its last
    entry for the end of a run, and learn the next one, which joins it, apart."""
    with redis_and_sql(tmp_path, join_entries=True) as (_, db, store):
        rng = np.random.default_rng(10)
        store.create_project(replace(RECORD, created_at=time.time()))
        snap = Snapshotter(db, store, interval_s=0.0, time_share=None)
        loop = EngineLoop(store, refine_passes=0, snapshotter=snap)
        store.append("p", "labels", *block(0, rng))
        loop.run_until_idle()
        snap.wait()  # entry 1 archived, the log trimmed to it
        trim = store.trim
        store.trim = lambda *args, **kw: None  # type: ignore[method-assign]
        store.append("p", "labels", *block(1, rng))
        loop.run_until_idle()
        snap.wait()  # entry 2 archived, still in the log
        store.trim = trim  # type: ignore[method-assign]
        for n in (2, 3):
            store.append("p", "labels", *block(n, rng))
        assert (db.archived_position("p"), store.log_start("p"), store.log_end("p")) == (2, 2, 4)
        assert [e.position for e in snap.read_log("p", 0, 4)] == [1, 2, 3, 4]  # (was [1, 2])
        snap.close()
