"""A single Redis demoted to a replica under the service, as a managed Redis's failover does:
the address the service was given names a replica for a while, which refuses every write
(``READONLY``). The API answers 503 with ``Retry-After``, the engine keeps its state and waits,
and once the node is a primary again nothing acknowledged is lost or applied twice."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import orjson
import pytest
import redis
from fastapi.testclient import TestClient

from app.api import create_app
from app.engine.loop import EngineLoop
from app.engine.snapshots import Snapshotter
from app.store.archive import SnapshotDB
from app.store.redis_store import RedisStore
from app.store.sql import sql_engine, upgrade
from app.testing import free_port
from tests.app.conftest import ADMIN, service_settings, start_redis
from tests.app.test_redis_rollback import RECORD, block, check_against_replay, label_ids


class FailoverPair:
    """Two private redis-servers: ``url`` names the first, the primary; ``demote`` fails over
    to the second (it takes the first's data and becomes primary, the first becomes its
    replica); ``promote`` makes the first a primary again."""

    def __init__(self, folder: Path) -> None:
        self.ports = (free_port(), free_port())
        for port in self.ports:
            (folder / str(port)).mkdir()
        self.procs = [start_redis(p, folder / str(p)) for p in self.ports]
        self.first, self.second = (redis.Redis(port=p) for p in self.ports)
        for node in (self.first, self.second):  # (a replica syncs at once, not 5 s later)
            node.config_set("repl-diskless-sync-delay", 0)
        self.url = f"redis://127.0.0.1:{self.ports[0]}/0"

    def demote(self) -> None:
        self.second.replicaof("127.0.0.1", self.ports[0])
        _wait_synced(self.second)
        self.first.wait(1, 5000)  # (the replica has every write)
        self.second.replicaof("NO", "ONE")
        self.first.replicaof("127.0.0.1", self.ports[1])
        _wait_synced(self.first)

    def promote(self) -> None:
        self.first.replicaof("NO", "ONE")

    def close(self) -> None:
        for client in (self.first, self.second):
            client.close()
        for proc in self.procs:
            proc.kill()
            proc.wait()


def _wait_synced(replica: redis.Redis) -> None:
    deadline = time.monotonic() + 10
    while replica.info("replication").get("master_link_status") != "up":
        assert time.monotonic() < deadline, "the replica did not sync"
        time.sleep(0.02)


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[FailoverPair]:
    made = FailoverPair(tmp_path)
    try:
        yield made
    finally:
        made.close()


def test_an_engine_whose_redis_turned_replica_keeps_its_state_and_loses_nothing(
    pair: FailoverPair, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'snapshots.sqlite3'}"
    upgrade(url)
    db = SnapshotDB(sql_engine(url))
    store = RedisStore(pair.url, "fo", timeout_s=2.0)
    loop = EngineLoop(store, refine_passes=0, snapshotter=Snapshotter(db, store, 0.0, 3))
    rng = np.random.default_rng(9)
    blocks = [block(n, rng) for n in range(8)]
    try:
        store.create_project(RECORD)
        for n in range(3):
            store.append("p", "labels", *blocks[n])
            loop.step()
        store.append("p", "labels", *blocks[3])  # (not applied yet)
        engine = loop.engines["p"]
        pair.demote()
        with pytest.raises(redis.ReadOnlyError) as refused:
            store.append("p", "labels", *blocks[4])
        assert store.is_moving(refused.value)
        with pytest.raises(redis.ReadOnlyError) as failed:
            loop.step()  # (applies block 3; its state write is refused)
        assert store.is_moving(failed.value)
        assert not loop.failed and loop.engines["p"] is engine  # not failed, not rebuilt
        pair.promote()
        store.recover()  # (as the engine's loop does after a failed step)
        for n in range(4, 8):
            store.append("p", "labels", *blocks[n])
            loop.step()
        loop.run_until_idle()
        assert not loop.failed and loop.engines["p"] is engine
        check_against_replay(store, db, engine, label_ids(blocks))
    finally:
        assert loop.snapshotter is not None
        loop.snapshotter.close()
        store.close()
        db.close()


def test_the_api_answers_503_while_its_redis_is_a_replica_and_202_once_it_is_primary(
    pair: FailoverPair, tmp_path: Path
) -> None:
    """A retryable 503 ``store_unavailable`` with ``Retry-After: 1`` that says why, not a 500;
    the same block posted again once the node is a primary is applied once."""
    settings = service_settings(tmp_path, store="redis", REDIS_URL=pair.url,
                                redis_prefix=f"fo-{uuid.uuid4().hex[:8]}")  # fmt: skip
    first = [{"item": "x", "worker": f"w{k}", "label": "a", "id": f"a{k}"} for k in range(3)]
    second = [{"item": "y", "worker": f"w{k}", "label": "b", "id": f"b{k}"} for k in range(3)]
    with TestClient(create_app(settings), headers={"Authorization": f"Bearer {ADMIN}"}) as c:
        assert c.post("/v1/projects", json={"name": "p", "labels": ["a", "b"]}).status_code == 201
        r = c.post("/v1/projects/p/labels?wait=true", content=orjson.dumps(first))
        assert r.status_code == 202 and r.json()["applied"], r.text
        pair.demote()
        r = c.post("/v1/projects/p/labels", content=orjson.dumps(second))
        assert r.status_code == 503, r.text
        assert r.headers["Retry-After"] == "1"
        assert r.json()["error"] == {
            "code": "store_unavailable",
            "message": "the store's node no longer takes writes (a failover made it a "
            "replica); nothing was changed: retry",
        } | {k: v for k, v in r.json()["error"].items() if k not in ("code", "message")}
        assert c.get("/v1/projects/p/items/x").json()["label"] == "a"  # (reads go on)
        pair.promote()
        r = c.post("/v1/projects/p/labels?wait=true", content=orjson.dumps(second))
        assert r.status_code == 202, r.text
        assert (r.json()["accepted"], r.json()["duplicates"], r.json()["applied"]) == (3, 0, True)
        assert c.get("/v1/projects/p").json()["stats"]["n_labels"] == 6
        assert c.get("/readyz").json()["failed_projects"] == {}


def test_a_running_engine_waits_out_a_failover_in_one_log_line(
    pair: FailoverPair, caplog: pytest.LogCaptureFixture
) -> None:
    """The engine's own loop, started on a block it cannot write the state of (its Redis is a
    replica): a step every second, one warning for the whole wait (no traceback a second, no
    project failed), and the block served once the node is a primary again."""
    store = RedisStore(pair.url, "fl", timeout_s=2.0)
    loop = EngineLoop(store, refine_passes=0)
    try:
        store.create_project(RECORD)
        store.append("p", "labels", *block(0, np.random.default_rng(10)))
        pair.demote()
        with caplog.at_level(logging.WARNING, logger="crowdtally.engine"):
            loop.start()
            time.sleep(2.5)  # (three steps refused)
            pair.promote()
            deadline = time.monotonic() + 10
            while store.applied_position("p") < 1:
                assert time.monotonic() < deadline, "the block was never served"
                time.sleep(0.05)
        assert [r.getMessage().split(":")[0] for r in caplog.records] == [
            "engine step waits for the store to answer again"
        ]
        assert not loop.failed and loop.last_error is None
    finally:
        loop.stop()
        store.close()
