"""The sync Client against a live service."""

from __future__ import annotations

import gzip
import json
import time
from typing import TYPE_CHECKING

import httpx
import pytest
from crowdtally_client import ApiError, Client, Label, auto_id

CLASSES = ["cat", "dog", "bird"]
LABELS = [
    ("i1", "ann", "cat"),
    ("i1", "bob", "cat"),
    ("i1", "cy", "dog"),
    ("i2", "ann", "dog"),
    ("i2", "bob", "dog"),
    ("i2", "cy", "dog"),
    ("i3", "ann", "bird"),
    ("i3", "bob", "bird"),
    ("i3", "cy", "cat"),
    ("i/4 odd", "ann", "bird"),
]

if TYPE_CHECKING:
    from conftest import LiveServer


@pytest.fixture
def project(live_server: LiveServer) -> tuple[str, str]:
    with Client(live_server.url, live_server.admin_key) as admin:
        name = live_server.project_name("sync")
        created = admin.create_project(name, CLASSES)
        assert created.name == name and created.labels == CLASSES
        assert created.stats.n_labels == 0
        return name, created.api_key


def test_post_batches_and_reposts_count_once(
    live_server: LiveServer, project: tuple[str, str]
) -> None:
    name, key = project
    with Client(live_server.url, key, batch_size=3) as c:
        first = c.post_labels(name, LABELS, ids="auto", wait=True)
        assert (first.accepted, first.duplicates, first.blocks, first.applied) == (10, 0, 4, True)
        again = c.post_labels(name, LABELS, ids="auto", wait=True, batch_size=10)
        assert (again.accepted, again.duplicates, again.blocks) == (0, 10, 1)
        stats = c.get_project(name).stats
        assert stats.n_labels == 10 and stats.n_items == 4 and stats.n_workers == 3

        item = c.get_item(name, "i2")
        assert item.label == "dog" and item.n_labels == 3
        assert item.labels is not None and {x.worker for x in item.labels} == {"ann", "bob", "cy"}
        assert sum(item.posterior.values()) == pytest.approx(1.0)
        assert c.get_item(name, "i/4 odd").n_labels == 1  # path-unsafe names are encoded


def test_iter_items_follows_the_cursor(live_server: LiveServer, project: tuple[str, str]) -> None:
    name, key = project
    with Client(live_server.url, key) as c:
        many = [(f"item{n:03d}", f"w{n % 7}", CLASSES[n % 3]) for n in range(250)]
        c.post_labels(name, many, ids="auto", wait=True)
        items = list(c.iter_items(name, page_size=7))
        assert sorted(x.item for x in items) == sorted({t for t, _, _ in many})
        sure = list(c.iter_items(name, page_size=50, min_probability=0.99))
        assert all(x.probability >= 0.99 for x in sure) and len(sure) <= len(items)
        lines = list(c.export(name, "jsonl"))
        assert len([ln for ln in lines if ln.strip()]) == 250
        csv_lines = [ln for ln in c.export(name, "csv") if ln.strip()]
        assert csv_lines[0].startswith("item,label,probability,cat,dog,bird")
        assert len(csv_lines) == 251


def test_workers_gold_and_models(live_server: LiveServer, project: tuple[str, str]) -> None:
    name, key = project
    with Client(live_server.url, key) as c:
        c.post_labels(
            name,
            [
                Label(item=t, worker=w, label=lab, id=f"x-{n}")
                for n, (t, w, lab) in enumerate(LABELS)
            ],
            wait=True,
        )
        page = c.list_workers(name, order="worst", limit=2)
        assert page.total == 3 and len(page.workers) == 2
        assert sorted(w.worker for w in c.iter_workers(name, page_size=1)) == ["ann", "bob", "cy"]
        ann = c.get_worker(name, "ann")
        assert ann.confusion is not None and set(ann.confusion) == set(CLASSES)
        assert sum(ann.confusion["cat"].values()) == pytest.approx(1.0)
        got = c.post_gold(name, [("i3", "bird")], wait=True)
        assert got.accepted == 1 and got.applied
        assert c.get_item(name, "i3").gold == "bird"
        report = c.calibration(name)  # the one gold item, scored from its answers
        assert report.n_gold == 1 and sum(b.n for b in report.bins) == 1
        assert report.accuracy in (0.0, 1.0) and report.eps >= 0.0
        refit = c.refit(name, wait=True)
        assert refit.applied


