"""Snapshots: exact round trips, restore + replay, trimmed logs, a wiped Redis, migrations."""

from __future__ import annotations

import io
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import orjson
import pytest
import zstandard
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect, update
from sqlalchemy.orm import Session

from app.engine.dyadic import settings_for
from app.engine.loop import EngineLoop
from app.engine.project import ProjectEngine
from app.engine.snapshots import Snapshotter, capture, decompress, describe, encode, restore
from app.store.archive import SnapshotDB, rebuild_store
from app.store.base import LogEntry, ProjectRecord, Store
from app.store.redis_store import RedisStore
from app.store.sql import (
    HEAD,
    REPO,
    Base,
    SnapshotRow,
    downgrade,
    schema_revision,
    sql_engine,
    upgrade,
)
from core.nominal import NominalConfig
from tests.app.test_engine import RECORD, label_entries
from tests.conftest import Synthetic


def same_state(a: ProjectEngine, b: ProjectEngine) -> None:
    assert a.position == b.position and a.last_refit == b.last_refit
    assert a.model.params.equals(b.model.params)
    n = a.items_count
    assert a.items.names == b.items.names and a.workers.names == b.workers.names
    for name in ("q", "b", "learned", "gold"):
        assert np.array_equal(getattr(a, name)[:n], getattr(b, name)[:n])
    assert a.labels.n_labels == b.labels.n_labels
    blocks_a, _ = a.labels.gather(np.arange(n))
    blocks_b, _ = b.labels.gather(np.arange(n))
    assert np.array_equal(blocks_a.slots, blocks_b.slots)
    assert np.array_equal(blocks_a.labels, blocks_b.labels)


def test_snapshot_round_trip_then_replay_is_bit_identical(synthetic: Synthetic) -> None:
    entries = label_entries(synthetic, [700, 3000, 5200, 9000, 12000])
    gold = orjson.dumps({"items": ["item-1", "item-2"], "labels": [0, 2]})
    entries = [
        *entries[:3],
        LogEntry(4, "gold", gold),
        LogEntry(5, "refit", b"{}"),
        *(LogEntry(e.position + 2, e.kind, e.payload) for e in entries[3:]),
    ]
    full = ProjectEngine(RECORD)
    full.apply_all(entries)
    half = ProjectEngine(RECORD)
    half.apply_all(entries[:5])
    assert half.last_refit is not None and half.last_refit["position"] == 5
    resumed = restore(RECORD, encode(capture(half)))
    same_state(half, resumed)
    resumed.apply_all(entries[5:])
    same_state(full, resumed)


def test_snapshots_are_zstandard_and_those_written_by_zlib_still_restore(
    synthetic: Synthetic,
) -> None:
    engine = ProjectEngine(RECORD)
    engine.apply_all(label_entries(synthetic, [2000, 4000]))
    blob = encode(capture(engine))
    assert blob[:4] == b"\x28\xb5\x2f\xfd"  # a Zstandard frame
    older = zlib.compress(decompress(blob), 1)  # as snapshots were written before
    same_state(engine, restore(RECORD, older))
    same_state(engine, restore(RECORD, blob))
    assert describe(older) == describe(blob)
    one_shot = zstandard.ZstdCompressor(level=1).compress(decompress(blob))  # (its size known)
    same_state(engine, restore(RECORD, one_shot))


def test_a_snapshot_with_64_bit_label_codes_restores_as_one_with_32_bit_ones(
    synthetic: Synthetic,
) -> None:
    """The label table holds item, slot, label and worker codes as int32 (32 bytes a label,
    48 with int64); snapshots written when they were int64 restore to the same engine, which
    then learns the next labels alike."""
    entries = label_entries(synthetic, [2000, 4000, 6000])
    engine = ProjectEngine(RECORD)
    engine.apply_all(entries[:2])
    for column in ("item", "slot", "label", "worker"):
        assert getattr(engine.labels, column).dtype == np.int32
    z = np.load(io.BytesIO(decompress(encode(capture(engine)))))
    wide = {k: (z[k].astype(np.int64) if z[k].dtype == np.int32 else z[k]) for k in z.files}
    assert all(wide[k].dtype == np.int64 for k in ("label_item", "label_slot", "label_worker"))
    buf = io.BytesIO()
    np.savez(buf, **wide)
    older = restore(RECORD, zlib.compress(buf.getvalue(), 1))
    same_state(engine, older)
    engine.apply_all(entries[2:])
    older.apply_all(entries[2:])
    same_state(engine, older)


