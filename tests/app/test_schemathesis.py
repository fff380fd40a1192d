"""The service against its own OpenAPI document: schemathesis generates requests for every
operation (valid ones and, for the same operations, invalid ones) and checks each response:
no 5xx, a documented status code, a documented content type, a body its schema accepts.

Bounded: a few derandomized examples per operation and generation mode, no shrinking, on the
embedded store in a temporary directory, the engine in process. Requests go through the
test's own ``TestClient`` (the service's lifespan and its requests share one event loop);
schemathesis only generates the cases and checks the responses.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Ok
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from app.api import create_app
from tests.app.conftest import ADMIN, service_settings

LABELS = ["cat", "dog", "bird"]
PROJECT = "fuzz"
EXAMPLES = 10
"""Per operation and generation mode (positive, negative)."""
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
LAST = ("delete_project", "rotate_admin_key")
"""Run after every other operation: each takes away what the others use (the project, the
admin key the requests carry; their later examples answer 404 / 401, both documented)."""


def _send(api: TestClient, case: Any, headers: dict[str, str]) -> Any:
    """The case as an httpx request through the service's test client."""
    kw = case.as_transport_kwargs(base_url="http://testserver", headers=headers)
    body: dict[str, Any] = {}
    if "json" in kw:
        body["json"] = kw["json"]
    elif isinstance(kw.get("data"), bytes | str):  # raw bodies (httpx: content=)
        body["content"] = kw["data"]
    elif kw.get("data") is not None:  # form fields
        body["data"] = kw["data"]
    if kw.get("cookies"):
        api.cookies.clear()
        for name, value in kw["cookies"].items():
            api.cookies.set(name, value)
    try:
        return api.request(
            kw["method"], kw["url"], params=kw.get("params"), headers=kw["headers"], **body
        )
    finally:
        api.cookies.clear()


def _fuzz(
    api: TestClient, strategy: Any, headers: dict[str, str], mode: str, failures: list[str]
) -> int:
    """Send the strategy's cases; each failed check is one line of ``failures``."""
    sent = 0

    @settings(
        max_examples=EXAMPLES,
        derandomize=True,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy)
    def run(case: Any) -> None:
        nonlocal sent
        sent_headers = {**(case.headers or {}), **headers}
        response = _send(api, case, sent_headers)
        sent += 1
        try:
            case.validate_response(response, checks=CHECKS, headers=sent_headers)
        except (AssertionError, BaseExceptionGroup) as exc:  # FailureGroup: each failed check
            failures.append(f"{case.operation.label} {mode}: {exc}")

    with contextlib.suppress(Unsatisfiable):  # a negative mode with nothing left to negate
        run()
    return sent


@pytest.mark.slow
def test_schemathesis_every_operation(tmp_path: Path) -> None:
    app = create_app(service_settings(tmp_path, max_block_labels=50))
    # the admin key reaches every operation (a project's key is refused its keys, its deletion)
    admin = {"Authorization": f"Bearer {ADMIN}"}
    failures: list[str] = []
    sent: dict[str, int] = {}
    # an unhandled exception is answered 500 (errors.py) for not_a_server_error to see
    with TestClient(app, raise_server_exceptions=False) as api:
        r = api.post("/v1/projects", json={"name": PROJECT, "labels": LABELS}, headers=admin)
        assert r.status_code == 201, r.text
        labels = [
            {"item": f"i{i}", "worker": f"w{i % 4}", "label": LABELS[(i + i // 4) % 3]}
            for i in range(40)
        ]
        r = api.post(
            f"/v1/projects/{PROJECT}/labels", params={"wait": True}, json=labels, headers=admin
        )
        assert r.status_code == 202, r.text

        schema = schemathesis.openapi.from_dict(api.get("/openapi.json").json())
        operations = []
        for result in schema.get_all_operations():
            assert isinstance(result, Ok), result.err()  # an operation schemathesis cannot read
            operations.append(result.ok())
        operations.sort(key=lambda op: (op.definition.raw.get("operationId") in LAST, op.label))
        modes = [schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE]
        for op in operations:
            pinned = {"project": PROJECT} if "{project}" in op.path else None
            raw = op.definition.raw
            negatable = raw.get("requestBody") or any(
                x["name"] != "project" for x in raw.get("parameters", [])
            )
            for mode in modes if negatable else modes[:1]:
                strategy = op.as_strategy(generation_mode=mode, path_parameters=pinned)
                n = _fuzz(api, strategy, admin, f"({mode.value})", failures)
                sent[op.label] = sent.get(op.label, 0) + n
    assert not failures, f"{len(failures)} failures:\n" + "\n\n".join(failures[:20])
    assert len(sent) == len(operations) >= 30 and min(sent.values()) >= 1, sent