def test_errors_name_the_entry_of_the_whole_input(
    live_server: LiveServer, project: tuple[str, str]
) -> None:
    name, key = project
    bad = [*LABELS[:5], ("i9", "ann", "horse"), *LABELS[6:]]
    with Client(live_server.url, key, batch_size=2) as c:
        with pytest.raises(ApiError) as err:
            c.post_labels(name, bad, ids="auto", wait=True)
        assert err.value.status == 422 and err.value.code == "unknown_label"
        assert err.value.entry == 5 and err.value.field == "label"
        assert str(err.value).startswith("422 unknown_label: entry 5 of the input, field 'label'")
        assert str(err.value).endswith("(sent in the block from entry 4)")
        assert err.value.sent.accepted == 4  # the two blocks before the bad one went in
        with pytest.raises(ApiError) as missing:
            c.get_item(name, "nope")
        assert missing.value.status == 404
    with Client(live_server.url, live_server.admin_key) as admin:
        reader = admin.create_key(name, "read").api_key
    with Client(live_server.url, reader) as r:
        with pytest.raises(ApiError) as forbidden:
            r.post_labels(name, LABELS)
        assert forbidden.value.status == 403
        assert r.get_project(name).name == name


def test_admin_lists_and_deletes(live_server: LiveServer) -> None:
    with Client(live_server.url, live_server.admin_key) as admin:
        name = live_server.project_name("gone")
        admin.create_project(name, ["a", "b"], worker_slots=1024, hyperparameters={"eta0": 10.0})
        assert name in {p.name for p in admin.list_projects()}
        assert admin.get_project(name).worker_slots == 1024
        admin.delete_project(name)
        assert name not in {p.name for p in admin.list_projects()}
        assert admin.healthz()


def test_auto_ids_depend_on_position_and_namespace() -> None:
    a = auto_id("i", "w", "l", 0)
    assert a == auto_id("i", "w", "l", 0) != auto_id("i", "w", "l", 1)
    assert a != auto_id("i", "w", "l", 0, namespace="batch-2")


def test_predictions_and_boundary(live_server: LiveServer, project: tuple[str, str]) -> None:
    name, key = project
    with Client(live_server.url, key) as c:
        assert c.get_project(name).dyadic == {**c.get_project(name).dyadic, "enabled": True}
        position = c.post_labels(name, LABELS, wait=True).position
        deadline = time.monotonic() + 30  # the predictions' model follows the posteriors
        while (c.get_project(name).stats.dyadic_position or 0) < position:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        got = c.predict(name, [("ann", "i1"), {"worker": "cy", "item": "i3"}, ("zed", "i9")])
        assert [(p.worker, p.item) for p in got] == [("ann", "i1"), ("cy", "i3"), ("zed", "i9")]
        assert all(p.label in CLASSES and set(p.scores) == set(CLASSES) for p in got)
        assert [p.trained for p in got] == [True, True, False]
        for _ in range(50):  # the idle sweeps move the model for a while after the labels
            before = c.predict(name, [("ann", "i1")])[0]
            many = c.predict(name, [("ann", f"i{n}") for n in range(10_050)])  # two requests
            if c.predict(name, [("ann", "i1")])[0] == before:
                break
        assert len(many) == 10_050 and many[1] == before
        page = c.boundary(name, item="i1", limit=5)
        assert page.item == "i1" and page.pairs == []  # every worker has labelled i1
        with pytest.raises(ValueError, match="exactly one"):
            c.boundary(name)
        with pytest.raises(ApiError) as err:
            c.predict(name, [("", "i1")])
        assert err.value.status == 422 and err.value.code == "invalid_pair"


