"""The API's edges: its docs pages without internet, answers for items without labels, and
the hardening of what reaches it (body sizes, numbers, malformed JSON, ids, a Redis that is
down, unknown routes, the OpenAPI document's references)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.api import create_app
from tests.app.conftest import service_settings


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