def _dyadic_arrays(eng: ProjectEngine) -> dict[str, np.ndarray]:
    assert eng.dyadic is not None
    return eng.dyadic.hashed_model().arrays()  # (learns what is queued first)


def test_a_capture_learns_nothing_and_the_restored_dyadic_model_learns_its_queue_alike(
    synthetic: Synthetic,
) -> None:
    """The dyadic model may lag behind the posteriors; a snapshot keeps its queue instead of
    learning it in the engine's thread, and the restored model learns it bit for bit as the
    live one does, whatever the slices."""
    record = ProjectRecord(
        "p",
        RECORD.labels,
        {**RECORD.config, "dyadic": settings_for(len(RECORD.labels)).to_dict()},
        1.0,
    )
    live = ProjectEngine(record)
    live.apply_all(label_entries(synthetic, [1500, 3000, 4500, 6000]))
    assert live.dyadic is not None
    live.dyadic_update(2000)  # learns the first 2,000 labels: the rest stays queued
    backlog, through = live.dyadic_backlog, live.dyadic.learned_through(live.position)
    assert backlog > 0 and 0 < through < live.position
    learned = live.dyadic.model.arrays()
    blob = encode(capture(live))
    assert live.dyadic_backlog == backlog  # nothing learned by the capture
    assert all(np.array_equal(v, live.dyadic.model.arrays()[k]) for k, v in learned.items())
    back = restore(record, blob)
    assert back.dyadic is not None
    assert back.dyadic_backlog == backlog and back.dyadic.learned_through(back.position) == through
    back.dyadic_update(777)  # other slices than the live model's
    back.dyadic_update(5)
    ours, theirs = _dyadic_arrays(live), _dyadic_arrays(back)
    assert all(np.array_equal(v, theirs[k]) for k, v in ours.items())
    # a snapshot of the format before (its model learned through its position) has no queue
    z = np.load(io.BytesIO(decompress(encode(capture(live)))))
    older = {k: z[k] for k in z.files if not k.startswith("dyadic_queue_")}
    older["meta"] = np.array([1.0, *z["meta"][1:]])
    buf = io.BytesIO()
    np.savez(buf, **older)
    again = restore(record, zlib.compress(buf.getvalue(), 1))
    assert again.dyadic_backlog == 0
    theirs = _dyadic_arrays(again)
    assert all(np.array_equal(v, theirs[k]) for k, v in ours.items())


def post_all(store: Store, synthetic: Synthetic, cuts: list[int]) -> None:
    for e in label_entries(synthetic, cuts):
        body = orjson.loads(e.payload)
        n = len(body["items"])
        body["ids"] = [f"{e.position}-{k}" for k in range(n)]
        store.append("p", "labels", orjson.dumps(body), body["ids"])


def loop_for(store: Store, db: SnapshotDB, **kw: float) -> EngineLoop:
    snap = Snapshotter(db, store, interval_s=kw.get("interval_s", 0.0), every_labels=10**9, keep=2)
    return EngineLoop(store, batch_entries=2, refine_passes=0, snapshotter=snap)


def drain(loop: EngineLoop, snapshot: bool = True) -> None:
    """Apply everything; with ``snapshot``, until a snapshot covers the last entry."""
    snap = loop.snapshotter
    assert snap is not None
    while True:
        while loop.step():
            pass
        snap.wait()
        assert snap.last_error is None
        if not snapshot or all(snap.covered(n) == e.position for n, e in loop.engines.items()):
            return


