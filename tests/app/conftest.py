"""Fixtures for the service: both stores (the Redis one is the real server), API clients."""

from __future__ import annotations

import atexit
import functools
import gc
import os
import shutil
import subprocess
import tempfile
import time
import uuid
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.api import create_app
from app.settings import Settings
from app.store.archive import SnapshotDB
from app.store.base import Store
from app.store.embedded import EmbeddedStore
from app.store.redis_store import RedisStore
from app.store.sql import sql_engine, upgrade
from app.testing import free_port
from bench.local_cluster import LocalCluster
from bench.scale import fresh_database

REDIS_URL = os.environ.get("CROWDTALLY_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
ADMIN = "test-admin-key-0123"
STORES = ["embedded", "redis"]
"""The stores the store contract runs on (and "cluster": a local Redis Cluster)."""


@functools.cache
def _migrated_file() -> Path:
    """An empty SQLite database at the current schema, migrated once per test process."""
    folder = Path(tempfile.mkdtemp(prefix="crowdtally-migrated-"))
    atexit.register(shutil.rmtree, folder, True)
    upgrade(f"sqlite:///{folder / 'crowdtally.sqlite3'}", deployment="")
    return folder / "crowdtally.sqlite3"


def migrated_sqlite(path: Path) -> Path:
    """``path``, made (unless it exists) a copy of an empty database at the current schema:
    what the service's ``alembic upgrade`` makes of a new file, without the ~0.2 s of CPU its
    migrations take on each (the service still runs the upgrade, which finds it at head)."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(_migrated_file(), path)
    return path


@functools.cache
def cluster_url() -> str:
    """A local Redis Cluster (6 nodes), started once per test process, stopped at its exit."""
    cluster = LocalCluster(Path(tempfile.mkdtemp(prefix="crowdtally-cluster-"))).start()
    atexit.register(cluster.stop)
    return cluster.url


def start_redis(port: int, folder: Path, aof: bool = True) -> subprocess.Popen[bytes]:
    """A redis-server of the test's own on ``port``, keeping its data in ``folder`` (an AOF
    fsynced every second, with ``aof``; else nothing on disk), once it answers PING."""
    persistence = (
        ["--appendonly", "yes", "--appendfsync", "everysec"] if aof else ["--appendonly", "no"]
    )
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(folder),
         *persistence, "--save", ""],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    store = RedisStore(f"redis://127.0.0.1:{port}/0")
    deadline = time.monotonic() + 10
    while not store.ping():
        assert time.monotonic() < deadline, "redis-server did not start"
        time.sleep(0.05)
    store.close()
    return proc


@functools.cache
def private_redis_url() -> str:
    """A Redis server of this test process alone, started once, stopped at its exit: for tests
    that change what is server-wide (its scripts), which on the shared server would reach the
    tests other workers run beside them."""
    folder = Path(tempfile.mkdtemp(prefix="crowdtally-redis-"))
    port = free_port()
    proc = start_redis(port, folder, aof=False)
    atexit.register(shutil.rmtree, folder, True)
    atexit.register(proc.wait, 10)
    atexit.register(proc.terminate)
    return f"redis://127.0.0.1:{port}/0"


def close_after_failover(store: RedisStore) -> None:
    """Close the store and the node clients that redis-py dropped when a failover changed the
    cluster's layout: ``RedisCluster.close`` closes only the nodes it still knows, so the
    dropped ones' sockets would be closed later by the garbage collector, with a
    ResourceWarning in whichever test runs then."""
    store.close()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


def make_store(kind: str, tmp_path: Path, private: bool = False) -> Store:
    """The store ``kind``; with ``private``, a Redis store on this process's own server."""
    if kind == "embedded":
        return EmbeddedStore(migrated_sqlite(tmp_path / "crowdtally.sqlite3"))
    prefix = f"test-{uuid.uuid4().hex[:12]}"
    if kind == "cluster":
        return RedisStore(cluster_url(), prefix=prefix, cluster=True)
    url = private_redis_url() if private else REDIS_URL
    store = RedisStore(url, prefix=prefix)
    if not store.ping():
        pytest.fail(f"Redis is not reachable at {url} (see .ci/run for how to start it)")
    return store


def opened_store(kind: str, tmp_path: Path, private: bool = False) -> Iterator[Store]:
    st = make_store(kind, tmp_path, private)
    yield st
    if isinstance(st, RedisStore):
        st.flush_prefix()
    st.close()


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    yield from opened_store(request.param, tmp_path)


def not_utf8(values: list[bytes], kind: Any) -> Any:
    """A pyarrow string (or binary) array of ``values`` as a Parquet file may hold them, UTF-8
    or not (pyarrow's own constructors build no such string array)."""
    import numpy as np
    import pyarrow as pa

    offsets = np.zeros(len(values) + 1, dtype=np.int32)
    np.cumsum([len(v) for v in values], out=offsets[1:])
    buffers = [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(values))]
    return pa.Array.from_buffers(kind, len(values), buffers)


def service_settings(tmp_path: Path, **changes: object) -> Settings:
    base: dict[str, object] = {
        "data_dir": tmp_path,
        "admin_key": ADMIN,
        "refine_passes": 0,
        "refine_idle_s": 0.05,
    }
    base.update(changes)
    if "database_url" not in changes:  # the snapshot database: data_dir's SQLite file
        migrated_sqlite(Path(str(base["data_dir"])) / "crowdtally.sqlite3")
    return Settings(**base)  # type: ignore[arg-type]


@pytest.fixture
def client(store: Store, tmp_path: Path) -> Iterator[TestClient]:
    """An API with its engine in process, on each store; authenticated as admin."""
    app = create_app(service_settings(tmp_path, max_block_labels=50), store=store)
    with TestClient(app, headers={"Authorization": f"Bearer {ADMIN}"}) as c:
        yield c


def listed_items(
    client: TestClient, headers: dict[str, str], project: str, limit: int
) -> dict[str, dict[str, Any]]:
    """Every item of ``project`` as the listing serves it, page by page, its labels left out
    (what the export must give)."""
    out: dict[str, dict[str, Any]] = {}
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": limit, **({"cursor": cursor} if cursor else {})}
        page = client.get(f"/v1/projects/{project}/items", params=params, headers=headers).json()
        out |= {x["item"]: {k: v for k, v in x.items() if k != "labels"} for x in page["items"]}
        if (cursor := page["next_cursor"]) is None:
            return out


PG_ADMIN_URL = os.environ.get("CROWDTALLY_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


@contextmanager
def fresh_postgres() -> Iterator[str]:
    """A fresh database on the real PostgreSQL (dropped afterwards): its SQLAlchemy URL."""
    import psycopg

    try:
        psycopg.connect(PG_ADMIN_URL).close()
    except psycopg.OperationalError as exc:
        pytest.fail(f"PostgreSQL is not reachable at {PG_ADMIN_URL} (see .ci/run): {exc}")
    with fresh_database(PG_ADMIN_URL) as url:
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
def sql_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database: a SQLite file, or a fresh database on the real PostgreSQL."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'snapshots.sqlite3'}"
        return
    with fresh_postgres() as url:
        yield url


@pytest.fixture
def db(sql_url: str) -> Iterator[SnapshotDB]:
    """The snapshot database on each SQL backend, migrated."""
    upgrade(sql_url)
    snapshots = SnapshotDB(sql_engine(sql_url))
    yield snapshots
    snapshots.close()
