"""The service on a Redis Cluster (6 local nodes, bench/local_cluster.py), chosen by
configuration: the same answers as on the embedded store, bit for bit; and a primary lost
mid-stream, its replica taking over."""

from __future__ import annotations

import csv
import time
import uuid
from collections.abc import Callable
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
from app.store.base import LogRewoundError, NodeDownError, StoreWipedError
from app.store.redis_store import NotReplicatedError, RedisStore
from app.store.sql import sql_engine, upgrade
from app.testing import free_port
from bench.datasets import DEFAULT_ROOT
from bench.local_cluster import LocalCluster
from tests.app.conftest import (
    ADMIN,
    REDIS_URL,
    close_after_failover,
    cluster_url,
    service_settings,
)
from tests.app.test_redis_resharding import on_two_primaries
from tests.app.test_redis_rollback import RECORD, block, check_against_replay, label_ids, whole_log


def dog_blocks(n_blocks: int = 6, size: int = 500) -> list[list[dict[str, str]]]:
    with open(DEFAULT_ROOT / "dog" / "answers.csv", newline="") as f:
        rows = [{"item": r["item"], "worker": r["worker"], "label": r["label"]}
                for r in csv.DictReader(f)]  # fmt: skip
    return [rows[lo : lo + size] for lo in range(0, n_blocks * size, size)]


