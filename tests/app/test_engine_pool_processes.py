"""A pool of 3 ``crowdtally engine --pool`` processes and an API process on a local Redis
Cluster (6 nodes, its own), while clients stream labels with ids into 3 projects: an engine
SIGKILLed mid-work and restarted, 20 times; one SIGSTOPped past its lease and resumed; the
Redis primary of a project's slot SIGKILLed (its replica takes over); and one engine killed
for good, its projects taken over. The clients retry what failed and, after the failover, post their blocks
again (same ids: docs/deploy.md). Afterwards every label is applied exactly once and every
served posterior is that of a fresh replay of the log."""

from __future__ import annotations

import os
import random
import signal
import socket
import threading
import time
import uuid
from pathlib import Path

import httpx
import numpy as np
import orjson
import pytest

from app.store.archive import SnapshotDB
from app.store.redis_store import RedisStore
from app.store.sql import sql_engine
from app.testing import wait_healthy
from bench.local_cluster import LocalCluster
from tests.app.conftest import ADMIN, close_after_failover, fresh_postgres
from tests.app.test_redis_rollback import check_against_replay
from tests.forked import Forked, crowdtally

PROJECTS = ["a", "b", "c"]
LEASE_S = 1.0
BLOCKS, BLOCK = 90, 150  # posted over about 15 s: the faults land while it streams
KILLS = 20


class Pool:
    def __init__(self, workdir: Path, database_url: str, redis_url: str) -> None:
        self.prefix = f"pool-{uuid.uuid4().hex[:8]}"
        self.env = {
            **os.environ, "CROWDTALLY_STORE": "redis", "REDIS_URL": redis_url,
            "CROWDTALLY_REDIS_CLUSTER": "true", "CROWDTALLY_REDIS_PREFIX": self.prefix,
            "CROWDTALLY_ADMIN_KEY": ADMIN, "CROWDTALLY_REFINE_PASSES": "0",
            "CROWDTALLY_DATA_DIR": str(workdir), "CROWDTALLY_DATABASE_URL": database_url,
            "CROWDTALLY_ENGINE_LEASE_S": str(LEASE_S), "CROWDTALLY_SNAPSHOT_INTERVAL_S": "1",
            "CROWDTALLY_MAX_LAG_S": "0",
        }  # fmt: skip
        self.workdir = workdir
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        self.api = self.spawn("serve", "--no-engine", "--port", str(port))
        self.engines = [self.spawn("engine", "--pool") for _ in range(3)]
        self.http = httpx.Client(
            base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {ADMIN}"}
        )

    def spawn(self, *args: str) -> Forked:
        return crowdtally(*args, env=self.env, cwd=self.workdir)

    def lags(self, keys: dict[str, dict[str, str]]) -> list[int]:
        return [
            self.http.get(f"/v1/projects/{p}", headers=k).json()["stats"]["lag"]
            for p, k in keys.items()
        ]

    def close(self) -> None:
        self.http.close()
        for p in (self.api, *self.engines):
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.kill()
            p.wait()


def blocks_of(project: str) -> list[list[dict[str, str]]]:
    rng = np.random.default_rng(len(project) + ord(project[0]))
    rows = [{"item": f"i{rng.integers(0, 400)}", "worker": f"w{rng.integers(0, 40)}",
             "label": "xyz"[rng.integers(0, 3)], "id": f"{project}{n}"}
            for n in range(BLOCKS * BLOCK)]  # fmt: skip
    return [rows[lo : lo + BLOCK] for lo in range(0, len(rows), BLOCK)]


def stream(
    pool: Pool, keys: dict[str, dict[str, str]], acked: set[str], pace_s: float = 0.15
) -> None:
    """Each project's blocks in turn, each retried until acknowledged (same ids)."""
    per_project = {p: blocks_of(p) for p in PROJECTS}
    for n in range(BLOCKS):
        for p in PROJECTS:
            block = per_project[p][n]
            while True:
                try:
                    r = pool.http.post(f"/v1/projects/{p}/labels", content=orjson.dumps(block),
                                       headers=keys[p], timeout=10)  # fmt: skip
                    if r.status_code == 202:
                        acked.update(x["id"] for x in block)
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.05)
        time.sleep(pace_s)


def wait_caught_up(pool: Pool, keys: dict[str, dict[str, str]], timeout_s: float) -> float:
    start = time.monotonic()
    while any(pool.lags(keys)):
        assert time.monotonic() - start < timeout_s, f"lags {pool.lags(keys)}"
        time.sleep(0.1)
    return time.monotonic() - start


@pytest.mark.slow
def test_engine_pool_processes_survive_kills_and_pauses(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "cluster").start()
    with fresh_postgres() as database_url:
        pool = Pool(tmp_path, database_url, cluster.url)
        store = RedisStore(cluster.url, pool.prefix, cluster=True)
        try:
            wait_healthy(pool.http, 240)
            keys = {}
            for p in PROJECTS:
                r = pool.http.post("/v1/projects", json={"name": p, "labels": ["x", "y", "z"]})
                keys[p] = {"Authorization": f"Bearer {r.json()['api_key']}"}
            acked: set[str] = set()
            writer = threading.Thread(target=stream, args=(pool, keys, acked))
            writer.start()
            chaos = random.Random(0)
            time.sleep(0.5)
            for _ in range(KILLS):  # SIGKILL mid-work, restarted at once
                n = chaos.randrange(3)
                pool.engines[n].kill()
                pool.engines[n].wait()
                pool.engines[n] = pool.spawn("engine", "--pool")
                time.sleep(chaos.uniform(0.2, 0.6))
            paused = pool.engines[chaos.randrange(3)]
            paused.send_signal(signal.SIGSTOP)  # past its lease: its projects taken over
            time.sleep(2.5 * LEASE_S)
            paused.send_signal(signal.SIGCONT)  # its late writes are refused
            primary = store.r.get_node_from_key(store._k("b", "log"))
            cluster.procs[primary.port].kill()  # its replica takes over in about 3 s
            assert writer.is_alive()  # the faults came while labels streamed in
            writer.join(timeout=120)
            assert not writer.is_alive()
            stream(pool, keys, acked, 0.0)  # all again after the outage: duplicates count once
            wait_caught_up(pool, keys, 60)
            # one engine killed for good: its projects are picked up by the other two
            pool.engines[0].kill()
            pool.engines[0].wait()
            probe = [{"item": "probe", "worker": "w0", "label": "x", "id": "probe"}]
            for p in PROJECTS:
                pool.http.post(f"/v1/projects/{p}/labels", content=orjson.dumps(probe),
                               headers=keys[p])  # fmt: skip
            took = wait_caught_up(pool, keys, 30)
            # Taken over within two leases when the machine is free (1.1 s seen alone); with the
            # whole suite on two cores, 9.9 and 13.0 s were seen, so the bound leaves room.
            assert took < 2 * LEASE_S + 15, took
            acked |= {"probe"}
            db = SnapshotDB(sql_engine(database_url), pool.prefix)
            try:
                for p in PROJECTS:
                    want = {i for i in acked if i.startswith(p) or i == "probe"}
                    check_against_replay(store, db, None, want, project=p)
            finally:
                db.close()
        finally:
            close_after_failover(store)
            pool.close()
            cluster.stop()
