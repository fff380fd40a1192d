"""The snapshot database (PostgreSQL here, reached through a proxy the test cuts) going away
while the API runs on Redis: reads and label blocks go on, ``/readyz`` and ``/metrics`` say
so instead of answering 500, and the routes that write to it answer 503
``snapshot_db_unavailable`` having kept nothing (a project, a key), or, for a deletion,
finish it when sent again."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import psycopg
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import make_url

from app.api import create_app
from app.engine.loop import EngineLoop
from app.engine.snapshots import Snapshotter
from app.store.archive import SnapshotDB
from app.store.base import ProjectRecord
from app.store.redis_store import RedisStore
from app.store.sql import sql_engine, upgrade
from core.nominal import NominalConfig
from tests.app.conftest import (
    ADMIN,
    PG_ADMIN_URL,
    REDIS_URL,
    fresh_postgres,
    make_store,
    service_settings,
)
from tests.app.test_processes import started_after_waiting, waiting_api_and_engine
from tests.tcp_proxy import Proxy


@pytest.fixture
def proxied_postgres() -> Iterator[tuple[str, Proxy]]:
    with fresh_postgres() as url:
        real = make_url(url)
        proxy = Proxy(real.host or "127.0.0.1", real.port or 5432)
        try:
            yield real.set(host="127.0.0.1", port=proxy.port).render_as_string(False), proxy
        finally:
            proxy.cut()


def create(c: TestClient, name: str) -> httpx.Response:
    return c.post("/v1/projects", json={"name": name, "labels": ["a", "b"]})


def test_the_snapshot_database_going_away_is_a_503_not_a_500(
    proxied_postgres: tuple[str, Proxy], tmp_path: Path
) -> None:
    url, proxy = proxied_postgres
    store = make_store("redis", tmp_path)
    assert isinstance(store, RedisStore)
    settings = service_settings(
        tmp_path, database_url=url, engine_in_process=True, snapshot_interval_s=0.1
    )
    app = create_app(settings, store=store)
    try:
        with TestClient(app, headers={"Authorization": f"Bearer {ADMIN}"}) as c:
            assert create(c, "p").status_code == 201
            label = [{"item": "i1", "worker": "w1", "label": "a"}]
            assert c.post("/v1/projects/p/labels?wait=true", json=label).json()["applied"]
            assert c.get("/readyz").json()["snapshot_db"] == "ok"
            proxy.cut()

            ready = c.get("/readyz")  # (a 500 before: the probe itself failed)
            assert ready.status_code == 200 and ready.json()["ready"], ready.text
            assert ready.json()["snapshot_db"] == "unreachable"
            # the in-process engine's next snapshot fails: reported, and still ready (it
            # answered 503 not ready once a snapshot had been tried)
            deadline = time.monotonic() + 30
            while (ready := c.get("/readyz")).json()["snapshot_error"] is None:
                assert time.monotonic() < deadline, ready.text
                c.post("/v1/projects/p/labels", json=[{"item": "i0", "worker": "w2", "label": "b"}])
                time.sleep(0.1)
            assert ready.status_code == 200 and ready.json()["ready"], ready.text
            metrics = c.get("/metrics")
            assert metrics.status_code == 200 and "crowdtally_snapshot_db_up 0.0" in metrics.text
            assert "crowdtally_store_up 1.0" in metrics.text
            more = [{"item": "i2", "worker": "w1", "label": "b"}]  # (labels live in Redis)
            assert c.post("/v1/projects/p/labels?wait=true", json=more).json()["applied"]
            assert c.get("/v1/projects/p/items/i2").status_code == 200

            listed = c.get("/v1/projects/p/snapshots")
            assert listed.status_code == 503, listed.text
            assert listed.json()["error"]["code"] == "snapshot_db_unavailable"
            assert listed.headers["Retry-After"] == "2"
            made = create(c, "q")
            assert made.status_code == 503, made.text
            assert store.get_project("q") is None  # nothing kept: it can be sent again
            keys_before = len(store.list_keys("p"))
            assert c.post("/v1/projects/p/keys", json={"scope": "read"}).status_code == 503
            assert len(store.list_keys("p")) == keys_before
            assert c.delete("/v1/projects/p").status_code == 503  # (Redis's part done)

            proxy.restore()
            assert c.get("/readyz").json()["snapshot_db"] == "ok"
            assert create(c, "q").status_code == 201
            db = app.state.service.db
            assert db.project("p") is not None  # what the failed deletion left in SQL ...
            assert c.delete("/v1/projects/p").status_code == 404
            assert db.project("p") is None  # ... the deletion sent again removes
    finally:
        store.flush_prefix()
        store.close()


def test_an_api_and_an_engine_started_before_their_database_answers_wait_for_it(
    proxied_postgres: tuple[str, Proxy], tmp_path: Path
) -> None:
    """They exited with "cannot open the snapshot database": an engine restarted while
    PostgreSQL was down left every posterior stale until someone started it again. Now they
    wait, as for Redis, and start once it answers."""
    url, proxy = proxied_postgres
    proxy.cut()  # (nothing listens on its port: the database does not answer)
    prefix = f"test-db-wait-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "CROWDTALLY_STORE": "redis", "REDIS_URL": REDIS_URL,
           "CROWDTALLY_REDIS_PREFIX": prefix, "CROWDTALLY_DATABASE_URL": url,
           "CROWDTALLY_DATA_DIR": str(tmp_path), "CROWDTALLY_ADMIN_KEY": ADMIN}  # fmt: skip
    try:
        with waiting_api_and_engine(env, tmp_path, "the snapshot database") as (engine, api, port):
            proxy.restore()
            started_after_waiting(engine, api, port)
            with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
                assert client.get("/readyz").json()["snapshot_db"] == "ok"
    finally:
        RedisStore(REDIS_URL, prefix).flush_prefix()


def test_a_database_turned_read_only_is_a_503_and_writable_again_is_used_again(
    tmp_path: Path,
) -> None:
    """A PostgreSQL that a failover made a standby (here: its sessions made read-only, the open
    ones ended) refuses every write: the API answers 503, not 500. Once it takes writes again,
    so does the API: the pool's sessions, opened read-only, were dropped with the refusal
    (they made every later write a 500 until the API was restarted)."""
    prefix = f"test-db-ro-{uuid.uuid4().hex[:8]}"
    with fresh_postgres() as url:
        name = make_url(url).database
        settings = service_settings(tmp_path, store="redis", REDIS_URL=REDIS_URL,
                                    redis_prefix=prefix, database_url=url)  # fmt: skip
        admin = psycopg.connect(PG_ADMIN_URL, autocommit=True)
        try:
            with TestClient(
                create_app(settings), headers={"Authorization": f"Bearer {ADMIN}"}
            ) as c:
                assert create(c, "before").status_code == 201
                admin.execute(f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
                admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = %s AND pid <> pg_backend_pid()",
                    (name,),
                )
                r = create(c, "during")
                assert r.status_code == 503, r.text
                assert r.json()["error"]["code"] == "snapshot_db_unavailable"
                assert "ReadOnlySqlTransaction" in r.json()["error"]["message"]
                assert r.headers["Retry-After"]
                assert c.get("/v1/projects/during").status_code == 404  # (nothing kept)
                admin.execute(f'ALTER DATABASE "{name}" RESET default_transaction_read_only')
                r = create(c, "during")
                assert r.status_code == 201, r.text
        finally:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = %s AND pid <> pg_backend_pid()",
                (name,),
            )
            admin.close()
            RedisStore(REDIS_URL, prefix).flush_prefix()


def test_an_engine_that_loads_a_project_while_the_database_is_down_waits_for_it(
    proxied_postgres: tuple[str, Proxy],
) -> None:
    """An engine (re)started while PostgreSQL does not answer cannot load its projects (their
    snapshots are there): it waits, the project not marked failed (which retried it after a
    back-off doubling up to a minute, so a minute after the database came back it could
    still be waiting), and applies its log as soon as the database answers."""
    url, proxy = proxied_postgres
    upgrade(url)
    db = SnapshotDB(sql_engine(url))
    prefix = f"test-db-load-{uuid.uuid4().hex[:8]}"
    store = RedisStore(REDIS_URL, prefix)
    loop = EngineLoop(store, refine_passes=0, snapshotter=Snapshotter(db, store, 0.0, 3))
    try:
        store.create_project(
            ProjectRecord("p", ("a", "b"), NominalConfig(n_classes=2).to_dict(), 1)
        )
        labels = {"items": ["x", "y"], "workers": ["w", "v"], "labels": [0, 1], "weights": None}
        store.append("p", "labels", orjson.dumps(labels))
        proxy.cut()
        for _ in range(3):
            with pytest.raises(Exception) as waits:
                loop.step()
            assert db.is_down(waits.value), repr(waits.value)
            assert not loop.failed
        proxy.restore()
        loop.step()
        assert store.applied_position("p") == 1 and not loop.failed
    finally:
        assert loop.snapshotter is not None
        loop.snapshotter.close()
        store.flush_prefix()
        store.close()
        db.close()
