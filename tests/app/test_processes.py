"""The production layout for real: an API process and an engine process on the real Redis."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from app.engine.runtime import SOLE_ENGINE
from app.store.redis_store import RedisStore
from app.testing import ServiceStartError, free_port, wait_healthy
from tests.app.conftest import ADMIN, REDIS_URL
from tests.forked import Process, crowdtally

CLI = [sys.executable, "-m", "app.cli"]


class Layout:
    """``crowdtally serve --no-engine`` and ``crowdtally engine`` as child processes: forked
    from a warm parent (tests/forked.py), or with ``forked=False`` the command executed."""

    def __init__(self, workdir: Path, forked: bool = True, **env: str) -> None:
        self.forked = forked
        self.prefix = f"test-proc-{uuid.uuid4().hex[:8]}"
        self.env = {
            **os.environ,
            "CROWDTALLY_STORE": "redis",
            "REDIS_URL": REDIS_URL,
            "CROWDTALLY_REDIS_PREFIX": self.prefix,
            "CROWDTALLY_ADMIN_KEY": ADMIN,
            "CROWDTALLY_REFINE_PASSES": "0",
            "CROWDTALLY_DATA_DIR": str(workdir),
            **env,
        }
        self.workdir = workdir
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        self.api = self._spawn("serve", "--no-engine", "--port", str(port))
        self.engine = self._spawn("engine")
        self.client = httpx.Client(
            base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {ADMIN}"}
        )

    def _spawn(self, *args: str) -> Process:
        if self.forked:
            return crowdtally(*args, env=self.env, cwd=self.workdir)
        return subprocess.Popen([*CLI, *args], env=self.env, cwd=self.workdir)

    def wait_ready(self, timeout_s: float = 240.0) -> None:  # a first start compiles kernels
        wait_healthy(self.client, timeout_s)

    def kill_engine(self) -> None:
        self.engine.kill()
        self.engine.wait()

    def start_engine(self) -> None:
        self.engine = self._spawn("engine")

    def close(self) -> None:
        self.client.close()
        for p in (self.api, self.engine):
            p.kill()
            p.wait()
        RedisStore(REDIS_URL, self.prefix).flush_prefix()


@contextlib.contextmanager
def waiting_api_and_engine(
    env: dict[str, str], folder: Path, what: str
) -> Iterator[tuple[subprocess.Popen[bytes], subprocess.Popen[bytes], int]]:
    """``crowdtally engine`` and ``crowdtally serve --no-engine`` started while ``what`` (the
    store, the snapshot database) cannot be reached, once each said it waits: (engine, API,
    the API's port); killed after."""
    api_port = free_port()
    started = [
        subprocess.Popen([*CLI, *args], env=env, cwd=folder, stderr=subprocess.PIPE)
        for args in (["engine"], ["serve", "--no-engine", "--port", str(api_port)])
    ]
    try:
        for p, who in zip(started, ("crowdtally engine", "crowdtally"), strict=True):
            assert p.stderr is not None
            lines = (x.decode() for x in iter(p.stderr.readline, b""))
            waiting = next(x for x in lines if not x.startswith("crowdtally: redis store"))
            assert waiting.startswith(f"{who}: {what} cannot be reached ("), waiting
        assert all(p.poll() is None for p in started)
        yield started[0], started[1], api_port
    finally:
        for p in started:
            p.kill()
            p.wait()
            if p.stderr is not None:
                p.stderr.close()


def started_after_waiting(
    engine: subprocess.Popen[bytes], api: subprocess.Popen[bytes], api_port: int
) -> None:
    """The engine's line that it runs, after those that it waits; the API healthy."""
    assert engine.stderr is not None
    lines = (x.decode() for x in iter(engine.stderr.readline, b""))
    up = next(x for x in lines if "cannot be reached" not in x)
    assert up.startswith("crowdtally engine: redis store"), up
    with httpx.Client(base_url=f"http://127.0.0.1:{api_port}") as client:
        wait_healthy(client, 60, api)
    assert engine.poll() is None and api.poll() is None


@pytest.fixture
def layout(tmp_path: Path) -> Iterator[Layout]:
    lay = Layout(tmp_path, forked=False)  # the commands themselves, as deployed
    try:
        lay.wait_ready()
        yield lay
    finally:
        lay.close()


def lag(client: httpx.Client, key: dict[str, str]) -> int:
    """Log entries not applied yet, or not learned by the dyadic model yet (it follows)."""
    stats = client.get("/v1/projects/p", headers=key).json()["stats"]
    return int(stats["lag"]) + stats["applied"] - (stats["dyadic_position"] or 0)


def test_api_and_engine_processes_and_engine_restart(layout: Layout) -> None:
    client = layout.client
    r = client.post("/v1/projects", json={"name": "p", "labels": ["yes", "no"]})
    assert r.status_code == 201
    key = {"Authorization": f"Bearer {r.json()['api_key']}"}
    block = [
        {
            "item": f"i{n % 30}",
            "worker": f"w{n % 7}",
            "label": ["yes", "no"][n % 3 == 0],
            "id": str(n),
        }
        for n in range(300)
    ]
    r = client.post(
        "/v1/projects/p/labels",
        params={"wait": True},
        content=orjson.dumps(block[:200]),
        headers=key,
    )
    assert r.json() == {"accepted": 200, "duplicates": 0, "position": 1, "applied": True}
    assert client.get("/v1/projects/p/items/i4", headers=key).json()["n_labels"] == 7

    # With the engine dead, labels are still accepted (and logged); a new engine replays
    # the log, catches up and serves them.
    layout.kill_engine()
    r = client.post("/v1/projects/p/labels", content=orjson.dumps(block[100:]), headers=key)
    assert (r.json()["accepted"], r.json()["duplicates"]) == (100, 100)
    time.sleep(0.3)
    assert client.get("/v1/projects/p", headers=key).json()["stats"]["lag"] == 1
    layout.start_engine()
    deadline = time.monotonic() + 60
    while lag(client, key):
        assert time.monotonic() < deadline, "the restarted engine did not catch up"
        time.sleep(0.1)
    after = client.get("/v1/projects/p/items/i4", headers=key).json()
    assert after["n_labels"] == 10 and after["position"] == 2
    assert client.get("/readyz").json()["engine_lag"] == {"p": 0}
    # predictions come from the rows the engine process wrote: equal to a replay of the log
    from app.engine.project import ProjectEngine
    from core.dyadic import dyadic_ids

    store = RedisStore(REDIS_URL, layout.prefix)
    record = store.get_project("p")
    assert record is not None
    replay = ProjectEngine(record)
    replay.apply_all(store.read_log("p", 0, 1000))
    pairs = [("w1", "i4"), ("w3", "i17"), ("w6", "i29"), ("stranger", "i4")]
    got = client.post(
        "/v1/projects/p/predictions",
        content=orjson.dumps([{"worker": w, "item": i} for w, i in pairs]),
        headers=key,
    ).json()
    assert got["position"] == replay.position == 2
    assert replay.dyadic is not None
    model = replay.dyadic.hashed_model()
    workers, items = dyadic_ids([w for w, _ in pairs]), dyadic_ids([i for _, i in pairs])
    labels, scores = model.predict(workers, items)
    h = model.h_min(workers, items)
    for n, p in enumerate(got["predictions"]):
        assert p["label"] == ["yes", "no"][labels[n]]
        assert list(p["scores"].values()) == scores[n].tolist()
        assert p["h_min"] == h[n]
    store.close()


def _sole_holder(store: RedisStore, timeout_s: float = 30.0, but: str | None = None) -> str:
    """The holder of the lease of the engine outside a pool, once one (other than ``but``)
    holds it."""
    deadline = time.monotonic() + timeout_s
    while (holder := store.lease_holder(SOLE_ENGINE)) in (None, but):
        assert time.monotonic() < deadline, f"no engine took the lease (holder {holder})"
        time.sleep(0.05)
    assert holder is not None
    return holder


def test_a_second_engine_outside_a_pool_is_refused(tmp_path: Path) -> None:
    """Two ``crowdtally engine`` processes on one Redis prefix each applied every project,
    fencing each other's writes off and restoring again and again. The second is now refused
    (so is a pool engine beside it); one stopped gives its lease up, and one killed is taken
    over once its lease lapses."""
    lay = Layout(tmp_path, CROWDTALLY_ENGINE_LEASE_S="1")
    store = RedisStore(REDIS_URL, lay.prefix)
    try:
        lay.wait_ready()
        first = _sole_holder(store)
        assert first.endswith(f"-{lay.engine.pid}")
        for args in (["engine"], ["engine", "--pool"]):
            run = subprocess.run([*CLI, *args], env=lay.env, cwd=tmp_path, capture_output=True,
                                 text=True, timeout=120)  # fmt: skip
            assert run.returncode == 2, run.stderr
            assert f"the engine of {first}" in run.stderr and "stop it first" in run.stderr
            assert "Traceback" not in run.stderr
        assert store.lease_holder(SOLE_ENGINE) == first
        lay.engine.terminate()  # stopped: its lease given up at once
        lay.engine.wait(30)
        assert store.lease_holder(SOLE_ENGINE) is None
        lay.start_engine()
        second = _sole_holder(store, but=first)
        lay.kill_engine()  # killed: the next engine takes over once the lease lapses
        lay.start_engine()
        assert _sole_holder(store, but=second).endswith(f"-{lay.engine.pid}")
        lay.wait_ready()
    finally:
        lay.close()
        store.close()


def test_wait_healthy_gives_up_on_an_exited_process_and_after_its_timeout() -> None:
    exited = subprocess.Popen([sys.executable, "-c", "pass"])
    exited.wait()
    with httpx.Client(base_url=f"http://127.0.0.1:{free_port()}") as nothing_there:
        with pytest.raises(ServiceStartError, match="exited with code 0"):
            wait_healthy(nothing_there, 60, exited)
        started = time.monotonic()
        with pytest.raises(ServiceStartError, match=r"did not answer /healthz in 0.3 s"):
            wait_healthy(nothing_there, 0.3)
        assert time.monotonic() - started < 5


def test_serve_on_a_port_in_use_is_one_line_and_makes_nothing(tmp_path: Path) -> None:
    """It printed its banner, made the data folder, the database and an admin key, then
    failed with uvicorn's log line; now the port is tried first."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        data = tmp_path / "data"
        run = subprocess.run(
            [*CLI, "serve", "--data-dir", str(data), "--port", str(port)],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert run.returncode == 2, run.stderr
    assert f"error: --port: cannot listen on 127.0.0.1:{port}: " in run.stderr
    assert "http://" not in run.stderr and not data.exists()


def test_metrics_of_several_api_processes_are_their_sum(tmp_path: Path) -> None:
    """``serve --workers 2``: every scrape, whichever process answers it, counts the labels
    both took (each process counted its own: scrapes read 5 and 8,075 in turn); the folder
    they share is removed when the service stops."""
    prefix = f"mw-{uuid.uuid4().hex[:8]}"
    port = free_port()
    env = {**os.environ, "CROWDTALLY_STORE": "redis", "REDIS_URL": REDIS_URL,
           "CROWDTALLY_REDIS_PREFIX": prefix, "CROWDTALLY_ADMIN_KEY": ADMIN,
           "CROWDTALLY_DATA_DIR": str(tmp_path), "TMPDIR": str(tmp_path)}  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "serve", "--no-engine", "--workers", "2",
         "--port", str(port)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10,
                          headers={"Authorization": f"Bearer {ADMIN}"}) as http:  # fmt: skip
            wait_healthy(http, 60, proc)
            assert http.post("/v1/projects", json={"name": "p", "labels": ["a", "b"]}).is_success
            for k in range(10):
                block = [{"item": f"i{k}", "worker": "w", "label": "a"}]
                assert http.post("/v1/projects/p/labels", json=block).status_code == 202
            for _ in range(6):  # (new connections: either process answers)
                text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
                assert 'crowdtally_labels_total{outcome="accepted",project="p"} 10.0' in text
        assert list(tmp_path.glob("crowdtally-metrics-*"))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        RedisStore(REDIS_URL, prefix).flush_prefix()
    assert not list(tmp_path.glob("crowdtally-metrics-*"))