def test_engine_restarts_from_snapshot_and_archive(
    store: Store, db: SnapshotDB, synthetic: Synthetic
) -> None:
    store.create_project(RECORD)
    post_all(store, synthetic, [1000, 4000, 6000, 8000, 10000])
    first = loop_for(store, db)
    drain(first)  # snapshots as it goes (interval 0), keeps 2
    infos = db.infos("p")
    assert (
        len(infos) == 2 and infos[-1].position == 6 and infos[-1].n_labels == synthetic.items.size
    )
    if isinstance(store, RedisStore):
        assert store.read_log("p", 0, 100) == []  # trimmed: all archived in SQL
        assert db.archived_position("p") == 6
    post_all_more = label_entries(synthetic, [500])[0]
    body = orjson.loads(post_all_more.payload)
    store.append("p", "labels", orjson.dumps(body), None)
    # a new engine (a restart) restores the latest snapshot, replays what follows
    second = loop_for(store, db, interval_s=3600)
    drain(second, snapshot=False)
    reference = ProjectEngine(RECORD)
    log = (
        store.read_log("p", 0, 100)
        if store.log_in_sql
        else [*db.read_archive("p", 0, 100), *store.read_log("p", 6, 100)]
    )
    reference.apply_all(log)
    same_state(reference, second.engines["p"])
    assert second.engines["p"].position == 7


@pytest.mark.parametrize("age_s, snapshots_at_once", [(3600.0, True), (0.0, False)])
def test_a_restored_engine_snapshots_once_caught_up_when_its_snapshot_is_old(
    store: Store, db: SnapshotDB, synthetic: Synthetic, age_s: float, snapshots_at_once: bool
) -> None:
    """The snapshot interval counts from the latest snapshot, not from the restart: an engine
    killed again and again before its next snapshot would else replay more at every start."""
    store.create_project(RECORD)
    entries = label_entries(synthetic, [1000, 4000, 6000, 8000])
    for e in entries[:2]:
        store.append("p", "labels", e.payload, None)
    drain(loop_for(store, db))
    assert [i.position for i in db.infos("p")][-1] == 2
    with Session(db.engine) as s, s.begin():
        s.execute(update(SnapshotRow).values(created_at=SnapshotRow.created_at - age_s))
    for e in entries[2:]:  # past the snapshot
        store.append("p", "labels", e.payload, None)
    restarted = loop_for(store, db, interval_s=600)
    drain(restarted, snapshot=False)
    assert restarted.engines["p"].position == len(entries)
    latest = [i.position for i in db.infos("p")][-1]
    assert (latest > 2) == snapshots_at_once  # (at its first step's end: entries 3-4)


def test_an_engine_restored_at_the_log_end_still_sweeps(
    store: Store, db: SnapshotDB, synthetic: Synthetic
) -> None:
    """Restarted after every label was applied, the engine has no label entry to apply: it
    still runs the refinement sweep its snapshot was due and gives the dyadic model its passes
    once idle (it waited for a new label forever)."""
    dyadic = settings_for(len(RECORD.labels), passes=3).to_dict()
    record = ProjectRecord("p", RECORD.labels, {**RECORD.config, "dyadic": dyadic}, 1.0)
    store.create_project(record)
    post_all(store, synthetic, [1000, 4000])
    snap = Snapshotter(db, store, interval_s=0.0, every_labels=10**9, keep=2)
    first = EngineLoop(
        store, batch_entries=2, refine_passes=1, refine_idle_s=3600, snapshotter=snap
    )
    drain(first)  # every label applied and snapshotted; the sweeps not begun
    assert first.engines["p"].wants_dyadic_sweep() and first.engines["p"].refine_due
    end = store.log_end("p")
    snap = Snapshotter(db, store, interval_s=3600, every_labels=10**9, keep=2)
    second = EngineLoop(store, refine_passes=1, refine_idle_s=0.05, snapshotter=snap)
    second.run_until_idle(timeout_s=30)
    eng = second.engines["p"]
    assert not eng.wants_dyadic_sweep() and not eng.refine_due
    after = second.snapshotter.read_log("p", end, 100, None, None)  # type: ignore[union-attr]
    sweep = [orjson.loads(e.payload) for e in after if e.kind == "refine"]  # (in slices)
    assert [cut["from"] for cut in sweep].count(0) == 1 and sweep[-1]["to"] == 2 * 3000
    assert eng.dyadic is not None and eng.dyadic.examples == 3 * eng.labels.n_labels


