"""Structured logs: one JSON line per request, carrying the request id the caller sent."""

from __future__ import annotations

import io
import logging

import orjson
from fastapi.testclient import TestClient

from app.logs import JsonFormatter, TextFormatter


def test_access_log_is_json_with_request_id(client: TestClient) -> None:
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.setFormatter(JsonFormatter())
    access = logging.getLogger("crowdtally.access")
    access.addHandler(handler)
    access.setLevel(logging.INFO)
    try:
        r = client.get("/v1/projects", headers={"X-Request-ID": "req-42"})
        assert r.headers["x-request-id"] == "req-42"
        r2 = client.get("/v1/projects/nope")
        generated = r2.headers["x-request-id"]
        assert len(generated) == 16
    finally:
        access.removeHandler(handler)
    lines = [orjson.loads(x) for x in buf.getvalue().splitlines()]
    first = next(x for x in lines if x.get("request_id") == "req-42")
    assert first["msg"] == "request" and first["status"] == 200 and first["route"] == "/v1/projects"
    assert first["level"] == "info" and first["ts"].endswith("Z") and first["ms"] >= 0
    second = next(x for x in lines if x.get("request_id") == generated)
    assert second["status"] == 404 and second["route"] == "/v1/projects/{project}"


def test_text_logs_carry_the_same_fields(client: TestClient) -> None:
    """CROWDTALLY_LOG_FORMAT=text: a request's line names its method, path, status and id
    (it said only 'request')."""
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.setFormatter(TextFormatter("%(levelname)s %(name)s %(message)s"))
    access = logging.getLogger("crowdtally.access")
    access.addHandler(handler)
    access.setLevel(logging.INFO)
    try:
        client.get("/v1/projects", headers={"X-Request-ID": "req-43"})
    finally:
        access.removeHandler(handler)
    line = next(x for x in buf.getvalue().splitlines() if "request_id=req-43" in x)
    assert line.startswith("INFO crowdtally.access request ")
    assert "method=GET" in line and "path=/v1/projects" in line and "status=200" in line
