"""A project deleted and created again under the same name is a new project: it is
snapshotted and archived from scratch, and a wiped Redis brings back its labels (and none of
the deleted project's)."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import Any
from unittest import mock

import orjson
import pytest
from fastapi.testclient import TestClient

from app.api import create_app
from app.engine.loop import QUIET_RECHECK_S, EngineLoop
from app.engine.snapshots import Snapshotter
from app.store.archive import SnapshotDB, rebuild_store
from app.store.base import ProjectRecord, Store, StoreWipedError
from app.store.redis_store import RedisStore
from app.store.sql import sql_engine, upgrade
from core.nominal import NominalConfig
from tests.app.conftest import ADMIN, make_store, service_settings


def block(prefix: str, n: int, start: int = 0) -> bytes:
    return orjson.dumps(
        [
            {
                "item": f"{prefix}-{k}",
                "worker": f"w{k % 5}",
                "label": "ab"[k % 2],
                "id": f"{prefix}-{k}",
            }
            for k in range(start, start + n)
        ]
    )


def settle(c: TestClient, project: str, timeout_s: float = 60.0) -> dict[str, int]:
    deadline = time.monotonic() + timeout_s
    while True:
        answer = c.get(f"/v1/projects/{project}")  # (503 while a wiped store is rebuilt)
        stats: dict[str, int] = answer.json()["stats"] if answer.status_code == 200 else {}
        restored = c.get("/readyz").status_code == 200  # 503 while served state is restored
        if restored and stats and stats["lag"] == 0 and stats["applied"] == stats["log_end"] > 0:
            return stats
        assert time.monotonic() < deadline, stats
        time.sleep(0.05)


def redis_with_db(tmp_path: Path) -> tuple[RedisStore, SnapshotDB]:
    """A store on the real Redis (its own prefix) and a snapshot database in ``tmp_path``."""
    store = make_store("redis", tmp_path)
    assert isinstance(store, RedisStore)
    url = f"sqlite:///{tmp_path / 'snap.sqlite3'}"
    upgrade(url)
    return store, SnapshotDB(sql_engine(url))


def test_recreated_project_survives_a_redis_wipe(tmp_path: Path) -> None:
    store = make_store("redis", tmp_path)
    assert isinstance(store, RedisStore)
    settings = service_settings(tmp_path, snapshot_interval_s=0.0, wait_timeout_s=20.0)
    head = {"Authorization": f"Bearer {ADMIN}"}
    new = {"name": "p", "labels": ["a", "b"], "worker_slots": 64}
    try:
        with TestClient(create_app(settings, store=store), headers=head) as c:
            assert c.post("/v1/projects", json=new).status_code == 201
            for n in range(4):  # the first project reaches log position 5
                r = c.post("/v1/projects/p/labels?wait=true", content=block("old", 10, 10 * n))
                assert r.json()["applied"]
            assert c.post("/v1/projects/p/snapshots?wait=true").json()["applied"]
            assert c.delete("/v1/projects/p").status_code == 204
            assert c.post("/v1/projects", json=new).status_code == 201
            r = c.post("/v1/projects/p/labels?wait=true", content=block("new", 12))
            assert r.json() == {"accepted": 12, "duplicates": 0, "position": 1, "applied": True}
            # acknowledged, and covered by a snapshot: durable in SQL from here on
            assert c.post("/v1/projects/p/snapshots?wait=true").json()["applied"]
        store.flush_prefix()  # Redis loses everything
        assert store.list_projects() == []
        with TestClient(create_app(settings, store=store), headers=head) as c:
            stats = settle(c, "p")
            assert stats["n_items"] == 12 and stats["n_labels"] == 12
            for k in range(12):
                item = c.get(f"/v1/projects/p/items/new-{k}").json()
                assert [lab["worker"] for lab in item["labels"]] == [f"w{k % 5}"]
            assert c.get("/v1/projects/p/items/old-0").status_code == 404
            # the ids came back: posting the same labels again is all duplicates
            r = c.post("/v1/projects/p/labels?wait=true", content=block("new", 12))
            assert r.json()["duplicates"] == 12
    finally:
        store.flush_prefix()
        store.close()


def test_engine_forgets_a_project_recreated_between_two_steps(tmp_path: Path) -> None:
    """The engine (its own process) may see a project deleted and created again only as a
    new creation time: it drops what it held and the SQL side starts from scratch."""
    store, db = redis_with_db(tmp_path)
    cfg = NominalConfig(n_classes=2, n_worker_slots=16).to_dict()

    def post(prefix: str, n: int) -> None:
        for k in range(n):
            body = {"items": [f"{prefix}-{k}"], "workers": ["w"], "labels": [k % 2],
                    "weights": None, "ids": [f"{prefix}-{k}"]}  # fmt: skip
            store.append("p", "labels", orjson.dumps(body), body["ids"])

    try:
        snap = Snapshotter(db, store, interval_s=0.0, every_labels=10**9, keep=2)
        loop = EngineLoop(store, refine_passes=0, snapshotter=snap)
        store.create_project(ProjectRecord("p", ("a", "b"), cfg, 1.0))
        post("old", 6)
        loop.step()
        snap.wait()
        assert db.archived_position("p") == 6
        store.delete_project("p")  # no engine step in between: nobody told the SQL side
        store.create_project(ProjectRecord("p", ("a", "b"), cfg, 2.0))
        post("new", 3)
        loop.step()
        snap.wait()
        assert snap.last_error is None
        assert [e.position for e in db.read_archive("p", 0, 100)] == [1, 2, 3]
        archived = [orjson.loads(e.payload)["items"][0] for e in db.read_archive("p", 0, 100)]
        assert archived == ["new-0", "new-1", "new-2"]
        assert [p.created_at for p in db.projects()] == [2.0]
        store.flush_prefix()
        assert rebuild_store(store, db) == ["p"]
        fresh = EngineLoop(store, refine_passes=0, snapshotter=Snapshotter(db, store))
        while fresh.step():
            pass
        assert fresh.engines["p"].items.names == ["new-0", "new-1", "new-2"]
        snap.close()
    finally:
        store.flush_prefix()
        store.close()
        db.close()


def test_engine_keeps_the_sql_side_of_a_project_the_store_lost(tmp_path: Path) -> None:
    """A project gone from the store may be deleted or wiped with Redis: the engine drops
    only what it holds, SQL keeps what rebuilds it (the API forgets a deleted project)."""
    store, db = redis_with_db(tmp_path)
    cfg = NominalConfig(n_classes=2, n_worker_slots=16).to_dict()
    try:
        snap = Snapshotter(db, store, interval_s=0.0, every_labels=10**9, keep=2)
        loop = EngineLoop(store, refine_passes=0, snapshotter=snap)
        store.create_project(ProjectRecord("p", ("a", "b"), cfg, 1.0))
        for k in range(4):
            body = {"items": [f"i{k}"], "workers": ["w"], "labels": [k % 2], "weights": None,
                    "ids": [f"id{k}"]}  # fmt: skip
            store.append("p", "labels", orjson.dumps(body), body["ids"])
        loop.step()
        snap.wait()
        store.flush_prefix()  # Redis wiped under a running engine
        loop.step()
        snap.wait()
        assert loop.engines == {}
        assert db.archived_position("p") == 4 and db.latest("p") is not None
        assert rebuild_store(store, db) == ["p"]
        assert store.log_end("p") == 4
        snap.close()
    finally:
        store.flush_prefix()
        store.close()
        db.close()


def test_stats_never_show_the_log_applied_with_older_counts(store: Store, tmp_path: Path) -> None:
    """A project's stats are read in several store calls: the counts are read after the
    applied position, so "applied == log_end" is never shown with counts of an earlier state
    (what a client waiting for its labels to be applied, as ``settle`` does, would trust)."""
    loop = EngineLoop(store, refine_passes=0)
    settings = service_settings(tmp_path, engine_in_process=False)
    head = {"Authorization": f"Bearer {ADMIN}"}
    with TestClient(create_app(settings, store=store), headers=head) as c:
        assert c.post("/v1/projects", json={"name": "p", "labels": ["a", "b"]}).status_code == 201
        assert c.post("/v1/projects/p/labels", content=block("new", 12)).status_code == 202
        read = store.get_params

        def then_the_engine_steps(project: str, slots: list[int]) -> Any:
            found = read(project, slots)
            loop.step()  # the engine writes the state while the request is between two reads
            return found

        store.get_params = then_the_engine_steps  # type: ignore[method-assign]
        stats = c.get("/v1/projects/p").json()["stats"]
        store.get_params = read  # type: ignore[method-assign]
        # not applied yet as far as this read knows, or applied with the counts that go with it
        assert stats["applied"] < stats["log_end"] or stats["n_items"] == 12, stats
        stats = c.get("/v1/projects/p").json()["stats"]
        assert stats["applied"] == stats["log_end"] == 1 and stats["n_items"] == 12, stats


class _WaitFailsOnce:
    """The store, whose first idle wait fails as a dropped Redis connection would."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.failed = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def wait_for_append(self, timeout_s: float) -> None:
        if not self.failed:
            self.failed = True
            raise ConnectionError("the store went away while the engine waited")
        self._store.wait_for_append(timeout_s)


