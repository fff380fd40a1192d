"""A project's memory is proportional to what it holds; a configuration that cannot fit is
refused at creation; one failing project does not stall the others."""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import orjson
import pytest
from fastapi.testclient import TestClient

from app.api import create_app
from app.engine.dyadic import settings_for
from app.engine.project import ProjectEngine, model_bytes
from app.engine.snapshots import capture, encode, restore
from app.store.base import LogEntry, ProjectRecord, Store
from core.nominal import NominalConfig
from tests.app.conftest import ADMIN, service_settings
from tests.app.test_engine import RECORD, label_entries
from tests.app.test_snapshots import same_state
from tests.conftest import Synthetic

MB = 2**20


def record(K: int, dyadic: bool, slots: int = 65_536) -> ProjectRecord:
    config = NominalConfig(n_classes=K, n_worker_slots=slots).to_dict()
    config["dyadic"] = settings_for(K).to_dict() if dyadic else None
    return ProjectRecord("p", tuple(f"c{k}" for k in range(K)), config, 1.0)


def entry(position: int, n: int, K: int, workers: int = 3) -> LogEntry:
    body = {
        "items": [f"i{position}-{k}" for k in range(n)],
        "workers": [f"w{k % workers}" for k in range(n)],
        "labels": [k % K for k in range(n)],
        "weights": None,
    }
    return LogEntry(position, "labels", orjson.dumps(body))


def peak_bytes(rec: ProjectRecord, entries: list[LogEntry]) -> int:
    """tracemalloc's peak while a project's engine is built, applies ``entries``, writes its
    state and is captured for a snapshot (kernels compiled beforehand)."""
    warm = ProjectEngine(record(3, dyadic=False, slots=8))
    warm.apply(entry(1, 4, 3))
    warm.state_update()
    tracemalloc.start()
    try:
        eng = ProjectEngine(rec)
        for e in entries:
            eng.apply(e)
        eng.state_update()
        capture(eng)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_three_label_project_at_default_slots_is_small() -> None:
    # The nominal model alone: under 1 MB (was 2 x 65,536 x 9 floats = 9.4 MB up front).
    assert peak_bytes(record(3, dyadic=False), [entry(1, 30, 3)]) < 1 * MB
    # With the API's default dyadic model too: its hashed tables (65,536 raters and 262,144
    # tasks x 3 scorers x 3 floats, 23.6 MB whole) hold only the rows of the slots in use.
    assert peak_bytes(record(3, dyadic=True), [entry(1, 30, 3)]) < 2 * MB
    eng = ProjectEngine(record(3, dyadic=True))
    eng.apply(entry(1, 40, 3, workers=5))
    assert eng.dyadic is not None
    assert eng.dyadic.model.config.rater_slots == 64  # 5 rows used, the least room
    assert sum(a.nbytes for a in eng.dyadic.model.arrays().values()) < 64 * 1024


def test_256_labels_at_default_slots_hold_only_their_workers_rows() -> None:
    # 65,536 slots x 256^2 x 8 bytes was 34 GB per table; five workers hold five rows (1 MB
    # each, with their statistics), the rest is per item (1,024 x 256 posteriors at least).
    peak = peak_bytes(record(256, dyadic=False), [entry(1, 40, 256), entry(2, 40, 256, 5)])
    assert peak < 32 * MB
    eng = ProjectEngine(record(256, dyadic=False))
    eng.apply(entry(1, 40, 256, workers=5))
    assert eng.n_rows <= 5 and eng.online.params.worker.shape[1:] == (256, 256)
    assert eng.online.params.worker.nbytes <= 8 * 256 * 256 * 8


def test_memory_estimate_of_a_configuration() -> None:
    assert model_bytes(record(256, dyadic=False)) > 60 * 2**30  # 2 x 34 GB
    # 3 classes: the model's tables and its pooled twin's (eq. 29), 2 x 9.4 MB
    assert 17 * MB < model_bytes(record(3, dyadic=False)) < 19 * MB
    assert 20 * MB < model_bytes(record(3, dyadic=True)) < 50 * MB
    # above 16 classes no twin: 65,536 x 17^2 x 16 bytes
    assert 288 * MB < model_bytes(record(17, dyadic=False)) < 290 * MB