def test_an_item_without_labels_has_none(live_server: LiveServer, project: tuple[str, str]) -> None:
    """A registered item with no labels yet reads with label and probability None, and
    to_pandas leaves it out (crowd-kit has no row for a task without answers)."""
    import httpx

    name, key = project
    with Client(live_server.url, key) as c:
        c.post_labels(name, [("i1", "w1", "cat"), ("i1", "w2", "cat")], wait=True)
        httpx.post(
            f"{live_server.url}/v1/projects/{name}/items?wait=true",
            json=[{"item": "waiting"}],
            headers={"Authorization": f"Bearer {key}"},
        ).raise_for_status()
        waiting = c.get_item(name, "waiting")
        assert (waiting.label, waiting.probability, waiting.n_labels) == (None, None, 0)
        assert {x.item for x in c.iter_items(name)} >= {"i1", "waiting"}
        frames = c.to_pandas(name, errors=False)
        assert list(frames.probas.index) == ["i1"] and list(frames.labels.index) == ["i1"]


def test_names_of_dots_are_names_not_path_steps(
    live_server: LiveServer, project: tuple[str, str]
) -> None:
    """A worker or item named '.' or '..' is fetched as itself (an HTTP client would otherwise
    read it as this or the parent folder of the path, and fetch the project instead)."""
    name, key = project
    with Client(live_server.url, key) as c:
        c.post_labels(name, [Label(item="..", worker=".", label="cat", id="dots")], wait=True)
        assert c.get_worker(name, ".").worker == "."
        assert c.get_item(name, "..").item == ".."


def test_an_export_keeps_ids_with_unicode_line_separators_whole(
    live_server: LiveServer, project: tuple[str, str]
) -> None:
    """httpx's iter_lines also ends lines at U+2028 and U+2029: an item id holding one came
    back as two broken rows."""
    name, key = project
    odd = "x\u2028y\u2029z"
    with Client(live_server.url, key) as c:
        c.post_labels(name, [(odd, "ann", "cat"), ("plain", "bob", "dog")], wait=True)
        rows = [json.loads(line) for line in c.export(name)]
        assert sorted(r["item"] for r in rows) == sorted([odd, "plain"])
        assert len(list(c.export(name, "csv"))) == 3  # the header and two rows


def test_compressed_blocks_are_taken_as_plain_ones(
    live_server: LiveServer, project: tuple[str, str]
) -> None:
    """A client made with ``compress=True`` sends long bodies gzipped, and asks for answers
    gzipped; the service takes them as if sent plain (short bodies go plain either way). A
    client made without it asks for answers as they are."""
    name, key = project
    many = [(f"z{i}", f"w{i % 7}", CLASSES[i % 3]) for i in range(400)]
    sent: list[tuple[int, int, str | None]] = []

    def seen(request: httpx.Request) -> None:
        encoding = request.headers.get("content-encoding")
        plain = gzip.decompress(request.content) if encoding else request.content
        sent.append((len(request.content), len(plain), encoding))

    with Client(live_server.url, key, compress=True) as c:
        c._http.event_hooks["request"] = [seen]
        got = c.post_labels(name, many, ids="auto", wait=True)
        assert (got.accepted, got.duplicates) == (400, 0)
        again = c.post_labels(name, many, ids="auto", wait=True)
        assert (again.accepted, again.duplicates) == (0, 400)
        labels = c.get_item(name, "z5").labels
        assert labels is not None and [(x.worker, x.label) for x in labels] == [("w5", "bird")]
        assert c.get_project(name).stats.n_labels == 400
    posts = [s for s in sent if s[2] is not None]
    assert len(posts) == 2 and all(s[2] == "gzip" and s[0] < s[1] / 2 for s in posts)
    assert None in {s[2] for s in sent}  # the GETs, bodiless, went plain
    answered: dict[bool, set[str | None]] = {}
    for compress in (True, False):

        def got(response: httpx.Response, flag: bool = compress) -> None:
            answered.setdefault(flag, set()).add(response.headers.get("content-encoding"))

        with Client(live_server.url, key, compress=compress) as c:
            c._http.event_hooks["response"] = [got]
            lines = list(c.export(name, "csv"))
            assert len(lines) == 1 + 400 and lines[0].startswith("item,")
    assert answered == {True: {"gzip"}, False: {None}}
