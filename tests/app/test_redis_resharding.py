"""A Redis Cluster resharded under load: the project's slot moved to another primary, key by
key, as ``redis-cli --cluster reshard`` moves it, while blocks are appended and applied. While
the slot's keys are split between the two nodes Redis refuses multi-key commands (``TRYAGAIN``):
the API answers 503 with ``Retry-After``, the engine waits for the slot and keeps its state,
and once the slot has moved nothing acknowledged is lost or applied twice."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import redis
from fastapi.testclient import TestClient

from app.api import create_app
from app.engine.loop import EngineLoop
from app.engine.snapshots import Snapshotter
from app.store.archive import SnapshotDB
from app.store.base import StateUpdate
from app.store.redis_store import RedisStore
from app.store.sql import sql_engine, upgrade
from bench.local_cluster import LocalCluster
from tests.app.conftest import ADMIN, service_settings
from tests.app.test_redis_rollback import RECORD, block, check_against_replay, label_ids


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A local cluster of this module's own: its tests move slots (each a project's of its
    own) from one primary to another."""
    made = LocalCluster(tmp_path_factory.mktemp("cluster")).start()
    try:
        yield made
    finally:
        made.stop()


def _node(port: int) -> redis.Redis:
    return redis.Redis(port=port, decode_responses=True)


class SlotMove:
    """The slot of ``key`` moved from the primary that serves it to another primary, by hand
    (CLUSTER SETSLOT IMPORTING / MIGRATING, MIGRATE key by key, SETSLOT NODE on every primary:
    Redis's resharding procedure)."""

    def __init__(self, cluster: LocalCluster, key: str) -> None:
        client = cluster.client()
        self.slot = client.keyslot(key)
        source = client.get_node_from_key(key)
        target = next(n for n in client.get_primaries() if n.port != source.port)
        self.primaries = [_node(n.port) for n in client.get_primaries()]
        self.source, self.target = _node(source.port), _node(target.port)
        self.target_port = target.port
        client.close()

    def begin(self) -> list[str]:
        """The slot marked migrating; returns its keys (none moved yet)."""
        source_id = self.source.execute_command("CLUSTER MYID")
        target_id = self.target.execute_command("CLUSTER MYID")
        self.target.execute_command("CLUSTER SETSLOT", self.slot, "IMPORTING", source_id)
        self.source.execute_command("CLUSTER SETSLOT", self.slot, "MIGRATING", target_id)
        self._target_id = target_id
        keys: list[str] = self.source.execute_command("CLUSTER GETKEYSINSLOT", self.slot, 1000)
        return keys

    def move(self, key: str) -> None:
        self.source.execute_command(
            "MIGRATE", "127.0.0.1", self.target_port, "", 0, 5000, "KEYS", key
        )

    def finish(self) -> None:
        """The keys still on the source moved, then the slot given to the target."""
        for key in self.source.execute_command("CLUSTER GETKEYSINSLOT", self.slot, 1000):
            self.move(key)
        for node in [self.target, self.source, *self.primaries]:
            node.execute_command("CLUSTER SETSLOT", self.slot, "NODE", self._target_id)

    def close(self) -> None:
        for node in [self.source, self.target, *self.primaries]:
            node.close()


