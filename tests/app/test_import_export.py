"""``crowdtally import`` / ``export``: every format parsed, round-tripped through a service, resumed.

Most round trips talk to an in-process service (fastapi's TestClient is an httpx.Client, so the
commands' HTTP code runs unchanged); the last tests start a real ``crowdtally serve``.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner, Result

from app.api import create_app
from app.cli import app as cli_app
from app.io import importers, transfer
from app.io.input import InputError
from app.io.triples import read_truth
from app.store.embedded import EmbeddedStore
from app.testing import cli_command, running_service
from tests.app.conftest import ADMIN, not_utf8, service_settings
from tests.cli_in_process import run_cli

DATA = Path(__file__).parent / "data"

# file, format given, --map, project labels, labels, gold items, rows skipped
CASES = [
    ("mapped.csv", "csv", "item=image,worker=annotator,label=answer,weight=confidence,gold=ref",
     ["cat", "dog", "bird"], 9, 1, 0),
    ("answers.tsv", "auto", None, ["cat", "dog", "bird"], 7, 0, 0),
    ("answers.jsonl", "auto", None, ["cat", "dog", "bird"], 5, 1, 0),
    ("crowdkit.csv", "auto", None, ["cat", "dog", "bird"], 7, 0, 0),
    ("toloka.tsv", "auto", None, ["cat", "dog"], 6, 1, 2),
    ("mturk.csv", "auto", None, ["Cat", "Dog"], 5, 0, 1),
    ("mturk_radio.csv", "mturk", None, ["negative", "positive"], 3, 0, 0),
    ("mturk_taskanswers.csv", "auto", None, ["negative", "positive"], 2, 0, 0),
    ("labelstudio.json", "auto", None, ["Positive", "Negative", "Neutral"], 6, 1, 1),
]  # fmt: skip
DETECTED = {
    "answers.tsv": "tsv",
    "answers.jsonl": "jsonl",
    "crowdkit.csv": "crowdkit",
    "toloka.tsv": "toloka",
    "mturk.csv": "mturk",
    "mturk_taskanswers.csv": "mturk",
    "labelstudio.json": "labelstudio",
}


# ---------------------------------------------------------------------- parsing


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_each_format_parses_into_records(case: tuple) -> None:  # type: ignore[type-arg]
    name, fmt, mapping, classes, n_labels, n_gold, n_skipped = case
    parsed = importers.read(DATA / name, fmt, importers.parse_map(mapping))
    if fmt == "auto":
        assert parsed.format == DETECTED[name]
    assert len(parsed.labels) == n_labels
    assert len({r.item for r in parsed.gold}) == n_gold
    assert parsed.skipped == n_skipped
    assert {r.label for r in parsed.records} <= set(classes)
    ids = [r.id for r in parsed.labels]
    assert None not in ids and len(set(ids)) == len(ids)  # every label has its own source id
    assert all(r.line for r in parsed.records)
    again = importers.read(DATA / name, fmt, importers.parse_map(mapping))
    assert [r.id for r in again.labels] == ids  # deterministic: a re-run is a no-op


def test_format_details() -> None:
    mapped = importers.read(DATA / "mapped.csv", "csv", importers.parse_map(
        "item=image,worker=annotator,label=answer,weight=confidence,gold=ref"))  # fmt: skip
    assert mapped.labels[1].weight == 0.5 and mapped.labels[-1].item == "img-04, with a comma"
    assert mapped.labels[-1].line == 10
    toloka = importers.read(DATA / "toloka.tsv")
    assert toloka.skip_reasons == {"rejected": 1, "skipped": 1}
    assert toloka.labels[0].item.endswith("cat_vs_dogs/cat.101.jpg".replace("cat_vs", "cats_vs"))
    assert toloka.labels[0].worker == "8f1e7b2a"
    assert toloka.labels[0].id == "toloka:00001a2b3c--6400f9a1:00001a2b3c--6400f1"
    assert {r.item for r in toloka.gold} == {toloka.labels[-1].item}
    mturk = importers.read(DATA / "mturk.csv")
    assert mturk.labels[0].item == "3Z8UJEJOCZEG603II1EL4BE2PLI93A"
    assert mturk.labels[0].id == "mturk:3R5F3LQFV2JWXC43QHIYK8XSD9TZOG"
    by_image = importers.read(DATA / "mturk.csv", mapping={"item": "Input.image_url"})
    assert by_image.labels[0].item.endswith("/cat_1.jpg")
    radio = importers.read(DATA / "mturk_radio.csv")
    assert [r.label for r in radio.labels] == ["positive", "negative", "negative"]
    studio = importers.read(DATA / "labelstudio.json")
    assert [r.worker for r in studio.labels[:3]] == ["1", "2", "carol@example.com"]
    assert studio.gold[0].item == "102" and studio.gold[0].label == "Negative"
    assert "2" not in {r.worker for r in studio.labels if r.item == "102"}  # cancelled
    assert studio.labels[0].line == 2  # the line where the task starts
    by_review = importers.read(DATA / "labelstudio.json", mapping={"item": "data.review_id"})
    assert by_review.labels[0].item == "rev-101"
    tsv = importers.read(DATA / "answers.tsv")
    assert tsv.labels[-1].id != tsv.labels[-2].id  # the same answer twice: two labels


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_a_line_separator_is_part_of_an_id(tmp_path: Path) -> None:
    """Lines end at LF, CRLF or CR only: U+2028 in a JSON string or a CSV cell is kept."""
    jsonl = _write(tmp_path, "a.jsonl", '{"item": "a\u2028b", "worker": "w", "label": "x"}\n')
    assert [r.item for r in importers.read(jsonl).labels] == ["a\u2028b"]
    quoted = _write(tmp_path, "a.csv", 'item,worker,label\n"a\u2028b",w,x\n')
    assert [r.item for r in importers.read(quoted).labels] == ["a\u2028b"]


TASK = (
    '{"id": 1, "annotations": [{"id": 9, "completed_by": 1, "result": '
    '[{"from_name": "c", "value": {"choices": ["A"]}}]}]}'
)  # one Label Studio task


def test_errors_name_file_and_line(tmp_path: Path) -> None:
    cases = [
        ("w.csv", "item,worker,label,weight\na,w,x,1\nb,w,x,heavy\n", None, 3, "weight 'heavy'"),
        ("e.csv", "item,worker,label\na,w,x\nb,,x\n", None, 3, "empty worker"),
        ("s.csv", "item,worker,label\na,w\n", None, 2, "expected 3 fields"),
        ("f.csv", "item,worker,label\na,w,x\nb,w,x,7\n", None, 3, "expected 3 fields, got 4"),
        ("q.csv", 'item,worker,label\na,w,x\nb,w,"x\n', None, 3, "a quoted field is not closed"),
        ("c.csv", "item,worker,label\na,w,x\nb\x01c,w,x\n", None, 3, "ids hold no control"),
        ("o.jsonl", '{"item":{"k":1},"worker":"w","label":"x"}\n', None, 1,
         "item must be text or a number, got an object"),
        ("a.jsonl", '{"item":"i","worker":["w"],"label":"x"}\n', None, 1, "got an array"),
        ("b.jsonl", '{"item":true,"worker":"w","label":"x"}\n', None, 1, "got true or false"),
        ("t.jsonl", '{"item":"i","worker":"w","label":"x","weight":true}\n', None, 1,
         "weight True is not a number"),
        ("m.csv", "pic,who,what\na,w,x\n", "item=pic,worker=who", 1, "no label column"),
        ("u.csv", "pic,who,what\na,w,x\n", "item=pic,worker=who,label=nope", 1, "no such column"),
        ("j.jsonl", '{"item":"a","worker":"w","label":"x"}\n{"item": "b",\n', None, 2, "not JSON"),
        ("t.tsv", "INPUT:a\tINPUT:b\tOUTPUT:r\tASSIGNMENT:worker_id\nx\ty\tz\tw\n", None, 1,
         "--map item="),
        ("k.csv", "HITId,AssignmentId,WorkerId,Answer.a,Answer.b\nh,a1,w,x,y\n", None, 1,
         "several answer columns"),
        ("l.json", '[\n {"id": 1, "annotations": [\n  {"id": 9, "completed_by": 1, "result": '
         '[{"from_name": "c", "value": {"choices": ["A", "B"]}}]}]}\n]\n', None, 2, "2 choices"),
        ("m.json", f"[{TASK}]\n[{TASK}]\n", None, 2, "more after the JSON array"),
        ("n.json", f"[{TASK}\n{TASK}]\n", None, 2, "expected ',' or ']' after a task"),
        ("d.csv", "item,worker,label,item\nx1,w1,a,x2\n", None, 1,
         "the header names column 'item' twice"),
        ("dq.csv", 'item,worker,label,label\nx1,w1,"a",b\n', None, 1,
         "the header names column 'label' twice"),
        ("dm.csv", "q,who,what,q\nx1,w1,a,x2\n", "item=q,worker=who,label=what", 1,
         "the header names column 'q' twice"),
        # a misspelt optional column: its weights (gold, ids) were dropped without a word
        ("wt.csv", "item,worker,label,wieght\na,w,x,5\n", None, 1,
         "column 'wieght' would not be read: if it holds the answers' weights, name it 'weight'"),
        ("ws.csv", "item,worker,label,Weights\na,w,x,5\n", None, 1, "column 'Weights'"),
        ("gl.csv", "item,worker,label,gold_label\na,w,x,y\n", None, 1, "--map gold=gold_label"),
        ("id.csv", "item,worker,label,ID\na,w,x,q\n", None, 1, "column 'ID' would not be read"),
        # no header (extract reads one as item, worker, label): how to give it one
        ("nh.csv", "a,w1,x\nb,w2,y\n", None, 1,
         "(columns: a, w1, x); a file without a header: pass --no-header, or give it a first "
         "line item,worker,label"),
    ]  # fmt: skip
    for name, text, mapping, line, reason in cases:
        with pytest.raises(InputError) as err:
            importers.read(_write(tmp_path, name, text), mapping=importers.parse_map(mapping))
        assert err.value.line == line, (name, str(err.value))
        assert reason in str(err.value) and str(err.value).startswith(str(tmp_path / name))
    with pytest.raises(InputError, match=r"f.csv:3: expected 3 fields, got 4"):  # (columns)
        importers.read_answers(tmp_path / "f.csv")
    with pytest.raises(InputError, match=r"d.csv:1: the header names column 'item' twice"):
        importers.read_answers(tmp_path / "d.csv")  # (the plain tables' reader too)
    with pytest.raises(InputError, match=r"c.csv:3: item 'b\\x01c': ids hold no control"):
        importers.read_answers(tmp_path / "c.csv")  # (before anything is sent)
    listed = tmp_path / "listed.parquet"
    table = {"item": ["a"], "worker": ["w"], "label": ["x"], "tags": [["t1", "t2"]]}
    pq.write_table(pa.table(table), listed)
    with pytest.raises(InputError, match=r"listed.parquet: column 'tags' holds list<"):
        importers.read_answers(listed)
    with pytest.raises(InputError, match="--map"):
        importers.parse_map("colour=c")
    with pytest.raises(InputError, match="--map: item is mapped twice \\('q', 'aid'\\)"):
        importers.parse_map("item=q,worker=w,label=l,item=aid")
    with pytest.raises(InputError, match="--map: column 'q' is mapped twice"):
        importers.parse_map("item=q,worker=q,label=l")
    with pytest.raises(InputError, match="no such file"):
        importers.read(tmp_path / "missing.csv")


@pytest.mark.parametrize("kind", [pa.string(), pa.binary()])
def test_a_parquet_value_that_is_not_utf8_names_its_file_row_and_column(
    tmp_path: Path, kind: pa.DataType
) -> None:
    """Refused before anything is sent (it was a UnicodeDecodeError's traceback, or a binary
    column called one of another type)."""
    labels = not_utf8([b"x", b"y", b"a\xffb"], kind)
    table = pa.table({"item": ["i", "j", "k"], "worker": ["w", "v", "w"], "label": labels})
    pq.write_table(table, tmp_path / "bad.parquet")
    run = run_cli("import", tmp_path / "bad.parquet", "-p", "p", "--url", "http://127.0.0.1:9")
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert run.stderr == f"error: {tmp_path / 'bad.parquet'}:3: column 'label': not UTF-8 text\n"


def test_a_file_in_a_pipe_is_read_whole(tmp_path: Path) -> None:
    """Looking for Parquet's magic bytes read the first four bytes of a pipe (``<(cat f)``),
    and the text read after it lacked them: 'no item column'."""
    read, write = os.pipe()
    with os.fdopen(write, "w") as fh:
        fh.write("item,worker,label\na,w,x\n")
    try:
        table, _ = importers.read_answers(Path(f"/dev/fd/{read}"))
    finally:
        os.close(read)
    assert (table.format, table.items.to_pylist()) == ("csv", ["a"])


# ---------------------------------------------------------------------- in-process service


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    tmp = tmp_path_factory.mktemp("transfer")
    store = EmbeddedStore(tmp / "crowdtally.sqlite3")
    app = create_app(service_settings(tmp), store=store)
    with TestClient(app, headers={"Authorization": f"Bearer {ADMIN}"}) as c:
        yield c
    store.close()


def _stats(client: httpx.Client, project: str) -> dict[str, int]:
    stats: dict[str, int] = client.get(f"/v1/projects/{project}").json()["stats"]
    return stats


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_round_trip(case: tuple, service: TestClient, tmp_path: Path) -> None:  # type: ignore[type-arg]
    name, fmt, mapping, classes, n_labels, n_gold, _ = case
    project = "rt-" + name.replace(".", "-").replace("_", "-")
    mp = importers.parse_map(mapping)
    first = transfer.run_import(service, DATA / name, project, format=fmt, mapping=mp,
                                create_with=classes, batch_size=4)  # fmt: skip
    assert (first.labels, first.accepted, first.duplicates, first.gold) == (
        n_labels,
        n_labels,
        0,
        n_gold,
    )
    assert first.blocks == -(-n_labels // 4)
    stats = _stats(service, project)
    assert stats["n_labels"] == n_labels and stats["lag"] == 0
    # resumable: a second run (or a run after a failure half-way) counts nothing twice
    again = transfer.run_import(service, DATA / name, project, format=fmt, mapping=mp)
    assert (again.accepted, again.duplicates) == (0, n_labels)
    assert _stats(service, project)["n_labels"] == n_labels

    parsed = importers.read(DATA / name, fmt, mp)
    items = {r.item for r in parsed.records}
    out = tmp_path / "posteriors.csv"
    assert transfer.run_export(service, project, out) == len(items)
    with out.open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert {r["item"] for r in rows} == items
    assert list(rows[0])[: 3 + len(classes)] == ["item", "label", "probability", *classes]
    gold = {r.item: r.label for r in parsed.gold}
    for r in rows:
        assert abs(sum(float(r[c]) for c in classes) - 1) < 1e-4
        if r["item"] in gold:
            assert r["gold"] == gold[r["item"]] and r["label"] == gold[r["item"]]
    labels = tmp_path / "labels.jsonl"
    assert transfer.run_export(service, project, labels, what="labels", format="jsonl") == len(
        items
    )
    best = [json.loads(x) for x in labels.read_text().splitlines()]
    assert {x["item"] for x in best} == items and all(x["label"] in classes for x in best)
    workers = tmp_path / "workers.csv"
    n_workers = len({r.worker for r in parsed.labels})
    assert (
        transfer.run_export(service, project, workers, what="workers", confusion=True) == n_workers
    )
    with workers.open(newline="") as f:
        header = next(csv.reader(f))
    assert header[:2] == ["worker", "accuracy"] and f"{classes[0]}->{classes[1]}" in header


def test_parquet_in_and_out(service: TestClient, tmp_path: Path) -> None:
    """A Parquet file imports as its CSV does (labels as integers too, nulls as empty), and
    every export writes Parquet with the CSV's columns, typed, the posteriors unrounded."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [
        ("i1", "w1", 0, None),
        ("i1", "w2", 1, None),
        ("i2", "w1", 1, 2.5),
        ("i3", "w2", 0, None),
    ]
    items, workers, labels, weights = (list(c) for c in zip(*rows, strict=True))
    table = pa.table({"task": items, "worker": workers, "label": labels, "weight": weights})
    pq.write_table(table, tmp_path / "answers.parquet")
    (tmp_path / "answers.csv").write_text(
        "task,worker,label,weight\n" + "".join(f"{i},{w},{z},{x or ''}\n" for i, w, z, x in rows)
    )
    (tmp_path / "named-otherwise").write_bytes((tmp_path / "answers.parquet").read_bytes())
    got = importers.read(tmp_path / "answers.parquet")
    assert got.format == "parquet"
    assert [(r.item, r.worker, r.label, r.weight) for r in got.records] == [
        (r.item, r.worker, r.label, r.weight)
        for r in importers.read(tmp_path / "answers.csv").records
    ]
    assert importers.read(tmp_path / "named-otherwise").format == "parquet"  # by its magic bytes
    with pytest.raises(InputError, match="not a Parquet file"):
        importers.read(_write(tmp_path, "text.parquet", "item,worker,label\na,b,c\n"))
    pq.write_table(pa.table({"task": ["i1"], "label": [0]}), tmp_path / "noworker.parquet")
    with pytest.raises(InputError, match=r"noworker\.parquet: no worker column"):
        importers.read(tmp_path / "noworker.parquet")

    done = transfer.run_import(service, tmp_path / "answers.parquet", "pq", create_with=["0", "1"])
    assert (done.format, done.accepted) == ("parquet", 4)
    out = {what: tmp_path / f"{what}.parquet" for what in transfer.WHAT}
    assert [transfer.run_export(service, "pq", f, what=w) for w, f in out.items()] == [3, 3, 2]
    posteriors = pq.read_table(out["posteriors"])
    assert posteriors.column_names == [
        "item",
        "label",
        "probability",
        "0",
        "1",
        "n_labels",
        "gold",
        "computed_at",
    ]
    csv_out = tmp_path / "posteriors.csv"
    transfer.run_export(service, "pq", csv_out)
    with csv_out.open(newline="") as f:
        by_item = {r["item"]: r for r in csv.DictReader(f)}
    for r in posteriors.to_pylist():
        assert f"{r['1']:.6g}" == by_item[r["item"]]["1"]  # the CSV's, unrounded
        assert r["n_labels"] == int(by_item[r["item"]]["n_labels"])
    assert pq.read_table(out["labels"]).column_names == [
        "item",
        "label",
        "probability",
        "n_labels",
        "gold",
    ]
    assert set(pq.read_table(out["workers"]).column("worker").to_pylist()) == {"w1", "w2"}
    with pytest.raises(InputError, match="--format"):
        transfer.run_export(service, "pq", tmp_path / "x.csv", format="xlsx")