def test_the_engine_survives_a_failed_idle_wait(store: Store) -> None:
    """An error while the idle engine waits for appends is an error of its step: reported,
    retried after a back-off; the engine goes on applying."""
    flaky = _WaitFailsOnce(store)
    loop = EngineLoop(flaky, refine_passes=0)  # type: ignore[arg-type]
    loop.start()
    try:
        deadline = time.monotonic() + 10
        while not flaky.failed:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        store.create_project(
            ProjectRecord("p", ("a", "b"), NominalConfig(n_classes=2).to_dict(), 1.0)
        )
        body = {"items": ["i"], "workers": ["w"], "labels": [0], "weights": None}
        position = store.append("p", "labels", orjson.dumps(body)).position
        while store.applied_position("p") < position:
            assert time.monotonic() < deadline, loop.last_error
            time.sleep(0.01)
        assert loop._thread is not None and loop._thread.is_alive()
    finally:
        loop.stop()


def test_the_engine_reads_the_project_records_only_when_they_change(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each step asks for the catalogue's token; the records themselves (a read that grows
    with the number of projects) only after a project was created or deleted. And a quiet
    project's log is not read: one call for all projects tells which have new entries."""
    cfg = NominalConfig(n_classes=2, n_worker_slots=16).to_dict()
    reads = mock.Mock(wraps=store.list_projects)
    log_reads = mock.Mock(wraps=store.read_log)
    monkeypatch.setattr(store, "list_projects", reads)
    monkeypatch.setattr(store, "read_log", log_reads)
    labels = orjson.dumps({"items": ["i"], "workers": ["w"], "labels": [0], "weights": None})
    loop = EngineLoop(store, refine_passes=0)
    store.create_project(ProjectRecord("p", ("a", "b"), cfg, 1.0))
    store.append("p", "labels", labels)
    for _ in range(5):
        loop.step()
    assert reads.call_count == 1 and store.applied_position("p") == 1
    # its entry; then nothing to read, known without reading
    assert [c.args[0] for c in log_reads.call_args_list] == ["p"]
    store.create_project(ProjectRecord("q", ("a", "b"), cfg, 1.0))
    store.append("q", "labels", labels)
    loop.step()
    assert reads.call_count == 2 and store.applied_position("q") == 1
    store.delete_project("p")
    loop.step()
    assert reads.call_count == 3 and sorted(loop.engines) == ["q"]


