"""Calibrated posteriors through the service: served everywhere a posterior is read, and the
calibration report on a project's gold items (docs/model.md eq. 21-24)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import orjson
import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from app.api import create_app
from app.cli import app as cli_app
from app.io import transfer
from app.serving import calibration as report_module
from app.store.base import Store
from core.calibration import reliability
from tests.app.conftest import ADMIN, service_settings
from tests.core.test_calibration import ambiguous_crowd

CLASSES = ["a", "b", "c"]


@pytest.fixture
def api(store: Store, tmp_path: Path) -> Iterator[TestClient]:
    settings = service_settings(tmp_path, refine_idle_s=60.0)  # no idle sweeps in between
    with TestClient(
        create_app(settings, store=store), headers={"Authorization": f"Bearer {ADMIN}"}
    ) as c:
        yield c


def _project(api: TestClient, name: str, n_items: int, n_gold: int) -> np.ndarray:
    """A crowd with ambiguous items posted as ``name``; the first ``n_gold`` items as gold."""
    blocks, truth, _ = ambiguous_crowd(11, n_items=n_items, hard=0.3)
    assert api.post("/v1/projects", json={"name": name, "labels": CLASSES}).status_code == 201
    item = np.repeat(np.arange(blocks.n_blocks), blocks.sizes())
    body = [
        {"item": f"i{i}", "worker": f"w{w}", "label": CLASSES[z]}
        for i, w, z in zip(
            item.tolist(), blocks.slots.tolist(), blocks.labels.tolist(), strict=True
        )
    ]
    for lo in range(0, len(body), 5000):
        r = api.post(f"/v1/projects/{name}/labels", json=body[lo : lo + 5000])
        assert r.status_code == 202
    gold = [{"item": f"i{i}", "label": CLASSES[truth[i]]} for i in range(n_gold)]
    if gold:
        assert api.post(f"/v1/projects/{name}/gold", json=gold).status_code == 202
    # a refit leaves every stored posterior under the final parameters (lists and exports
    # serve stored posteriors); a snapshot entry applied means everything before it is
    assert api.post(f"/v1/projects/{name}/refit").status_code == 202
    assert api.post(f"/v1/projects/{name}/snapshots", params={"wait": True}).json()["applied"]
    return truth


def _exported(api: TestClient, name: str) -> dict[str, list[float]]:
    rows = api.get(f"/v1/projects/{name}/export", params={"format": "jsonl"}).text.splitlines()
    return {d["item"]: [d["posterior"][c] for c in CLASSES] for d in map(orjson.loads, rows)}


def test_served_posteriors_are_calibrated_and_the_report_is_cross_fitted(api: TestClient) -> None:
    truth = _project(api, "amb", 1500, 200)
    report = api.get("/v1/projects/amb/calibration").json()
    assert report["n_gold"] == 200
    assert sum(b["n"] for b in report["bins"]) == 200
    assert report["rho"] >= 0.1  # ambiguous items: answers correlated within an item
    assert 0.0 <= report["ece"] <= 10.0 and report["nll"] < 1.0
    # what the service serves, on the items it was not told: calibrated
    served = _exported(api, "amb")
    rest = list(range(200, 1500))
    q = np.array([served[f"i{i}"] for i in rest])
    assert reliability(q, truth[rest]).ece <= 5.0
    # one item read fresh is the same number as the export (same parameters, same calibration)
    one = api.get("/v1/projects/amb/items/i700").json()
    np.testing.assert_allclose([one["posterior"][c] for c in CLASSES], served["i700"], atol=1e-9)
    out = _cli(api, "calibration", "-p", "amb")
    assert "200 gold items" in out and f"ECE {report['ece']:.2f} points" in out
    assert f"rho {report['rho']:g}" in out


def test_a_project_without_gold_reports_nothing_to_score(
    api: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without gold no answer is read (every answer was, and 45.7M of them ran the service
    out of memory)."""
    _project(api, "nogold", 300, 0)

    def no_scan(store: Store, project: str) -> None:
        raise AssertionError("the answers were read")

    monkeypatch.setattr(report_module, "_read_answers", no_scan)
    report = api.get("/v1/projects/nogold/calibration").json()
    assert report["n_gold"] == 0 and report["ece"] is None and report["accuracy"] is None
    assert report["eps"] == 0.0  # the consensus error needs gold
    assert api.post("/v1/projects", json={"name": "new", "labels": CLASSES}).status_code == 201
    empty = api.get("/v1/projects/new/calibration").json()  # nothing applied: when it was made
    assert empty["position"] == 0 and not empty["computed_at"].startswith("1970")
    assert all(b["n"] == 0 for b in report["bins"])
    assert "no gold items" in _cli(api, "calibration", "-p", "nogold")