def test_refused_labels_point_at_the_source_line(service: TestClient, tmp_path: Path) -> None:
    path = _write(tmp_path, "bad.csv", "item,worker,label\na,w1,cat\nb,w1,dog\nc,w2,horse\n")
    service.post("/v1/projects", json={"name": "refuse", "labels": ["cat", "dog"]})
    with pytest.raises(InputError) as err:
        transfer.run_import(service, path, "refuse")
    assert err.value.line == 4 and "'horse' is not one of" in str(err.value)
    assert _stats(service, "refuse")["n_labels"] == 0  # checked before anything was sent
    with pytest.raises(transfer.ServiceError, match="no project named"):
        transfer.run_import(service, DATA / "crowdkit.csv", "absent")


def test_cli_commands(service: TestClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The typer commands, their options and output, on the in-process service."""
    urls: list[tuple[str, str | None]] = []

    def borrowed(url: str, key: str | None) -> contextlib.nullcontext[TestClient]:
        urls.append((url, key))
        return contextlib.nullcontext(service)

    monkeypatch.setattr(transfer, "make_http", borrowed)
    monkeypatch.setenv("CROWDTALLY_KEY", "from-env")
    runner = CliRunner()
    args = ["import", str(DATA / "mapped.csv"), "--project", "cli", "--format", "csv",
            "--map", "item=image,worker=annotator,label=answer,weight=confidence,gold=ref",
            "--create-with-labels", "cat,dog,bird", "--url", "http://ct.example:9000", "--no-progress"]  # fmt: skip
    result = runner.invoke(cli_app, args)
    assert result.exit_code == 0, result.output
    assert "9 labels in 1 blocks: 9 new, 0 already there; 1 gold" in result.output
    assert urls[-1] == ("http://ct.example:9000", "from-env")
    result = runner.invoke(cli_app, [*args[:-1], "--progress", "--key", "k2"])
    assert result.exit_code == 0 and "0 new, 9 already there" in result.output
    assert urls[-1][1] == "k2"
    monkeypatch.setenv("CROWDTALLY_URL", "http://from-env:8001")
    result = runner.invoke(cli_app, [*args[:-3], "--no-progress"])  # no --url: the variable
    assert result.exit_code == 0 and urls[-1] == ("http://from-env:8001", "from-env")
    out = tmp_path / "p.jsonl"
    result = runner.invoke(
        cli_app, ["export", "--project", "cli", "--format", "jsonl", "-o", str(out)]
    )
    assert result.exit_code == 0 and "4 items" in result.output
    assert {json.loads(x)["item"] for x in out.read_text().splitlines()} == {
        "img-01", "img-02", "img-03", "img-04, with a comma"}  # fmt: skip


def test_an_import_with_compress_sends_gzipped_blocks(
    service: TestClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``import --compress`` sends its blocks gzipped; the service takes the same labels."""
    monkeypatch.setattr(transfer, "make_http", lambda url, key: contextlib.nullcontext(service))
    sent: list[tuple[str | None, int]] = []

    def seen(request: httpx.Request) -> None:
        if request.url.path.endswith("/labels"):
            sent.append((request.headers.get("content-encoding"), len(request.content)))

    monkeypatch.setitem(service.event_hooks, "request", [seen])
    rows = "".join(f"i{n},w{n % 7},{'xy'[n % 2]}\n" for n in range(2000))
    path = _write(tmp_path, "many.csv", "item,worker,label\n" + rows)
    for project, flag in (("plain", []), ("gzipped", ["--compress"])):
        result = CliRunner().invoke(cli_app, ["import", str(path), "-p", project, "--key", "k",
                                              "--create-with-labels", "x,y", "--no-progress",
                                              "--batch-size", "1000", *flag])  # fmt: skip
        assert result.exit_code == 0, result.output
        assert "2,000 labels in 2 blocks: 2,000 new" in result.output
    assert [e for e, _ in sent] == [None, None, "gzip", "gzip"]
    assert sent[2][1] < sent[0][1] / 2
    plain, gzipped = (_stats(service, p) for p in ("plain", "gzipped"))
    assert plain["n_labels"] == gzipped["n_labels"] == 2000


def test_export_asks_for_gzip_only_with_compress(
    service: TestClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The command line's requests ask for answers as they are (on one machine gzip costs
    more time than the bytes it saves), and gzipped with ``--compress``."""
    asked: list[str] = []

    def borrowed(url: str, key: str | None) -> contextlib.nullcontext[TestClient]:
        asked.append(transfer._http(url, key).headers["accept-encoding"])
        return contextlib.nullcontext(service)

    monkeypatch.setattr(transfer, "make_http", borrowed)
    transfer.run_import(service, DATA / "answers.tsv", "gz", create_with=["cat", "dog", "bird"])
    for flag in ([], ["--compress"]):
        out = tmp_path / f"gz{len(flag)}.csv"
        args = ["export", "--project", "gz", "--format", "csv", "-o", str(out), *flag]
        result = CliRunner().invoke(cli_app, args)
        assert result.exit_code == 0, result.output
    assert asked == ["identity", "gzip"]
    assert (tmp_path / "gz0.csv").read_bytes() == (tmp_path / "gz1.csv").read_bytes()


def test_an_import_says_which_columns_it_did_not_read(
    service: TestClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A column no answer reads was dropped without a word; a gold column is read as gold."""
    monkeypatch.setattr(transfer, "make_http", lambda url, key: contextlib.nullcontext(service))
    path = _write(tmp_path, "notes.csv", "item,worker,label,note,gold\na,w1,x,fine,x\n"
                  "b,w1,y,unsure,\nb,w2,y,,\n")  # fmt: skip
    result = CliRunner().invoke(cli_app, ["import", str(path), "-p", "notes", "--key", "k",
                                          "--create-with-labels", "x,y", "--no-progress"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "3 labels in 1 blocks: 3 new, 0 already there; 1 gold" in result.output
    assert f"{path}: columns not read: note" in result.output
    kept, _ = importers.read_answers(_write(tmp_path, "p.csv", "item,worker,label\na,w,x\n"))
    assert kept.unread == ()
    plain = _write(tmp_path, "n.csv", "item,worker,label,note\na,w,x,n\n")  # (read in columns)
    assert importers._plain_table(importers._source(plain, "auto", None)) is not None
    assert importers.read_answers(plain)[0].unread == ("note",)


def test_a_file_without_a_header_imports_with_no_header(
    service: TestClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--no-header reads every line as an answer, item,worker,label[,weight], in columns or
    row by row (a quoted cell), with the ids the same file with a header gets: importing
    that one afterwards finds every answer already there."""
    monkeypatch.setattr(transfer, "make_http", lambda url, key: contextlib.nullcontext(service))
    rows = "a,w1,x,2\nb,w1,y,1\nb,w2,y,0.5\na,w2,x,1\n"
    bare = _write(tmp_path, "bare.csv", rows)
    quoted = _write(tmp_path, "quoted.csv", rows.replace("a,w1", '"a",w1'))  # (row by row)
    headed = _write(tmp_path, "headed.csv", "item,worker,label,weight\n" + rows)
    for path in (bare, quoted):
        table, _ = importers.read_answers(path, header=False)
        assert table.items.to_pylist() == ["a", "b", "b", "a"]
        assert table.weights.tolist() == [2.0, 1.0, 0.5, 1.0] and table.lines.tolist() == [
            1,
            2,
            3,
            4,
        ]
    assert (importers.read_answers(bare, header=False)[0].ids.to_pylist()
            == importers.read_answers(headed)[0].ids.to_pylist())  # fmt: skip

    def run(*args: str) -> Result:
        return CliRunner().invoke(cli_app, ["import", *args, "-p", "bare", "--key", "k",
                                            "--no-progress"])  # fmt: skip

    result = run(str(bare), "--no-header", "--create-with-labels", "x,y")
    assert result.exit_code == 0, result.output
    assert "4 labels in 1 blocks: 4 new, 0 already there" in result.output
    result = run(str(headed))
    assert "4 labels in 1 blocks: 0 new, 4 already there" in result.output, result.output
    assert "pass --no-header" in str(run(str(bare)).exception)  # (how to read such a file)
    for path, flags, why in [
        (bare, ["--map", "item=a"], "no columns to map"),
        (_write(tmp_path, "five.csv", "a,w,x,1,z\n"), [], "5 fields: a file without a header"),
        (_write(tmp_path, "rows.jsonl", '{"item": "a", "worker": "w", "label": "x"}\n'), [],
         "a jsonl file names its fields"),
    ]:  # fmt: skip
        refused = run(str(path), "--no-header", *flags).exception
        assert isinstance(refused, InputError) and why in str(refused), (why, refused)


def test_export_to_standard_output(
    service: TestClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``export -o -`` writes CSV or JSONL to standard output and its summary to standard
    error (it wrote a file named '-'); Parquet is refused there."""
    monkeypatch.setattr(transfer, "make_http", lambda url, key: contextlib.nullcontext(service))
    monkeypatch.chdir(tmp_path)
    transfer.run_import(service, DATA / "answers.tsv", "stdout", create_with=["cat", "dog", "bird"])
    runner = CliRunner()
    for what, format, name in [("posteriors", "auto", "p.csv"), ("labels", "jsonl", "l.jsonl"),
                               ("workers", "csv", "w.csv")]:  # fmt: skip
        args = ["export", "-p", "stdout", "--what", what, "--format", format]
        assert runner.invoke(cli_app, [*args, "-o", name]).exit_code == 0
        printed = runner.invoke(cli_app, [*args, "-o", "-"])
        assert printed.exit_code == 0, printed.output
        assert printed.stdout_bytes == Path(name).read_bytes()
        assert printed.stderr.startswith("standard output: ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["l.jsonl", "p.csv", "w.csv"]
    refused = run_cli("export", "-p", "stdout", "-f", "parquet", "-o", "-")
    assert refused.returncode == 2 and refused.stdout == ""
    assert (
        refused.stderr
        == "error: --format: Parquet is not written to standard output: give -o FILE\n"
    )
    assert not Path("-").exists()


def test_a_file_refused_against_the_labels_to_create_leaves_no_project(
    service: TestClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``import --create-with-labels`` refused the file's label after creating the project, and
    left it behind with none of the answers."""
    monkeypatch.setattr(transfer, "make_http", lambda url, key: contextlib.nullcontext(service))
    bad = _write(tmp_path, "bad.csv", "item,worker,label\na,w,cat\nb,w,zebra\n")
    run = run_cli("import", bad, "-p", "none-made", "--create-with-labels", "cat,dog")
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr == (f"error: {bad}:3: label 'zebra' is not one of project 'none-made''s "
                          "labels ['cat', 'dog']\n")  # fmt: skip
    good = _write(tmp_path, "good.csv", "item,worker,label\na,w,cat\nb,w,dog\n")
    truth = _write(tmp_path, "truth.csv", "item,label\na,cat\nb,zebra\n")
    run = run_cli("import", good, "-p", "none-made", "--create-with-labels", "cat,dog",
                  "--truth", truth)  # fmt: skip
    assert run.returncode == 2 and run.stderr.startswith(f"error: {truth}:3: gold label 'zebra'")
    assert service.get("/v1/projects/none-made").status_code == 404
    # refused by the service (a weight above its limit): the project made is removed again
    heavy = _write(tmp_path, "heavy.csv", "item,worker,label,weight\na,w,cat,2e6\n")
    run = run_cli("import", heavy, "-p", "none-made", "--create-with-labels", "cat,dog")
    assert run.returncode == 2 and "invalid_label" in run.stderr, run.stderr
    assert service.get("/v1/projects/none-made").status_code == 404
    run = run_cli("import", good, "-p", "none-made", "--create-with-labels", "cat,dog",
                  "--no-progress")  # fmt: skip
    assert run.returncode == 0 and "2 new" in run.stdout, run.stderr
    assert service.get("/v1/projects/none-made").json()["labels"] == ["cat", "dog"]


def test_a_truth_file_is_checked_against_the_answers_labels_and_items(
    service: TestClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``--create-with-labels auto`` a truth file's labels are checked against those the
    answers use, not added to them ("Yes" beside "yes" made a project of four classes, none of
    its gold right); a truth file none of whose items the answers hold is refused, as
    ``extract`` refuses it. Neither leaves a project behind."""
    monkeypatch.setattr(transfer, "make_http", lambda url, key: contextlib.nullcontext(service))
    answers = _write(tmp_path, "yn.csv", "item,worker,label\n1,a,yes\n1,b,no\n2,a,no\n")
    cased = _write(tmp_path, "cased.csv", "item,label\n1,Yes\n2,No\n")
    run = run_cli("import", answers, "-p", "yn", "--create-with-labels", "auto", "--truth", cased)
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.startswith(f"error: {cased}:2: gold label 'Yes' is not one of project 'yn''s "
                                 "labels ['no', 'yes'] (--create-with-labels auto takes the labels "
                                 "the answers use")  # fmt: skip
    headed = _write(tmp_path, "headed.csv", "id,answer\n1,yes\n2,no\n")  # (read as data)
    run = run_cli(
        "import", answers, "-p", "yn", "--create-with-labels", "no,yes", "--truth", headed
    )
    assert run.returncode == 2
    assert run.stderr == (f"error: {headed}:1: gold label 'answer' is not one of project 'yn''s "
                          "labels ['no', 'yes'] (a first line of column names must read "
                          "item,label or task,label)\n")  # fmt: skip
    other = _write(tmp_path, "other.csv", "item,label\nzzz1,yes\nzzz2,no\n")
    run = run_cli("import", answers, "-p", "yn", "--create-with-labels", "no,yes", "--truth", other)
    assert run.returncode == 2
    assert run.stderr == f"error: {other}: none of its 2 items is among the answers' items\n"
    assert service.get("/v1/projects/yn").status_code == 404
    right = _write(tmp_path, "right.csv", "item,label\n1,yes\n9,no\n")  # (9: no answers yet)
    run = run_cli("import", answers, "-p", "yn", "--create-with-labels", "auto", "--truth", right,
                  "--no-progress")  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert (
        f"{right}: 1 items with gold have no answers in {answers} (posted as gold alone"
        in run.stdout
    )
    empty = _write(tmp_path, "empty.csv", "item,label\n")  # (imported 0 gold; extract refused it)
    run = run_cli("import", answers, "-p", "yn", "--truth", empty)
    assert (
        run.returncode == 2
        and run.stderr == f"error: {empty}: no gold label in it (item,label rows)\n"
    )
    assert service.get("/v1/projects/yn").json()["labels"] == ["no", "yes"]


# ---------------------------------------------------------------------- a real `crowdtally serve`


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    # No idle sweeps: they would only compete for the CPU (the exports are online EM's).
    env = {"CROWDTALLY_ADMIN_KEY": ADMIN, "CROWDTALLY_STORE": "embedded",
           "CROWDTALLY_REFINE_PASSES": "0"}  # fmt: skip
    with running_service(tmp_path_factory.mktemp("live"), env) as url:
        yield url


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CROWDTALLY_KEY": ADMIN}
    return subprocess.run(
        [*cli_command(), *args], env=env, capture_output=True, text=True, timeout=120
    )


def _main(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, env={"CROWDTALLY_KEY": ADMIN})


def test_import_a_shared_dataset_and_export_posteriors(
    live: str, datasets_root: Path, tmp_path: Path
) -> None:
    answers, truth = datasets_root / "dog" / "answers.csv", datasets_root / "dog" / "truth.csv"
    done = _run(
        "import", str(answers), "--project", "dog", "--url", live, "--create-with-labels", "auto"
    )
    assert done.returncode == 0, done.stderr
    assert "8,070 labels in 2 blocks: 8,070 new, 0 already there" in done.stdout  # of 5,000
    again = _run("import", str(answers), "--project", "dog", "--url", live, "--no-progress")
    assert again.returncode == 0 and "0 new, 8,070 already there" in again.stdout
    out = tmp_path / "dog.csv"
    exported = _run("export", "--project", "dog", "--what", "posteriors", "--format", "csv",
                    "-o", str(out), "--url", live)  # fmt: skip
    assert exported.returncode == 0, exported.stderr
    with out.open(newline="") as f:
        rows = {r["item"]: r for r in csv.DictReader(f)}
    gold = read_truth(truth)
    assert len(rows) == 807 and set(gold) <= set(rows)
    accuracy = sum(rows[i]["label"] == z for i, z in gold.items()) / len(gold)
    assert accuracy > 0.8  # extract's online EM on dog: 0.83


def test_live_formats_and_errors(live: str, tmp_path: Path) -> None:
    """The commands in this process (``app.cli.run``, as the script runs it): the test above
    runs the installed script."""
    pa.set_memory_pool(pa.mimalloc_memory_pool())  # (as a process starts; extract may have run)
    done = _main("import", str(DATA / "toloka.tsv"), "-p", "toloka", "--url", live,
                 "--create-with-labels", "cat,dog", "--no-progress")  # fmt: skip
    reader = httpx.post(f"{live}/v1/projects/toloka/keys", json={"scope": "read"},
                        headers={"Authorization": f"Bearer {ADMIN}"}).json()["api_key"]  # fmt: skip
    refused = run_cli("import", str(DATA / "toloka.tsv"), "-p", "toloka", "--url", live,
                      "--key", reader, "--no-progress")  # fmt: skip
    assert refused.returncode == 2 and refused.stderr.startswith("error: --key: "), refused.stderr
    assert "mend the file" not in refused.stderr and "CROWDTALLY_KEY" in refused.stderr
    assert done.returncode == 0, done.stderr
    # the reader's memory given back as freed (mimalloc kept 62 MiB more over 1M answers)
    assert pa.default_memory_pool().backend_name == "system"
    assert "toloka, 6 labels" in done.stdout and "1 gold, 2 rows skipped" in done.stdout
    studio = _main("import", str(DATA / "labelstudio.json"), "-p", "studio", "--url", live,
                   "--create-with-labels", "auto", "--no-progress")  # fmt: skip
    assert studio.returncode == 0 and "labelstudio, 6 labels" in studio.stdout
    out = tmp_path / "w.jsonl"
    workers = _main("export", "-p", "studio", "--what", "workers", "--format", "jsonl",
                    "--confusion", "-o", str(out), "--url", live)  # fmt: skip
    assert workers.returncode == 0, workers.stderr
    names = {json.loads(x)["worker"] for x in out.read_text().splitlines()}
    assert names == {"1", "2", "carol@example.com"}
    bad = _write(tmp_path, "bad.csv", "item,worker,label\na,w,cat\nb,w,zebra\n")
    refused = _main("import", str(bad), "-p", "toloka", "--url", live)
    assert refused.returncode == 2 and f"{bad}:3:" in refused.stderr
    folder = _main("export", "-p", "studio", "-o", str(tmp_path / "no" / "x.csv"), "--url", live)
    assert folder.returncode == 2 and "--output: no folder" in folder.stderr
    dots = _write(tmp_path, "dots.csv", "item,worker,label\n..,.,x\n.,..,gold\n")
    made = _main("import", str(dots), "-p", "dots", "--url", live, "--create-with-labels", "gold,x")
    assert made.returncode == 0, made.stderr
    workers = tmp_path / "dots-workers.csv"  # each worker fetched by name: '.' and '..' too
    out = _main("export", "-p", "dots", "-o", str(workers), "--what", "workers", "--confusion",
                "--url", live)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert sorted(line.split(",")[0] for line in workers.read_text().splitlines()[1:]) == [
        ".",
        "..",
    ]
    truth = tmp_path / "truth.csv"  # with a byte order mark, as Excel writes CSV
    truth.write_bytes(b"\xef\xbb\xbfitem,label\n..,x\n.,cat\n")
    wrong = _main("import", str(dots), "-p", "dots", "--url", live, "--truth", str(truth))
    assert wrong.returncode == 2, wrong.stderr
    assert wrong.stderr.startswith(f"error: {truth}:3: gold label 'cat' is not one of"), (
        wrong.stderr
    )
    truth.write_bytes(b"\xef\xbb\xbfitem,label\n..,x\n")
    right = _main("import", str(dots), "-p", "dots", "--url", live, "--truth", str(truth))
    assert right.returncode == 0, right.stderr
    with_gold = _write(tmp_path, "with-gold.csv", "item,worker,label,gold\n..,.,x,gold\n")
    both = _main("import", str(with_gold), "-p", "dots", "--url", live, "--truth", str(truth),
                 "--map", "gold=gold")  # fmt: skip
    assert both.returncode == 2  # (the truth file's gold won, silently)
    assert (
        f"{truth}:2: item '..' has gold 'x' here and 'gold' in {with_gold}, line 2" in both.stderr
    )
    wrong_url = _main("import", str(dots), "-p", "dots", "--url", live + "/v1")
    assert wrong_url.returncode != 0 and "no project named" not in wrong_url.stderr
    assert "404 not_found" in wrong_url.stderr and "without /v1" in wrong_url.stderr
    reused = _write(tmp_path, "reused.csv", "item,worker,label,id\nk1,w1,x,r1\nk2,w2,gold,r1\n")
    refused_id = _main("import", str(reused), "-p", "dots", "--url", live)
    assert refused_id.returncode == 2
    assert f"{reused}:3: id 'r1' names another answer on line 2" in refused_id.stderr
    typed = tmp_path / "dots-workers.parquet"  # (no worker has gold: a column of nulls)
    assert _main("export", "-p", "dots", "-o", str(typed), "--what", "workers",
                 "--url", live).returncode == 0  # fmt: skip
    schema = pq.read_schema(typed)
    assert (
        schema.names == list(transfer.WORKER_FIELDS)
        and schema.field("gold_accuracy").type == pa.float64()
    )
    httpx.post(f"{live}/v1/projects", json={"name": "none", "labels": ["a", "b"]},
               headers={"Authorization": f"Bearer {ADMIN}"}).raise_for_status()  # fmt: skip
    empty = tmp_path / "none-workers.parquet"
    assert _main("export", "-p", "none", "-o", str(empty), "--what", "workers", "--confusion",
                 "--url", live).returncode == 0  # fmt: skip
    assert pq.read_schema(empty).names == [*transfer.WORKER_FIELDS, "a->a", "a->b", "b->a", "b->b"]
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)  # (as /dev/stdout may be: renaming the export over it replaced the link)
    piped = _main("export", "-p", "studio", "-o", str(pipe), "--url", live)
    assert piped.returncode == 2 and "is not a regular file" in piped.stderr and pipe.is_fifo()
    unwritable = _main("export", "-p", "studio", "-o", "/proc/x.csv", "--url", live)
    assert unwritable.returncode == 2 and "Traceback" not in unwritable.stderr
    assert unwritable.stderr.startswith("error: /proc/x.csv.part: ")
    gold = _write(tmp_path, "gold.csv", "item,worker,label\na,w,gold\nb,w,x\n")
    made = _main("import", str(gold), "-p", "golden", "--url", live,
                 "--create-with-labels", "gold,x", "--no-progress")  # fmt: skip
    assert made.returncode == 0, made.stderr
    clash = _main("export", "-p", "golden", "-o", str(tmp_path / "g.parquet"), "--url", live)
    assert clash.returncode == 2 and "a class named 'gold' would give the Parquet" in clash.stderr
    assert (
        _main("export", "-p", "golden", "-o", str(tmp_path / "g.csv"), "--url", live).returncode
        == 0
    )
    nobody = _main(
        "import",
        str(bad),
        "-p",
        "x",
        "--url",
        "http://127.0.0.1:9",
        "--retries",
        "1",
        "--no-progress",
    )
    assert nobody.returncode == 2 and "cannot reach" in nobody.stderr


@pytest.mark.slow
def test_every_shared_dataset_imports_and_exports_with_one_command_each(
    live: str, datasets_root: Path, tmp_path: Path
) -> None:
    """The commands run in this process (the same typer app, over HTTP to the live service):
    the tests above run the installed script, started once per command (about 0.5 s of CPU each)."""
    from bench.datasets import dataset_names

    runner, env = CliRunner(), {"CROWDTALLY_KEY": ADMIN}
    for name in dataset_names(datasets_root):
        answers = datasets_root / name / "answers.csv"
        with answers.open() as f:
            n_answers = sum(1 for _ in f) - 1
        project = f"all-{name.replace('_', '-')}"
        done = runner.invoke(cli_app, ["import", str(answers), "--project", project, "--url", live,
                                       "--create-with-labels", "auto", "--progress"], env=env)  # fmt: skip
        assert done.exit_code == 0, (name, done.output)
        assert f"{n_answers:,} new, 0 already there" in done.stdout, (name, done.stdout)
        out = tmp_path / f"{name}.jsonl"
        exported = runner.invoke(cli_app, ["export", "--project", project, "--what", "posteriors",
                                           "--format", "jsonl", "-o", str(out), "--url", live],
                                 env=env)  # fmt: skip
        assert exported.exit_code == 0, (name, exported.output)
        items = {json.loads(line)["item"] for line in out.read_text().splitlines()}
        gold = read_truth(datasets_root / name / "truth.csv")
        assert set(gold) <= items, name


@pytest.mark.parametrize("cut", [1, 2, 3, 7, 4096])
def test_the_export_is_copied_as_it_streams_each_line_ending_in_a_line_feed(
    cut: int, tmp_path: Path
) -> None:
    """The posteriors' export reaches the file byte for byte but for CRLF, which becomes a line
    feed even when a chunk of the stream ends between the two (chunks of ``cut`` bytes)."""
    body = 'item,label\r\n"a,b",x\r\nc,é\r\n'.encode()

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/export"):
            chunks = [body[at : at + cut] for at in range(0, len(body), cut)]
            return httpx.Response(200, content=iter(chunks))
        return httpx.Response(200, json={"labels": ["x", "é"]})

    out = tmp_path / "posteriors.csv"
    with httpx.Client(transport=httpx.MockTransport(answer), base_url="http://t") as http:
        assert transfer.run_export(http, "p", out) == 2
    assert out.read_bytes() == body.replace(b"\r\n", b"\n")


@pytest.mark.parametrize("limit", [{"max_block_labels": 50}, {"max_body_bytes": 4096}])
def test_an_import_halves_its_blocks_for_a_service_that_takes_smaller_ones(
    tmp_path: Path, limit: dict[str, int]
) -> None:
    """A service whose blocks hold at most 50 labels (413 block_too_large), or 4 KiB (413
    body_too_large: about 37 of these labels with their ids), refuses the import's blocks of
    120: they are sent again as 60, then 30, and every answer goes in once."""
    store = EmbeddedStore(tmp_path / "crowdtally.sqlite3")
    app = create_app(service_settings(tmp_path, **limit), store=store)
    answers = tmp_path / "answers.csv"
    rows = [f"i{n % 40},w{n % 7},{'ab'[n % 3 == 0]}" for n in range(230)]
    answers.write_text("item,worker,label\n" + "\n".join(rows) + "\n")
    with TestClient(app, headers={"Authorization": f"Bearer {ADMIN}"}) as service:
        r = transfer.run_import(service, answers, "small", auto_labels=True, batch_size=120)
        assert (r.accepted, r.duplicates, r.blocks) == (230, 0, 8)  # 8 blocks of 30 or fewer
        assert _stats(service, "small")["n_labels"] == 230
        again = transfer.run_import(service, answers, "small", batch_size=120)
        assert (again.accepted, again.duplicates) == (0, 230)
    store.close()


def test_every_jsonl_export_is_compact_utf8_and_counts_what_it_wrote(
    service: TestClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The labels and workers exports wrote ``"w\\u00e9"`` with spaced separators where the
    posteriors' JSONL is raw UTF-8; ``--what labels`` counted its item rows as labels."""
    monkeypatch.setattr(transfer, "make_http", lambda url, key: contextlib.nullcontext(service))
    monkeypatch.chdir(tmp_path)
    answers = tmp_path / "accents.csv"
    answers.write_text("item,worker,label\nimagé,wé,cat\nimagé,w2,dog\n", encoding="utf-8")
    transfer.run_import(service, answers, "utf8", create_with=["cat", "dog"])
    runner = CliRunner()
    for what, count in [("labels", "1 items"), ("workers", "2 workers")]:
        out = runner.invoke(
            cli_app, ["export", "-p", "utf8", "--what", what, "-o", f"{what}.jsonl"]
        )
        assert out.exit_code == 0 and f": {count}" in out.output, out.output
        text = Path(f"{what}.jsonl").read_text(encoding="utf-8")
        assert "\\u00e9" not in text and ('"wé"' in text or '"imagé"' in text)
        assert ", " not in text.splitlines()[0] and '": ' not in text.splitlines()[0]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["export", "-p", "", "-o", "-"], "--project: '' is not a project name"),
        (["import", "a.csv", "-p", "a b"], "--project: 'a b' is not a project name"),
        (["calibration", "-p", "/x"], "--project: '/x' is not a project name"),
        (
            ["import", "a.csv", "-p", "ok", "--create-with-labels", "a,,b"],
            "--create-with-labels: class names cannot be empty, got 'a,,b'",
        ),
        (  # (it was ignored without a word)
            ["export", "-p", "ok", "--what", "posteriors", "--confusion", "-o", "p.csv"],
            "--confusion: adds the workers' matrices: it applies to --what workers",
        ),
    ],
)
def test_bad_project_names_and_labels_are_refused_before_a_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], message: str
) -> None:
    """One line, status 2, no request sent (an empty name asked for /v1/projects/, whose
    bodiless redirect was printed as "Expecting value: line 1 column 1 (char 0)")."""
    monkeypatch.chdir(tmp_path)
    _write(tmp_path, "a.csv", "item,worker,label\ni,w,a\n")
    run = run_cli(*args, "--url", "http://127.0.0.1:9")  # (nothing listens there)
    assert run.returncode == 2 and message in run.stderr, run.stderr
    assert "Traceback" not in run.stderr and "cannot reach" not in run.stderr


@given(st.lists(st.sampled_from(["0", "1", "01", "+1", "10", "-2", "x", "X", "1.0"]), min_size=1))
def test_one_label_order_for_every_command_whatever_the_order_of_the_answers(
    names: list[str],
) -> None:
    """import --create-with-labels auto sorted a set by number, so '1' and '01' came out in
    the set's order (varying from run to run), and in another order than extract's."""
    from app.io.extract import resolve_classes
    from app.io.input import label_order

    order = label_order(names)
    assert order == label_order(reversed(names)) == sorted(set(names), key=order.index)
    if len(order) >= 2:  # (extract needs two classes)
        assert list(resolve_classes(names, None, None, "f")) == order
    if all(n.lstrip("+-").isdigit() for n in names):
        assert [int(n) for n in order] == sorted(int(n) for n in order)