def test_rows_replay_and_snapshots_match_the_s_slot_model(synthetic: Synthetic) -> None:
    """Snapshots name slots, not rows: one written in the S-slot layout (every row of a
    used slot, by slot; older engines wrote those) restores to the same state."""
    entries = label_entries(synthetic, [700, 3000, 5200, 9000])
    full = ProjectEngine(RECORD)
    for e in entries:
        full.apply(e)
    half = ProjectEngine(RECORD)
    for e in entries[:3]:
        half.apply(e)
    cap = capture(half)
    by_slot = np.argsort(cap.arrays["used_slots"])  # the S-slot layout's order
    for name in ("used_slots", "worker_rows", "count_rows"):
        cap.arrays[name] = cap.arrays[name][by_slot]
    resumed = restore(RECORD, encode(cap))
    assert resumed.model.params.equals(half.model.params)
    for e in entries[3:]:
        resumed.apply(e)
    assert resumed.model.params.equals(full.model.params)
    n = full.items_count
    assert np.array_equal(resumed.q[:n], full.q[:n])
    assert np.array_equal(resumed.held_out[:n], full.held_out[:n])
    again = restore(RECORD, encode(capture(full)))  # its own layout: the very same rows
    same_state(full, again)


@pytest.fixture
def small_client(store: Store, tmp_path: Path) -> Iterator[TestClient]:
    app = create_app(service_settings(tmp_path, wait_timeout_s=10.0), store=store)
    with TestClient(app, headers={"Authorization": f"Bearer {ADMIN}"}) as c:
        yield c


def test_a_project_too_large_is_refused_at_creation(small_client: TestClient) -> None:
    c = small_client
    labels = [f"c{k}" for k in range(256)]
    r = c.post("/v1/projects", json={"name": "big", "labels": labels})
    assert r.status_code == 422
    err = r.json()["error"]
    assert err["code"] == "project_too_large" and err["field"] == "dyadic"  # 2 GB alone
    assert "1,024 MiB" in err["message"] and "CROWDTALLY_PROJECT_MEMORY_LIMIT_MB" in err["message"]
    body = {"name": "big", "labels": labels, "dyadic": {"enabled": False}}
    err = c.post("/v1/projects", json=body).json()["error"]
    assert err["code"] == "project_too_large" and err["field"] == "worker_slots"
    assert "65,536 worker slots x 256^2 x 16 bytes" in err["message"]
    assert "at most 1,023 fit" in err["message"]
    assert c.get("/v1/projects/big").status_code == 404
    too_many = c.post("/v1/projects", json={**body, "worker_slots": 1024})
    assert too_many.status_code == 422
    made = c.post("/v1/projects", json={**body, "worker_slots": 1023})
    assert made.status_code == 201
    key = {"Authorization": f"Bearer {made.json()['api_key']}"}
    block = [{"item": f"i{k}", "worker": f"w{k % 3}", "label": f"c{k % 256}"} for k in range(50)]
    r = c.post("/v1/projects/big/labels?wait=true", json=block, headers=key)
    assert r.json()["applied"]
    assert c.get("/v1/projects/big/items/i7", headers=key).json()["labels"][0]["label"] == "c7"


def test_a_failing_project_does_not_stall_the_others(
    small_client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = small_client
    apply_run = ProjectEngine.apply_run

    def failing(self: ProjectEngine, run: Sequence[LogEntry]) -> None:
        if self.record.name == "bad" and run[0].kind == "labels":
            raise MemoryError("injected")
        apply_run(self, run)

    monkeypatch.setattr(ProjectEngine, "apply_run", failing)
    keys = {}
    for name in ("bad", "good"):
        made = c.post("/v1/projects", json={"name": name, "labels": ["a", "b"], "worker_slots": 64})
        keys[name] = {"Authorization": f"Bearer {made.json()['api_key']}"}
    block = [{"item": f"i{k}", "worker": f"w{k % 3}", "label": "ab"[k % 2]} for k in range(20)]
    r = c.post("/v1/projects/bad/labels", json=block, headers=keys["bad"])
    assert r.status_code == 202
    for n in range(3):  # the engine keeps applying the other project, entry after entry
        more = [{**x, "item": f"{x['item']}-{n}"} for x in block]
        r = c.post("/v1/projects/good/labels?wait=true", json=more, headers=keys["good"])
        assert r.json()["applied"]
    deadline = time.monotonic() + 10
    while "bad" not in (ready := c.get("/readyz")).json()["failed_projects"]:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert ready.status_code == 200 and ready.json()["ready"]  # the others are served
    assert ready.json()["failed_projects"]["bad"] == "MemoryError: injected"
    assert ready.json()["engine_error"] is None
    metrics = c.get("/metrics").text
    assert 'crowdtally_project_failed{project="bad"} 1.0' in metrics
    assert 'crowdtally_project_failed{project="good"} 0.0' in metrics
    monkeypatch.undo()  # the cause goes away: the project is tried again and catches up
    deadline = time.monotonic() + 20
    while c.get("/v1/projects/bad").json()["stats"]["lag"]:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert c.get("/readyz").json()["failed_projects"] == {}
    assert c.get("/v1/projects/bad/items/i3", headers=keys["bad"]).status_code == 200
