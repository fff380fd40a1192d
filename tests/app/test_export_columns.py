"""The export, written from the stored records in columns, is byte for byte what the item's
JSON gives item by item (the listing's items, calibrated from their parsed label lists):
weighted labels, gold, unlabelled items and ids that CSV must quote included; and a Redis
holding records from before they carried their label counts is exported the same way."""

from __future__ import annotations

import csv
import io
from typing import Any

import numpy as np
import orjson
from fastapi.testclient import TestClient

from app.store.base import Store
from app.store.embedded import EmbeddedStore
from app.store.item_records import record_dtype, record_size
from app.store.redis_store import RedisStore
from tests.app.conftest import listed_items

CLASSES = ["cat", "dog, big", 'say "hi"']
ITEMS = 6 + 60 + 2  # (labelled, then registered without labels)


def _project(client: TestClient) -> dict[str, str]:
    r = client.post("/v1/projects", json={"name": "ex", "labels": CLASSES})
    assert r.status_code == 201, r.text
    return {"Authorization": f"Bearer {r.json()['api_key']}"}


def _fill(client: TestClient, key: dict[str, str]) -> None:
    rng = np.random.default_rng(3)
    names = ["plain", "a,b", 'q"uote', '"quoted"', "é ü", " lead"]
    names += [f"item {i}" for i in range(60)]
    block = [
        {
            "item": names[i % len(names)],
            "worker": f"w{i % 9}",
            "label": CLASSES[int(c)],
            "weight": float(w),
        }
        for i, (c, w) in enumerate(
            zip(rng.integers(0, 3, 400), rng.choice([0.1, 0.3, 0.7, 1.0, 1.9], 400), strict=True)
        )
    ]
    for lo in range(0, len(block), 50):  # (the test service takes blocks of 50)
        r = client.post("/v1/projects/ex/labels?wait=true", json=block[lo : lo + 50], headers=key)
        assert r.status_code == 202, r.text
    gold = [{"item": "a,b", "label": 'say "hi"'}, {"item": "item 7", "label": "cat"}]
    assert client.post("/v1/projects/ex/gold?wait=true", json=gold, headers=key).status_code == 202
    bare = [{"item": "no labels, yet"}, {"item": "bare"}]
    assert client.post("/v1/projects/ex/items?wait=true", json=bare, headers=key).status_code < 300


def _listed(client: TestClient, key: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Every item as the listing serves it (its stored JSON parsed), labels left out."""
    return listed_items(client, key, "ex", 25)


def _csv_row(x: dict[str, Any]) -> str:
    buf = io.StringIO()
    csv.writer(buf).writerow(
        [
            x["item"],
            x["label"] or "",
            "" if x["probability"] is None else f"{x['probability']:.6g}",
            *(f"{v:.6g}" for v in x["posterior"].values()),
            x["n_labels"],
            x["gold"] or "",
            x["computed_at"],
        ]
    )
    return buf.getvalue()


def _assert_exports_are_the_listing(client: TestClient, key: dict[str, str]) -> None:
    listed = _listed(client, key)
    jsonl = client.get("/v1/projects/ex/export", headers=key).content
    lines = jsonl.splitlines(keepends=True)
    assert len(lines) == len(listed) == ITEMS
    for line in lines:
        item = orjson.loads(line)["item"]
        assert line == orjson.dumps(listed.pop(item)) + b"\n"
    listed = _listed(client, key)
    text = client.get("/v1/projects/ex/export", params={"format": "csv"}, headers=key).text
    header, *rows = csv.reader(io.StringIO(text, newline=""))
    assert header == ["item", "label", "probability", *CLASSES, "n_labels", "gold", "computed_at"]
    assert text.startswith('item,label,probability,cat,"dog, big","say ""hi""",n_labels,')
    want = "".join(_csv_row(listed[row[0]]) for row in rows)
    assert text.split("\r\n", 1)[1] == want and len(rows) == ITEMS
    weighted = listed["plain"]
    assert weighted["n_labels"] > 0 and weighted["gold"] is None
    assert listed["bare"]["label"] is None and listed["a,b"]["gold"] == 'say "hi"'


def test_the_export_is_the_listing_byte_for_byte(client: TestClient) -> None:
    key = _project(client)
    _fill(client, key)
    _assert_exports_are_the_listing(client, key)


def test_records_from_before_label_counts_export_alike(client: TestClient, store: Store) -> None:
    """Every other item's record rewritten as a store kept from before records carried label
    counts holds it (a Redis across an upgrade): those pages are read from the items' JSON,
    with the same bytes."""
    key = _project(client)
    _fill(client, key)
    before = client.get("/v1/projects/ex/export", headers=key).content
    records = _records(store, "ex")
    old = {name: _uncounted(record) for name, record in sorted(records.items())[::2]}
    _put_records(store, "ex", old)
    assert client.get("/v1/projects/ex/export", headers=key).content == before
    _assert_exports_are_the_listing(client, key)
    _put_records(store, "ex", records)  # (a mutation check: the rewrite took)
    assert all(_records(store, "ex")[n] != r for n, r in old.items())


def _records(store: Store, project: str) -> dict[str, bytes]:
    names: list[str] = []
    records: list[bytes] = []
    cursor = 0
    while True:
        cursor, n, r = store.scan_records(project, cursor, 1000)
        names += n
        records += r
        if cursor == 0:
            return dict(zip(names, records, strict=True))


def _put_records(store: Store, project: str, records: dict[str, bytes]) -> None:
    """Replace the items' records, their label lists kept."""
    if isinstance(store, EmbeddedStore):
        store._state[project].items.update(records)
        return
    assert isinstance(store, RedisStore)
    key = store._k(project, "items")
    for name, record in records.items():
        value = store.r.hget(key, name)
        store.r.hset(key, name, record + value[record_size(value) :])


def _uncounted(record: bytes) -> bytes:
    """The record as written before records carried their item's label count and weight."""
    k = len(CLASSES)
    table = np.frombuffer(record, dtype=record_dtype(k))
    out = np.empty(1, dtype=record_dtype(k, counted=False))
    for field in out.dtype.names or ():
        out[field] = table[field]
    out["n_classes"] = k
    return out.tobytes()