def served(settings_changes: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    """Post the blocks, then read every item and the project's stats."""
    blocks = dog_blocks()
    labels = sorted({x["label"] for b in blocks for x in b})
    app = create_app(service_settings(tmp_path, **settings_changes))
    with TestClient(app, headers={"Authorization": f"Bearer {ADMIN}"}) as c:
        assert c.post("/v1/projects", json={"name": "dog", "labels": labels}).status_code == 201
        for block in blocks:
            r = c.post("/v1/projects/dog/labels?wait=true", content=orjson.dumps(block))
            assert r.status_code == 202 and r.json()["applied"], r.text
        items = sorted({x["item"] for b in blocks for x in b})
        posteriors = {i: c.get(f"/v1/projects/dog/items/{i}").json()["posterior"] for i in items}
        stats = c.get("/v1/projects/dog").json()["stats"]
        queue = c.get("/v1/projects/dog/queue?limit=20").json()
    return {"posteriors": posteriors, "n_labels": stats["n_labels"], "queue": queue}


def test_the_service_on_a_redis_cluster_answers_as_on_the_embedded_store(tmp_path: Path) -> None:
    prefix = f"cl-{uuid.uuid4().hex[:8]}"
    cluster = {"store": "redis", "REDIS_URL": cluster_url(), "redis_cluster": True,
               "redis_prefix": prefix}  # fmt: skip
    try:
        on_cluster = served(cluster, tmp_path / "cluster")
    finally:
        store = RedisStore(cluster_url(), prefix, cluster=True)
        store.flush_prefix()
        store.close()
    embedded = served({}, tmp_path / "embedded")
    assert on_cluster["n_labels"] == embedded["n_labels"] == 3000
    assert on_cluster["posteriors"] == embedded["posteriors"]
    assert on_cluster["queue"] == embedded["queue"]


@pytest.mark.slow
def test_a_primary_lost_mid_stream_fails_over_and_nothing_acknowledged_is_lost(
    tmp_path: Path,
) -> None:
    """SIGKILL the primary that holds the project's slot while blocks stream in, some queued
    behind others (learned as one); its replica takes over. Clients retry what failed and
    re-post what was acknowledged in the last seconds (same label ids), as docs/deploy.md
    asks: every label applied exactly once, and the served state that of a fresh replay of
    the log, its queued blocks joined as the log says."""
    cluster = LocalCluster(tmp_path / "cluster").start()
    url = f"sqlite:///{tmp_path / 'snapshots.sqlite3'}"
    upgrade(url)
    db = SnapshotDB(sql_engine(url))
    store = RedisStore(cluster.url, "fo", timeout_s=2.0, cluster=True, join_entries=True)
    rng = np.random.default_rng(5)
    blocks = [block(n, rng) for n in range(40)]
    loop = EngineLoop(store, refine_passes=0, snapshotter=Snapshotter(db, store, 0.0, 3),
                      batch_entries=4)  # fmt: skip

    def retried(call: Callable[[], Any]) -> Any:
        deadline = time.monotonic() + 60
        while True:
            try:
                return call()
            except (redis.RedisError, LogRewoundError):
                assert time.monotonic() < deadline, "the cluster did not come back"
                time.sleep(0.2)

    try:
        store.create_project(RECORD)
        for n in range(15):  # two blocks a step from the third on: they queue and join
            retried(lambda n=n: store.append("p", "labels", *blocks[n]))
            if n < 2 or n % 2:
                retried(loop.step)
        primary = store.r.get_node_from_key(store._k("p", "log"))
        cluster.procs[primary.port].kill()  # mid-stream: the engine is at work on the log
        for n in range(15, 30):
            retried(lambda n=n: store.append("p", "labels", *blocks[n]))
            if n % 3 == 0:
                retried(loop.step)
        cluster.wait_healthy()
        assert store.r.get_node_from_key(store._k("p", "log")).port != primary.port
        for n in [*range(10, 30), *range(30, 40)]:  # re-posted, then new blocks
            retried(lambda n=n: store.append("p", "labels", *blocks[n]))
            retried(loop.step)
        retried(loop.run_until_idle)
        want = label_ids(blocks)
        check_against_replay(store, db, loop.engines["p"], want)
        joined = sum(e.joins for e in whole_log(store, db, "p", end=store.log_end("p")))
        assert joined >= 5, joined
    finally:
        assert loop.snapshotter is not None
        loop.snapshotter.close()
        close_after_failover(store)
        db.close()
        cluster.stop()


@pytest.mark.slow
def test_with_wait_replicas_an_acknowledged_block_survives_its_primary_s_failover(
    tmp_path: Path,
) -> None:
    """CROWDTALLY_REDIS_WAIT_REPLICAS=1: each append returns once the replica has it, so a
    primary SIGKILLed right after an acknowledgement loses nothing (no re-post needed)."""
    cluster = LocalCluster(tmp_path / "cluster").start()
    store = RedisStore(cluster.url, "wr", timeout_s=2.0, cluster=True, wait_replicas=1)
    try:
        store.create_project(RECORD)
        rng = np.random.default_rng(6)
        blocks = [block(n, rng) for n in range(30)]
        for body, ids in blocks:
            assert store.append("p", "labels", body, ids).accepted == 100
        primary = store.r.get_node_from_key(store._k("p", "log"))
        cluster.procs[primary.port].kill()  # at once after the last acknowledgement
        cluster.wait_healthy()
        deadline = time.monotonic() + 30
        while True:
            try:
                end = store.log_end("p")
                break
            except redis.RedisError:
                assert time.monotonic() < deadline
                time.sleep(0.2)
        assert end == 30
        assert [e.position for e in store.read_log("p", 0, 100)] == list(range(1, 31))
        # The new primary has no replica left (its old primary is dead): no promise to give.
        with pytest.raises(NotReplicatedError, match="0 of 1 replicas"):
            store.append("p", "labels", *blocks[29])
        store.wait_replicas = 0
        again = store.append("p", "labels", *blocks[29])  # its ids are known: duplicates
        assert (again.accepted, again.duplicates) == (0, 100)
    finally:
        close_after_failover(store)
        cluster.stop()


def test_an_append_not_on_enough_replicas_is_refused_yet_logged() -> None:
    """The machine's Redis has no replica: WAIT finds none in time. The answer is an error
    (the API's 503) though the block is in the log: posted again, its labels are duplicates."""
    store = RedisStore(REDIS_URL, f"nr-{uuid.uuid4().hex[:8]}", wait_replicas=1, wait_timeout_ms=50)
    try:
        store.create_project(RECORD)
        body, ids = block(0, np.random.default_rng(7))
        with pytest.raises(NotReplicatedError, match="0 of 1 replicas"):
            store.append("p", "labels", body, ids)
        assert store.log_end("p") == 1
        store.wait_replicas = 0
        assert store.append("p", "labels", body, ids).duplicates == 100
    finally:
        store.flush_prefix()
        store.close()


def test_the_api_says_a_block_not_on_enough_replicas_is_in_the_log(tmp_path: Path) -> None:
    """The 503 of a block that fewer replicas than asked confirmed says what happened (it is
    in the log; posted again with the same ids it counts once), not that the store could not
    be reached."""
    prefix = f"nr-{uuid.uuid4().hex[:8]}"
    settings = service_settings(tmp_path, store="redis", REDIS_URL=REDIS_URL,
                                redis_prefix=prefix, redis_wait_replicas=1,
                                redis_wait_timeout_ms=50)  # fmt: skip
    try:
        with TestClient(create_app(settings), headers={"Authorization": f"Bearer {ADMIN}"}) as c:
            assert (
                c.post("/v1/projects", json={"name": "p", "labels": ["a", "b"]}).status_code == 201
            )
            r = c.post(
                "/v1/projects/p/labels",
                json=[{"item": "x", "worker": "w", "label": "a", "id": "1"}],
            )
            assert r.status_code == 503 and r.json()["error"]["code"] == "store_unavailable"
            assert r.json()["error"]["message"] == (
                "the store did not confirm the write on its replicas: 0 of 1 replicas "
                "acknowledged the block within 50 ms; it is in the log: post it again (same ids)"
            )
    finally:
        RedisStore(REDIS_URL, prefix).flush_prefix()


def test_a_client_whose_default_node_died_works_again_once_the_cluster_failed_over(
    tmp_path: Path,
) -> None:
    """redis-py looks up a cluster pipeline's keys (lease renewals, state writes, reads) on
    its default node; once that primary is dead, ``recover`` reads the cluster's layout anew,
    and the pipelines work again."""
    cluster = LocalCluster(tmp_path / "cluster").start()
    store = RedisStore(cluster.url, "dn", timeout_s=2.0, cluster=True)
    try:
        store.create_project(RECORD)
        assert store.renew_leases(["p"], "e1", 5.0)[0] > 0
        cluster.procs[store.r.get_default_node().port].kill()
        deadline = time.monotonic() + 30
        while True:  # as an engine's renewals go on, one a second or so
            try:
                token = store.renew_leases(["p"], "e1", 5.0)[0]
                if token is not None:  # (None: its node unreachable, failing over)
                    break
            except redis.ConnectionError:
                store.recover()  # as the engine loop and the API do after a store error
            assert time.monotonic() < deadline, "the cluster's pipelines never worked again"
            time.sleep(0.2)
        assert token > 0
    finally:
        close_after_failover(store)
        cluster.stop()


@pytest.mark.slow
def test_projects_on_live_nodes_are_applied_while_one_primary_is_down(tmp_path: Path) -> None:
    """One engine, two projects on two primaries; the first one's primary SIGKILLed: the next
    step applies the second project's new block (the catalogue and the record of appends,
    wherever they live, read from what the engine knows when their node is the one down; the
    quiet check asked node by node), then fails for the first, which waits for its failover
    instead of every project waiting for it."""
    cluster = LocalCluster(tmp_path / "cluster").start()
    store = RedisStore(cluster.url, "nd", timeout_s=2.0, cluster=True)
    loop = EngineLoop(store, refine_passes=0)
    rng = np.random.default_rng(13)
    try:
        down, live = on_two_primaries(store)
        for name in (down, live):
            store.create_project(replace(RECORD, name=name))
            store.append(name, "labels", *block(0, rng))
        loop.step()
        for name in (down, live):
            store.append(name, "labels", *block(1, rng))
        port = store.r.get_node_from_key(store._k(down, "log")).port
        with redis.Redis(port=port) as primary:
            assert primary.wait(1, 5000) == 1  # (its replica has the block)
        for node in cluster.ports:  # (the other slots served while one has no primary)
            with redis.Redis(port=node) as each:
                each.config_set("cluster-require-full-coverage", "no")
        cluster.procs[port].kill()
        with pytest.raises(Exception) as waits:
            loop.step()
        assert store.node_down(waits.value) or isinstance(waits.value, NodeDownError)
        assert store.applied_position(live) == 2 and not loop.failed
        deadline = time.monotonic() + 30
        while True:  # (the failover: a replica promoted)
            store.recover()
            try:
                loop.step()
                if store.applied_position(down) == 2:
                    break
            except Exception as exc:
                assert store.node_down(exc) or isinstance(exc, NodeDownError), repr(exc)
            assert time.monotonic() < deadline, "the failover never came"
            time.sleep(0.2)
        assert not loop.failed
    finally:
        close_after_failover(store)
        cluster.stop()


@pytest.mark.slow
def test_a_pool_engine_s_leases_on_live_nodes_are_renewed_while_one_primary_is_down(
    tmp_path: Path,
) -> None:
    """Renewed in one round trip, a pool engine's leases all failed while any one primary was
    unreachable, and every lease of every engine lapsed if its failover took longer than a
    lease: now those on the other nodes are renewed, the down node's neither renewed nor
    lost, and after the failover its replica has them."""
    cluster = LocalCluster(tmp_path / "cluster").start()
    store = RedisStore(cluster.url, "ln", timeout_s=2.0, cluster=True)
    try:
        down, live = on_two_primaries(store)
        held = [store.acquire_lease(name, "A", 60.0) for name in (down, live)]
        port = store.r.get_node_from_key(store._k(down, "lease")).port
        with redis.Redis(port=port) as primary:
            assert primary.wait(1, 5000) == 1  # (its replica has the lease)
        cluster.procs[port].kill()
        assert store.renew_leases([down, live], "A", 60.0) == [None, held[1]]
        cluster.wait_healthy()
        deadline = time.monotonic() + 30
        while True:
            store.recover()  # (as the engine does after a store error)
            tokens = store.renew_leases([down, live], "A", 60.0)
            if tokens[0] is not None:
                break
            assert time.monotonic() < deadline, tokens
            time.sleep(0.2)
        assert tokens == held
    finally:
        close_after_failover(store)
        cluster.stop()


def test_redis_url_may_list_several_cluster_nodes_and_any_live_one_will_do() -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    store = RedisStore(f"{dead},{cluster_url()}", f"nodes-{uuid.uuid4().hex[:8]}", cluster=True)
    try:
        store.create_project(RECORD)
        assert store.get_project("p") == RECORD
    finally:
        store.flush_prefix()
        store.close()
    with pytest.raises(redis.exceptions.RedisClusterException, match="reachable node"):
        RedisStore(dead, "x", cluster=True)
    with pytest.raises(ValueError, match="a list is for a Redis Cluster"):
        RedisStore(f"{REDIS_URL},{REDIS_URL}", "x")


def test_closing_a_cluster_store_closes_every_node_s_connections() -> None:
    """redis-py's ``RedisCluster.close`` leaves the nodes' connection pools open; the store's
    close disconnects them (else their sockets stay open until the garbage collector)."""
    store = RedisStore(cluster_url(), f"close-{uuid.uuid4().hex[:8]}", cluster=True)
    store.create_project(RECORD)
    store.flush_prefix()  # a scan on every primary: a connection to each
    pools = [n.redis_connection.connection_pool for n in store.r.get_nodes() if n.redis_connection]
    connections = [c for pool in pools for c in pool._available_connections]
    assert len(connections) >= 3 and all(c._sock is not None for c in connections)
    store.close()
    assert all(c._sock is None for c in connections)


def test_a_cluster_mode_other_than_the_settings_say_is_one_error_line() -> None:
    """CROWDTALLY_REDIS_CLUSTER=true against a single Redis was retried every second for ever
    ("Cluster mode is not enabled on this node"); a cluster's node without it would have run
    until a key's slot lay on another node. Both are refused before anything starts; a
    cluster's node with it, and a single Redis without it, pass."""
    from app.cli.service import check_redis
    from app.io.input import InputError

    with pytest.raises(InputError, match=r"true, but .* is a single Redis"):
        check_redis(REDIS_URL, cluster=True)
    with pytest.raises(InputError, match="is a node of a Redis Cluster: set"):
        check_redis(cluster_url(), cluster=False)
    check_redis(f"{cluster_url()},redis://127.0.0.1:{free_port()}/0", cluster=True)
    check_redis(REDIS_URL, cluster=False)


def test_a_project_is_put_back_on_a_wiped_cluster_once() -> None:
    """``restore_project`` (a rebuild from SQL) on a cluster: the log and the seen ids under
    a watch on the project's slot, then its record; a second restore changes nothing; an
    append before it is refused, after it takes the next position."""
    store = RedisStore(cluster_url(), f"restore-{uuid.uuid4().hex[:8]}", cluster=True)
    rng = np.random.default_rng(0)
    try:
        store.create_project(RECORD)
        body, ids = block(0, rng)
        store.append(RECORD.name, "labels", body, ids)
        entries = store.read_log(RECORD.name, 0, 100)
        seen = [i for i in ids if i is not None]
        store.flush_prefix()
        with pytest.raises(StoreWipedError):  # (no admin key: a wiped store)
            store.append(RECORD.name, "labels", body, ids)
        assert store.restore_project(RECORD, entries, seen, 1)
        assert not store.restore_project(RECORD, entries, seen, 1)
        assert store.project_names() == [RECORD.name]
        assert store.read_log(RECORD.name, 0, 100) == entries
        again = store.append(RECORD.name, "labels", body, ids)
        assert (again.position, again.accepted, again.duplicates) == (1, 0, len(seen))
        fresh, fresh_ids = block(1, rng)
        assert store.append(RECORD.name, "labels", fresh, fresh_ids).position == 2
    finally:
        store.flush_prefix()
        store.close()


def test_a_cluster_node_that_would_evict_labels_is_refused_whichever_it_is() -> None:
    """Eviction is asked of every node the cluster lists, not only of the URL's first: a
    replica set to ``allkeys-lru`` would drop label logs and ids once a failover made it a
    primary. The error line names that node."""
    from app.cli.service import check_redis
    from app.io.input import InputError

    url = cluster_url()
    first = url.split(",")[0]
    listed = redis.Redis.from_url(first).execute_command("CLUSTER NODES")
    replica = next(address for address, node in listed.items() if "slave" in node["flags"])
    other = redis.Redis.from_url(f"redis://{replica}/0")
    try:
        other.config_set("maxmemory", "100mb")
        other.config_set("maxmemory-policy", "allkeys-lru")
        with pytest.raises(InputError, match=rf"{replica} evicts keys at its maxmemory"):
            check_redis(first, cluster=True)
        other.config_set("maxmemory-policy", "volatile-lru")
        check_redis(first, cluster=True)
    finally:
        other.config_set("maxmemory", 0)
        other.config_set("maxmemory-policy", "noeviction")
        other.close()