@pytest.mark.parametrize("store", ["redis"], indirect=True)
def test_the_engine_asks_only_about_the_logs_that_moved(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A quiet project's log is looked at again when its project moved (an append since the
    last step); each is in its turn, a share of them a step, all within QUIET_RECHECK_S, so an
    append whose move was lost is seen."""
    assert isinstance(store, RedisStore)
    cfg = NominalConfig(n_classes=2, n_worker_slots=16).to_dict()
    labels = orjson.dumps({"items": ["i"], "workers": ["w"], "labels": [0], "weights": None})
    names = ["p", "q", "r"]
    for name in names:
        store.create_project(ProjectRecord(name, ("a", "b"), cfg, 1.0))
        store.append(name, "labels", labels)
    loop = EngineLoop(store, refine_passes=0)
    asked = mock.Mock(wraps=store.quiet_logs)
    monkeypatch.setattr(store, "quiet_logs", asked)

    def step_asking() -> list[str]:
        asked.reset_mock()
        loop.step()
        return sorted(asked.call_args.args[0])

    loop.step()  # every entry applied
    loop.step()  # every project found quiet
    assert step_asking() == []
    store.append("q", "labels", labels)
    assert step_asking() == ["q"] and store.applied_position("q") == 2
    assert step_asking() == ["q"]  # its heads moved with its new entry: found quiet again
    assert step_asking() == []
    monkeypatch.setattr(store, "_moved", lambda pipe, project: pipe)  # an append's move lost
    store.append("r", "labels", labels)
    assert step_asking() == [] and store.applied_position("r") == 1  # not seen yet

    def step_asking_later(share: float) -> list[str]:
        """A step that many QUIET_RECHECK_S after the last one."""
        assert loop._recheck_clock is not None
        monkeypatch.setattr(loop, "_recheck_clock", loop._recheck_clock - share * QUIET_RECHECK_S)
        return step_asking()

    assert step_asking_later(1 / 3 + 1e-6) == ["p"]  # a third of them in a third of the time
    assert step_asking_later(1 / 3 + 1e-6) == ["q"]
    assert store.applied_position("r") == 1
    assert step_asking_later(1 / 3 + 1e-6) == ["r"] and store.applied_position("r") == 2
    assert step_asking_later(1.0) == names  # every one of them within QUIET_RECHECK_S


def test_a_quiet_project_with_nothing_left_to_do_is_not_stepped_until_it_moves(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once its sweeps are done, a quiet project's step is skipped (visiting each of
    thousands of quiet projects cost more than the rest of a step); new labels wake it."""
    cfg = NominalConfig(n_classes=2, n_worker_slots=16).to_dict()
    labels = orjson.dumps({"items": ["i"], "workers": ["w"], "labels": [0], "weights": None})
    store.create_project(ProjectRecord("p", ("a", "b"), cfg, 1.0))
    store.append("p", "labels", labels)
    loop = EngineLoop(store, refine_passes=1, refine_idle_s=0.0)
    stepped = mock.Mock(wraps=loop._step_project)
    monkeypatch.setattr(loop, "_step_project", stepped)
    loop.run_until_idle()  # the labels, their refinement sweep, the dyadic passes
    kinds = [e.kind for e in store.read_log("p", 0, 100)]
    assert kinds[:2] == ["labels", "refine"] and store.applied_position("p") == len(kinds)
    loop.step()
    stepped.reset_mock()
    for _ in range(3):
        loop.step()
    assert stepped.call_count == 0  # dormant
    store.append("p", "labels", labels)
    loop.step()
    assert stepped.call_count == 1 and store.applied_position("p") == len(kinds) + 1
    loop.run_until_idle()  # and its sweeps come again
    assert [e.kind for e in store.read_log("p", len(kinds) + 1, 100)][:1] == ["refine"]


