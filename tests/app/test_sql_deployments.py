"""Two deployments (two Redis key prefixes) sharing one SQL database see only their own rows:
projects, keys, archive, snapshots; a wiped Redis of one is rebuilt with its own only.

Run on SQLite and on the real PostgreSQL (``sql_url``)."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path
from typing import Any

import orjson
from sqlalchemy import event, text

from app.engine.loop import EngineLoop
from app.engine.snapshots import Snapshotter
from app.settings import Settings
from app.store.archive import SnapshotDB, open_snapshot_db, rebuild_store
from app.store.base import KeyRecord, ProjectRecord
from app.store.redis_store import RedisStore
from app.store.sql import sql_engine, upgrade
from core.nominal import NominalConfig
from tests.app.conftest import REDIS_URL, fresh_postgres


def deployment(prefix: str, url: str, labels: tuple[str, ...]) -> tuple[RedisStore, SnapshotDB]:
    store = RedisStore(REDIS_URL, prefix)
    db = open_snapshot_db(Settings(store="redis", redis_prefix=prefix, database_url=url))
    store.create_project(
        ProjectRecord("p", labels, NominalConfig(n_classes=len(labels)).to_dict(), 1.0)
    )
    store.put_key(f"{prefix}-key", KeyRecord(prefix[-10:], "write", "p", 1.0))
    ids: list[str | None] = [f"{prefix}-{k}" for k in range(30)]
    body = {
        "items": [f"{prefix}-i{k % 5}" for k in range(30)],
        "workers": [f"w{k % 3}" for k in range(30)],
        "labels": [k % len(labels) for k in range(30)],
        "weights": None,
        "ids": ids,
    }
    store.append("p", "labels", orjson.dumps(body), ids)
    snap = Snapshotter(db, store, interval_s=0.0)
    EngineLoop(store, refine_passes=0, snapshotter=snap).run_until_idle()
    snap.wait()
    snap.close()
    return store, db


def test_two_prefixes_share_one_database(sql_url: str) -> None:
    a, b = (f"test-dep-{uuid.uuid4().hex[:8]}-{n}" for n in "ab")
    store_a, db_a = deployment(a, sql_url, ("x", "y"))
    store_b, db_b = deployment(b, sql_url, ("u", "v", "w"))
    try:
        assert [r.labels for r in db_a.projects()] == [("x", "y")]
        assert [r.labels for r in db_b.projects()] == [("u", "v", "w")]
        assert db_a.project("p").labels == ("x", "y")  # type: ignore[union-attr]
        assert set(db_a.keys()) == {f"{a}-key"} and set(db_b.keys()) == {f"{b}-key"}
        assert len(db_a.infos()) == len(db_b.infos()) == 1
        (info_a,) = db_a.infos()
        assert db_b.get(info_a.id) is None and not db_b.delete(info_a.id)
        assert {
            i for e in db_a.read_archive("p", 0, 10) for i in orjson.loads(e.payload)["ids"]
        } == {f"{a}-{k}" for k in range(30)}
        # A's Redis wiped and rebuilt: A's project, A's keys, A's labels; B untouched.
        store_a.flush_prefix()
        assert rebuild_store(store_a, db_a) == ["p"]
        assert store_a.get_project("p").labels == ("x", "y")  # type: ignore[union-attr]
        assert set(store_a.keys_for("p")) == {f"{a}-key"}
        assert store_a.append("p", "labels", b"{}", [f"{a}-3", f"{b}-3"]).duplicates == 1
        db_a.forget_project("p")
        assert db_a.projects() == [] and db_a.keys() == {}
        assert [r.labels for r in db_b.projects()] == [("u", "v", "w")]
        assert len(db_b.infos("p")) == 1 and db_b.archived_position("p") == 1
    finally:
        for store, db in ((store_a, db_a), (store_b, db_b)):
            store.flush_prefix()
            store.close()
            db.close()


def test_rows_from_before_the_migration_are_the_upgrading_deployments(
    sql_url: str, tmp_path: Path
) -> None:
    upgrade(sql_url, "0003")
    engine = sql_engine(sql_url)
    with engine.begin() as c:
        c.execute(
            text(
                "INSERT INTO projects (name, labels, config, created_at) "
                "VALUES ('old', '[\"a\", \"b\"]', '{}', 1.0)"
            )
        )
    engine.dispose()
    upgrade(sql_url, deployment="prod")
    mine, other = (SnapshotDB(sql_engine(sql_url), d) for d in ("prod", "staging"))
    try:
        assert [r.name for r in mine.projects()] == ["old"]
        assert other.projects() == []
    finally:
        mine.close()
        other.close()


def save_keys_at_once(dbs: list[SnapshotDB]) -> list[str]:
    """Each database handle saves its project's key and the admin key, all at one moment."""
    admin = {"h-admin": KeyRecord("kid", "admin", None, 1.0)}
    start = threading.Barrier(len(dbs))
    failures: list[str] = []

    def save(n: int) -> None:
        start.wait()
        key = {f"h{n}": KeyRecord(f"k{n}", "write", f"p{n}", 1.0)}
        try:
            dbs[n].save_keys(f"p{n}", {**admin, **key})
        except Exception as exc:
            failures.append(repr(exc)[:100])

    threads = [threading.Thread(target=save, args=(n,)) for n in range(len(dbs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return failures


def test_engines_saving_their_projects_keys_at_once_all_succeed() -> None:
    """Pool engines snapshot their projects at the same moment: each saves its project's keys
    and the admin key, which none of them found archived yet (PostgreSQL: each inserts it)."""
    with fresh_postgres() as url:
        upgrade(url)
        failures: list[str] = []
        for _ in range(10):
            deployment = f"d-{uuid.uuid4().hex[:8]}"  # nothing archived yet
            dbs = [SnapshotDB(sql_engine(url), deployment) for _ in range(4)]
            failures += save_keys_at_once(dbs)
            for db in dbs:
                db.close()
        assert failures == []


def test_a_project_archived_while_the_engine_clears_its_name_keeps_its_record_and_key(
    sql_url: str,
) -> None:
    """An engine loading a project whose record SQL does not hold yet clears what SQL holds of
    the name (``forget_project`` with ``unless_created_at``) while the API that made the
    project archives it. Archived just before the engine's deletes run, the record and the key
    stay: a Redis wiped before the project's first snapshot gives it back."""
    prefix = f"test-forget-{uuid.uuid4().hex[:8]}"
    settings = Settings(store="redis", redis_prefix=prefix, database_url=sql_url)
    engine_side, api_side = open_snapshot_db(settings), open_snapshot_db(settings)
    record = ProjectRecord("q", ("a", "b"), NominalConfig(n_classes=2).to_dict(), 2.0)
    fired: list[str] = []

    def archive_first(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if not fired and statement.lstrip().upper().startswith("DELETE"):
            fired.append(statement)  # what the API does as it makes a project (Redis store)
            api_side.forget_project("q")
            api_side.save_project(record)
            api_side.put_keys({"q-key": KeyRecord("k", "write", "q", 2.0)})

    event.listen(engine_side.engine, "before_cursor_execute", archive_first)
    try:
        engine_side.forget_project("q", unless_created_at=record.created_at)
        assert fired
        assert engine_side.project("q") == record
        assert set(engine_side.keys()) == {"q-key"}
        engine_side.forget_project("q", unless_created_at=1.0)  # an earlier project's time
        assert engine_side.project("q") is None and engine_side.keys() == {}
    finally:
        event.remove(engine_side.engine, "before_cursor_execute", archive_first)
        engine_side.close()
        api_side.close()
