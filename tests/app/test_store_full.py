"""A store with no room for a write (Redis at its maxmemory, the embedded store's disk full)
answers 507 ``store_full`` with ``Retry-After``, keeps nothing of the request, and takes the
same request once there is room: each label applied once, none lost to the ids it carried."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import orjson
import pytest
from fastapi.testclient import TestClient

from app.api import create_app
from app.api.errors import FULL_RETRY_AFTER_S
from app.cli.service import check_redis
from app.engine.loop import EngineLoop
from app.io import transfer
from app.io.transfer import call
from app.store.base import ProjectRecord, Store
from app.store.embedded import EmbeddedStore
from app.store.redis_store import RedisStore
from core.nominal import NominalConfig
from tests.app.conftest import ADMIN, make_store, private_redis_url, service_settings


def block(n: int, start: int) -> list[dict[str, str]]:
    """``n`` labels with ids, of items with long names (a block that needs new pages)."""
    return [
        {"item": f"item-{k:06d}-" + "x" * 200, "worker": f"w{k % 7}", "label": "ab"[k % 2],
         "id": f"label-{k}"}
        for k in range(start, start + n)
    ]  # fmt: skip


@contextmanager
def full(store: Store, cause: str = "memory") -> Iterator[None]:
    """The store with no room for anything new while the block runs, room again after.
    ``cause``: Redis at its maxmemory ("memory"), or a Redis that cannot save to its disk
    ("disk": a failed save, Redis's MISCONF); the embedded store's disk is always full."""
    if isinstance(store, EmbeddedStore):  # SQLite's SQLITE_FULL, as a full disk gives it
        db = store._db  # (the store's one connection: the limit is the connection's)
        pages = db.execute("PRAGMA page_count").fetchone()[0]
        db.execute(f"PRAGMA max_page_count = {pages}")
        try:
            yield
        finally:
            db.execute("PRAGMA max_page_count = 4294967294")
        return
    assert isinstance(store, RedisStore)  # this process's own Redis: no other test writes there
    if cause == "disk":
        with cannot_save(store):
            yield
        return
    store.r.config_set("maxmemory-policy", "noeviction")
    store.r.config_set("maxmemory", 1)
    try:
        yield
    finally:
        store.r.config_set("maxmemory", 0)


@contextmanager
def cannot_save(store: RedisStore) -> Iterator[None]:
    """Redis unable to save to its disk: a folder where its dump file goes, a save point set,
    a save tried (it fails: MISCONF on every write until one succeeds); after, the folder
    gone and a save that succeeds."""
    in_the_way = (
        Path(store.r.config_get("dir")["dir"]) / store.r.config_get("dbfilename")["dbfilename"]
    )
    in_the_way.unlink(missing_ok=True)
    in_the_way.mkdir()
    store.r.config_set("save", "3600 1")
    try:
        store.r.bgsave()
        _wait_saved(store, "err")
        yield
    finally:
        in_the_way.rmdir()
        store.r.bgsave()
        _wait_saved(store, "ok")
        store.r.config_set("save", "")


def _wait_saved(store: RedisStore, status: str) -> None:
    deadline = time.monotonic() + 10
    while True:
        info = store.r.info("persistence")
        if not info["rdb_bgsave_in_progress"] and info["rdb_last_bgsave_status"] == status:
            return
        assert time.monotonic() < deadline, info
        time.sleep(0.01)


READS = [
    "/v1/projects/p", "/v1/projects", "/v1/projects/p/items", "/v1/projects/p/items/item-000001-"
    + "x" * 200, "/v1/projects/p/workers", "/v1/projects/p/workers/w1", "/v1/projects/p/queue",
    "/v1/projects/p/queue?worker=w1", "/v1/projects/p/summary", "/v1/projects/p/export",
    "/v1/projects/p/boundary?worker=w1", "/readyz", "/metrics",
]  # fmt: skip


def stats(c: TestClient) -> dict[str, int]:
    return c.get("/v1/projects/p").json()["stats"]  # type: ignore[no-any-return]


def applied_through(c: TestClient, position: int) -> None:
    deadline = time.monotonic() + 60  # (an engine write refused while full is tried again)
    while stats(c)["applied"] < position:
        assert time.monotonic() < deadline, stats(c)
        time.sleep(0.05)


@pytest.mark.parametrize(
    ("kind", "cause"), [("embedded", "disk"), ("redis", "memory"), ("redis", "disk")]
)
def test_a_full_store_answers_507_keeps_nothing_and_takes_the_block_later(
    kind: str, cause: str, tmp_path: Path
) -> None:
    store = make_store(kind, tmp_path, private=True)
    app = create_app(service_settings(tmp_path), store=store)
    try:
        with TestClient(app, headers={"Authorization": f"Bearer {ADMIN}"}) as c:
            assert (
                c.post("/v1/projects", json={"name": "p", "labels": ["a", "b"]}).status_code == 201
            )
            first = c.post("/v1/projects/p/labels", json=block(50, 0))
            assert first.status_code == 202, first.text
            applied_through(c, first.json()["position"])
            second = block(50, 50)
            with full(store, cause):
                r = c.post("/v1/projects/p/labels", json=second)
                assert r.status_code == 507, r.text
                assert r.json()["error"]["code"] == "store_full"
                assert "nothing of the request was kept" in r.json()["error"]["message"]
                assert r.headers["Retry-After"] == str(FULL_RETRY_AFTER_S)
                if kind == "redis" and cause == "disk":  # (even an idle engine writes: BLPOP)
                    deadline = time.monotonic() + 10
                    while c.get("/readyz").json()["engine_error"] is None:
                        assert time.monotonic() < deadline, "the engine never met the refusal"
                        time.sleep(0.05)
                for path in READS:  # reads go on, /readyz ready though the engine's writes fail
                    assert c.get(path).status_code == 200, (path, c.get(path).text)
                pair = [{"worker": "w1", "item": second[0]["item"]}]
                assert c.post("/v1/projects/p/predictions", json=pair).status_code == 200
                assert stats(c)["log_end"] == first.json()["position"]
            again = c.post("/v1/projects/p/labels", json=second)
            assert again.status_code == 202, again.text
            assert again.json()["accepted"] == 50 and again.json()["duplicates"] == 0
            applied_through(c, again.json()["position"])
            assert stats(c)["n_labels"] == 100
    finally:
        if isinstance(store, RedisStore):
            store.flush_prefix()
        store.close()


def test_the_openapi_document_names_507_on_writes_only() -> None:
    paths = create_app().openapi()["paths"]
    assert "507" in paths["/v1/projects/{project}/labels"]["post"]["responses"]
    assert "507" in paths["/v1/projects"]["post"]["responses"]
    assert "507" not in paths["/v1/projects/{project}/items/{item}"]["get"]["responses"]


@contextmanager
def redis_config(url: str, **settings: str) -> Iterator[None]:
    """This process's own Redis with ``settings`` while the block runs."""
    store = RedisStore(url)
    before = {k: store.r.config_get(k.replace("_", "-"))[k.replace("_", "-")] for k in settings}
    try:
        for k, v in settings.items():
            store.r.config_set(k.replace("_", "-"), v)
        yield
    finally:
        for k, v in before.items():
            store.r.config_set(k.replace("_", "-"), v)
        store.close()


def test_a_redis_that_would_evict_labels_is_refused_at_start(tmp_path: Path) -> None:
    """With a maxmemory and an ``allkeys-*`` policy Redis would drop label logs and ids once
    full: acknowledged labels lost without a word. ``serve`` and ``engine`` refuse it in one
    line; ``noeviction`` (507s once full) and ``volatile-*`` (only the leases expire) start."""
    url = private_redis_url()
    with redis_config(url, maxmemory="100mb", maxmemory_policy="allkeys-lru"):
        env = {**os.environ, "REDIS_URL": url, "CROWDTALLY_DATA_DIR": str(tmp_path)}
        run = subprocess.run([sys.executable, "-m", "app.cli", "engine", "--store", "redis"],
                             env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
        assert run.returncode == 2 and len(run.stderr.splitlines()) == 1, run.stderr[-500:]
        assert "maxmemory-policy allkeys-lru" in run.stderr
        assert "set maxmemory-policy noeviction" in run.stderr
    for policy in ("noeviction", "volatile-lru"):
        with redis_config(url, maxmemory="100mb", maxmemory_policy=policy):
            check_redis(url)
    with redis_config(url, maxmemory="0", maxmemory_policy="allkeys-lru"):
        check_redis(url)  # (no maxmemory: nothing is ever evicted)


def test_the_import_command_sends_again_what_a_full_store_kept_nothing_of(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 507 kept nothing: even gold, which ``import`` posts without retries (no ids), goes
    again after the answer's Retry-After, spending the retries."""
    slept: list[float] = []
    monkeypatch.setattr(transfer.time, "sleep", slept.append)
    full_answer = httpx.Response(507, headers={"Retry-After": "10"})
    answers = [full_answer, full_answer, httpx.Response(202, json={})]

    def handler(request: httpx.Request) -> httpx.Response:
        return answers.pop(0) if answers else full_answer

    with httpx.Client(transport=httpx.MockTransport(handler), base_url="http://ct.test") as http:
        gold = [{"item": "i", "label": "a"}]
        assert call(http, "POST", "/v1/projects/p/gold", body=gold, retry=False).status_code == 202
        assert slept == [8.0, 8.0]  # (Retry-After, capped at 8 s)
        assert call(http, "POST", "/v1/projects/p/gold", body=gold, retries=1).status_code == 507


def test_an_import_into_a_full_store_says_to_run_it_again_not_to_mend_the_file(
    tmp_path: Path,
) -> None:
    """The file is not at fault: the import says so, and run again once there is room it
    posts what was not taken (the rest counted once)."""
    answers = tmp_path / "answers.csv"
    answers.write_text("item,worker,label\n" + "".join(
        f"item-{k}-{'x' * 200},w{k % 7},{'ab'[k % 2]}\n" for k in range(400)))  # fmt: skip
    store = make_store("embedded", tmp_path)
    app = create_app(service_settings(tmp_path), store=store)
    retries = transfer.RETRIES.set(0)
    try:
        with TestClient(app, headers={"Authorization": f"Bearer {ADMIN}"}) as c:
            assert (
                c.post("/v1/projects", json={"name": "p", "labels": ["a", "b"]}).status_code == 201
            )
            first = transfer.run_import(c, answers, "p", batch_size=100, wait=False)
            assert first.accepted == 400
            answers.write_text(answers.read_text() + "".join(
                f"new-{k}-{'y' * 200},w{k % 7},{'ab'[k % 2]}\n" for k in range(400)))  # fmt: skip
            with full(store), pytest.raises(transfer.ServiceError) as refused:
                transfer.run_import(c, answers, "p", batch_size=100, wait=False)
            message = str(refused.value)
            assert "the service could not take this block: 507 store_full" in message
            assert "run the import again once it can" in message and "mend" not in message
            again = transfer.run_import(c, answers, "p", batch_size=100)
            assert (again.accepted, again.duplicates) == (400, 400)
    finally:
        transfer.RETRIES.reset(retries)
        store.close()


@pytest.mark.parametrize("cause", ["memory", "disk"])
def test_an_engine_whose_write_finds_redis_full_keeps_its_state_and_writes_once_there_is_room(
    cause: str, tmp_path: Path
) -> None:
    """A full Redis is the store's state, not the project's: the step fails as when the store
    is unreachable (retried a second later, reported as the engine's error), the engine keeps
    what it applied instead of being dropped, rebuilt from its snapshot and log, and retried
    after a back-off that grew to a minute while the store stayed full; once there is room,
    the next step writes it all. (The embedded store serves its state from memory: a full
    disk does not stop its engine's writes.)"""
    store = make_store("redis", tmp_path, private=True)
    try:
        store.create_project(
            ProjectRecord("p", ("a", "b"), NominalConfig(n_classes=2).to_dict(), 1)
        )
        loop = EngineLoop(store, refine_passes=0)
        store.append("p", "labels", _payload(block(50, 0)))
        assert loop.step() == 1
        engine = loop.engines["p"]
        end = store.append("p", "labels", _payload(block(50, 50))).position
        with full(store, cause):
            for _ in range(3):
                with pytest.raises(Exception) as refused:
                    loop.step()
                assert "p" not in loop.failed and loop.engines["p"] is engine, refused.value
        assert store.applied_position("p") == end - 1
        loop.run_until_idle()
        assert loop.engines["p"] is engine and store.applied_position("p") == end
        item = orjson.loads(store.get_item("p", block(1, 99)[0]["item"]) or b"{}")
        assert len(item["labels"]) == 1
    finally:
        if isinstance(store, RedisStore):
            store.flush_prefix()
        store.close()


def _payload(labels: list[dict[str, str]]) -> bytes:
    return orjson.dumps({
        "items": [x["item"] for x in labels], "workers": [x["worker"] for x in labels],
        "labels": [int(x["label"] == "b") for x in labels], "weights": None,
    })  # fmt: skip
