"""Push-back: while a project's engine lags more than ``CROWDTALLY_MAX_LAG_S``, label and gold
blocks are refused (429 ``engine_behind``, ``Retry-After``) and nothing of them is appended;
once the engine caught up, the same block is taken, and every acknowledged label is applied
exactly once. On both stores (Redis: the real server), the engine held back (not in process,
run by the test when it should catch up)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest
from fastapi.testclient import TestClient

from app.api import create_app
from app.api.errors import engine_behind
from app.engine.loop import EngineLoop
from app.io import transfer
from app.io.transfer import call
from app.store.base import Store
from tests.app.conftest import ADMIN, service_settings

BOUND_S = 0.4
PROJECT = {"name": "p", "labels": ["a", "b"], "worker_slots": 64, "dyadic": {"enabled": False}}


def _block(tag: str, n: int) -> list[dict[str, str]]:
    return [
        {"item": f"{tag}{k % 7}", "worker": f"w{k}", "label": "ab"[k % 2], "id": f"{tag}-{k}"}
        for k in range(n)
    ]


def _api(store: Store, tmp_path: Path, max_lag_s: float) -> TestClient:
    """The API alone: its engine never runs in process (the test applies the log)."""
    settings = service_settings(tmp_path, engine_in_process=False, max_lag_s=max_lag_s)
    return TestClient(
        create_app(settings, store=store), headers={"Authorization": f"Bearer {ADMIN}"}
    )


def _project(api: TestClient) -> dict[str, str]:
    """Create the project; its write key's header."""
    return {"Authorization": f"Bearer {api.post('/v1/projects', json=PROJECT).json()['api_key']}"}


@pytest.fixture
def held(store: Store, tmp_path: Path) -> Iterator[tuple[TestClient, dict[str, str]]]:
    with _api(store, tmp_path, BOUND_S) as api:
        yield api, _project(api)


def _metric(text: str, name: str, **labels: str) -> float | None:
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        m = re.fullmatch(rf"{name}\{{(.*)\}} (\S+)", line)
        if m and ",".join(sorted(m.group(1).split(","))) == want:
            return float(m.group(2))
    return None


def _logged_ids(store: Store) -> list[str]:
    """Every label id of the project's log, in order (each entry's labels)."""
    out: list[str] = []
    for e in store.read_log("p", 0, 1000):
        if e.kind == "labels":
            out.extend(i for i in orjson.loads(e.payload)["ids"] if i is not None)
    return out


def test_a_block_is_refused_while_the_engine_is_behind_then_taken(
    held: tuple[TestClient, dict[str, str]], store: Store
) -> None:
    api, key = held
    first, second = _block("x", 30), _block("y", 20)
    before = api.get("/metrics").text  # (the counters are the process's: tests add up)
    ok = api.post("/v1/projects/p/labels", json=first, headers=key)
    assert ok.status_code == 202 and ok.json()["accepted"] == 30, ok.text
    time.sleep(BOUND_S + 0.3)  # the engine does not run: the block waits past the bound
    assert store.lag_seconds("p") > BOUND_S
    r = api.post("/v1/projects/p/labels", json=second, headers=key)
    assert r.status_code == 429, r.text
    body = r.json()
    assert set(body) == {"error"} and body["error"]["code"] == "engine_behind", body
    assert set(body["error"]) == {"code", "message", "entry", "field"}
    assert re.fullmatch(r"[1-9][0-9]*", r.headers["retry-after"]), r.headers
    gold = api.post("/v1/projects/p/gold", json=[{"item": "y0", "label": "a"}], headers=key)
    assert gold.status_code == 429 and gold.json()["error"]["code"] == "engine_behind"
    assert int(gold.headers["retry-after"]) >= 1
    # nothing of the refused blocks is in the log, and their ids are not taken
    assert store.log_end("p") == 1
    assert _logged_ids(store) == [x["id"] for x in first]
    metrics = api.get("/metrics").text
    assert (_metric(metrics, "crowdtally_engine_lag_seconds", project="p") or 0) > BOUND_S
    assert _metric(metrics, "crowdtally_engine_lag_entries", project="p") == 1
    for name, labels, n in (
        ("crowdtally_blocks_refused_total", {"kind": "labels"}, 1),
        ("crowdtally_blocks_refused_total", {"kind": "gold"}, 1),
        ("crowdtally_labels_total", {"outcome": "refused"}, 20),
    ):
        was = _metric(before, name, project="p", **labels) or 0
        assert _metric(metrics, name, project="p", **labels) == was + n, (name, labels)
    # refused before it is parsed (an overload does not cost the API a parse per block): not
    # even a block that is not JSON gets further than the 429
    junk = api.post("/v1/projects/p/labels", content=b'[{"item": "z", not json', headers=key)
    assert junk.status_code == 429 and junk.json()["error"]["code"] == "engine_behind"

    EngineLoop(store, refine_passes=0).run_until_idle()  # the engine catches up
    assert store.lag_seconds("p") == 0
    again = api.post("/v1/projects/p/labels", json=second, headers=key)
    assert again.status_code == 202, again.text
    assert again.json()["accepted"] == 20 and again.json()["duplicates"] == 0
    assert api.post("/v1/projects/p/labels", json=second, headers=key).json()["duplicates"] == 20
    EngineLoop(store, refine_passes=0).run_until_idle()
    # every acknowledged label applied exactly once
    assert _logged_ids(store) == [x["id"] for x in first + second]
    stats = api.get("/v1/projects/p", headers=key).json()["stats"]
    assert stats["n_labels"] == 50 and stats["lag"] == 0, stats
    for item in {x["item"] for x in first + second}:
        got = api.get(f"/v1/projects/p/items/{item}", headers=key).json()
        want = sorted((x["worker"], x["label"]) for x in first + second if x["item"] == item)
        assert sorted((x["worker"], x["label"]) for x in got["labels"]) == want, item
    metrics = api.get("/metrics").text
    assert _metric(metrics, "crowdtally_engine_lag_seconds", project="p") == 0


