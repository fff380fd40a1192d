"""/readyz is not ready while served state is being restored (its items would answer 404).

Two restores: a wiped Redis rebuilt from SQL, and the embedded service started again (its
served state lives in memory). The engine is held back, so the restore is certainly still
running when /readyz is asked; then the engine catches up, and /readyz is ready.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import orjson
from fastapi.testclient import TestClient

from app.api import create_app
from app.engine.loop import EngineLoop
from app.engine.snapshots import Snapshotter
from app.store.archive import SnapshotDB, rebuild_store
from app.store.base import ProjectRecord, Store
from app.store.embedded import EmbeddedStore
from app.store.redis_store import RedisStore
from app.store.sql import sql_engine, upgrade
from core.nominal import NominalConfig
from tests.app.conftest import ADMIN, REDIS_URL, service_settings

RECORD = ProjectRecord("p", ("a", "b"), NominalConfig(n_classes=2).to_dict(), 1.0)


def post(store: Store, n: int) -> None:
    ids: list[str | None] = [f"{n}-{k}" for k in range(50)]
    body = {
        "items": [f"i{k % 20}" for k in range(50)],
        "workers": [f"w{k % 7}" for k in range(50)],
        "labels": [k % 2 for k in range(50)],
        "weights": None,
        "ids": ids,
    }
    store.append("p", "labels", orjson.dumps(body), ids)


def readiness(st: Store, tmp_path: Path, **settings: object) -> tuple[dict, int, int]:  # type: ignore[type-arg]
    """/readyz's body and status, and the status of an item, with no engine running."""
    app = create_app(service_settings(tmp_path, engine_in_process=False, **settings), st)
    with TestClient(app, headers={"Authorization": f"Bearer {ADMIN}"}) as c:
        r = c.get("/readyz")
        return r.json(), r.status_code, c.get("/v1/projects/p/items/i3").status_code


def test_not_ready_while_a_wiped_redis_is_restored(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'snapshots.sqlite3'}"
    upgrade(url)
    db = SnapshotDB(sql_engine(url))
    prefix = f"test-ready-{uuid.uuid4().hex[:8]}"
    store = RedisStore(REDIS_URL, prefix)
    try:
        store.create_project(RECORD)
        for n in range(6):
            post(store, n)
        loop = EngineLoop(store, refine_passes=0, snapshotter=Snapshotter(db, store, 0.0))
        loop.run_until_idle()
        assert loop.snapshotter is not None
        loop.snapshotter.wait()
        loop.snapshotter.close()
        store.flush_prefix()  # Redis wiped
        assert rebuild_store(store, db) == ["p"]
        settings = {"store": "redis", "redis_prefix": prefix, "database_url": url}
        body, status, item = readiness(store, tmp_path, **settings)
        assert status == 503 and not body["ready"] and item == 503  # (restoring, not 404)
        assert body["restoring"] == {"p": {"applied": 0, "target": store.log_end("p")}}
        loop = EngineLoop(store, refine_passes=0, snapshotter=Snapshotter(db, store, 3600.0))
        loop.run_until_idle()
        body, status, item = readiness(store, tmp_path, **settings)
        assert (status, body["ready"], body["restoring"], item) == (200, True, {}, 200)
        assert loop.snapshotter is not None
        loop.snapshotter.close()
    finally:
        store.flush_prefix()
        store.close()
        db.close()


def test_not_ready_while_the_embedded_service_restores(tmp_path: Path) -> None:
    path = tmp_path / "crowdtally.sqlite3"
    store = EmbeddedStore(path)
    store.create_project(RECORD)
    for n in range(4):
        post(store, n)
    EngineLoop(store, refine_passes=0).run_until_idle()
    assert store.restoring() == {}
    store.close()
    store = EmbeddedStore(path)  # started again: the served state is rebuilt by the engine
    try:
        body, status, item = readiness(store, tmp_path)
        assert status == 503 and body["restoring"] == {"p": {"applied": 0, "target": 4}}
        assert item == 503  # (restoring: not an item unknown)
        EngineLoop(store, refine_passes=0).run_until_idle()
        body, status, item = readiness(store, tmp_path)
        assert (status, body["ready"], body["restoring"], item) == (200, True, {}, 200)
    finally:
        store.close()