def test_the_answers_are_read_in_item_name_order_with_workers_coded_by_name(
    api: TestClient, store: Store
) -> None:
    """As held in typed arrays page by page, the same blocks, workers and gold as read whole."""
    _project(api, "read", 400, 30)
    items = []
    cursor = 0
    while True:
        cursor, page = store.scan_items("read", cursor, 2000)
        items += [(name, orjson.loads(blob)) for name, blob in page]
        if cursor == 0:
            break
    items.sort(key=lambda t: t[0])
    given = [a for _, d in items for a in d["labels"]]
    names = sorted({w for w, _, _ in given})
    got = report_module._read_answers(store, "read")
    assert got.n_workers == len(names)
    assert got.blocks.ptr.tolist() == np.cumsum([0] + [len(d["labels"]) for _, d in items]).tolist()
    assert got.blocks.slots.tolist() == [names.index(w) for w, _, _ in given]
    assert got.blocks.labels.tolist() == [z for _, z, _ in given]
    assert got.blocks.weights.tolist() == [h for _, _, h in given]
    assert got.gold.tolist() == [-1 if d.get("gold") is None else d["gold"] for _, d in items]


def _cli(api: TestClient, *args: str) -> str:
    """``crowdtally`` with its HTTP calls sent to the in-process service."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(transfer, "make_http", lambda url, key: contextlib.nullcontext(api))
        result = CliRunner().invoke(cli_app, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def test_the_report_scores_gold_items_with_a_model_that_did_not_see_their_gold(
    api: TestClient,
) -> None:
    # Each gold item is answered by 3 workers seen nowhere else, right 65% of the time. A model
    # that learned the gold knows those workers from it and gets nearly every gold item right;
    # one that did not see an item's gold has only the crowd's confusion for them, so its best
    # label is their majority's (measured: 0.72 against 0.96 scored under the served model).
    rng = np.random.default_rng(3)
    body, gold, majority_right = [], [], []
    for i in range(120):
        z = int(rng.integers(2))
        gold.append({"item": f"g{i}", "label": "ab"[z]})
        answers = [z if rng.random() < 0.65 else 1 - z for _ in range(3)]
        majority_right.append(sum(a == z for a in answers) >= 2)
        body += [
            {"item": f"g{i}", "worker": f"once-{i}-{k}", "label": "ab"[a]}
            for k, a in enumerate(answers)
        ]
    for i in range(600):  # the rest of the crowd: 12 workers, right 80% of the time
        z = int(rng.integers(2))
        for w in rng.choice(12, 3, replace=False).tolist():
            a = z if rng.random() < 0.8 else 1 - z
            body.append({"item": f"r{i}", "worker": f"w{w}", "label": "ab"[a]})
    assert (
        api.post("/v1/projects", json={"name": "honest", "labels": ["a", "b"]}).status_code == 201
    )
    assert api.post("/v1/projects/honest/labels", json=body).status_code == 202
    assert api.post("/v1/projects/honest/gold", json=gold).status_code == 202
    assert api.post("/v1/projects/honest/refit").status_code == 202  # batch EM, gold included
    assert api.post("/v1/projects/honest/snapshots", params={"wait": True}).json()["applied"]
    report = api.get("/v1/projects/honest/calibration").json()
    assert report["n_gold"] == 120
    assert abs(report["accuracy"] - np.mean(majority_right)) <= 0.05, report


def test_a_report_is_kept_while_nothing_is_applied_or_while_it_is_recent(
    api: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    _project(api, "kept", 300, 40)
    svc = api.app.state.service  # type: ignore[attr-defined]
    record = svc.project("kept")

    def report() -> report_module.CalibrationReport:
        return report_module.calibration_report(
            svc.store, "kept", svc.config(record), record.created_at
        )

    first = report()
    monkeypatch.setattr(report_module.REPORTS, "reuse", 0.0)  # no reuse for its age
    assert report() is first  # nothing applied since: the same report
    label = [{"item": "i0", "worker": "late", "label": "a"}]
    assert api.post("/v1/projects/kept/labels", params={"wait": True}, json=label).json()["applied"]
    second = report()
    assert second is not first and second.position > first.position
    monkeypatch.setattr(report_module.REPORTS, "reuse", 1e9)  # recent: kept, even after labels
    assert api.post("/v1/projects/kept/labels", params={"wait": True}, json=label).json()["applied"]
    assert report() is second


def test_a_fresh_projects_first_answers_do_not_temper_it(api: TestClient) -> None:
    """Three new workers' answers on a project's first item, one arrival each: the third is
    one scored answer of evidence about rho, well under the log(2 (G - 1)) nats its prior asks
    of a tempering (eq. 22), so which worker disagrees does not decide how the item is served."""
    for name, answers in (("first", "aab"), ("second", "aba"), ("third", "abc")):
        assert api.post("/v1/projects", json={"name": name, "labels": CLASSES}).status_code == 201
        for worker, label in zip(("w1", "w2", "w3"), answers, strict=True):
            block = [{"item": "x", "worker": worker, "label": label}]
            r = api.post(f"/v1/projects/{name}/labels", params={"wait": True}, json=block)
            assert r.status_code == 202, r.text
        assert api.get(f"/v1/projects/{name}/items/x").json()["n_labels"] == 3
        assert api.get(f"/v1/projects/{name}/calibration").json()["rho"] == 0.0, answers


def test_honeypots_given_gold_before_any_answer_leave_the_served_posteriors_alone(
    api: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Gold posted for items nobody has answered yet (honeypots seeded before a campaign)
    moves neither eps nor any served posterior; once answered, they calibrate."""
    _project(api, "seeded", 300, 0)
    before = api.get("/v1/projects/seeded/calibration").json()
    first = api.get("/v1/projects/seeded/items/i0").json()["posterior"]
    honeypots = [{"item": f"h{k}", "label": CLASSES[k % 3]} for k in range(40)]
    r = api.post("/v1/projects/seeded/gold", params={"wait": True}, json=honeypots)
    assert r.status_code == 202 and r.json()["applied"]
    after = api.get("/v1/projects/seeded/calibration").json()
    assert (after["eps"], after["rho"], after["n_gold"]) == (before["eps"], before["rho"], 0)
    assert api.get("/v1/projects/seeded/items/i0").json()["posterior"] == first
    wrong = [
        {"item": f"h{k}", "worker": f"w{(3 * k + j) % 60}", "label": CLASSES[(k + 1) % 3]}
        for k in range(40)
        for j in range(3)
    ]  # from the crowd's own workers
    r = api.post("/v1/projects/seeded/labels", params={"wait": True}, json=wrong)
    assert r.status_code == 202
    monkeypatch.setattr(
        report_module.REPORTS, "reuse", 0.0
    )  # not the report of before, kept for its age
    report = api.get("/v1/projects/seeded/calibration").json()
    assert report["n_gold"] == 40 and report["eps"] > before["eps"]  # answered, all wrong: counted