def test_zero_disables_the_check(store: Store, tmp_path: Path) -> None:
    with _api(store, tmp_path, 0.0) as api:
        key = _project(api)
        r = api.post("/v1/projects/p/labels", json=_block("x", 5), headers=key)
        assert r.status_code == 202, r.text
        time.sleep(0.3)
        assert store.lag_seconds("p") >= 0.25  # behind, and measured ...
        for tag in "yz":  # ... but never refused
            r = api.post("/v1/projects/p/labels", json=_block(tag, 5), headers=key)
            assert r.status_code == 202, r.text
        r = api.post("/v1/projects/p/gold", json=[{"item": "y0", "label": "a"}], headers=key)
        assert r.status_code == 202, r.text
        assert store.log_end("p") == 4


def test_lag_is_the_wait_of_the_oldest_entry_not_applied(store: Store, tmp_path: Path) -> None:
    """0 with nothing to apply; the oldest waiting entry's age; 0 again once applied."""
    with _api(store, tmp_path, 0.0) as api:
        key = _project(api)
        assert store.lag_seconds("p") == 0
        api.post("/v1/projects/p/labels", json=_block("x", 5), headers=key)
        time.sleep(0.3)
        api.post("/v1/projects/p/labels", json=_block("y", 5), headers=key)
        assert 0.25 <= store.lag_seconds("p") < 5  # the first block's wait, not the second's
        EngineLoop(store, refine_passes=0).run_until_idle()
        assert store.lag_seconds("p") == 0


def test_retry_after_grows_with_the_excess_up_to_the_bound() -> None:
    def wait(lag: float, bound: float) -> int:
        return int((engine_behind("p", lag, bound).headers or {})["Retry-After"])

    assert [wait(lag, 5.0) for lag in (5.01, 6.5, 8.0, 30.0, 3600.0)] == [1, 2, 3, 5, 5]
    assert wait(0.7, 0.5) == 1 and wait(2.0, 0.5) == 1  # never below 1 s


def test_the_import_command_waits_out_a_429_even_where_it_does_not_retry() -> None:
    """``crowdtally import`` posts gold without retries (no ids), but a 429 took nothing."""
    answers = [httpx.Response(429, headers={"Retry-After": "0"}), httpx.Response(202, json={})]
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return answers.pop(0)

    with httpx.Client(transport=httpx.MockTransport(handler), base_url="http://ct.test") as http:
        r = call(
            http, "POST", "/v1/projects/p/gold", body=[{"item": "i", "label": "a"}], retry=False
        )
        assert r.status_code == 202 and len(seen) == 2
        answers[:] = [httpx.Response(503)]  # other errors: still not retried
        assert call(http, "POST", "/v1/projects/p/gold", body=[], retry=False).status_code == 503


def test_the_import_command_waits_for_a_busy_engine_beyond_its_retries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Push-back is not a failure: 429s do not spend ``--retries`` (a 1M-answer import into a
    busy embedded service gave up after five of them); they are waited out up to
    PUSHBACK_WAIT_S in all, then answered as they are."""
    slept: list[float] = []
    monkeypatch.setattr(transfer.time, "sleep", slept.append)
    answers = [httpx.Response(429, headers={"Retry-After": "2"}) for _ in range(12)]
    answers.append(httpx.Response(202, json={}))

    def handler(request: httpx.Request) -> httpx.Response:
        return answers.pop(0) if answers else httpx.Response(429, headers={"Retry-After": "8"})

    with httpx.Client(transport=httpx.MockTransport(handler), base_url="http://ct.test") as http:
        assert call(http, "POST", "/v1/projects/p/labels", body=[], retries=2).status_code == 202
        assert slept == [2.0] * 12
        slept.clear()
        assert call(http, "POST", "/v1/projects/p/labels", body=[], retries=2).status_code == 429
        assert sum(slept) == pytest.approx(transfer.PUSHBACK_WAIT_S) and set(slept) == {8.0}
