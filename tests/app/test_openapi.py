"""The OpenAPI document is the service's contract with its clients: it does not change by
accident. ``data/openapi_before.json`` is the document as it was before the API was split into
one router per domain; a deliberate change updates the file in the same commit."""

from __future__ import annotations

import json
from pathlib import Path

from app.api import create_app

FIXTURE = Path(__file__).with_name("data") / "openapi_before.json"


def test_openapi_document_unchanged() -> None:
    now = json.loads(json.dumps(create_app().openapi(), sort_keys=True))
    before = json.loads(FIXTURE.read_text())
    assert sorted(now["paths"]) == sorted(before["paths"])
    for path, ops in before["paths"].items():
        assert now["paths"][path] == ops, path
    assert now == before
