"""Crashes of every process mid-stream, Redis restarted from a truncated AOF among them.

The production layout (``crowdtally serve --no-engine`` and ``crowdtally engine``) on a private
``redis-server --appendonly yes --appendfsync everysec``, while a client posts blocks of labels
with ids and retries each block until it is acknowledged. Meanwhile: Redis is SIGKILLed and
restarted from its AOF cut back to a size taken earlier (what it acknowledged since is lost:
the client retries those blocks, as the docs tell it to), twice, once with the engine dead;
the engine is SIGKILLed; the API is SIGKILLed mid-request.

Checked at the end: every acknowledged label is in the log once (0 lost after the retries,
0 applied twice), and the served state is that of a fresh replay of the log.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import numpy as np
import orjson
import pytest

from app.store.archive import SnapshotDB
from app.store.redis_store import RedisStore
from app.store.sql import sql_engine
from app.testing import free_port, wait_healthy
from tests.app.test_crash import LABELS
from tests.app.test_processes import Layout
from tests.app.test_redis_rollback import RedisWithAof, check_against_replay

BLOCK = 500


def blocks_of(n_blocks: int, seed: int) -> list[tuple[bytes, list[str]]]:
    rng = np.random.default_rng(seed)
    out = []
    for b in range(n_blocks):
        ids = [f"b{b}-{k}" for k in range(BLOCK)]
        rows = [
            {"item": f"i{i}", "worker": f"w{w}", "label": LABELS[c], "id": n}
            for i, w, c, n in zip(
                rng.integers(0, 2000, BLOCK).tolist(),
                rng.integers(0, 100, BLOCK).tolist(),
                rng.integers(0, len(LABELS), BLOCK).tolist(),
                ids,
                strict=True,
            )
        ]
        out.append((orjson.dumps(rows), ids))
    return out


class Client:
    """Posts every block in turn and retries it until acknowledged (same ids), on the next
    API process when one does not answer (as behind a load balancer)."""

    def __init__(self, urls: list[str], key: dict[str, str], blocks: list[tuple[bytes, list[str]]]):
        self.urls, self.key, self.blocks = urls, key, blocks
        self.api = 0
        self.acked_at: dict[int, float] = {}
        self.retries = 0
        self.thread = threading.Thread(target=self.run)
        self.pace = 0.03

    def post(self, n: int) -> None:
        while True:
            try:
                url = f"{self.urls[self.api]}/v1/projects/p/labels"
                r = httpx.post(url, content=self.blocks[n][0], headers=self.key, timeout=10)
                if r.status_code == 202:
                    body = r.json()
                    assert body["accepted"] + body["duplicates"] == BLOCK, body
                    self.acked_at[n] = time.monotonic()
                    return
            except httpx.TransportError:  # the API died under the request: the next one
                self.api = (self.api + 1) % len(self.urls)
            self.retries += 1
            time.sleep(0.05)

    def run(self) -> None:
        for n in range(len(self.blocks)):
            self.post(n)
            time.sleep(self.pace)

    def retry_since(self, t: float) -> int:
        """Post again every block acknowledged after ``t`` (its answer may be lost)."""
        lost = [n for n, at in list(self.acked_at.items()) if at >= t]
        for n in lost:
            self.post(n)
        return len(lost)


def wait_acked(client: Client, n: int, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while len(client.acked_at) < n:
        assert time.monotonic() < deadline, f"only {len(client.acked_at)} blocks acknowledged"
        time.sleep(0.02)


@pytest.mark.slow
def test_processes_and_redis_crash_mid_stream_lose_nothing(tmp_path: Path) -> None:
    (tmp_path / "redis").mkdir()
    redis_ = RedisWithAof(tmp_path / "redis")
    sql_url = f"sqlite:///{tmp_path / 'snapshots.sqlite3'}"
    lay = Layout(
        tmp_path,
        REDIS_URL=redis_.url,
        CROWDTALLY_DATABASE_URL=sql_url,
        CROWDTALLY_SNAPSHOT_INTERVAL_S="0.3",
    )
    second = free_port()  # a second API process (as behind a load balancer)
    api2 = lay._spawn("serve", "--no-engine", "--port", str(second))
    blocks = blocks_of(40, seed=7)  # 20,000 labels
    crashes = {"redis (AOF cut back)": 0, "engine": 0, "api": 0}
    try:
        lay.wait_ready()
        r = lay.client.post("/v1/projects", json={"name": "p", "labels": LABELS})
        key = {"Authorization": f"Bearer {r.json()['api_key']}"}
        urls = [str(lay.client.base_url).rstrip("/"), f"http://127.0.0.1:{second}"]
        client = Client(urls, key, blocks)
        client.thread.start()

        def roll_back_redis(engine_dead: bool) -> None:
            """Take the AOF's size, let blocks be acknowledged past it, crash Redis and start
            it on the AOF cut back to that size; the client retries what was acknowledged
            since (a client not told otherwise retries what it cannot be sure of)."""
            time.sleep(0.4)  # (snapshots written, the log trimmed: SQL is ahead)
            t_cut, cut = time.monotonic(), redis_.aof_size()
            before = len(client.acked_at)
            wait_acked(client, before + 5)
            if engine_dead:
                lay.kill_engine()
                crashes["engine"] += 1
            redis_.restart_truncated(cut)
            crashes["redis (AOF cut back)"] += 1
            if engine_dead:
                time.sleep(0.3)
                lay.start_engine()
            assert client.retry_since(t_cut) >= 5

        wait_acked(client, 4)
        roll_back_redis(engine_dead=False)
        wait_acked(client, len(client.acked_at) + 3)
        lay.kill_engine()
        crashes["engine"] += 1
        lay.start_engine()
        wait_acked(client, len(client.acked_at) + 3)
        with httpx.Client(base_url=urls[1]) as second_api:
            wait_healthy(second_api, timeout_s=60)
        lay.api.kill()  # mid-request, most likely: the client goes on with the second API
        lay.api.wait()
        crashes["api"] += 1
        lay.api = lay._spawn("serve", "--no-engine", "--port", str(lay.client.base_url.port))
        wait_acked(client, len(client.acked_at) + 3)
        roll_back_redis(engine_dead=True)
        client.pace = 0.0
        client.thread.join(timeout=120)
        assert not client.thread.is_alive()
        assert len(client.acked_at) == len(blocks)

        deadline = time.monotonic() + 60
        while True:
            stats = httpx.get(f"{urls[1]}/v1/projects/p", headers=key).json()["stats"]
            if stats["lag"] == 0 and stats["n_labels"] == 20_000:
                break
            assert time.monotonic() < deadline, stats
            time.sleep(0.2)
        store = RedisStore(redis_.url, lay.prefix)
        db = SnapshotDB(sql_engine(sql_url), lay.prefix)
        try:
            want = {i for _, ids in blocks for i in ids}
            check_against_replay(store, db, None, want)  # 0 lost, 0 twice, state = replay
        finally:
            db.close()
            store.close()
        assert crashes == {"redis (AOF cut back)": 2, "engine": 2, "api": 1}, crashes
    finally:
        api2.kill()
        api2.wait()
        lay.close()
        redis_.close()