def snapshots_after(
    loop: EngineLoop, db: SnapshotDB, entries: list[LogEntry], archived: list[int] | None = None
) -> list[int]:
    """Project p made, then ``entries`` appended and applied one at a time: the position of
    the latest snapshot after each (and in ``archived``, the archive's last position)."""
    loop.store.create_project(RECORD)
    out = []
    for e in entries:
        loop.store.append("p", "labels", e.payload, None)
        drain(loop, snapshot=False)
        out.append(db.infos("p")[-1].position)
        if archived is not None:
            archived.append(db.archived_position("p"))
    return out


def test_snapshots_come_after_a_share_of_the_labels_not_a_fixed_count(
    store: Store, db: SnapshotDB, synthetic: Synthetic
) -> None:
    """After a snapshot of 4,000 labels the next is due after 400 more (``REPLAY_SHARE``),
    not after ``every_labels`` = 100: a snapshot costs in proportion to the project. With
    Redis the log is archived to SQL (and trimmed) every 100 labels all the same: that count
    bounds what a lost Redis volume costs."""
    snap = Snapshotter(db, store, interval_s=3600, every_labels=100, keep=5, time_share=None)
    loop = EngineLoop(store, batch_entries=1, refine_passes=0, snapshotter=snap)
    archived: list[int] = []
    entries = label_entries(synthetic, [4000, 4200, 4450])[:3]
    snapshotted = snapshots_after(loop, db, entries, archived)
    assert snap.labels_between(4000) == 400
    # 4,000 labels, then 200 (200 < 400: no snapshot), then 250 (450 >= 400)
    assert snapshotted == [1, 1, 3]
    if not store.log_in_sql:
        assert archived == [1, 2, 3]  # (the second entry's 200 labels >= 100: archived)


def test_a_snapshot_due_waits_out_its_share_of_the_time(
    store: Store, db: SnapshotDB, synthetic: Synthetic
) -> None:
    """A snapshot that took w seconds is followed by the next no sooner than w / time_share
    seconds after it began, however many labels came since; one asked for is taken at once.
    With Redis, the entries are archived to SQL and trimmed from the live log meanwhile, and
    an engine restarted then restores the snapshot and replays the archive."""
    snap = Snapshotter(db, store, interval_s=3600, every_labels=100, keep=5, time_share=1e-6)
    loop = EngineLoop(store, batch_entries=1, refine_passes=0, snapshotter=snap)
    archived: list[int] = []
    entries = label_entries(synthetic, [2000, 2500, 3000])[:3]
    snapshotted = snapshots_after(loop, db, entries, archived)
    assert snap.resting("p", 3600.0)  # (an hour < w / 1e-6)
    assert snapshotted == [1, 1, 1]
    if not store.log_in_sql:
        assert archived == [1, 2, 3] and store.read_log("p", 0, 100) == []  # (all trimmed)
        restarted = loop_for(store, db, interval_s=3600)
        drain(restarted, snapshot=False)
        reference = ProjectEngine(RECORD)
        reference.apply_all(db.read_archive("p", 0, 100))
        same_state(reference, restarted.engines["p"])
        restarted.snapshotter.close()  # type: ignore[union-attr]
    future = snap.maybe_snapshot(loop.engines["p"], force=True)
    assert future is not None and future.result() is not None
    assert db.infos("p")[-1].position == 3
    snap.unload("p")
    assert not snap.resting("p", 0.0)  # (a project loaded again starts afresh)


def test_wiped_redis_is_rebuilt_from_sql(
    tmp_path: Path, db: SnapshotDB, synthetic: Synthetic
) -> None:
    from tests.app.conftest import make_store

    store = make_store("redis", tmp_path)
    assert isinstance(store, RedisStore)
    try:
        store.create_project(RECORD)
        store.set_admin_key_hash("admin-hash")
        post_all(store, synthetic, [3000, 9000])
        loop = loop_for(store, db)
        drain(loop)
        before = {k: orjson.loads(v) for k, v in store.scan_items("p", 0, 10**6)[1]}
        store.flush_prefix()  # Redis loses everything
        assert store.list_projects() == []
        assert rebuild_store(store, db) == ["p"]
        assert store.get_key("admin-hash") is not None
        assert store.log_end("p") == 3
        again = label_entries(synthetic, [3000, 9000])[0]
        body = orjson.loads(again.payload)
        ids = [f"1-{k}" for k in range(len(body["items"]))]
        assert store.append("p", "labels", again.payload, ids).duplicates == len(ids)  # ids back
        fresh = loop_for(store, db, interval_s=3600)
        drain(fresh, snapshot=False)
        after = {k: orjson.loads(v) for k, v in store.scan_items("p", 0, 10**6)[1]}
        assert after.keys() == before.keys()
        for k, v in before.items():
            assert after[k]["posterior"] == v["posterior"]
    finally:
        store.flush_prefix()
        store.close()