def test_a_project_whose_slot_is_split_does_not_hold_back_projects_on_other_nodes(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """One engine, two projects on two primaries; the first one it steps has its slot split:
    the step still applies the second project's labels, then fails (and is tried again)."""
    store = RedisStore(cluster.url, f"ro-{uuid.uuid4().hex[:8]}", timeout_s=2.0, cluster=True)
    loop = EngineLoop(store, refine_passes=0)
    rng = np.random.default_rng(11)
    move: SlotMove | None = None
    try:
        names = on_two_primaries(store)
        for name in names:
            store.create_project(replace(RECORD, name=name))
            store.append(name, "labels", *block(0, rng))
        loop.step()
        first, other = list(loop._catalogue())  # (the order the engine steps them in)
        for name in (first, other):
            store.append(name, "labels", *block(1, rng))
        move = SlotMove(cluster, store._k(first, "log"))
        keys = move.begin()
        move.move(next(k for k in keys if k.endswith(":state")))
        with pytest.raises(redis.RedisError) as refused:
            loop.step()
        assert store.is_moving(refused.value)
        assert store.applied_position(other) == 2  # (applied in the step that failed)
        assert store.applied_position(first) == 1 and not loop.failed
        move.finish()
        loop.run_until_idle()
        assert store.applied_position(first) == 2 and not loop.failed
    finally:
        if move is not None:
            move.close()
        store.flush_prefix()
        store.close()


def test_a_pool_engine_keeps_renewing_its_other_leases_while_one_slot_is_split(
    cluster: LocalCluster,
) -> None:
    """Renewed in one round trip, the leases of a pool engine's projects on other nodes are
    renewed while one project's lease and fence keys are split between two nodes (its renewal
    is refused: neither renewed nor lost); once the slot has moved, it is renewed again."""
    store = RedisStore(cluster.url, f"rl-{uuid.uuid4().hex[:8]}", timeout_s=2.0, cluster=True)
    move: SlotMove | None = None
    try:
        moving, other = on_two_primaries(store)
        held = [store.acquire_lease(name, "A", 5.0) for name in (moving, other)]
        assert all(held)
        move = SlotMove(cluster, store._k(moving, "lease"))
        keys = move.begin()
        move.move(next(k for k in keys if k.endswith(":lease")))
        assert store.renew_leases([moving, other], "A", 5.0) == [None, held[1]]
        move.finish()
        assert store.renew_leases([moving, other], "A", 5.0) == held
    finally:
        if move is not None:
            move.close()
        store.flush_prefix()
        store.close()


def test_a_state_write_refused_while_its_slot_moves_is_sent_again_as_it_was(
    cluster: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The project's items moved ahead of its log: the engine reads and applies a block, and
    its state write is refused whole. Once the slot has moved, that same write goes (the
    block's items), not every item of the project anew, and the served state is a fresh
    replay's."""
    url = f"sqlite:///{tmp_path / 'snapshots.sqlite3'}"
    upgrade(url)
    db = SnapshotDB(sql_engine(url))
    store = RedisStore(cluster.url, f"rw-{uuid.uuid4().hex[:8]}", timeout_s=2.0, cluster=True)
    loop = EngineLoop(store, refine_passes=0, snapshotter=Snapshotter(db, store, 0.0, 3))
    rng = np.random.default_rng(12)
    blocks = [block(n, rng) for n in range(6)]
    move: SlotMove | None = None
    try:
        store.create_project(RECORD)
        store.acquire_lease("p", "nobody", 60.0)  # (a fence key: the write's WATCH finds its
        # keys on the slot's node, and the refusal comes at the transaction's EXEC)
        for n in range(4):
            store.append("p", "labels", *blocks[n])
            loop.step()
        engine = loop.engines["p"]
        store.append("p", "labels", *blocks[4])
        sizes: list[int] = []
        write = store.write_state

        def counted(project: str, update: StateUpdate) -> None:
            sizes.append(len(update.items))
            write(project, update)

        monkeypatch.setattr(store, "write_state", counted)
        move = SlotMove(cluster, store._k("p", "log"))
        keys = move.begin()
        move.move(next(k for k in keys if k.endswith(":items")))
        with pytest.raises(redis.RedisError) as refused:
            loop.step()  # (reads and applies block 4; its write is refused)
        assert store.is_moving(refused.value) and sizes
        move.finish()
        store.append("p", "labels", *blocks[5])
        loop.run_until_idle()
        assert sizes[1] == sizes[0] < len(engine.items.names), sizes
        assert not loop.failed and loop.engines["p"] is engine
        check_against_replay(store, db, engine, label_ids(blocks))
    finally:
        if move is not None:
            move.close()
        assert loop.snapshotter is not None
        loop.snapshotter.close()
        store.flush_prefix()
        store.close()
        db.close()


def on_two_primaries(store: RedisStore) -> tuple[str, str]:
    """Two project names whose keys sit on different primaries."""
    names = [f"q{k}" for k in range(64)]
    nodes = {name: store.r.get_node_from_key(store._k(name, "log")).port for name in names}
    a = names[0]
    return a, next(n for n in names if nodes[n] != nodes[a])


@pytest.mark.slow
def test_an_engine_waits_out_its_project_s_slot_moving_and_loses_nothing(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """The slot moves a key at a time, a block appended and the engine stepped while its keys
    are split between the nodes (after the first key, and before the last): every error either side meets is the store's slot moving (``is_moving``: the
    appends refused are posted again once it has moved), the engine keeps the same project
    state throughout (never marked failed and rebuilt from a snapshot), and afterwards the
    log holds every label once and the served state is a fresh replay's."""
    url = f"sqlite:///{tmp_path / 'snapshots.sqlite3'}"
    upgrade(url)
    db = SnapshotDB(sql_engine(url))
    store = RedisStore(cluster.url, "rs", timeout_s=2.0, cluster=True, join_entries=True)
    loop = EngineLoop(store, refine_passes=0, snapshotter=Snapshotter(db, store, 0.0, 3),
                      batch_entries=4)  # fmt: skip
    rng = np.random.default_rng(8)
    blocks = [block(n, rng) for n in range(30)]
    refused: list[int] = []

    def refused_as_moving(call: Callable[[], Any]) -> bool:
        try:
            call()
        except redis.RedisError as exc:
            assert store.is_moving(exc), repr(exc)  # (nothing else may go wrong)
            return True
        return False

    move = SlotMove(cluster, store._k("p", "log"))
    try:
        store.create_project(RECORD)
        for n in range(10):
            store.append("p", "labels", *blocks[n])
            loop.step()
        engine = loop.engines["p"]
        keys = move.begin()
        assert len(keys) >= 5, keys
        split = (0, len(keys) - 2)  # (each refusal takes redis-py's retries: ~0.5 s)
        for k, key in enumerate(keys):
            move.move(key)
            if k in split:
                n = 10 + split.index(k)
                if refused_as_moving(lambda n=n: store.append("p", "labels", *blocks[n])):
                    refused.append(n)
                refused_as_moving(loop.step)
                assert not loop.failed
        move.finish()
        for n in [*refused, *range(12, 30)]:
            store.append("p", "labels", *blocks[n])
            loop.step()
        loop.run_until_idle()
        assert refused, "no append met the slot split: nothing was tested"
        assert not loop.failed and loop.engines["p"] is engine
        check_against_replay(store, db, engine, label_ids(blocks))
    finally:
        move.close()
        assert loop.snapshotter is not None
        loop.snapshotter.close()
        store.close()
        db.close()


def test_the_api_answers_503_while_a_project_s_slot_is_split_and_202_once_it_moved(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """With the label ids' key moved and the log's not, Redis cannot run the append (TRYAGAIN):
    a retryable 503 ``store_unavailable`` with ``Retry-After: 1`` that says why, not a 500. The
    same block posted again once the slot has moved is applied once."""
    prefix = f"rs-{uuid.uuid4().hex[:8]}"
    settings = service_settings(tmp_path, store="redis", REDIS_URL=cluster.url,
                                redis_cluster=True, redis_prefix=prefix)  # fmt: skip
    first = [{"item": "x", "worker": f"w{k}", "label": "a", "id": f"a{k}"} for k in range(3)]
    second = [{"item": "y", "worker": f"w{k}", "label": "b", "id": f"b{k}"} for k in range(3)]
    move: SlotMove | None = None
    try:
        with TestClient(create_app(settings), headers={"Authorization": f"Bearer {ADMIN}"}) as c:
            assert (
                c.post("/v1/projects", json={"name": "p", "labels": ["a", "b"]}).status_code == 201
            )
            r = c.post("/v1/projects/p/labels?wait=true", content=orjson.dumps(first))
            assert r.status_code == 202 and r.json()["applied"], r.text
            store = RedisStore(cluster.url, prefix, cluster=True)
            move = SlotMove(cluster, store._k("p", "log"))
            keys = move.begin()
            move.move(next(k for k in keys if k.endswith(":ids")))
            r = c.post("/v1/projects/p/labels", content=orjson.dumps(second))
            assert r.status_code == 503, r.text
            assert r.headers["Retry-After"] == "1"
            error = r.json()["error"]
            assert error["code"] == "store_unavailable"
            assert "moving this project's keys between its nodes" in error["message"]
            move.finish()
            r = c.post("/v1/projects/p/labels?wait=true", content=orjson.dumps(second))
            assert r.status_code == 202, r.text
            assert (r.json()["accepted"], r.json()["duplicates"], r.json()["applied"]) == (
                3,
                0,
                True,
            )
            assert c.get("/v1/projects/p").json()["stats"]["n_labels"] == 6
            assert c.get("/v1/projects/p/items/y").json()["label"] == "b"
            assert c.get("/readyz").json()["failed_projects"] == {}
            store.close()
    finally:
        if move is not None:
            move.close()
