"""The service on a Redis Cluster (6 local nodes, tests/redis_cluster.py), chosen by
configuration: the same answers as on the embedded store, bit for bit."""

from __future__ import annotations

import csv
import uuid
from pathlib import Path
from typing import Any

import orjson
from fastapi.testclient import TestClient

from app.api import create_app
from app.store.redis_store import RedisStore
from bench.datasets import DEFAULT_ROOT
from tests.app.conftest import ADMIN, cluster_url, service_settings


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
        RedisStore(cluster_url(), prefix, cluster=True).flush_prefix()
    embedded = served({}, tmp_path / "embedded")
    assert on_cluster["n_labels"] == embedded["n_labels"] == 3000
    assert on_cluster["posteriors"] == embedded["posteriors"]
    assert on_cluster["queue"] == embedded["queue"]