def test_a_wiped_redis_comes_back_with_what_was_archived_after_its_snapshot(
    tmp_path: Path, db: SnapshotDB, synthetic: Synthetic
) -> None:
    """Snapshots resting (their share of the time), the entries after the latest one were
    archived apart from it: a Redis that loses everything is rebuilt with them, and the
    engine serves what it served."""
    from tests.app.conftest import make_store

    store = make_store("redis", tmp_path)
    assert isinstance(store, RedisStore)
    try:
        snap = Snapshotter(db, store, interval_s=3600, every_labels=100, keep=2, time_share=1e-6)
        loop = EngineLoop(store, batch_entries=1, refine_passes=0, snapshotter=snap)
        entries = label_entries(synthetic, [2000, 2500, 3000])[:3]
        assert snapshots_after(loop, db, entries) == [1, 1, 1]
        assert db.archived_position("p") == 3
        before = {k: orjson.loads(v) for k, v in store.scan_items("p", 0, 10**6)[1]}
        store.flush_prefix()  # Redis loses everything
        assert rebuild_store(store, db) == ["p"]
        assert store.log_end("p") == 3
        fresh = loop_for(store, db, interval_s=3600)
        drain(fresh, snapshot=False)
        assert fresh.engines["p"].position == 3
        after = {k: orjson.loads(v) for k, v in store.scan_items("p", 0, 10**6)[1]}
        assert after.keys() == before.keys()
        for k, v in before.items():
            assert after[k]["posterior"] == v["posterior"]
        snap.close()
    finally:
        store.flush_prefix()
        store.close()


def test_migrations_match_models_and_downgrade_cleanly(sql_url: str) -> None:
    upgrade(sql_url)
    engine = sql_engine(sql_url)
    with engine.connect() as c:
        diff = compare_metadata(MigrationContext.configure(c), Base.metadata)
    assert diff == []
    assert set(inspect(engine).get_table_names()) >= {
        "projects",
        "api_keys",
        "label_log",
        "label_ids",
        "snapshots",
    }
    downgrade(sql_url, "base")
    assert set(inspect(sql_engine(sql_url)).get_table_names()) <= {"alembic_version"}
    upgrade(sql_url)
    assert "snapshots" in inspect(sql_engine(sql_url)).get_table_names()


class Snapshots:
    """Snapshots of one small project written at chosen log positions into a SQLite file."""

    def __init__(self, tmp_path: Path, revision: str = "head") -> None:
        self.url = f"sqlite:///{tmp_path / 's.sqlite3'}"
        upgrade(self.url, revision)
        self.db = SnapshotDB(sql_engine(self.url))
        cfg = NominalConfig(n_classes=2, n_worker_slots=8).to_dict()
        self.eng = ProjectEngine(ProjectRecord("p", ("a", "b"), cfg, 1.0))

    def write(self, position: int, keep: int) -> int:
        """A snapshot at ``position``; returns the newest snapshot's id."""
        self.eng.position = position
        self.db.write(capture(self.eng), encode(capture(self.eng)), [], keep=keep)
        return self.db.infos("p")[-1].id


def test_snapshot_retention_and_delete(tmp_path: Path) -> None:
    snaps = Snapshots(tmp_path)
    db = snaps.db
    for position in range(1, 6):
        snaps.write(position, keep=3)
    assert [i.position for i in db.infos("p")] == [3, 4, 5]
    first = db.infos("p")[0].id
    assert db.delete(first) and not db.delete(first)
    assert [i.position for i in db.infos("p")] == [4, 5]
    latest = db.latest("p")
    assert latest is not None and latest[0].position == 5
    newest = db.infos("p")[-1].id
    assert db.delete(newest)
    assert snaps.write(6, keep=3) > newest  # a deleted snapshot's id is never given again