def test_projects_gone_quiet_together_log_their_sweeps_one_after_another(store: Store) -> None:
    """Idle sweeps are log entries; queued for every quiet project at once, new labels would
    wait behind all of them. At most one waits at a time, and every project gets its own."""
    cfg = NominalConfig(n_classes=2, n_worker_slots=16).to_dict()
    labels = orjson.dumps({"items": ["i"], "workers": ["w"], "labels": [0], "weights": None})
    names = [f"p{n}" for n in range(4)]
    loop = EngineLoop(store, refine_passes=1, refine_idle_s=0.0)
    for name in names:
        store.create_project(ProjectRecord(name, ("a", "b"), cfg, 1.0))
        store.append(name, "labels", labels)

    def sweeps() -> int:
        return sum(e.kind != "labels" for n in names for e in store.read_log(n, 0, 100))

    loop.step()  # the labels applied
    for k in range(len(names)):
        loop.step()
        assert sweeps() == k + 1  # one more each step: the last one applied, then a new one
    loop.run_until_idle()
    assert all(e.kind == "refine" for n in names for e in store.read_log(n, 1, 100)[:1])


def test_a_long_sweep_lets_other_projects_sweep_between_its_slices(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A project's sweep is logged a slice at a time; while one ran, no other project's sweep
    could start (a 45.7M-label project's 8,000 slices kept the others unswept for minutes).
    Now the projects take turns, one entry in flight at a time."""
    monkeypatch.setattr("app.engine.loop.SWEEP_SLICE", 2)  # a slice of about 2 labels' work
    cfg = NominalConfig(n_classes=2, n_worker_slots=16).to_dict()
    big = {"items": [f"i{k}" for k in range(40)], "workers": [f"w{k % 5}" for k in range(40)],
           "labels": [k % 2 for k in range(40)], "weights": None}  # fmt: skip
    small = {"items": ["i"], "workers": ["w"], "labels": [0], "weights": None}
    loop = EngineLoop(store, refine_passes=1, refine_idle_s=0.0)
    for name, body in (("big", big), ("small", small)):
        store.create_project(ProjectRecord(name, ("a", "b"), cfg, 1.0))
        store.append(name, "labels", orjson.dumps(body))

    def refines(name: str) -> int:
        return sum(e.kind == "refine" for e in store.read_log(name, 0, 1000))

    for _ in range(6):
        loop.step()
        in_flight = sum(store.log_end(n) > store.applied_position(n) for n in ("big", "small"))
        assert in_flight <= 1  # one sweep entry waits at a time, over the projects
    assert refines("small") >= 1 and 1 <= refines("big") < 10  # small's sweep amid big's
    loop.run_until_idle()
    assert refines("big") >= 10


@pytest.mark.parametrize("kind", ["embedded", "redis"])
def test_a_model_gone_non_finite_is_not_served(tmp_path: Path, kind: str) -> None:
    """Settings whose first step overflows (refused at creation today; a project saved before
    the bound may have them): the labels that take the model out of the finite numbers are not
    applied to the served state, the project is marked failed with the reason, and what was
    served before stays (it was served as null posteriors, and reads failed with 500)."""
    store = make_store(kind, tmp_path)
    config = NominalConfig(
        n_classes=2, eta0=1e12, tau0=1.0, rho=0.0, population_rate=1e6, class_rate=1e6
    )
    store.create_project(ProjectRecord("p", ("a", "b"), config.to_dict(), time.time()))
    loop = EngineLoop(store, refine_passes=0)
    try:
        store.append("p", "labels", orjson.dumps(_entry(["x"], ["w"], [0])))
        loop.run_until_idle()
        served = orjson.loads(store.get_item("p", "x") or b"{}")["posterior"]
        items = [f"i{k % 30}" for k in range(300)]
        workers = [f"w{k % 7}" for k in range(300)]
        store.append(
            "p", "labels", orjson.dumps(_entry(items, workers, [k % 2 for k in range(300)]))
        )
        loop.step()
        assert "not finite" in store.failed_projects()["p"]
        assert store.applied_position("p") == 1
        assert orjson.loads(store.get_item("p", "x") or b"{}")["posterior"] == served
        assert store.get_item("p", "i1") is None
    finally:
        if isinstance(store, RedisStore):
            store.flush_prefix()
        store.close()


@pytest.mark.parametrize("kind", ["embedded", "redis"])
def test_a_project_another_engine_marked_failed_is_cleared_by_the_engine_that_applies_it(
    tmp_path: Path, kind: str
) -> None:
    """An engine failed on a project and stopped (or let it go to the pool); the engine that
    applies the project next clears the mark, which ``/readyz`` and ``/metrics`` read."""
    store = make_store(kind, tmp_path)
    store.create_project(ProjectRecord("p", ("a", "b"), NominalConfig(n_classes=2).to_dict(), 1.0))
    try:
        store.append("p", "labels", orjson.dumps(_entry(["x"], ["w"], [0])))
        store.set_project_failed("p", "ProgrammingError: another engine's")
        EngineLoop(store, refine_passes=0).run_until_idle()
        assert store.failed_projects() == {}
        assert store.applied_position("p") == 1
    finally:
        if isinstance(store, RedisStore):
            store.flush_prefix()
        store.close()


def _entry(items: list[str], workers: list[str], labels: list[int]) -> dict[str, Any]:
    return {"items": items, "workers": workers, "labels": labels, "weights": None}


def test_a_wiped_redis_gets_its_admin_key_back_and_no_other(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The API made a new admin key before it rebuilt the wiped store from SQL, which then put
    the archived one back: two admin keys, both archived at the next snapshot."""
    store = make_store("redis", tmp_path)
    assert isinstance(store, RedisStore)
    settings = service_settings(tmp_path, admin_key=None, snapshot_interval_s=0.0)
    try:
        with TestClient(create_app(settings, store=store)) as c:
            made = re.findall(r"created the admin API key[^:]*: (\S+)", capsys.readouterr().err)[0]
            head = {"Authorization": f"Bearer {made}"}
            new = {"name": "p", "labels": ["a", "b"]}
            assert c.post("/v1/projects", json=new, headers=head).status_code == 201
            assert c.post("/v1/projects/p/snapshots?wait=true", headers=head).json()["applied"]
        store.flush_prefix()
        with TestClient(create_app(settings, store=store)) as c:
            assert "created the admin API key" not in capsys.readouterr().err
            assert [k.scope for k in store.list_keys(None).values()] == ["admin"]
            assert c.get("/v1/projects", headers=head).status_code == 200
    finally:
        store.flush_prefix()
        store.close()


def test_a_redis_wiped_under_the_api_is_rebuilt_without_a_restart(tmp_path: Path) -> None:
    """A Redis restarted empty under a running API: /readyz says so, appends are refused with
    503 (nothing written, not 202 into a log the rebuild would drop), and within seconds the
    API itself puts every project back from SQL: its labels, its keys, its seen ids."""
    store = make_store("redis", tmp_path)
    assert isinstance(store, RedisStore)
    settings = service_settings(tmp_path, snapshot_interval_s=0.0, wait_timeout_s=20.0)
    head = {"Authorization": f"Bearer {ADMIN}"}
    new = {"name": "p", "labels": ["a", "b"], "worker_slots": 64}
    try:
        with TestClient(create_app(settings, store=store), headers=head) as c:
            assert c.post("/v1/projects", json=new).status_code == 201
            made = c.post("/v1/projects/p/keys", json={"scope": "write"}).json()["api_key"]
            r = c.post("/v1/projects/p/labels?wait=true", content=block("old", 10))
            assert r.json()["applied"]
            assert c.post("/v1/projects/p/snapshots?wait=true").json()["applied"]
            # a project made just before the wipe, never snapshotted: back with its keys
            q = c.post("/v1/projects", json={"name": "q", "labels": ["a", "b"]}).json()
            c.app.state.service.watch.stop()  # (looked at by hand below, then started again)
            assert c.get("/v1/projects/p").status_code == 200  # (the key and project cached)
            store.flush_prefix()  # Redis loses everything
            own = {"Authorization": f"Bearer {made}"}
            assert c.get("/v1/projects/p", headers=own).status_code == 503  # (not cached)
            ready = c.get("/readyz")
            assert ready.status_code == 503
            assert ready.json()["store"] == "wiped: being rebuilt from SQL"
            time.sleep(0.3)  # (past RESTORING_CACHE_S: a read of served state looks again)
            r = c.get("/v1/projects/p/items/old-3")  # (not 404: the item is coming back)
            assert r.status_code == 503 and r.json()["error"]["code"] == "store_rebuilding"
            # the API's cached key and project let the block through to the store: refused
            r = c.post("/v1/projects/p/labels", content=block("lost", 3))
            assert r.status_code == 503, r.text
            assert r.json()["error"]["code"] == "store_rebuilding"
            assert r.headers["Retry-After"] == "2"
            with pytest.raises(StoreWipedError):
                store.append("p", "labels", block("lost", 3), ["lost-0"])
            # a key not in the cache: the keys are coming back, so 503 as well, not 401
            r = c.get("/v1/projects/p", headers={"Authorization": "Bearer not-cached"})
            assert r.status_code == 503 and r.json()["error"]["code"] == "store_rebuilding"
            assert list(store.r.scan_iter(match=f"{{{store.prefix}:*")) == []  # nothing written
            assert c.app.state.service.watch.check()  # what the watch does every second
            assert c.get("/v1/projects/p", headers=own).status_code == 200  # (no miss kept)
            q_key = {"Authorization": f"Bearer {q['api_key']}"}
            r = c.post("/v1/projects/q/labels?wait=true", content=block("q", 4), headers=q_key)
            assert "accepted" in r.json(), r.text
            assert r.json()["accepted"] == 4 and r.json()["applied"]
            stats = settle(c, "p")
            assert stats["n_items"] == 10 and stats["n_labels"] == 10
            time.sleep(0.3)  # (each API process takes the served state as read for 0.25 s)
            assert c.get("/v1/projects/p/items/old-3").status_code == 200
            # the ids came back, and so did the project's key and the admin key
            r = c.post("/v1/projects/p/labels?wait=true", content=block("old", 10))
            assert r.json()["duplicates"] == 10
            r = c.post("/v1/projects/p/labels?wait=true", content=block("lost", 3), headers=own)
            assert r.json()["accepted"] == 3 and r.json()["applied"]
            assert c.get("/readyz").status_code == 200
            assert not c.app.state.service.watch.check()  # not wiped: nothing to do
    finally:
        store.flush_prefix()
        store.close()


def project_with_labels(c: TestClient, project: str, n: int) -> None:
    """A project of two classes with ``n`` labels (ids x-0 ...) applied."""
    assert c.post("/v1/projects", json={"name": project, "labels": ["a", "b"]}).status_code == 201
    r = c.post(f"/v1/projects/{project}/labels?wait=true", content=block("x", n))
    assert r.json()["applied"]


def test_the_watch_rebuilds_a_wiped_redis_on_its_own(tmp_path: Path) -> None:
    """Nobody restarts anything: the API's watch thread notices the wipe and rebuilds."""
    store = make_store("redis", tmp_path)
    assert isinstance(store, RedisStore)
    settings = service_settings(tmp_path, snapshot_interval_s=0.0, wait_timeout_s=20.0)
    head = {"Authorization": f"Bearer {ADMIN}"}
    try:
        with TestClient(create_app(settings, store=store), headers=head) as c:
            project_with_labels(c, "p", 5)
            assert c.post("/v1/projects/p/snapshots?wait=true").json()["applied"]
            store.flush_prefix()
            assert settle(c, "p", timeout_s=30.0)["n_labels"] == 5
            assert c.app.state.service.watch.rebuilt == ["p"]
    finally:
        store.flush_prefix()
        store.close()


def test_processes_that_find_redis_wiped_at_once_rebuild_it_once(tmp_path: Path) -> None:
    """API processes and engines that start (or look) together each call rebuild_store: one
    holds the rebuild lease and puts every project back, the others wait and find none."""
    store, db = redis_with_db(tmp_path)
    cfg = NominalConfig(n_classes=2, n_worker_slots=16).to_dict()
    names = [f"p{k}" for k in range(6)]
    try:
        for name in names:
            record = ProjectRecord(name, ("a", "b"), cfg, 1.0)
            store.create_project(record)
            db.save_project(record)
            body = _entry([f"{name}-i"], ["w"], [1]) | {"ids": [f"{name}-0"]}
            store.append(name, "labels", orjson.dumps(body), [f"{name}-0"])
        snap = Snapshotter(db, store, interval_s=0.0, every_labels=1, keep=2)
        loop = EngineLoop(store, refine_passes=0, snapshotter=snap)
        deadline = time.monotonic() + 30
        while not all(db.latest(name) for name in names):  # every project snapshotted
            assert time.monotonic() < deadline
            loop.step()
            snap.wait()
        assert snap.last_error is None
        store.flush_prefix()
        found: list[list[str]] = []
        workers = [threading.Thread(target=lambda: found.append(rebuild_store(store, db)))
                   for _ in range(4)]  # fmt: skip
        for t in workers:
            t.start()
        for t in workers:
            t.join()
        assert sorted(n for f in found for n in f) == names  # each project put back once
        assert sorted(store.project_names()) == names
        for name in names:
            assert store.append(name, "labels", b"{}", [f"{name}-0"]).duplicates == 1
    finally:
        store.flush_prefix()
        store.close()


def test_a_project_whose_log_was_never_opened_gets_it_at_start(tmp_path: Path) -> None:
    """Projects made before appends needed an open log, never appended to, take labels after
    the next start of the API (``rebuild_store`` opens their logs)."""
    store, db = redis_with_db(tmp_path)
    try:
        store.create_project(ProjectRecord("p", ("a", "b"), NominalConfig(2).to_dict(), 1.0))
        store.set_admin_key_hash("h")
        store.r.delete(store._k("p", "seq"))  # as such a project is
        with pytest.raises(StoreWipedError):
            store.append("p", "labels", b"{}")
        assert rebuild_store(store, db) == []
        assert store.append("p", "labels", b"{}").position == 1
    finally:
        store.flush_prefix()
        store.close()


@pytest.mark.parametrize("kind", ["embedded", "redis"])
def test_served_answers_wait_while_a_project_is_restored(kind: str, tmp_path: Path) -> None:
    """While a project's served state is being restored (after a restart, or a rebuild from
    SQL), its items, lists, queue, workers and summary answer 503 ``restoring`` with
    Retry-After, not an empty project or 404s; its status and its snapshots still answer."""
    store = make_store(kind, tmp_path)
    settings = service_settings(tmp_path)
    head = {"Authorization": f"Bearer {ADMIN}"}
    try:
        with TestClient(create_app(settings, store=store), headers=head) as c:
            project_with_labels(c, "p", 5)
            served = ["/items/x-1", "/items?limit=5", "/queue", "/workers/w1", "/summary"]
            for path in served:
                assert c.get(f"/v1/projects/p{path}").status_code == 200, path
            if isinstance(store, RedisStore):
                store.r.set(store._k("p", "restoring"), 99)
            else:
                store._state["p"].restoring = 99  # type: ignore[attr-defined]
            time.sleep(0.3)  # (each API process looks again after RESTORING_CACHE_S)
            for path in served:
                r = c.get(f"/v1/projects/p{path}")
                assert r.status_code == 503 and r.json()["error"]["code"] == "restoring", path
                assert r.headers["Retry-After"] == "1"
            assert c.get("/v1/projects/p").status_code == 200
            assert c.get("/v1/projects/p/snapshots").status_code == 200
            if isinstance(store, RedisStore):
                store.r.delete(store._k("p", "restoring"))
            else:
                store._state["p"].restoring = 0  # type: ignore[attr-defined]
            time.sleep(0.3)
            for path in served:
                assert c.get(f"/v1/projects/p{path}").status_code == 200, path
    finally:
        if isinstance(store, RedisStore):
            store.flush_prefix()
        store.close()


def test_an_admin_key_made_at_start_survives_a_wipe_before_any_project(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The admin key the API made was archived only with a project's snapshot: a Redis wiped
    before any project lost it, and the rebuild made another."""
    store = make_store("redis", tmp_path)
    assert isinstance(store, RedisStore)
    settings = service_settings(tmp_path, admin_key=None)
    try:
        with TestClient(create_app(settings, store=store)) as c:
            made = re.findall(r"created the admin API key[^:]*: (\S+)", capsys.readouterr().err)[0]
            c.app.state.service.watch.stop()
            store.flush_prefix()
            assert c.app.state.service.watch.check()
            assert "created the admin API key" not in capsys.readouterr().err
            head = {"Authorization": f"Bearer {made}"}
            assert c.get("/v1/projects", headers=head).status_code == 200
    finally:
        store.flush_prefix()
        store.close()
