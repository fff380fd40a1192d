"""The HTTP API on both stores: the user's loop, keys, and every class of bad input."""

from __future__ import annotations

import csv
import io
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest
from fastapi.testclient import TestClient

from app.api import create_app
from app.store.base import Store
from tests.app.conftest import ADMIN, listed_items, service_settings

LABELS = ["asian", "black", "hispanic", "white", "other"]


def make_project(client: TestClient, name: str = "census") -> dict[str, str]:
    r = client.post("/v1/projects", json={"name": name, "labels": LABELS})
    assert r.status_code == 201, r.text
    return {"Authorization": f"Bearer {r.json()['api_key']}"}


def post(
    client: TestClient, key: dict[str, str], block: Any, project: str = "census", wait: bool = True
) -> Any:
    return client.post(
        f"/v1/projects/{project}/labels",
        params={"wait": wait},
        content=orjson.dumps(block),
        headers=key,
    )


def triples(n: int, offset: int = 0) -> list[dict[str, Any]]:
    return [
        {
            "item": f"img{i % 20}",
            "worker": f"w{i % 6}",
            "label": LABELS[(i // 20) % 3],
            "id": f"L{i + offset}",
        }
        for i in range(n)
    ]


def log_end(client: TestClient, key: dict[str, str], project: str = "census") -> int:
    return int(client.get(f"/v1/projects/{project}", headers=key).json()["stats"]["log_end"])


def test_user_loop_post_then_read(client: TestClient) -> None:
    key = make_project(client)
    r = post(client, key, triples(40))
    assert r.status_code == 202
    assert r.json() == {"accepted": 40, "duplicates": 0, "position": 1, "applied": True}
    item = client.get("/v1/projects/census/items/img3", headers=key).json()
    assert item["n_labels"] == 2 and len(item["labels"]) == 2
    assert set(item["posterior"]) == set(LABELS)
    assert item["posterior"][item["label"]] == pytest.approx(item["probability"])
    assert sum(item["posterior"].values()) == pytest.approx(1.0)
    assert item["computed_at"].endswith("Z") and item["position"] == 1
    worker = client.get("/v1/projects/census/workers/w2", headers=key).json()
    assert worker["n_labels"] == 7
    assert all(sum(row.values()) == pytest.approx(1.0) for row in worker["confusion"].values())
    stats = client.get("/v1/projects/census", headers=key).json()["stats"]
    deadline = time.monotonic() + 10
    while stats["dyadic_position"] < 1:  # the dyadic model learns right after the posteriors
        assert time.monotonic() < deadline, stats
        time.sleep(0.01)
        stats = client.get("/v1/projects/census", headers=key).json()["stats"]
    assert stats == {
        "log_end": 1,
        "applied": 1,
        "lag": 0,
        "n_items": 20,
        "n_workers": 6,
        "n_labels": 40,
        "dyadic_passes": 1.0,  # each label learned once: idle sweeps are off in these tests
        "dyadic_position": 1,
        "last_refit": None,  # no refit asked for
    }


def test_resent_ids_count_once(client: TestClient) -> None:
    key = make_project(client)
    assert post(client, key, triples(30)).json()["accepted"] == 30
    again = post(client, key, triples(30)[10:] + triples(5, offset=100))
    assert again.json()["accepted"] == 5 and again.json()["duplicates"] == 20
    assert client.get("/v1/projects/census", headers=key).json()["stats"]["n_labels"] == 35


def test_an_id_names_one_label_of_a_block(client: TestClient) -> None:
    """The same label twice in a block is a repeat; another label under its id is refused,
    where it was dropped as a repeat of the first."""
    key = make_project(client)
    block = triples(4)
    repeat = post(client, key, [*block, block[1]]).json()
    assert repeat["accepted"] == 4 and repeat["duplicates"] == 1
    other = post(client, key, [*triples(3, offset=10), {**block[0], "id": "L11"}])
    assert other.status_code == 422, other.text
    error = other.json()["error"]
    assert error["entry"] == 3 and error["field"] == "id" and "entry 1" in error["message"]


def test_labels_without_ids_and_second_answers_all_count(client: TestClient) -> None:
    # Documented: a label without an id is always new; a worker's second answer on an item
    # is a second label (both count).
    key = make_project(client)
    block = [
        {"item": "x", "worker": "w", "label": "white"},
        {"item": "x", "worker": "w", "label": "other"},
    ]
    post(client, key, block)
    r = post(client, key, block)
    assert r.json()["accepted"] == 2
    assert client.get("/v1/projects/census/items/x", headers=key).json()["n_labels"] == 4


def test_opaque_ids_with_slashes_and_unicode(client: TestClient) -> None:
    key = make_project(client)
    post(client, key, [{"item": "a/b c?é", "worker": "wörker/1", "label": "white"}])
    r = client.get("/v1/projects/census/items/a%2Fb%20c%3F%C3%A9", headers=key)
    assert r.status_code == 200 and r.json()["item"] == "a/b c?é"
    assert client.get("/v1/projects/census/workers/w%C3%B6rker%2F1", headers=key).status_code == 200


def test_gold_labels(client: TestClient) -> None:
    key = make_project(client)
    post(client, key, triples(40))
    r = client.post(
        "/v1/projects/census/gold",
        params={"wait": True},
        json=[{"item": "img3", "label": "asian"}],
        headers=key,
    )
    assert r.status_code == 202 and r.json()["applied"]
    item = client.get("/v1/projects/census/items/img3", headers=key).json()
    assert item["gold"] == "asian" and item["posterior"]["asian"] == 1.0
    w = client.get("/v1/projects/census/workers/w3", headers=key).json()
    assert w["gold_labels"] == 1 and w["gold_accuracy"] == 1.0  # w3 said asian on img3 (i=3)
    empty = client.post("/v1/projects/census/gold", json=[], headers=key).json()["error"]
    assert empty == {**empty, "code": "empty_block", "message": "the block holds no gold answers"}
    two = [{"item": "img4", "label": "asian"}, {"item": "img4", "label": "white"}]
    refused = client.post("/v1/projects/census/gold", json=two, headers=key).json()["error"]
    assert (refused["entry"], refused["field"]) == (1, "label")  # (the last one won)
    bad = client.post("/v1/projects/census/gold", json=[{"item": "x"}], headers=key).json()
    assert bad["error"]["code"] == "invalid_label" and bad["error"]["field"] == "label"
    items = client.post("/v1/projects/census/items", json=[], headers=key).json()["error"]
    assert items["message"] == "the block holds no items"  # (it said labels)
    twice = [{"item": "new1"}, {"item": "new2"}, {"item": "new1"}]
    named = client.post("/v1/projects/census/items", json=twice, headers=key).json()
    assert (named["accepted"], named["duplicates"]) == (2, 1)  # (it said 3 accepted)


def test_gold_given_twice_in_a_block_counts_once(client: TestClient) -> None:
    key = make_project(client)
    post(client, key, triples(40))
    path = "/v1/projects/census/gold"
    twice = [{"item": "img3", "label": "asian"}, {"item": "img5", "label": "white"}] * 2
    r = client.post(path, params={"wait": True}, json=twice, headers=key)
    assert r.status_code == 202, r.text
    assert (r.json()["accepted"], r.json()["duplicates"]) == (2, 2)  # (it said 4 and 0)
    w = client.get("/v1/projects/census/workers/w3", headers=key).json()
    assert w["gold_labels"] == 1  # img3's gold, once
    again = client.post(path, params={"wait": True}, json=twice[:1], headers=key)
    assert again.status_code == 202  # posted again later (gold has no ids): replaced, not added
    w2 = client.get("/v1/projects/census/workers/w3", headers=key).json()
    assert (w2["gold_labels"], w2["gold_accuracy"]) == (1, w["gold_accuracy"])
    bad = [*twice, {"item": "img6", "label": "purple"}]  # an entry is named in the block
    err = client.post(path, json=bad, headers=key).json()["error"]
    assert (err["code"], err["entry"], err["field"]) == ("unknown_label", 4, "label")


def test_items_pages_filter_and_export(client: TestClient) -> None:
    key = make_project(client)
    assert post(client, key, triples(40)).status_code == 202
    seen: list[str] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 7}
        if cursor:
            params["cursor"] = cursor
        page = client.get("/v1/projects/census/items", params=params, headers=key).json()
        seen += [x["item"] for x in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert sorted(set(seen)) == sorted(f"img{i}" for i in range(20))
    for bad in ("-1", "-3", "x"):  # (-1 gave an empty page whose next cursor was -1 again)
        r = client.get("/v1/projects/census/items", params={"cursor": bad}, headers=key)
        assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_cursor", bad
    unsure = client.get(
        "/v1/projects/census/items", params={"limit": 1000, "max_probability": 0.9}, headers=key
    ).json()
    assert all(x["probability"] <= 0.9 for x in unsure["items"])
    jsonl = client.get("/v1/projects/census/export", headers=key)
    rows = [orjson.loads(line) for line in jsonl.text.splitlines()]
    assert jsonl.headers["content-type"].startswith("application/x-ndjson") and len(rows) == 20
    csv_text = client.get("/v1/projects/census/export", params={"format": "csv"}, headers=key).text
    lines = csv_text.strip().splitlines()
    assert lines[0].startswith("item,label,probability,asian,black") and len(lines) == 21


def test_a_listing_page_holds_at_most_limit_items(client: TestClient) -> None:
    """Redis' HSCAN takes its count as a hint (it counts hash buckets): a page of limit 7 held
    8 items here (over 20,000 fields, 797 of 1,885 scans of count 10 gave more than 10)."""
    key = make_project(client)
    block = [{"item": f"i{k}", "worker": f"w{k % 9}", "label": LABELS[k % 3]} for k in range(400)]
    for lo in range(0, len(block), 50):  # (the test service takes blocks of 50)
        assert post(client, key, block[lo : lo + 50], wait=lo + 50 >= len(block)).status_code == 202
    seen: list[str] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 7, **({"cursor": cursor} if cursor else {})}
        page = client.get("/v1/projects/census/items", params=params, headers=key).json()
        assert len(page["items"]) <= 7, (cursor, len(page["items"]))
        seen += [x["item"] for x in page["items"]]
        if (cursor := page["next_cursor"]) is None:
            break
    assert sorted(seen) == sorted(x["item"] for x in block)  # each once
    r = client.get("/v1/projects/census/items", params={"cursor": "3:"}, headers=key)
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_cursor"


def test_a_filtered_listing_has_no_empty_page_before_its_end(client: TestClient) -> None:
    """With limit 1 and a filter only a few items pass, most pages came back empty with a
    next_cursor to follow (a client stopping at an empty page missed items)."""
    key = make_project(client)
    assert post(client, key, triples(40)).status_code == 202
    every = client.get("/v1/projects/census/items", params={"limit": 1000}, headers=key).json()
    lowest = sorted(x["probability"] for x in every["items"])[2]  # three items pass
    pages, cursor = [], None
    while True:
        params: dict[str, Any] = {"limit": 1, "max_probability": lowest}
        if cursor:
            params["cursor"] = cursor
        page = client.get("/v1/projects/census/items", params=params, headers=key).json()
        pages.append([x["item"] for x in page["items"]])
        cursor = page["next_cursor"]
        if cursor is None:
            break
    passing = [x["item"] for x in every["items"] if x["probability"] <= lowest]
    assert all(pages[:-1]) and sorted(x for p in pages for x in p) == sorted(passing)


def test_the_export_is_the_listing_without_labels_over_several_pages(client: TestClient) -> None:
    """Export rows are built without a model per item: they must be the listing's items
    (gold, unlabelled and unicode ones included) but their labels, over pages of 1,000."""
    key = make_project(client)
    block = [{"item": f"it\u00e9m {i}", "worker": f"w{i % 7}", "label": LABELS[i % 3 + (i % 11 == 0)]}
             for i in range(2_300)]  # fmt: skip
    for lo in range(0, len(block), 50):  # (the test service takes blocks of 50)
        last = lo + 50 >= len(block)
        assert post(client, key, block[lo : lo + 50], wait=last).status_code == 202
    gold = [{"item": "it\u00e9m 5", "label": "white"}]
    assert (
        client.post("/v1/projects/census/gold?wait=true", json=gold, headers=key).status_code == 202
    )
    bare = [{"item": f"new {i}"} for i in range(3)]
    assert (
        client.post("/v1/projects/census/items?wait=true", json=bare, headers=key).status_code < 300
    )
    listed = listed_items(client, key, "census", 500)
    lines = client.get("/v1/projects/census/export", headers=key).text.splitlines()
    exported = {r["item"]: r for r in map(orjson.loads, lines)}
    assert len(lines) == len(exported) == len(listed) == 2_303 and exported == listed
    assert exported["it\u00e9m 5"]["gold"] == "white" and exported["new 0"]["label"] is None
    rows = list(csv.reader(io.StringIO(
        client.get("/v1/projects/census/export", params={"format": "csv"}, headers=key).text)))  # fmt: skip
    assert len(rows) == 2_304 and {r[0] for r in rows[1:]} == set(listed)
    first = exported[rows[1][0]]
    assert rows[1][1:4] == [first["label"], f"{first['probability']:.6g}",
                            f"{first['posterior']['asian']:.6g}"]  # fmt: skip


def test_workers_ranked_spammer_first(client: TestClient) -> None:
    key = make_project(client, "spam")
    block = []
    for i in range(200):
        truth = LABELS[i % 2]
        for w in ("good1", "good2", "good3"):
            block.append({"item": f"i{i}", "worker": w, "label": truth})
        block.append({"item": f"i{i}", "worker": "spammer", "label": LABELS[(i * 7 // 3) % 5]})
    for lo in range(0, len(block), 50):
        post(client, key, block[lo : lo + 50], project="spam")
    worst = client.get("/v1/projects/spam/workers", params={"order": "worst"}, headers=key).json()
    assert worst["total"] == 4 and worst["workers"][0]["worker"] == "spammer"
    best = client.get("/v1/projects/spam/workers", headers=key).json()
    assert best["workers"][-1]["worker"] == "spammer"


def test_refit(client: TestClient) -> None:
    key = make_project(client)
    # each item answered by three workers, two of whom agree (``triples`` gives each item one
    # answer of two classes: a tie, which the two fits may break either way)
    block = [
        {"item": f"img{i}", "worker": f"w{(i + j) % 6}",
         "label": LABELS[(i + (j == 2)) % 3], "id": f"L{i}-{j}"}
        for i in range(15) for j in range(3)
    ]  # fmt: skip
    sent = post(client, key, block)
    assert sent.status_code == 202, sent.text
    r = client.post("/v1/projects/census/refit", params={"wait": True}, headers=key)
    assert r.status_code == 202 and r.json()["applied"] and r.json()["position"] == 2
    line = next(
        x
        for x in client.get("/metrics").text.splitlines()
        if x.startswith("crowdtally_batch_em_iterations_total")
    )
    assert float(line.split()[-1]) >= 2  # the refit's EM iterations are counted
    assert 'crowdtally_last_refit_adopted{project="census"} 1.0' in client.get("/metrics").text
    stats = client.get("/v1/projects/census", headers=key).json()["stats"]
    assert stats["last_refit"]["position"] == 2 and stats["last_refit"]["adopted"]
    assert 0.85 <= stats["last_refit"]["agreement"] <= 1.0


def test_project_admin(client: TestClient) -> None:
    make_project(client, "one")
    make_project(client, "two")
    assert [p["name"] for p in client.get("/v1/projects").json()] == ["one", "two"]
    r = client.post("/v1/projects", json={"name": "one", "labels": ["a", "b"]})
    assert r.status_code == 409 and r.json()["error"]["code"] == "project_exists"
    assert client.delete("/v1/projects/one").status_code == 204
    assert client.delete("/v1/projects/one").status_code == 404
    assert [p["name"] for p in client.get("/v1/projects").json()] == ["two"]


def test_the_listing_shows_each_project_as_its_own_page_does(client: TestClient) -> None:
    """The listing reads every project's positions and parameters in one round trip."""
    key = make_project(client, "one")
    assert post(client, key, triples(20), "one").status_code == 202
    make_project(client, "two")
    deadline = time.monotonic() + 10
    # the dyadic model learns in its own step after the posteriors: wait for it, so that
    # nothing moves between the two reads compared
    while client.get("/v1/projects/one", headers=key).json()["stats"]["dyadic_position"] < 1:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    listed = client.get("/v1/projects").json()
    assert [p["stats"]["n_labels"] for p in listed] == [20, 0]
    for p in listed:
        assert p == client.get(f"/v1/projects/{p['name']}").json()


def test_hyperparameters_and_slots(client: TestClient) -> None:
    r = client.post(
        "/v1/projects",
        json={
            "name": "h",
            "labels": ["a", "b"],
            "worker_slots": 1024,
            "hyperparameters": {"eta0": 2.0, "difficulty": True},
        },
    )
    assert r.status_code == 201
    body = r.json()
    assert body["worker_slots"] == 1024 and body["hyperparameters"]["eta0"] == 2.0
    assert body["hyperparameters"]["difficulty"] is True


# ---------------------------------------------------------------------------- keys
def test_keys_and_scopes(client: TestClient) -> None:
    key_a = make_project(client, "a")
    key_b = make_project(client, "b")
    anon = {"Authorization": ""}
    assert client.get("/v1/projects/a", headers=anon).json()["error"]["code"] == "missing_key"
    assert client.get("/v1/projects/a", headers=anon).status_code == 401
    # a key sent another way is named (it read 'send an API key', as if none had been sent)
    for header, got in (
        ("Basic abc", "got a 'Basic' Authorization header"),
        (key_a["Authorization"][7:], "got an Authorization header without 'Bearer '"),
        ("Bearer ", "got an empty Bearer key"),
    ):
        err = client.get("/v1/projects/a", headers={"Authorization": header}).json()["error"]
        assert err["code"] == "missing_key" and err["message"].endswith(got), err
    r = client.get("/v1/projects/a", headers={"Authorization": "Bearer nope"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_key"
    # a project's key reaches nothing of another project
    assert client.get("/v1/projects/b", headers=key_a).status_code == 403
    refused = post(client, key_a, triples(3), project="b")
    assert refused.status_code == 403  # (it said the key's scope did not allow read access)
    assert refused.json()["error"]["message"] == "this key belongs to project 'a', not 'b'"
    assert client.get("/v1/projects/b/items/img1", headers=key_a).status_code == 403
    assert client.get("/v1/projects/b/export", headers=key_a).status_code == 403
    # project keys are not admin keys
    assert client.get("/v1/projects", headers=key_a).status_code == 403
    assert client.delete("/v1/projects/b", headers=key_b).status_code == 403
    # a read key reads but cannot write
    r = client.post("/v1/projects/a/keys", json={"scope": "read"})
    read = {"Authorization": "", "X-API-Key": r.json()["api_key"]}
    assert client.get("/v1/projects/a", headers=read).status_code == 200
    r = post(client, read, triples(3), project="a")
    assert r.status_code == 403 and log_end(client, key_a, "a") == 0


# ---------------------------------------------------------------------------- bad input
BAD_BLOCKS = [
    (
        "unknown label",
        [{"item": "i", "worker": "w", "label": "purple"}],
        422,
        "unknown_label",
        1,
        "label",
    ),
    (
        "empty item",
        [{"item": "", "worker": "w", "label": "white"}],
        422,
        "invalid_label",
        1,
        "item",
    ),
    (
        "oversized worker id",
        [{"item": "i", "worker": "w" * 513, "label": "white"}],
        422,
        "invalid_label",
        1,
        "worker",
    ),
    (
        "oversized label id",
        [{"item": "i", "worker": "w", "label": "white", "id": "x" * 513}],
        422,
        "invalid_label",
        1,
        "id",
    ),
    (
        "label not a string",
        [{"item": "i", "worker": "w", "label": 3}],
        422,
        "invalid_label",
        1,
        "label",
    ),
    (
        "item not a string",
        [{"item": 17, "worker": "w", "label": "white"}],
        422,
        "invalid_label",
        1,
        "item",
    ),
    (
        "weight not a number",
        [{"item": "i", "worker": "w", "label": "white", "weight": "heavy"}],
        422,
        "invalid_label",
        1,
        "weight",
    ),
    (
        "negative weight",
        [{"item": "i", "worker": "w", "label": "white", "weight": -1}],
        422,
        "invalid_label",
        1,
        "weight",
    ),
    ("missing worker", [{"item": "i", "label": "white"}], 422, "invalid_label", 1, "worker"),
    (
        "unknown field",
        [{"item": "i", "worker": "w", "label": "white", "colour": 1}],
        422,
        "invalid_label",
        1,
        "colour",
    ),
    ("entry not an object", ["i,w,white"], 422, "invalid_label", 1, None),
    (
        "not an array",
        {"item": "i", "worker": "w", "label": "white"},
        422,
        "invalid_block",
        None,
        None,
    ),
    ("empty block", [], 422, "empty_block", None, None),
]


@pytest.mark.parametrize(
    ("case", "bad", "status", "code", "entry", "field"), BAD_BLOCKS, ids=[b[0] for b in BAD_BLOCKS]
)
def test_bad_block_is_rejected_whole(
    client: TestClient,
    case: str,
    bad: Any,
    status: int,
    code: str,
    entry: int | None,
    field: str | None,
) -> None:
    key = make_project(client)
    good = [{"item": "i0", "worker": "w", "label": "white", "id": "good"}]
    block = good + bad if isinstance(bad, list) and bad else bad
    r = post(client, key, block, wait=False)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == code
    assert err["entry"] == entry and err["field"] == field
    if entry is not None:
        assert f"entry {entry}" in err["message"]
    assert "field None" not in err["message"]  # (an entry that is not an object said so)
    # nothing of the block was applied, not even its good first entry
    assert log_end(client, key) == 0
    assert client.get("/v1/projects/census/items/i0", headers=key).status_code == 404
    assert post(client, key, good).json()["accepted"] == 1  # its id was not burnt either


def test_oversized_block(client: TestClient) -> None:
    key = make_project(client)
    r = post(client, key, triples(51), wait=False)  # the fixture's limit is 50
    assert r.status_code == 413 and r.json()["error"]["code"] == "block_too_large"
    assert "limit is 50" in r.json()["error"]["message"]
    assert log_end(client, key) == 0


def test_oversized_body_is_refused_before_parsing(client: TestClient) -> None:
    key = make_project(client)
    body = b"[" + b" " * (50 * 2048) + b"]"  # over 2 KiB per label at the fixture's limit of 50
    r = client.post("/v1/projects/census/labels", content=body, headers=key)
    assert r.status_code == 413 and r.json()["error"]["code"] == "block_too_large"
    assert "102,402-byte body" in r.json()["error"]["message"]
    assert log_end(client, key) == 0


def test_invalid_json(client: TestClient) -> None:
    key = make_project(client)
    r = client.post("/v1/projects/census/labels", content=b'[{"item": ', headers=key)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    assert log_end(client, key) == 0


def test_unknown_project_and_item(client: TestClient) -> None:
    key = make_project(client)
    r = client.post("/v1/projects/nope/labels", content=orjson.dumps(triples(2)))
    assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_project"
    r = client.get("/v1/projects/census/items/never", headers=key)
    assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_item"
    r = client.get("/v1/projects/census/workers/never", headers=key)
    assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_worker"


@pytest.mark.parametrize(
    ("path", "field"),
    [("queue?worker=%0A", "worker"), ("boundary?worker=%00", "worker"),
     ("boundary?item=%09", "item"), ("boundary?item=a%C2%85b", "item")],
)  # fmt: skip
def test_an_id_in_the_query_with_a_control_character_is_refused(
    client: TestClient, path: str, field: str
) -> None:
    """As in a body: NUL, newline, tab, and U+0085 (NEL) were served, echoed back (200)."""
    make_project(client)
    r = client.get(f"/v1/projects/census/{path}")
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["code"] == "invalid_request" and error["field"] == field
    assert "no control characters" in error["message"]


def test_a_block_for_a_project_deleted_meanwhile_is_answered_404(client: TestClient) -> None:
    """A request that found its project, which is then deleted before the block is appended
    (the service's record of it still cached): 404, not 500 (embedded) nor 202 (Redis, where
    the block went to keys of no project, which a project created later under the name read
    as its own log)."""
    make_project(client)
    svc = client.app.state.service  # type: ignore[attr-defined]
    svc.project("census")  # found, and cached
    assert svc.store.delete_project("census")
    r = client.post("/v1/projects/census/labels", content=orjson.dumps(triples(2)))  # (admin)
    assert r.status_code == 404, r.text
    assert r.json()["error"] == {**r.json()["error"], "code": "unknown_project"}
    assert "'census' was deleted" in r.json()["error"]["message"]
    key = make_project(client)  # a new project of that name starts from an empty log
    assert log_end(client, key) == 0


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "bad name!", "labels": ["a", "b"]}, "name"),
        ({"name": "p", "labels": ["a"]}, "labels"),
        ({"name": "p", "labels": ["a", "a"]}, "labels"),
        ({"name": "p", "labels": ["a", "b\nc"]}, "labels.1"),  # (it broke exports' rows)
        ({"name": "p", "labels": ["a", "b"], "worker_slots": 0}, "worker_slots"),
        (
            {"name": "p", "labels": ["a", "b"], "hyperparameters": {"rho": -1}},
            "hyperparameters.rho",
        ),
        (
            {"name": "p", "labels": ["a", "b"], "hyperparameters": {"class_prior": [1, 2, 3]}},
            "hyperparameters",
        ),
        # values past which the model's arithmetic overflowed and every read failed
        (
            {"name": "p", "labels": ["a", "b"], "hyperparameters": {"eta0": 1e308}},
            "hyperparameters.eta0",
        ),
        (
            {"name": "p", "labels": ["a", "b"], "hyperparameters": {"tau0": 0}},
            "hyperparameters.tau0",
        ),
        (
            {"name": "p", "labels": ["a", "b"], "hyperparameters": {"n_items": 1e-300}},
            "hyperparameters.n_items",
        ),
        (
            {"name": "p", "labels": ["a", "b"], "hyperparameters": {"class_rate": 1e6}},
            "hyperparameters.class_rate",
        ),
        (
            {"name": "p", "labels": ["a", "b"], "hyperparameters": {"population_prior": 1e300}},
            "hyperparameters.population_prior",
        ),
        (  # each within its bound, together a first step that made the parameters NaN
            {
                "name": "p",
                "labels": ["a", "b"],
                "hyperparameters": {"eta0": 1e6, "rho": 0, "tau0": 1, "population_rate": 1000},
            },
            "hyperparameters",
        ),
        (  # a prior whose sum overflows: every item was served 500 (NaN parameters)
            {"name": "p", "labels": ["a", "b"], "hyperparameters": {"class_prior": [1e308, 1e308]}},
            "hyperparameters",
        ),
    ],
)
def test_bad_project(client: TestClient, body: dict[str, Any], field: str) -> None:
    r = client.post("/v1/projects", json=body)
    assert r.status_code == 422, r.text
    assert r.json()["error"]["field"] == field
    assert client.get("/v1/projects").json() == []


@pytest.mark.parametrize(
    "hyper",
    [
        {"class_prior": [1.0, 2.0, 1e-300, 1.0, 1.0]},
        {  # a first step at its bound (eta0 1e6 with these rates is refused: NaN with n_items 100;
            # Gamma's step is population_rate x K/2, 1e3 over these 5 classes)
            "eta0": 1e3,
            "tau0": 1.0,
            "rho": 0.0,
            "population_rate": 400.0,
            "class_rate": 1e3,
            "n_items": 1.0,
        },
        {"eta0": 1e3, "tau0": 1.0, "rho": 0.0, "population_rate": 400.0, "n_items": 100.0},
        {
            "worker_prior": 1e6,
            "population_prior": 1e6,
            "class_prior_strength": 1e6,
            "population_diagonal": -100.0,
        },
        {"difficulty": True, "difficulty_prior": 1e6, "population_diagonal": 100.0},
    ],
)
def test_hyperparameters_within_their_bounds_serve_every_read(
    client: TestClient, hyper: dict[str, Any]
) -> None:
    """Extreme settings (a class prior among them, which the project listing once failed to
    serve) still give a project whose every read answers."""
    r = client.post("/v1/projects", json={"name": "p", "labels": LABELS, "hyperparameters": hyper})
    assert r.status_code == 201, r.text
    assert r.json()["hyperparameters"]["class_prior"] == hyper.get("class_prior")
    key = {"Authorization": f"Bearer {r.json()['api_key']}"}
    assert post(client, key, triples(40), project="p").status_code == 202
    for path in ("", "/items/img1", "/items", "/workers/w1", "/workers", "/queue"):
        assert client.get(f"/v1/projects/p{path}").status_code == 200, path
    assert [p["name"] for p in client.get("/v1/projects").json()] == ["p"]


def test_operations_endpoints(client: TestClient) -> None:
    key = make_project(client)
    post(client, key, triples(10))
    assert client.get("/healthz", headers={"Authorization": ""}).json() == {"status": "ok"}
    for path in ("/healthz", "/readyz"):  # (load balancers that check with HEAD)
        head = client.head(path, headers={"Authorization": ""})
        assert head.status_code == 200 and head.content == b"", path
    ready = client.get("/readyz").json()
    assert ready["ready"] and ready["engine_lag"] == {"census": 0}
    text = client.get("/metrics").text
    assert 'crowdtally_labels_total{outcome="accepted",project="census"}' in text
    assert 'crowdtally_engine_lag_entries{project="census"} 0.0' in text
    assert 'crowdtally_queue_items{project="census"}' in text
    assert 'crowdtally_online_steps_total{project="census"}' in text
    assert 'crowdtally_batch_em_iterations_total{project="census"} 0.0' in text
    assert 'crowdtally_dyadic_lag_entries{project="census"}' in text
    assert 'crowdtally_store_seconds_count{op="append"}' in text
    assert "\ncrowdtally_store_up 1.0\n" in text


def test_metrics_say_when_the_store_does_not_answer(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The projects' lag and failure series are absent while the store is down: a gauge says
    so, for an alert that would otherwise go silent with the outage."""
    make_project(client)
    monkeypatch.setattr(client.app.state.service.store, "ping", lambda: False)  # type: ignore[attr-defined]
    text = client.get("/metrics").text
    assert "\ncrowdtally_store_up 0.0\n" in text
    assert "crowdtally_engine_lag_entries{" not in text


def test_openapi_has_stable_operation_ids(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    ids = {op["operationId"] for path in spec["paths"].values() for op in path.values()}
    assert {
        "create_project",
        "post_labels",
        "get_item",
        "list_items",
        "export_items",
        "get_worker",
        "list_workers",
        "post_gold",
        "refit",
        "healthz",
        "readyz",
    } <= ids


def test_workers_by_name_page_without_missing_any_while_labels_arrive(client: TestClient) -> None:
    """Paged by rank while labels arrive, a listing missed workers and repeated others (the
    ranking moved between pages); by name, a new worker shifts later pages only."""
    key = make_project(client)
    post(
        client,
        key,
        [{"item": f"i{k}", "worker": f"w{k:02d}", "label": LABELS[0]} for k in range(30)],
    )
    url = "/v1/projects/census/workers"
    first = client.get(url, params={"order": "name", "limit": 10}, headers=key).json()
    assert [w["worker"] for w in first["workers"]] == [f"w{k:02d}" for k in range(10)]
    post(client, key, [{"item": "i0", "worker": "w00a", "label": LABELS[1]}])  # (sorts early)
    seen = [w["worker"] for w in first["workers"]]
    for offset in (10, 20, 30):
        page = client.get(url, params={"order": "name", "limit": 10, "offset": offset}, headers=key)
        seen += [w["worker"] for w in page.json()["workers"]]
    assert {f"w{k:02d}" for k in range(30)} <= set(seen)


def test_a_project_saved_beyond_todays_bounds_is_still_listed_and_read(
    client: TestClient, store: Store
) -> None:
    """Bounds added later (a first step above MAX_FIRST_STEP, dyadic eta x rate above 100)
    are for new input: one such project made every listing of projects answer 500."""
    assert client.post("/v1/projects", json={"name": "p", "labels": ["a", "b"]}).status_code == 201
    record = store.get_project("p")
    assert record is not None
    config = {**record.config, "eta0": 1e300}
    config["dyadic"] = {**config["dyadic"], "eta": 100.0, "dyadic_rate": 100.0}
    store.create_project(replace(record, name="legacy", config=config))
    listed = client.get("/v1/projects")
    assert listed.status_code == 200, listed.text
    one = client.get("/v1/projects/legacy").json()
    assert one["hyperparameters"]["eta0"] == 1e300 and one["dyadic"]["eta"] == 100.0


def test_queue_settings_not_applied_within_the_wait_answer_504(tmp_path: Path) -> None:
    """With the engine stopped, PUT queue/settings?wait=true answered 202 with the policy
    asked for after the wait, while GET still showed the old one."""
    settings = service_settings(tmp_path, wait_timeout_s=0.3)
    with TestClient(create_app(settings), headers={"Authorization": f"Bearer {ADMIN}"}) as c:
        assert c.post("/v1/projects", json={"name": "p", "labels": ["a", "b"]}).status_code == 201
        c.app.state.service.engine.stop()  # type: ignore[attr-defined]
        r = c.put("/v1/projects/p/queue/settings?wait=true", json={"policy": "margin"})
        assert r.status_code == 504 and r.json()["error"]["code"] == "not_applied"
        assert c.get("/v1/projects/p/queue/settings").json()["policy"] != "margin"


def test_a_slow_summary_tally_is_kept_a_while_and_a_quiet_one_until_labels_come(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every summary read every item's posterior (23 s on a project of 6.86M items, which a
    dashboard asks for every few seconds)."""
    from app.api import views

    key = make_project(client)
    post(client, key, triples(20))

    def histogram() -> list[int]:
        got = client.get("/v1/projects/census/summary", headers=key).json()
        return list(got["confidence_histogram"]["counts"])

    first = histogram()
    scans = []
    real = views.stored_pages
    monkeypatch.setattr(views, "stored_pages", lambda *a: scans.append(1) or real(*a))
    assert histogram() == first and not scans  # nothing applied since: kept
    post(client, key, [*triples(20, offset=20), {"item": "new", "worker": "w9", "label": "black"}])
    assert sum(histogram()) == sum(first) + 1 and len(scans) == 1  # quick to make: made again
    monkeypatch.setattr(views.TALLIES, "slow_s", 0.0)  # as if it were slow: kept a while
    monkeypatch.setattr(views.TALLIES, "reuse", 1e9)
    post(client, key, [{"item": "newer", "worker": "w9", "label": "black"}])
    assert sum(histogram()) == sum(first) + 1 and len(scans) == 1