def test_snapshot_ids_survive_the_migration_that_stops_their_reuse(tmp_path: Path) -> None:
    """Migration 0007 makes SQLite's snapshot table again (AUTOINCREMENT): the rows keep their
    ids, and the ids go on from the largest."""
    snaps = Snapshots(tmp_path, "0006")
    for position in range(1, 4):
        snaps.write(position, keep=5)
    before = [(i.id, i.position) for i in snaps.db.infos("p")]
    assert snaps.db.delete(before[-1][0])
    upgrade(snaps.url)
    snaps.db = SnapshotDB(sql_engine(snaps.url))
    assert [(i.id, i.position) for i in snaps.db.infos("p")] == before[:-1]
    newest = snaps.write(4, keep=5)
    assert newest > before[-2][0]
    assert snaps.db.delete(newest)
    assert snaps.write(5, keep=5) > newest


@pytest.mark.parametrize("kind", ["embedded"])
def test_embedded_service_restarts_from_snapshot(
    kind: str, tmp_path: Path, synthetic: Synthetic
) -> None:
    from fastapi.testclient import TestClient

    from app.api import create_app
    from tests.app.conftest import ADMIN, service_settings

    settings = service_settings(tmp_path, snapshot_interval_s=0.0)
    head = {"Authorization": f"Bearer {ADMIN}"}
    with TestClient(create_app(settings), headers=head) as c:
        key = {
            "Authorization": f"Bearer {c.post('/v1/projects', json={'name': 'p', 'labels': ['a', 'b', 'c']}).json()['api_key']}"
        }
        for e in label_entries(synthetic, [2000, 5000]):
            body = orjson.loads(e.payload)
            block = [
                {"item": i, "worker": w, "label": "abc"[z]}
                for i, w, z in zip(body["items"], body["workers"], body["labels"], strict=True)
            ]
            for lo in range(0, len(block), 5000):
                c.post(
                    "/v1/projects/p/labels",
                    params={"wait": True},
                    content=orjson.dumps(block[lo : lo + 5000]),
                    headers=key,
                )
        before = c.get("/v1/projects/p/items/item-7", headers=key).json()
        r = c.post("/v1/projects/p/snapshots", params={"wait": True}, headers=key)
        assert r.status_code == 202 and r.json()["applied"]
        snaps = c.get("/v1/projects/p/snapshots", headers=key).json()
        assert snaps[-1]["n_labels"] == synthetic.items.size
        assert snaps[-1]["position"] == r.json()["position"]
        one = c.get(f"/v1/projects/p/snapshots/{snaps[-1]['id']}", headers=key).json()
        assert one == {**snaps[-1], "age_s": one["age_s"]}
        assert c.get("/v1/projects/p/snapshots/999", headers=key).status_code == 404
    with TestClient(create_app(settings), headers=head) as c:  # a restart: snapshot + replay
        deadline = 0
        while c.get("/v1/projects/p", headers=key).json()["stats"]["lag"] and deadline < 200:
            deadline += 1
            import time

            time.sleep(0.05)
        after = c.get("/v1/projects/p/items/item-7", headers=key).json()
    assert after["posterior"] == before["posterior"] and after["labels"] == before["labels"]


def test_head_is_alembics_and_a_database_at_head_is_not_migrated_again(tmp_path: Path) -> None:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    cfg = Config()
    cfg.set_main_option("script_location", str(REPO / "migrations"))
    assert ScriptDirectory.from_config(cfg).get_current_head() == HEAD
    url = f"sqlite:///{tmp_path / 'db.sqlite3'}"
    assert schema_revision(url) is None
    upgrade(url)
    assert schema_revision(url) == HEAD
    check = (
        "import sys; from app.store.sql import upgrade; "
        f"upgrade({url!r}); sys.exit('alembic' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", check], cwd=REPO).returncode == 0
