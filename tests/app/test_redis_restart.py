"""Redis restarted with AOF on (as in docker-compose.yml): acknowledged labels come back.

The machine's own Redis runs without persistence, so this test starts its own redis-server
with ``--appendonly yes --appendfsync everysec`` on a free port, SIGKILLs it and restarts it.
With ``everysec`` the documented window is one second: labels acknowledged more than a
second before the crash are never lost.
"""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import orjson

from app.store.base import ProjectRecord
from app.store.redis_store import RedisStore
from core.nominal import NominalConfig


def start_redis(port: int, folder: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(folder),
         "--appendonly", "yes", "--appendfsync", "everysec", "--save", ""],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    store = RedisStore(f"redis://127.0.0.1:{port}/0")
    deadline = time.monotonic() + 10
    while not store.ping():
        assert time.monotonic() < deadline, "redis-server did not start"
        time.sleep(0.05)
    store.close()
    return proc


def test_acknowledged_labels_survive_a_redis_crash_with_aof(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
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
