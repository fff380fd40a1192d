"""The queue the service serves is the ranking ``bench.active`` replays: a campaign on the
dog dataset, posted to the service entry by entry, gives the same order, item by item."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from fastapi.testclient import TestClient

from app.api import create_app
from app.store.base import Store
from bench.active import Campaign, load_crowd, served_queue
from tests.app.conftest import ADMIN, service_settings

PROJECT = "replay"


def applied(client: TestClient) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        stats = client.get(f"/v1/projects/{PROJECT}").json()["stats"]
        if stats["lag"] == 0 and stats["applied"] == stats["log_end"]:
            return
        time.sleep(0.01)
    raise TimeoutError("the engine did not apply the log")


def post_like_the_bench(
    client: TestClient, store: Store, c: Campaign, kind: str, body: Any
) -> None:
    """The entry the bench's engine applied, through the API (labels, settings) or the log."""
    if kind == "labels":
        names = c.crowd.classes
        block = [
            {"item": i, "worker": w, "label": names[y]}
            for i, w, y in zip(body["items"], body["workers"], body["labels"], strict=True)
        ]
        r = client.post(
            f"/v1/projects/{PROJECT}/labels", params={"wait": True}, content=orjson.dumps(block)
        )
    elif kind == "settings":
        r = client.put(
            f"/v1/projects/{PROJECT}/queue/settings", params={"wait": True}, json=body["queue"]
        )
    else:  # the engine's own refinement sweep
        store.append(PROJECT, kind, orjson.dumps(body), None)  # type: ignore[arg-type]
        applied(client)
        return
    assert r.status_code == 202, r.text


@pytest.mark.parametrize("policy", ["lookahead", "voi", "uniform"])
def test_the_served_queue_is_the_ranking_the_bench_replays(
    store: Store, tmp_path: Path, datasets_root: Path, policy: str
) -> None:
    crowd = load_crowd("dog")
    entries: list[tuple[str, Any]] = []
    original = Campaign.log

    def logged(c: Campaign, kind: Any, body: dict[str, Any]) -> None:
        entries.append((kind, body))
        original(c, kind, body)

    Campaign.log = logged  # type: ignore[method-assign]
    try:
        c = Campaign.start_from(crowd, seed=3, queue_policy=policy)
        for step in range(1, 13):
            items, _ = served_queue(c, 16)
            c.reveal(items)
            if step % 5 == 0:
                c.refine()
    finally:
        Campaign.log = original  # type: ignore[method-assign]
    settings = service_settings(tmp_path, max_block_labels=10_000)
    app = create_app(settings, store=store)
    with TestClient(app, headers={"Authorization": f"Bearer {ADMIN}"}) as client:
        r = client.post(
            "/v1/projects",
            json={"name": PROJECT, "labels": list(crowd.classes), "dyadic": {"enabled": False}},
        )
        assert r.status_code == 201, r.text
        for kind, body in entries:
            post_like_the_bench(client, store, c, kind, body)
        page = client.get(f"/v1/projects/{PROJECT}/queue", params={"limit": 1000}).json()
    served = [(int(x["item"]), x["score"]) for x in page["items"]]
    assert page["size"] == len(served) == int(np.isfinite(c.score).sum()) > 700
    open_ = c.revealed < c.counts
    served_open = [i for i, _ in served if open_[i]]
    bench = served_queue(c, 1000)[0].tolist()
    assert served_open == bench  # the same items, in the same order
    scores = np.array([s for _, s in served])
    assert np.array_equal(scores, c.score[[i for i, _ in served]])
    ties = np.flatnonzero(np.diff(scores) == 0)
    assert ties.size  # ties occur (uniform: all at one count; voi: certain items) ...
    arrival = c.code[[i for i, _ in served]]
    assert np.all(arrival[ties] < arrival[ties + 1])  # ... and come out in arrival order
