"""The OpenAPI document is the service's contract with its clients: it does not change by
accident. ``data/openapi_before.json`` is the document as it was before the API was split into
one router per domain; a deliberate change updates the file in the same commit."""

from __future__ import annotations

import json
from pathlib import Path

from fastapi.testclient import TestClient

from app.api import create_app
from tests.app.conftest import service_settings

FIXTURE = Path(__file__).with_name("data") / "openapi_before.json"


def test_openapi_document_unchanged() -> None:
    now = json.loads(json.dumps(create_app().openapi(), sort_keys=True))
    before = json.loads(FIXTURE.read_text())
    assert sorted(now["paths"]) == sorted(before["paths"])
    for path, ops in before["paths"].items():
        assert now["paths"][path] == ops, path
    assert now == before


def test_export_documents_its_two_content_types(tmp_path: Path) -> None:
    """``GET .../export`` streams NDJSON or CSV (tests/app/test_api.py checks what is served);
    /openapi.json says so, and not ``application/json``."""
    with TestClient(create_app(service_settings(tmp_path))) as api:
        document = api.get("/openapi.json").json()
    ok = document["paths"]["/v1/projects/{project}/export"]["get"]["responses"]["200"]
    assert sorted(ok["content"]) == ["application/x-ndjson", "text/csv"]
    assert "NDJSON" in ok["description"] and "CSV" in ok["description"]