def test_the_report_scores_the_model_served_where_batch_em_is_declined(
    api: TestClient, datasets_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One answer an item (dog): batch EM falls into a one-class fit, which the service
    declines to serve; the report's folds do the same and score the one-pass model served,
    whose label is each item's one answer (its folds' batch EM fits read 52% right where the
    served labels are 68% right)."""
    import csv

    with (datasets_root / "dog" / "answers.csv").open() as fh:
        given: dict[str, list[tuple[str, str]]] = {}
        for row in csv.DictReader(fh):
            given.setdefault(row["item"], []).append((row["worker"], row["label"]))
    rng = np.random.default_rng(1)  # (one answer an item at random)
    first = {i: given[i][rng.integers(len(given[i]))] for i in sorted(given)}
    with (datasets_root / "dog" / "truth.csv").open() as fh:
        truth = {row["item"]: row["label"] for row in csv.DictReader(fh)}
    labels = sorted(set(truth.values()))
    assert api.post("/v1/projects", json={"name": "once", "labels": labels}).status_code == 201
    body = [{"item": i, "worker": w, "label": lab} for i, (w, lab) in first.items()]
    assert api.post("/v1/projects/once/labels", params={"wait": True}, json=body).status_code == 202
    gold = sorted(first)[:80]
    r = api.post("/v1/projects/once/gold", params={"wait": True},
                 json=[{"item": i, "label": truth[i]} for i in gold])  # fmt: skip
    assert r.status_code == 202
    monkeypatch.setattr(report_module.REPORTS, "reuse", 0.0)
    report = api.get("/v1/projects/once/calibration").json()
    served_right = np.mean([first[i][1] == truth[i] for i in gold])  # (0.675)
    assert report["n_gold"] == 80 and abs(report["accuracy"] - served_right) <= 0.05, report
