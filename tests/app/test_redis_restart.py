"""Redis restarted with AOF on (as in docker-compose.yml): acknowledged labels come back. An
API and an engine started while their Redis is down wait for it.

The machine's own Redis runs without persistence, so these tests start their own redis-server
with ``--appendonly yes --appendfsync everysec`` on a free port, SIGKILL it and restart it.
With ``everysec`` the documented window is one second: labels acknowledged more than a
second before the crash are never lost.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import orjson

from app.store.base import ProjectRecord
from app.store.redis_store import RedisStore
from app.testing import free_port
from core.nominal import NominalConfig
from tests.app.conftest import ADMIN, start_redis
from tests.app.test_processes import CLI, started_after_waiting, waiting_api_and_engine


def test_acknowledged_labels_survive_a_redis_crash_with_aof(tmp_path: Path) -> None:
    port = free_port()
    proc = start_redis(port, tmp_path)
    try:
        store = RedisStore(f"redis://127.0.0.1:{port}/0")
        store.create_project(
            ProjectRecord("p", ("a", "b"), NominalConfig(n_classes=2).to_dict(), 1.0)
        )
        for n in range(50):
            ids: list[str | None] = [f"{n}-{k}" for k in range(100)]
            body = {
                "items": [f"i{k}" for k in range(100)],
                "workers": ["w"] * 100,
                "labels": [0] * 100,
                "weights": None,
                "ids": ids,
            }
            store.append("p", "labels", orjson.dumps(body), ids)
        time.sleep(1.5)  # past the everysec window
        proc.kill()
        proc.wait()
        store.close()
        proc = start_redis(port, tmp_path)
        store = RedisStore(f"redis://127.0.0.1:{port}/0")
        assert store.get_project("p") is not None
        assert store.log_end("p") == 50
        assert len(store.read_log("p", 0, 1000)) == 50
        assert store.append("p", "labels", b"{}", ["0-0", "49-99"]).duplicates == 2
        store.close()
    finally:
        proc.kill()
        proc.wait()


def test_an_api_and_an_engine_started_before_their_redis_wait_for_it(tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "CROWDTALLY_STORE": "redis", "REDIS_URL": f"redis://127.0.0.1:{port}/0",
           "CROWDTALLY_DATA_DIR": str(tmp_path), "CROWDTALLY_ADMIN_KEY": ADMIN}  # fmt: skip
    proc = None
    try:
        with waiting_api_and_engine(env, tmp_path, "the store") as (engine, api, api_port):
            proc = start_redis(port, tmp_path)
            started_after_waiting(engine, api, api_port)
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()


def test_an_api_waiting_for_its_redis_stops_on_sigterm(tmp_path: Path) -> None:
    """It went on waiting until killed: the server notes SIGTERM for a loop the wait blocks."""
    env = {**os.environ, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
           "CROWDTALLY_STORE": "redis", "CROWDTALLY_DATA_DIR": str(tmp_path)}  # fmt: skip
    api = subprocess.Popen(
        [*CLI, "serve", "--no-engine", "--port", str(free_port())],
        env=env, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert api.stderr is not None
        while "cannot be reached" not in api.stderr.readline():
            assert api.poll() is None
        api.terminate()
        assert api.wait(timeout=10) == 128 + 15
        assert "SIGTERM: stopped while waiting for the store" in api.stderr.read()
    finally:
        api.kill()
        api.wait()
        if api.stderr is not None:
            api.stderr.close()
