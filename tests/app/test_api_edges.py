"""The API's edges: its docs pages without internet, answers for items without labels, and
the hardening of what reaches it (body sizes, numbers, malformed JSON, ids, a Redis that is
down, unknown routes, the OpenAPI document's references)."""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path
from typing import Any

import orjson
import pytest
from fastapi.testclient import TestClient

from app.api import create_app
from tests.app.conftest import service_settings
from tests.app.test_api import LABELS, make_project


@pytest.fixture
def bare(tmp_path: Path) -> TestClient:
    """The app without its lifespan (no store): enough for pages and routes that need none."""
    return TestClient(create_app(service_settings(tmp_path)))


@pytest.mark.parametrize(
    ("page", "assets"),
    [("/docs", {"text/css", "text/javascript", "image/png"}), ("/redoc", {"text/javascript"})],
)
def test_docs_pages_load_their_assets_from_this_service(
    bare: TestClient, page: str, assets: set[str]
) -> None:
    r = bare.get(page)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    html = r.text
    assert "//" not in re.sub(r"<!--.*?-->", "", html, flags=re.S).replace("://", ""), html
    assert not re.search(r"https?:", html), "a URL to another host"
    urls = re.findall(r'(?:src|href|spec-url)="([^"]+)"', html)
    urls += re.findall(r"url: '([^']+)'", html)
    assert "/openapi.json" in urls
    seen = set()
    for url in urls:
        assert url.startswith("/"), url
        got = bare.get(url)
        assert got.status_code == 200, url
        kind = got.headers["content-type"].split(";")[0]
        seen.add(kind if kind != "application/javascript" else "text/javascript")
        if url.endswith(".js"):
            assert len(got.content) > 100_000 and b"function" in got.content[:2000], url
        if url.endswith(".css"):
            assert b"{" in got.content and len(got.content) > 10_000, url
    assert assets <= seen, seen


def _post(client: TestClient, key: dict[str, str], what: str, block: Any) -> None:
    r = client.post(
        f"/v1/projects/census/{what}",
        params={"wait": True},
        content=orjson.dumps(block),
        headers=key,
    )
    assert r.status_code == 202 and r.json()["applied"], r.text


def test_an_item_without_labels_has_no_label(client: TestClient) -> None:
    key = make_project(client)
    _post(client, key, "items", [{"item": "fresh"}, {"item": "seen"}])
    _post(
        client,
        key,
        "labels",
        [{"item": "seen", "worker": f"w{j}", "label": "white"} for j in range(3)],
    )
    _post(client, key, "gold", [{"item": "known", "label": "black"}])
    fresh = client.get("/v1/projects/census/items/fresh", headers=key).json()
    assert fresh["label"] is None and fresh["probability"] is None, fresh
    assert fresh["n_labels"] == 0 and fresh["labels"] == [] and fresh["gold"] is None
    assert set(fresh["posterior"]) == set(LABELS)  # the class prior
    assert sum(fresh["posterior"].values()) == pytest.approx(1.0)
    seen = client.get("/v1/projects/census/items/seen", headers=key).json()
    assert seen["label"] == "white" and seen["probability"] > 0.5
    known = client.get("/v1/projects/census/items/known", headers=key).json()
    assert (known["label"], known["probability"], known["n_labels"]) == ("black", 1.0, 0)
    r = client.get("/v1/projects/census/items/never", headers=key)
    assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_item"

    def listed(**params: Any) -> dict[str, Any]:
        r = client.get("/v1/projects/census/items", params=params, headers=key)
        assert r.status_code == 200, r.text
        return {x["item"]: x for x in r.json()["items"]}

    items = listed()
    assert set(items) == {"fresh", "seen", "known"}
    assert items["fresh"]["label"] is None and items["fresh"]["probability"] is None
    assert items["seen"]["label"] == "white" and items["known"]["label"] == "black"
    # no probability: kept while there is no lower bound
    assert "fresh" in listed(max_probability=0.5) and "fresh" not in listed(min_probability=0.01)
    lines = client.get("/v1/projects/census/export", headers=key).text.splitlines()
    exported = {x["item"]: x for x in map(orjson.loads, lines)}
    assert exported["fresh"]["label"] is None and exported["fresh"]["probability"] is None
    assert exported["seen"]["label"] == "white"
    text = client.get("/v1/projects/census/export", params={"format": "csv"}, headers=key).text
    rows = {r["item"]: r for r in csv.DictReader(io.StringIO(text))}
    assert rows["fresh"]["label"] == "" and rows["fresh"]["probability"] == ""
    assert rows["seen"]["label"] == "white" and float(rows["seen"]["probability"]) > 0.5
    queue = client.get("/v1/projects/census/queue", headers=key).json()["items"]
    queued = {x["item"]: x for x in queue}
    assert queued["fresh"]["label"] is None and queued["fresh"]["probability"] is None
    summary = client.get("/v1/projects/census/summary", headers=key).json()
    assert sum(summary["label_counts"].values()) == 2  # seen and known: fresh has no label
    assert summary["label_counts"]["asian"] == 0
    assert sum(summary["confidence_histogram"]["counts"]) == 2
