"""The active-learning queue end to end, on both stores: registration, policies, stopping rule."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest
from fastapi.testclient import TestClient

from tests.app.test_api import make_project


def post(client: TestClient, key: dict[str, str], path: str, body: Any) -> Any:
    r = client.post(
        f"/v1/projects/census/{path}",
        params={"wait": True},
        content=orjson.dumps(body),
        headers=key,
    )
    assert r.status_code == 202, r.text
    return r.json()


def queue(client: TestClient, key: dict[str, str], **params: Any) -> Any:
    r = client.get("/v1/projects/census/queue", params=params, headers=key)
    assert r.status_code == 200, r.text
    return r.json()


def settings(client: TestClient, key: dict[str, str], **body: Any) -> None:
    r = client.put(
        "/v1/projects/census/queue/settings", params={"wait": True}, json=body, headers=key
    )
    assert r.status_code == 202, r.text


def test_queue_loop(client: TestClient) -> None:
    key = make_project(client)
    post(client, key, "items", [{"item": f"new{i}"} for i in range(5)])
    q = queue(client, key, limit=10)
    assert q["size"] == 5 and q["policy"] == "lookahead"
    assert {x["item"] for x in q["items"]} == {f"new{i}" for i in range(5)} and all(
        x["n_labels"] == 0 for x in q["items"]
    )
    # new0 gets 5 agreeing answers: confident, it leaves the queue; new1 gets a split vote
    five = [{"item": "new0", "worker": f"w{j}", "label": "white"} for j in range(5)]
    split = [
        {"item": "new1", "worker": "w0", "label": "white"},
        {"item": "new1", "worker": "w1", "label": "asian"},
    ]
    post(client, key, "labels", five + split)
    q = queue(client, key, limit=10)
    names = [x["item"] for x in q["items"]]
    assert "new0" not in names and q["size"] == 4
    scores = [x["score"] for x in q["items"]]
    assert scores == sorted(scores, reverse=True)
    # a worker is not offered items they labelled
    mine = [x["item"] for x in queue(client, key, limit=10, worker="w0")["items"]]
    assert "new1" not in mine and set(mine) == {"new2", "new3", "new4"}


def test_stopping_rule_and_policies(client: TestClient) -> None:
    key = make_project(client)
    post(
        client,
        key,
        "labels",
        [
            {"item": f"i{i}", "worker": f"w{j}", "label": "white"}
            for i in range(6)
            for j in range(i % 3)
        ],
    )
    settings(client, key, policy="uniform", target_confidence=1.0)
    q = queue(client, key, limit=10)
    assert [x["n_labels"] for x in q["items"]] == [
        1,
        1,
        2,
        2,
    ]  # fewest labels first (i0, i3 have none: not items yet)
    settings(client, key, policy="uniform", target_confidence=1.0, max_labels_per_item=2)
    assert [x["n_labels"] for x in queue(client, key, limit=10)["items"]] == [1, 1]
    settings(client, key, policy="uncertainty", target_confidence=1.0, budget=6)
    assert queue(client, key)["size"] == 0  # 6 labels spent: everything is finished
    r = client.get("/v1/projects/census/queue/settings", headers=key).json()
    assert r == {
        "policy": "uncertainty",
        "target_confidence": 1.0,
        "max_labels_per_item": None,
        "budget": 6,
    }
    r = client.put("/v1/projects/census/queue/settings", json={"policy": "random"}, headers=key)
    assert r.status_code == 422 and r.json()["error"]["field"] == "policy"


def test_gold_items_leave_the_queue(client: TestClient) -> None:
    key = make_project(client)
    post(
        client,
        key,
        "labels",
        [
            {"item": "a", "worker": "w1", "label": "white"},
            {"item": "b", "worker": "w1", "label": "asian"},
        ],
    )
    assert queue(client, key)["size"] == 2
    post(client, key, "gold", [{"item": "a", "label": "white"}])
    assert [x["item"] for x in queue(client, key)["items"]] == ["b"]


def test_queue_needs_read_key_and_valid_limit(client: TestClient) -> None:
    make_project(client)
    assert client.get("/v1/projects/census/queue", headers={"Authorization": ""}).status_code == 401
    r = client.get("/v1/projects/census/queue", params={"limit": 0})
    assert r.status_code == 422 and r.json()["error"]["field"] == "limit"


def test_put_settings_answers_the_settings_in_force(client: TestClient) -> None:
    key = make_project(client)
    path = "/v1/projects/census/queue/settings"
    default = client.get(path, headers=key).json()
    assert default == {
        "policy": "lookahead",
        "target_confidence": 0.95,
        "max_labels_per_item": None,
        "budget": None,
    }
    # a PUT replaces the settings: what it leaves out takes its default
    for wait in (True, False):
        body = {"policy": "margin", "budget": 10 if wait else 11}
        r = client.put(path, params={"wait": wait}, json=body, headers=key)
        assert r.status_code == 202, r.text
        assert r.json() == {**default, **body}
        client.post("/v1/projects/census/refit", params={"wait": True}, headers=key)
        assert client.get(path, headers=key).json() == r.json()
    r = client.put(path, params={"wait": True}, json={"target_confidence": 0.5}, headers=key)
    assert r.json() == {**default, "target_confidence": 0.5}


def test_ties_come_out_in_the_order_items_arrived(client: TestClient) -> None:
    key = make_project(client)
    arrived = ["m", "zz", "a", "q7", "b"]  # neither sorted nor reverse-sorted
    post(client, key, "items", [{"item": x} for x in arrived])
    for policy in ("lookahead", "voi", "uniform", "uncertainty"):
        settings(client, key, policy=policy)
        assert [x["item"] for x in queue(client, key, limit=10)["items"]] == arrived, policy
    # labels on the first two: under uniform the unlabelled come first, still in arrival order
    post(
        client,
        key,
        "labels",
        [{"item": x, "worker": "w0", "label": "white"} for x in ("m", "zz")],
    )
    settings(client, key, policy="uniform")
    assert [x["item"] for x in queue(client, key, limit=10)["items"]] == ["a", "q7", "b", "m", "zz"]
    assert [x["item"] for x in queue(client, key, limit=2)["items"]] == ["a", "q7"]


def test_the_queue_reports_what_the_stopping_rule_promises(client: TestClient) -> None:
    """``progress``: the finished items, their mean served confidence (the share expected
    right), the open items and the labels they are expected to need (docs/active.md A8)."""
    key = make_project(client)
    empty = {"done": 0, "expected_accuracy": None, "open": 0, "labels_to_finish": 0.0}
    assert queue(client, key)["progress"] == empty  # (it said null: "some cannot reach it")
    summary = client.get("/v1/projects/census/summary", headers=key).json()
    assert summary["queue_progress"] == empty
    sure = [
        {"item": f"s{i}", "worker": f"w{j}", "label": "white"} for i in range(4) for j in range(6)
    ]
    split = [
        {"item": f"u{i}", "worker": f"w{j}", "label": ("white", "asian")[(i + j) % 2]}
        for i in range(3)
        for j in range(2)
    ]
    lone = [{"item": f"one{i}", "worker": "w0", "label": "black"} for i in range(2)]
    post(client, key, "labels", sure + split + lone)
    post(client, key, "gold", [{"item": "s0", "label": "white"}])
    settings(client, key, target_confidence=0.9)
    q = queue(client, key, limit=100)
    page = client.get("/v1/projects/census/items", params={"limit": 1000}, headers=key).json()
    served = {x["item"]: x["probability"] for x in page["items"] if x["gold"] is None}
    done = [p for p in served.values() if p >= 0.9]
    progress = q["progress"]
    assert done and len(done) < len(served)
    assert progress["done"] == len(done) and progress["open"] == q["size"] == len(served) - len(
        done
    )
    assert progress["expected_accuracy"] == pytest.approx(np.mean(done), abs=1e-9)
    assert progress["labels_to_finish"] >= progress["open"]  # every open item needs one more
    settings(client, key, target_confidence=0.9, max_labels_per_item=2)
    capped = queue(client, key, limit=100)["progress"]
    # the capped split items are finished; each lone item needs at most 1 more
    assert capped["open"] == 2 and capped["labels_to_finish"] <= 2
    assert capped["done"] == len(served) - 2
