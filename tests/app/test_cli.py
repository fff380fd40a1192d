"""``crowdtally extract`` end to end: through the installed script (the seed's examples, a
missing file, help), and through the function the script runs (``app.cli.run``, the same
argument parsing, output, errors and exit codes) in this process for the many other cases:
each interpreter start costs about 0.8 s of CPU, most of this file's time."""

from __future__ import annotations

import csv
import gc
import gzip
import io
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pytest

from app.io import codes
from app.io import extract as job
from app.io.codes import read_codes
from app.io.input import InputError
from app.io.model_file import SavedModel, load_model, save_model
from core.hashing import worker_slots
from core.nominal import NominalConfig
from core.online import OnlineEM
from tests.app.conftest import not_utf8
from tests.cli_in_process import run_cli


def extract_script(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """``crowdtally extract ARGS``: the installed script, in a new process."""
    return subprocess.run(
        ["crowdtally", "extract", *map(str, args)], capture_output=True, text=True, timeout=300
    )


def extract(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """``crowdtally extract ARGS`` as the script runs it, in this process."""
    return run_cli("extract", *args)


@pytest.fixture
def dog(datasets_root: Path) -> Path:
    return datasets_root / "dog"


def test_seed_flags_print_the_table(dog: Path, tmp_path: Path) -> None:
    # The seed's example run, flag for flag (with its underscore spellings), on a shared set.
    run = extract_script(
        "--initial_t", "10000", "--n_items", "807", "--n_labels", "4", "--priorz", "1,1,1,1",
        "--model", tmp_path / "flass", "--data", dog / "answers.csv", "--eta", "1", "--rho", "0.5",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert (
        "initial_t = 10000" in lines[0]
        and "priorz = 0.250000,0.250000,0.250000,0.250000" in lines[0]
    )
    assert lines[1].startswith("average F")
    counters = [int(ln.split()[2]) for ln in lines[3:] if ln[:1] == "-"]
    assert counters == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 807]
    assert (tmp_path / "flass").exists()


def test_extract_runs_with_the_cycle_collector_paused(
    dog: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Loading numba makes the collector walk several hundred thousand objects again and
    again (70 ms of a 1 s run); extract pauses it, and it runs again after, as it was."""
    seen: list[bool] = []
    monkeypatch.setattr(codes, "use_system_allocator", lambda: seen.append(gc.isenabled()))
    done = extract(dog / "answers.csv", "--predictions", tmp_path / "p.csv")
    assert done.returncode == 0, done.stderr
    assert seen == [False]
    assert gc.isenabled()
    gc.disable()
    try:  # (a job run by a caller that had paused it leaves it paused)
        assert extract(dog / "answers.csv", "--predictions", tmp_path / "p.csv").returncode == 0
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_truth_predictions_and_accuracy(dog: Path, tmp_path: Path) -> None:
    out = tmp_path / "pred.csv"
    run = extract(
        dog / "answers.csv", "--truth", dog / "truth.csv", "--predictions", out, "--shuffle", "0"
    )
    assert run.returncode == 0, run.stderr
    accuracy = float(
        next(ln for ln in run.stdout.splitlines() if ln.startswith("accuracy")).split()[1]
    )
    assert accuracy > 0.82  # majority vote gets 0.8178 on dog
    with out.open() as fh:
        rows = list(csv.reader(fh))
    assert rows[0] == ["item", "label", "probability", "0", "1", "2", "3"]
    assert len(rows) == 1 + 807
    probs = np.array([[float(x) for x in r[3:]] for r in rows[1:]])
    assert probs.sum(axis=1) == pytest.approx(1.0, abs=1e-4)
    for r, p in zip(rows[1:], probs, strict=True):
        assert r[1] == str(int(p.argmax())) and float(r[2]) == pytest.approx(p.max(), rel=1e-4)
    again = tmp_path / "again.csv"  # -o, as export names its output
    run = extract(dog / "answers.csv", "--truth", dog / "truth.csv", "-o", again, "--shuffle", "0")
    assert run.returncode == 0 and again.read_bytes() == out.read_bytes(), run.stderr


@pytest.mark.parametrize(
    ("truth", "message"),
    [
        ("item,label\nnot-an-item,0\n", "none of its 1 items is among the answers' items"),
        ("item,label\n", "no gold label in it"),
        ("", "no gold label in it"),
    ],
)
def test_a_truth_file_that_names_no_item_of_the_answers_is_refused(
    dog: Path, tmp_path: Path, truth: str, message: str
) -> None:
    """It printed "accuracy nan on 0 items with gold" and exited 0."""
    path = tmp_path / "truth.csv"
    path.write_text(truth)
    run = extract(dog / "answers.csv", "--truth", path)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert message in run.stderr


def test_a_missing_weight_is_called_missing(tmp_path: Path) -> None:
    """A Parquet null weight (or an empty cell) read "weight '' is not a number"."""
    path = tmp_path / "w.parquet"
    table = {"item": ["a", "b"], "worker": ["w", "v"], "label": ["0", "1"], "weight": [1.0, None]}
    pq.write_table(pa.table(table), path)
    run = extract(path)
    assert run.stderr == f"error: {path}:2: no weight (an empty cell, or a null in Parquet)\n"


def test_truth_rows_the_answers_do_not_hold_or_repeat(dog: Path, tmp_path: Path) -> None:
    """Gold of an item with no answers was left out without a word; the same gold twice was
    an error (the API takes it as a repeat); a bad gold label named no line and hinted at a
    header that was there; a Parquet or gzip file was 'not UTF-8 text'."""
    path = tmp_path / "truth.csv"
    path.write_text("item,label\n1,3\nzzz,1\n1,3\n")
    run = extract(dog / "answers.csv", "--truth", path)
    assert run.returncode == 0, run.stderr
    assert "warning: 1 of the 2 items with gold have no answers: they are not scored" in run.stderr
    assert "on 1 items with gold" in run.stdout
    path.write_text("item,label\n1,3\n1,2\n")
    run = extract(dog / "answers.csv", "--truth", path)
    assert run.returncode == 2 and f"{path}:3: item '1' has gold '3' on line 2" in run.stderr
    path.write_text("item,label\n1,9\n2,0\n")
    run = extract(dog / "answers.csv", "--truth", path)
    assert run.stderr == (f"error: {path}:2: gold label '9' is not among the classes "
                          "['0', '1', '2', '3']\n")  # fmt: skip
    parquet = tmp_path / "truth.parquet"
    pq.write_table(pa.table({"item": ["1"], "label": ["0"]}), parquet)
    run = extract(dog / "answers.csv", "--truth", parquet)
    assert run.stderr == f"error: {parquet}: a Parquet file, where CSV text is read\n"
    packed = tmp_path / "answers.csv.gz"
    packed.write_bytes(gzip.compress((dog / "answers.csv").read_bytes()))
    run = extract(packed)
    assert run.stderr == f"error: {packed}: a gzip-compressed file: decompress it first\n"


def test_a_loaded_model_is_not_silently_set_aside(dog: Path, tmp_path: Path) -> None:
    """--load with --batch, or with other --labels than the model's, ran as if no model had
    been given."""
    model = tmp_path / "m.npz"
    assert extract(dog / "answers.csv", "--save", model).returncode == 0
    batch = extract(dog / "answers.csv", "--load", model, "--batch")
    assert batch.returncode == 2 and "--load: applies to online EM only" in batch.stderr
    named = extract(dog / "answers.csv", "--load", model, "--labels", "3,2,1,0")
    assert named.returncode == 2 and "--labels: 3,2,1,0, but" in named.stderr
    same = extract(dog / "answers.csv", "--load", model, "--labels", "0,1,2,3")
    assert same.returncode == 0, same.stderr


def test_save_load_test_only_round_trip(dog: Path, tmp_path: Path) -> None:
    model, p1, p2 = tmp_path / "m.npz", tmp_path / "a.csv", tmp_path / "b.csv"
    assert extract(dog / "answers.csv", "--save", model, "--predictions", p1).returncode == 0
    run = extract(dog / "answers.csv", "--load", model, "--test-only", "--predictions", p2)
    assert run.returncode == 0, run.stderr
    assert "online EM: 8070 labels scored (--test-only: none learned) in" in run.stdout
    # test-only under the saved final parameters reproduces the final posteriors exactly
    assert p1.read_text() == p2.read_text()


def _report(stdout: str) -> dict[str, float]:
    """Accuracy, ECE and NLL from extract's report on the items with gold."""
    lines = stdout.splitlines()
    acc = next(ln for ln in lines if ln.startswith("accuracy")).split()
    cal = next(ln for ln in lines if ln.startswith("calibration on them")).split()
    return {"acc": float(acc[1]), "ece": float(cal[4]), "nll": float(cal[7])}


def _probabilities(path: Path) -> np.ndarray:
    with path.open() as fh:
        return np.array([[float(x) for x in r[3:]] for r in list(csv.reader(fh))[1:]])


@pytest.mark.parametrize("mode", [(), ("--batch",)], ids=["online", "batch"])
def test_predictions_are_the_calibrated_posteriors_the_service_serves(
    dog: Path, tmp_path: Path, mode: tuple[str, ...]
) -> None:
    served, raw, again, model = (tmp_path / n for n in ("s.csv", "r.csv", "t.csv", "m.npz"))
    truth = ("--truth", dog / "truth.csv")
    run = extract(dog / "answers.csv", *mode, *truth, "--predictions", served, "--save", model)
    own = extract(dog / "answers.csv", *mode, *truth, "--predictions", raw, "--raw")
    assert run.returncode == 0 and own.returncode == 0, run.stderr + own.stderr
    assert "(calibrated posteriors, as served)" in run.stdout
    assert "(the model's own posteriors)" in own.stdout
    rho = next(ln for ln in run.stdout.splitlines() if ln.startswith("posteriors calibrated"))
    assert 0 < float(rho.split("correlated at ")[1].split()[0]) <= 1  # dog's are not independent
    assert "posteriors calibrated" not in own.stdout
    a, b = _report(run.stdout), _report(own.stdout)
    # probabilities that mean more: dog's model is overconfident (NLL 1.4)
    assert a["nll"] < 0.8 * b["nll"] and a["ece"] < b["ece"]
    p, q = _probabilities(served), _probabilities(raw)
    same = p.argmax(axis=1) == q.argmax(axis=1)
    if not mode:  # the same labels: tempering keeps each item's most probable one
        assert a["acc"] == b["acc"] and same.all()
    else:  # a batch fit is served held out (eq. 26), which moves a few near-ties
        assert abs(a["acc"] - b["acc"]) < 0.01 and same.mean() > 0.98
    assert not np.allclose(p, q)
    # a saved model keeps what the calibration needs: --test-only serves the same again
    test = extract(dog / "answers.csv", "--load", model, "--test-only", "--predictions", again)
    assert test.returncode == 0, test.stderr
    if not mode:
        assert again.read_text() == served.read_text()
    else:  # the saved model is the fit mapped into hashed slots (2 of dog's workers share one),
        # and --test-only takes the answers as new ones: not held out (eq. 26)
        t = _probabilities(again)
        assert np.abs(t - p).mean() < 0.02 and np.mean(t.argmax(1) == p.argmax(1)) > 0.97


def _agreement(stdout: str) -> float:
    line = next(ln for ln in stdout.splitlines() if ln.startswith("batch EM:"))
    return float(line.split("on ")[-1].split("%")[0])


def test_batch_reports_its_agreement_with_one_online_pass(dog: Path, tmp_path: Path) -> None:
    # dog in full: the two agree; one answer per item: batch EM puts every item in one class
    # (docs/model.md, "A limit: batch EM on one answer per item"), the online pass does not
    first = tmp_path / "first.csv"
    header, *rows = (dog / "answers.csv").read_text().splitlines()
    first_answer: dict[str, str] = {}
    for row in rows:
        first_answer.setdefault(row.split(",")[0], row)
    first.write_text("\n".join([header, *first_answer.values()]) + "\n")
    full, thin = (extract(f, "--batch", "--n-labels", "4") for f in (dog / "answers.csv", first))
    assert full.returncode == 0 and thin.returncode == 0, full.stderr + thin.stderr
    assert _agreement(full.stdout) > 90.0 and _agreement(thin.stdout) < 50.0
    assert "100% of the items have one answer" in thin.stderr and "warning" not in full.stderr
    assert "agree" not in extract(dog / "answers.csv", "--batch", "--raw").stdout


def test_batch_mode(dog: Path, tmp_path: Path) -> None:
    run = extract(
        dog / "answers.csv", "--batch", "--truth", dog / "truth.csv", "--save", tmp_path / "b.npz"
    )
    assert run.returncode == 0, run.stderr
    tables = run.stdout.split("worker prior lambda_A = ")[1:]  # a table for each fit
    assert tables[0].startswith("1, to convergence") and "(converged; held-out" in tables[0]
    assert tables[1].startswith("2, a probe of 5 iterations") and "(probe; held-out" in tables[1]
    assert "worker prior lambda_A = 1, chosen by the held-out answers (tried 1, 2)" in run.stdout
    assert (
        float(next(ln for ln in run.stdout.splitlines() if ln.startswith("accuracy")).split()[1])
        > 0.83
    )
    assert extract(dog / "answers.csv", "--load", tmp_path / "b.npz", "--test-only").returncode == 0
    # the fit mapped into the hashed slots its workers fall in, their rows only (a row for each
    # of the 65,536 slots was 5.2 GB at 100 classes)
    with dog.joinpath("answers.csv").open() as fh:
        names = sorted({row["worker"] for row in csv.DictReader(fh)})
    slots = np.unique(worker_slots(names, NominalConfig(n_classes=4).n_worker_slots))
    saved = load_model(tmp_path / "b.npz")
    assert np.array_equal(saved.slots, slots) and saved.params.worker.shape == (slots.size, 4, 4)


def test_one_pass_over_weak_workers_keeps_the_pooled_twin(tmp_path: Path) -> None:
    """Workers right 55-65% of the time, 15 answers an item: the pass keeps its pooled twin
    (docs/model.md eq. 29), says so, saves its worker prior and votes about as well as the
    majority (one pass alone: 6 points below it on this crowd)."""
    from tests.core.test_orientation import weak_binary

    blocks, truth, votes = weak_binary(0)
    items = np.repeat(np.arange(blocks.n_blocks), blocks.sizes())
    answers, gold = tmp_path / "answers.csv", tmp_path / "truth.csv"
    rows = (
        f"i{i},w{w},{'ab'[a]}" for i, w, a in zip(items, blocks.slots, blocks.labels, strict=True)
    )
    answers.write_text("item,worker,label\n" + "\n".join(rows) + "\n")
    gold.write_text("item,label\n" + "".join(f"i{i},{'ab'[t]}\n" for i, t in enumerate(truth)))
    run = extract(answers, "--truth", gold, "--shuffle", "0", "--save", tmp_path / "m.npz")
    assert run.returncode == 0, run.stderr
    assert "worker prior lambda_A = 32, chosen by how well each predicted" in run.stdout
    accuracy = float(
        next(ln for ln in run.stdout.splitlines() if ln.startswith("accuracy")).split()[1]
    )
    assert accuracy > np.mean(votes == truth) - 0.02
    assert load_model(tmp_path / "m.npz").config.worker_prior == 32.0


def test_newton_later_passes_reach_batch_em(dog: Path, tmp_path: Path) -> None:
    run = extract(
        dog / "answers.csv", "--truth", dog / "truth.csv", "--shuffle", "0", "--passes", "10",
        "--later-passes", "newton", "--save", tmp_path / "n.npz",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    start = lines.index("Newton sweep   F (log posterior)")
    sweeps = [ln.split() for ln in lines[start + 1 : start + 10]]
    assert [int(n) for n, _ in sweeps] == list(range(1, 10))
    f = [float(v) for _, v in sweeps]
    assert f == sorted(f) and f[-1] - f[0] > 1.0  # F never falls, and it rose
    batch = extract(dog / "answers.csv", "--batch", "--truth", dog / "truth.csv")
    accuracy = [
        float(next(ln for ln in r.stdout.splitlines() if ln.startswith("accuracy")).split()[1])
        for r in (run, batch)
    ]
    assert abs(accuracy[0] - accuracy[1]) <= 0.003  # dog: 83.89% against batch EM's 84.01%
    assert extract(dog / "answers.csv", "--load", tmp_path / "n.npz", "--test-only").returncode == 0


def test_newton_refuses_a_loaded_model_with_difficulty(dog: Path, tmp_path: Path) -> None:
    model = tmp_path / "d.npz"
    assert extract(dog / "answers.csv", "--difficulty", "--save", model).returncode == 0
    for extra, message in (
        (["--passes", "2"], "newton needs a model without difficulty"),
        (["--test-only"], "cannot be used with --test-only"),
    ):
        run = extract(dog / "answers.csv", "--load", model, "--later-passes", "newton", *extra)
        assert run.returncode == 2 and message in run.stderr, run.stderr
        assert "Traceback" not in run.stderr


def test_tab_separated_with_string_labels(tmp_path: Path) -> None:
    data = tmp_path / "a.tsv"
    data.write_text("i1\tw1\tcat\ni1\tw2\tcat\ni2\tw1\tdog\ni2\tw2 \tdog\n")
    run = extract(data)
    assert run.returncode == 0, run.stderr
    assert "2 items, 4 labels, 2 classes" in run.stdout


def test_crowd_kit_headers_are_headers(tmp_path: Path) -> None:
    data, truth = tmp_path / "answers.csv", tmp_path / "gt.csv"
    data.write_text("task,worker,label\ni1,w1,cat\ni1,w2,cat\ni2,w1,dog\ni2,w2,dog\n")
    truth.write_text("task,true_label\ni1,cat\ni2,dog\n")
    run = extract(data, "--truth", truth)
    assert run.returncode == 0, run.stderr
    assert "2 items, 4 labels, 2 classes" in run.stdout  # the header is not an answer
    assert "accuracy 1.0000 on 2 items with gold" in run.stdout


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("item,worker,label\na,w,1\nb,w\n", ":3: expected 3 fields (item, worker, label), got 2"),
        ("item,worker,label\na,w,1\n,w,0\n", ":3: empty item"),
        ("item,worker,label\na,w,1\nb,w,0\nc,w,1,2,3\n", ":4: expected 3 fields"),
        (
            "item,worker,label,weight\na,w,1,1\nb,w,0,-1\n",
            ":3: weight '-1' must be a finite number >= 0",
        ),
        (
            "item,worker,label\na,w,1\nb," + "x" * 600 + ",0\n",
            ":3: worker is longer than 512 characters",
        ),
        ("item,worker,label\n", "only a header"),
        (
            "item,worker,label\n" + "".join(f"i{n},w,c{n}\n" for n in range(257)),
            ": 257 distinct labels: at most 256 classes",
        ),
        ("item,worker,label,weight,extra\na,w,0,1,x\n", ":1: unknown columns ['extra']"),
        # a header with a misspelt name (it was read as an answer: item 'item', class 'lable')
        ("item,worker,lable\na,w,0\nb,w,1\n", ":1: unknown columns ['lable']"),
        ("item,item,label\na,w,0\n", ":1: columns ['item', 'item', 'label']: item (or task),"),
        ("item,worker\na,w\n", ":1: columns ['item', 'worker']: item (or task), worker and"),
        ("item,worker,label\na\x01b,w,0\n", ":2: item 'a\\x01b': ids hold no control characters"),
        ('item,worker,label\n"a\nb",w,0\n', ":2: a quoted field runs on to the next line"),
        ('item,worker,label\na,w,0\nb,w,"1\n', ":3: a quoted field is not closed"),
        ('item,worker,label\na,w,0\nb,w,"1', ":3: a quoted field is not closed"),
        ('item,worker,label\na,"w"x,0\n', ":2: malformed quotes"),
        # the header names 3 columns: a 4th field is not a weight
        ("item,worker,label\na,w,0,1\n", ":2: expected 3 fields (item, worker, label), got 4"),
        ("item\tworker\tlabel\na\tw\t0\t1\n", ":2: expected 3 fields (item, worker, label)"),
    ],
)
def test_malformed_files_name_the_line(tmp_path: Path, content: str, message: str) -> None:
    data = tmp_path / "bad.csv"
    data.write_text(content)
    run = extract(data)
    assert run.returncode == 2
    assert message in run.stderr
    assert "Traceback" not in run.stderr


@pytest.mark.parametrize("mode", [["--batch", "--raw"], ["--batch"], []])
def test_a_weight_above_a_million_is_refused(
    tmp_path: Path, mode: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Weights of 1e17 made batch EM's posteriors NaN (written as 'nan', or as 0.5 once
    calibrated); an answer may weigh up to 1e6, and such weights give finite posteriors."""
    monkeypatch.chdir(tmp_path)
    rows = [f"i{i},w{j},{'ab'[(i + j) % 3 == 0]}" for i in range(20) for j in range(3)]
    weights = ["1e17" if n % 5 == 0 else "1" for n in range(len(rows))]
    heavy = Path("heavy.csv")
    heavy.write_text("item,worker,label,weight\n" + "".join(
        f"{r},{w}\n" for r, w in zip(rows, weights, strict=True)))  # fmt: skip
    run = extract(heavy, *mode, "--predictions", "p.csv")
    assert run.returncode == 2 and not Path("p.csv").exists()
    assert run.stderr == ("error: heavy.csv:2: weight '1e17' is above 1e+06, the most one answer "
                          "may weigh (a weight counts as that many answers): scale the weights "
                          "down\n")  # fmt: skip
    bound = Path("bound.csv")
    bound.write_text(heavy.read_text().replace("1e17", "1e6"))
    run = extract(bound, *mode, "--predictions", "p.csv")
    assert run.returncode == 0, run.stderr
    with open("p.csv", newline="") as fh:
        posteriors = np.array([r[2:] for r in list(csv.reader(fh))[1:]], dtype=float)
    assert posteriors.shape == (20, 3) and np.isfinite(posteriors).all()


def test_label_outside_declared_classes(tmp_path: Path) -> None:
    data = tmp_path / "a.csv"
    data.write_text("item,worker,label\na,w,yes\nb,w,no\nc,w,maybe\n")
    run = extract(data, "--labels", "yes,no")
    assert run.returncode == 2 and ":4: label 'maybe' is not one of ['yes', 'no']" in run.stderr
    run = extract(data, "--n-labels", "2")
    assert run.returncode == 2 and "name the classes with --labels" in run.stderr
    assert run.stderr.startswith("error: --n-labels: 2 classes, but")
    run = extract(data, "--n_labels", "3")  # three distinct labels: classes in sorted order
    assert run.returncode == 0 and "labels = maybe,no,yes" in run.stdout, run.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--test-only"], "needs a model to test"),
        (["--load", "missing.npz"], "missing.npz: no such file"),
        (["--eta", "-1"], "--eta: must be a finite number >= 0"),
        (["--priorz", "1,x"], "expected comma-separated numbers"),
        (["--priorz", "1,1,1"], "--priorz: needs 2 positive numbers, one per class"),
        (["--later-passes", "newton", "--difficulty"], "newton needs a model without difficulty"),
    ],
)
def test_bad_options(tmp_path: Path, args: list[str], message: str) -> None:
    data = tmp_path / "a.csv"
    data.write_text("item,worker,label\na,w,0\nb,w,1\n")
    run = extract(data, *args)
    assert run.returncode == 2 and message in run.stderr and "Traceback" not in run.stderr


def test_standard_input_is_named_as_not_read() -> None:
    run = extract(Path("-"))
    assert run.returncode == 2
    assert run.stderr == "error: -: standard input is not read: give the answers' file\n"


def test_outputs_go_through_links_and_never_replace_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A predictions or model path that is a symbolic link is written through (the link
    stays, its target gets the file); a link to standard output (``/dev/stdout``, which the
    write beside and rename over it once replaced, as root, with a regular file) is refused
    with a pointer to ``-``."""
    monkeypatch.chdir(tmp_path)
    Path("a.csv").write_text("item,worker,label\na,w,0\nb,w,1\n")
    for name in ("p-target.csv", "m-target.npz"):
        Path(name).write_text("old")
    Path("p.csv").symlink_to("p-target.csv")
    Path("m.npz").symlink_to("m-target.npz")
    run = extract("a.csv", "--predictions", "p.csv", "--model", "m.npz")
    assert run.returncode == 0, run.stderr
    assert Path("p.csv").is_symlink() and Path("m.npz").is_symlink()
    assert Path("p-target.csv").read_text().startswith("item,label,probability")
    assert Path("m-target.npz").read_bytes()[:2] == b"PK"  # (a .npz archive)
    Path("out").symlink_to("/proc/self/fd/1")
    refused = extract("a.csv", "--predictions", "out")
    assert refused.returncode == 2 and "not to a regular file: give a file name, or - for" in (
        refused.stderr
    )
    assert Path("out").is_symlink()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--labels", "0,1,"], "--labels: class names cannot be empty, got '0,1,'"),
        (["--labels", ""], "--labels: class names cannot be empty"),
        (["--batch", "--passes", "3"], "--passes: applies to online EM only"),
        (["--batch", "--shuffle", "1"], "--shuffle: applies to online EM only"),
        (["--batch", "--later-passes", "newton"], "--later-passes: applies to online EM only"),
        (
            ["--load", "m.npz", "--test_only", "--passes", "3"],
            "--passes: 3, but --test_only learns nothing: it scores each item once (one pass)",
        ),
        (["--predictions", "no/p.csv"], "--predictions: no folder no to write p.csv in"),
        (["--predictions", "."], "--predictions: give a file name"),
        (["--predictions", "out"], "--predictions: out is a folder: give a file name"),
        (["--predictions", "a.csv"], "--predictions: a.csv is an input of this command"),
        (["--model", "no/m.npz"], "--model: no folder no to write m.npz in"),
        (["--model", "-"], "--model: cannot write to standard output (a model is a binary"),
        (["--predictions", "p.csv", "--model", "./p.csv"], "--model: p.csv is the --predictions"),
        (["--truth", "out"], "--truth: out is a folder, not a file"),
        (["--load", "a.csv"], "a.csv: not a readable crowdtally model (not a .npz archive of"),
    ],
)
def test_bad_paths_and_flags_are_refused_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], message: str
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out").mkdir()
    Path("a.csv").write_text("item,worker,label\na,w,0\nb,w,1\n")
    run = extract("a.csv", *args)
    assert run.returncode == 2 and message in run.stderr and "Traceback" not in run.stderr
    assert run.stdout == ""  # (nothing read, nothing fitted)
    assert Path("a.csv").read_text() == "item,worker,label\na,w,0\nb,w,1\n"
    assert not Path("-").exists()
    folder = extract("out")
    assert folder.returncode == 2 and "DATA: out is a folder, not a file" in folder.stderr


def test_predictions_to_standard_output(dog: Path, tmp_path: Path) -> None:
    """``--predictions -`` writes the CSV to standard output, the report to standard error (it
    wrote a file named '-')."""
    answers, written = dog / "answers.csv", tmp_path / "p.csv"
    assert extract(answers, "--predictions", written).returncode == 0
    run = subprocess.run(
        [sys.executable, "-m", "app.cli", "extract", answers, "--predictions", "-"],
        capture_output=True, timeout=300, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert run.stdout == written.read_bytes()
    report = run.stderr.decode()
    assert "online EM: 8070 labels" in report and "predictions written" not in report
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.csv"]


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        ({"item": [[1], [2]]}, "column 'item' holds list<element: int64>: expected text or"),
        ({"weight": [[1.0], [2.0]]}, "column 'weight' holds list<element: double>: expected"),
        ({"item": ["i", None]}, "bad.parquet:2: empty item"),
        ({"label": [None, "b"]}, "bad.parquet:1: empty label"),
    ],
)
def test_parquet_columns_of_another_type_or_with_nulls_are_refused(
    tmp_path: Path, columns: dict[str, list[object]], message: str
) -> None:
    table = {"item": ["i", "j"], "worker": ["w", "v"], "label": ["a", "b"], **columns}
    pq.write_table(pa.table(table), tmp_path / "bad.parquet")
    run = extract(tmp_path / "bad.parquet")
    assert run.returncode == 2 and message in run.stderr and "Traceback" not in run.stderr


@pytest.mark.parametrize("kind", [pa.string(), pa.binary()])
@pytest.mark.parametrize("bad", [b"\xff\xfe", b"a\xffb"], ids=["first byte", "inner byte"])
def test_a_parquet_value_that_is_not_utf8_names_its_file_row_and_column(
    tmp_path: Path, kind: pa.DataType, bad: bytes
) -> None:
    """It was pyarrow's 'Invalid UTF8 payload' (or '... sequence in input'), without the file,
    the row or the column."""
    workers = not_utf8([b"w", b"v", bad], kind)
    table = pa.table({"item": ["i", "j", "k"], "worker": workers, "label": ["a", "b", "a"]})
    pq.write_table(table, tmp_path / "bad.parquet")
    run = extract(tmp_path / "bad.parquet")
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert run.stderr == f"error: {tmp_path / 'bad.parquet'}:3: column 'worker': not UTF-8 text\n"


def test_a_class_named_as_a_fixed_column_is_refused_for_parquet_only(tmp_path: Path) -> None:
    data = tmp_path / "a.csv"
    data.write_text("item,worker,label\na,w,label\nb,w,x\n")
    run = extract(data, "--predictions", tmp_path / "p.parquet")
    assert run.returncode == 2 and "a class named 'label' would give the Parquet file" in run.stderr
    run = extract(data, "--predictions", tmp_path / "p.csv")  # (read by position)
    assert run.returncode == 0, run.stderr


def test_header_words_as_ids_and_classes_read_and_write_unambiguously(tmp_path: Path) -> None:
    """Only a first row is a header: under one, an answer of item 'item', worker 'worker' and
    label 'label' is an answer; the predictions CSV starts with its header whatever the classes
    are named, its columns by position (README: what a file without a header does)."""
    rows = ["item,worker,label", "label,worker,item", "i,w,label", "i,v,item"]
    headed = tmp_path / "headed.csv"
    headed.write_text("item,worker,label\n" + "\n".join(rows) + "\n")
    run = extract(headed, "--predictions", tmp_path / "p.csv")
    assert run.returncode == 0 and "3 items, 4 labels, 2 classes" in run.stdout, run.stderr
    with (tmp_path / "p.csv").open(newline="") as fh:
        read = list(csv.reader(fh))
    assert read[0] == ["item", "label", "probability", "item", "label"]
    assert [r[0] for r in read[1:]] == ["item", "label", "i"]  # one row per item, in file order
    for r in read[1:]:
        assert r[2] == r[3 + ["item", "label"].index(r[1])]
    bare = tmp_path / "bare.csv"  # (documented: its first answer is taken for a header)
    bare.write_text("\n".join(rows) + "\n")
    run = extract(bare)
    assert run.returncode == 0 and "2 items, 3 labels" in run.stdout, run.stderr


def test_missing_file() -> None:
    run = extract_script("/nonexistent/answers.csv")  # one error through the script
    assert run.returncode == 2 and "no such file" in run.stderr


def test_unknown_option_is_a_usage_error_not_a_traceback() -> None:
    import subprocess

    out = subprocess.run(
        [sys.executable, "-m", "app.cli", "serve", "--hostx"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 2
    assert "No such option" in out.stderr and "Traceback" not in out.stderr


# ---------------------------------------------------------------------- the seed's flags on adult2


def test_seed_example_on_adult2_with_letter_labels(datasets_root: Path, tmp_path: Path) -> None:
    # The seed's example command line as written (process substitution and all), on adult2,
    # whose labels are G, P, R, X: --n_labels 4 counts them, in sorted order (priorz's order).
    adult2 = datasets_root / "adult2"
    model, pred = tmp_path / "flass", tmp_path / "pred.csv"
    command = (
        f"crowdtally extract --initial_t 10000 --n_items 11040 --n_labels 4 --priorz 1,1,1,1 "
        f"--model {model} --data <(cat {adult2 / 'answers.csv'}) --eta 1 --rho 0.5 "
        f"--truth {adult2 / 'truth.csv'} --predictions {pred}"
    )
    run = subprocess.run(
        ["bash", "-c", command], capture_output=True, text=True, timeout=300, check=False
    )
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert "n_items = 11040  n_labels = 4" in lines[0]
    assert lines[0].endswith("priorz = 0.250000,0.250000,0.250000,0.250000  labels = G,P,R,X")
    assert [ln for ln in lines if ln[:1] == "-"][-1].split()[2] == "11040"
    assert "11040 items, 92721 labels, 4 classes" in run.stdout
    accuracy = float(next(ln for ln in lines if ln.startswith("accuracy")).split()[1])
    assert accuracy > 0.7  # 333 gold items
    with pred.open() as fh:
        header = next(csv.reader(fh))
    assert header == ["item", "label", "probability", "G", "P", "R", "X"]
    # the model keeps the class names: test-only with the seed's spelling reproduces them
    again = extract(adult2 / "answers.csv", "--load", model, "--test_only", "--n_labels", "4")
    assert again.returncode == 0 and "labels = G,P,R,X" in again.stdout, again.stderr


@pytest.mark.parametrize(
    ("content", "args", "classes"),
    [
        ("a,w,1\nb,w,2\nc,w,3\n", ["--n_labels", "3"], "1,2,3"),  # not indices: sorted
        ("a,w,10\nb,w,9\nc,w,-2\n", ["--n-labels", "3"], "-2,9,10"),  # numerically
        ("a,w,0\nb,w,2\n", ["--n_labels", "4"], "0,1,2,3"),  # indices: unseen classes kept
        ("a,w,b\nb,w,a\n", ["--n_labels", "2", "--priorz", "3,1"], "a,b"),
    ],
)
def test_n_labels_maps_the_labels(
    tmp_path: Path, content: str, args: list[str], classes: str
) -> None:
    data = tmp_path / "a.csv"
    data.write_text("item,worker,label\n" + content)
    run = extract(data, *args)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[0].endswith(f"labels = {classes}")
    if "--priorz" in args:
        assert "priorz = 0.750000,0.250000" in run.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--n_labels", "5"], "error: --n_labels: 5 classes, but"),
        (["--n-labels", "3"], "error: --n-labels: 3 classes, but"),
        (["--n_labels", "1"], "error: --n_labels: needs at least 2 classes, got 1"),
        (["--n-labels", "100000"], "error: --n-labels: 100000 classes: at most 256"),
        (["--n_labels", "4", "--priorz", "1,1,1"], "error: --priorz: needs 4 positive numbers"),
        (["--priorz", "1,1,1,0"], "error: --priorz: needs 4 positive numbers, one per class"),
        (["--priorz", "1,1,1,inf"], "error: --priorz: needs 4 positive numbers"),
        (["--priorz", "1e308,1e308,1,1"], "error: --priorz: the numbers' sum overflows"),
        (["--eta", "1e308"], "error: --eta: 1e+308 with --initial-t 100 and --rho 0.75 is a first"),
        (["--initial_t", "-1"], "error: --initial_t: must be a finite number >= 0, got -1"),
        (["--initial-t", "nan"], "error: --initial-t: must be a finite number >= 0, got nan"),
        (["--rho", "-0.5"], "error: --rho: must be a finite number >= 0"),
        (["--n_items", "0"], "error: --n_items: must be a finite number > 0, got 0"),
        (["--n_workers", "0"], "error: --n_workers: must be at least 1, got 0"),
        (["--n_worker_slots", "0"], "error: --n_worker_slots: must be at least 1"),
        (["--test_only"], "error: --test_only: needs a model to test"),
        (["--shuffle", "-1"], "error: --shuffle: the seed must be >= 0"),
        (["--labels", "G"], "error: --labels: needs at least 2 class names"),
        (["--n_items", "abc"], "Invalid value for '--n_items':"),
        (["--n-items=abc"], "Invalid value for '--n-items':"),
    ],
)
def test_bad_flag_values_name_the_flag_as_typed(
    datasets_root: Path, args: list[str], message: str
) -> None:
    run = extract(datasets_root / "adult2" / "answers.csv", *args)
    assert run.returncode == 2 and message in run.stderr, run.stderr
    assert "Traceback" not in run.stderr
    for internal in (
        "class_prior",
        "eta0",
        "tau0",
        "n_items must",
        "n_classes",
        "n_worker_slots must",
    ):
        assert internal not in run.stderr


# ---------------------------------------------------------------------- --help


def _commands() -> list[tuple[list[str], object]]:
    """Every command and group of ``crowdtally``, with its path of names."""
    import typer

    from app.cli import app

    found: list[tuple[list[str], object]] = []

    def walk(path: list[str], cmd: object) -> None:
        found.append((path, cmd))
        for name, sub in getattr(cmd, "commands", {}).items():
            walk([*path, name], sub)

    walk([], typer.main.get_command(app))
    return found


@pytest.mark.parametrize("columns", ["40", "60", "80", "200", None])
def test_help_is_whole_at_any_width(columns: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from app.cli import app

    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)  # not a terminal: 120 columns
    else:
        monkeypatch.setenv("COLUMNS", columns)
    width = int(columns) if columns else 120
    commands = _commands()
    assert {" ".join(p) for p, _ in commands} >= {
        "", "extract", "serve", "engine", "restore", "import", "export", "calibration",
        "snapshots", "snapshots list", "snapshots inspect", "snapshots delete",
    }  # fmt: skip
    longest = 0
    for path, cmd in commands:
        result = CliRunner().invoke(app, [*path, "--help"], prog_name="crowdtally")
        assert result.exit_code == 0, (path, result.output)
        out = result.output
        assert "<bool>" not in out and "…" not in out, (path, out)
        lines = out.splitlines()
        body = lines[lines.index("") :]  # after the usage (whose "[ARGS]..." is no cut)
        names_only = [ln.lstrip().startswith("-") and "  " not in ln.strip() for ln in lines]
        for ln, names in zip(lines, names_only, strict=True):
            if ln in body and not names:  # (a metavar like "A,B,..." is no cut either)
                assert not ln.rstrip().endswith("..."), (path, out)
            # only an option's names, on a line of their own, may be wider than the terminal
            assert len(ln) <= width or names, (path, ln)
        longest = max(longest, *(len(ln) for ln in lines))
        flat = "".join(out.split())
        for param in getattr(cmd, "params", []):
            for opt in [*param.opts, *param.secondary_opts]:
                assert opt in out or param.param_type_name == "argument", (path, opt)
            if getattr(param, "is_flag", False) and param.secondary_opts:
                shown = f"{param.opts[0]} / {param.secondary_opts[0]}"  # --flag / --no-flag
                assert shown in out, (path, shown)
            help_text = getattr(param, "help", None)
            if help_text:  # every word of every option's help, in order
                assert "".join(help_text.split()) in flat, (path, param.name)
        for name, sub in getattr(cmd, "commands", {}).items():
            first = sub.get_short_help_str(limit=10_000)  # the whole first sentence
            assert "".join(first.split()) in flat and name in out, (path, name)
    if columns is None or int(columns) >= 100:
        assert 80 < longest <= width  # the width is used, not 80


def test_boolean_flags_have_no_value_in_help() -> None:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}  # not a terminal: 120
    run = subprocess.run(
        ["crowdtally", "extract", "--help"], capture_output=True, text=True, timeout=60, env=env
    )
    assert run.returncode == 0
    lines = run.stdout.splitlines()
    assert any(ln.strip().startswith("--difficulty / --no-difficulty  Model") for ln in lines)
    assert any(ln.strip().startswith("--batch  ") for ln in lines)
    assert "[default: items in the file]" in run.stdout  # printed as written, not as markup
    assert max(len(ln) for ln in lines) > 80  # a pipe gets 120 columns


@pytest.mark.parametrize("mode", [[], ["--batch"]])
def test_csv_and_parquet_answers_give_identical_predictions(
    dog: Path, tmp_path: Path, mode: list[str]
) -> None:
    as_parquet = tmp_path / "answers.parquet"
    pq.write_table(pa_csv.read_csv(dog / "answers.csv"), as_parquet)  # integer columns
    out = {}
    for name, data in (("csv", dog / "answers.csv"), ("parquet", as_parquet)):
        for suffix in (".csv", ".parquet"):
            out[name + suffix] = tmp_path / f"{name}-predictions{suffix}"
            order = [] if mode else ["--shuffle", "3"]  # (batch EM has no order)
            run = extract(data, *mode, *order, "--predictions", out[name + suffix])
            assert run.returncode == 0, run.stderr
    assert out["csv.csv"].read_bytes() == out["parquet.csv"].read_bytes()
    from_csv, from_parquet = (pq.read_table(out[k]) for k in ("csv.parquet", "parquet.parquet"))
    assert from_csv.equals(from_parquet)
    with out["csv.csv"].open() as fh:
        rows = list(csv.reader(fh))
    assert [r[0] for r in rows[1:]] == from_csv.column("item").to_pylist()
    assert np.allclose(
        np.array([r[3:] for r in rows[1:]], dtype=float),
        np.column_stack([from_csv.column(k).to_numpy() for k in rows[0][3:]]),
        rtol=1e-5,
    )


def test_a_parquet_file_is_known_by_its_magic_bytes_whatever_its_name(tmp_path: Path) -> None:
    """It was read as CSV unless named .parquet ('not UTF-8 text' on line 1); a text file whose
    first id starts with the magic bytes stays text."""
    answers = "item,worker,label\nPAR1a,w,x\nb,w,y\nb,v,x\n"
    pq.write_table(pa_csv.read_csv(io.BytesIO(answers.encode())), tmp_path / "answers.dat")
    (tmp_path / "answers.csv").write_text(answers)
    (tmp_path / "magic.csv").write_text(answers.removeprefix("item,worker,label\n"))
    written = []
    for name in ("answers.dat", "answers.csv", "magic.csv"):
        out = tmp_path / f"{name}.predictions.csv"
        run = extract(tmp_path / name, "--predictions", out)
        assert run.returncode == 0, run.stderr
        assert "3 labels" in run.stdout
        written.append(out.read_text())
    assert written[0] == written[1] == written[2] and "PAR1a,x," in written[0]


def test_a_file_read_in_many_chunks_fits_bit_for_bit_the_same(
    datasets_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = datasets_root / "web" / "answers.csv"  # 160 kB: about 80 chunks of 2 kB
    fits = []
    for chunk_bytes in (1 << 24, 2048):
        answers = read_codes(path, chunk_bytes)
        classes = job.resolve_classes(answers.label_names.to_pylist(), None, None, str(path))
        data = job.encode(answers, classes, str(path))
        config = NominalConfig(n_classes=len(classes), n_items=float(data.n_items))
        gold = np.full(data.n_items, -1)
        used, blocks = job.online_blocks(data, config, None, None)
        online = job.run_online(
            blocks, used, classes, config, None, 2, 0, gold, False, io.StringIO()
        )
        batch = job.run_batch(job.exact_blocks(data), data.n_workers, config, io.StringIO())
        fits.append((data, online.final.posteriors, batch.result.probas, online.served(True)[0]))
    (whole, *fit_whole), (chunked, *fit_chunked) = fits
    assert whole.item_names.equals(chunked.item_names)
    assert whole.worker_names.equals(chunked.worker_names)
    for a, b in zip(fit_whole, fit_chunked, strict=True):
        assert np.array_equal(a, b)


def test_the_online_model_over_the_slots_in_use_is_the_model_over_every_slot(
    datasets_root: Path, tmp_path: Path
) -> None:
    """extract's new online model keeps a table for the worker slots in use only: the same
    posteriors, rows and statistics, bit for bit, as the model over all the slots fed the
    same items (one pass, then revisits); saved with the slots' numbers and loaded again, the
    worker table over every slot."""
    path = datasets_root / "web" / "answers.csv"
    answers = read_codes(path)
    classes = job.resolve_classes(answers.label_names.to_pylist(), None, None, str(path))
    data = job.encode(answers, classes, str(path))
    config = NominalConfig(n_classes=len(classes), n_items=float(data.n_items))
    gold = np.full(data.n_items, -1)
    used, mine = job.online_blocks(data, config, None, None)
    run = job.run_online(mine, used, classes, config, None, 3, 0, gold, False, io.StringIO())
    assert run.used is not None and run.model.params.worker.shape[0] == run.used.size
    assert run.used.size < config.n_worker_slots
    full = OnlineEM(config)
    blocks = job.hashed_blocks(data, config)
    rng = np.random.default_rng(0)  # run_online's orders: one per pass, seed 0
    result = full.learn_many(blocks, order=rng.permutation(data.n_items))
    for _ in range(2):
        result = full.revisit_many(blocks, result, order=rng.permutation(data.n_items), out=result)
    assert np.array_equal(run.final.posteriors, full.predict_many(blocks).posteriors)
    rows, want, used = run.model.params, full.params, run.used
    others = np.ones(config.n_worker_slots, dtype=bool)
    others[used] = False
    for name in ("worker", "counts"):
        assert np.array_equal(getattr(rows, name), getattr(want, name)[used]), name
        assert not np.any(getattr(want, name)[others]), name
    for name in ("class_logits", "population", "scalars", "sums", "evidence"):
        assert np.array_equal(getattr(rows, name), getattr(want, name)), name
    file = tmp_path / "m.npz"
    save_model(file, SavedModel(config, rows, classes), used)
    loaded = load_model(file)
    assert loaded.slots is not None and np.array_equal(loaded.slots, used)
    assert np.array_equal(loaded.params.worker, want.worker[used])
    # learning on from the file, over the slots of the file and the answers, as over every slot
    used, mine = job.online_blocks(data, config, loaded.params, loaded.slots)
    again = job.run_online(mine, used, classes, config, loaded.params, 1, 1, gold, False,
                           io.StringIO(), params_slots=loaded.slots)  # fmt: skip
    every = OnlineEM(config, want.copy())
    every.params.counts, every.params.sums = None, None  # (a loaded model has no statistics)
    every.learn_many(blocks, order=np.random.default_rng(1).permutation(data.n_items))
    assert np.array_equal(again.final.posteriors, every.predict_many(blocks).posteriors)


def test_the_online_pass_run_beside_batch_em_gives_what_it_gives_alone(
    datasets_root: Path,
) -> None:
    """``extract --batch`` runs the online pass that gives the fit its evidence in a second
    thread during the fit: the same evidence and posteriors, bit for bit, and the same fit."""
    path = datasets_root / "web" / "answers.csv"
    answers = read_codes(path)
    classes = job.resolve_classes(answers.label_names.to_pylist(), None, None, str(path))
    data = job.encode(answers, classes, str(path))
    config = NominalConfig(n_classes=len(classes), n_items=float(data.n_items))
    blocks = job.exact_blocks(data)
    beside = job.run_batch(blocks, data.n_workers, config, io.StringIO(), one_pass=True)
    alone = job.run_batch(blocks, data.n_workers, config, io.StringIO())
    assert np.array_equal(beside.result.probas, alone.result.probas)
    for a, b in zip(beside.one_pass(config), alone.one_pass(config), strict=True):
        assert np.array_equal(a, b)
    assert beside.one_pass(config)[0][-1] > 0  # (evidence was gathered)


def test_bad_rows_in_a_later_chunk_name_their_line(tmp_path: Path) -> None:
    rows = [f"i{n},w{n % 7},{n % 3}" for n in range(3000)]
    rows[2500] = "i2500,,1"
    data = tmp_path / "a.csv"
    data.write_text("item,worker,label\n" + "\n".join(rows) + "\n")
    with pytest.raises(InputError, match=r"a.csv:2502: empty worker"):
        read_codes(data, chunk_bytes=4096)
    rows[2500] = "i2500,w1,7"
    data.write_text("item,worker,label\n" + "\n".join(rows) + "\n")
    answers = read_codes(data, chunk_bytes=4096)
    with pytest.raises(InputError, match=r"a.csv:2502: label '7' is not one of"):
        job.encode(answers, ("0", "1", "2"), str(data))


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("ENGINE_BATCH_ENTRIES", "0"),  # the engine applied nothing
        ("SNAPSHOT_KEEP", "0"),  # every snapshot written was deleted
        ("MAX_BLOCK_LABELS", "-5"),  # every block refused
        ("MAX_LABEL_WEIGHT", "inf"),  # any weight taken
        ("WAIT_TIMEOUT_S", "nan"),
        ("SNAPSHOT_INTERVAL_S", "-1"),
        ("REFINE_IDLE_S", "-1"),
        ("LOG_LEVEL", "LOUD"),
    ],
)
def test_a_setting_that_would_break_the_service_is_one_error_line(
    tmp_path: Path, name: str, value: str
) -> None:
    run = run_cli("snapshots", "list", env={f"CROWDTALLY_{name}": value,
                                             "CROWDTALLY_DATA_DIR": str(tmp_path)})  # fmt: skip
    assert run.returncode == 2 and run.stderr.startswith(f"error: CROWDTALLY_{name}: ")
    assert "Traceback" not in run.stderr


def test_serve_refuses_what_it_cannot_run(tmp_path: Path) -> None:
    """The embedded store without its engine accepted labels that nothing would apply; a port
    past 65535 was taken modulo 65536."""
    env = {**os.environ, "CROWDTALLY_DATA_DIR": str(tmp_path), "CROWDTALLY_STORE": "embedded"}
    for args, message in (
        (["--no-engine"], "error: --no-engine: the embedded store's engine runs in the API's"),
        (["--port", "99999"], "--port': 99999 is not in the range 1<=x<=65535"),
    ):
        run = subprocess.run(
            [sys.executable, "-m", "app.cli", "serve", *args],
            env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert run.returncode == 2 and message in run.stderr, run.stderr


def test_serve_warns_of_an_admin_key_short_enough_to_guess() -> None:
    """CROWDTALLY_ADMIN_KEY=a was taken without a word."""
    from app.cli.service import weak_admin_key
    from app.settings import Settings

    warning = weak_admin_key(Settings(admin_key="a"))
    assert warning is not None and "CROWDTALLY_ADMIN_KEY has 1 character;" in warning
    assert weak_admin_key(Settings(admin_key="k" * 16)) is None
    assert weak_admin_key(Settings(admin_key=None)) is None


def test_a_first_start_says_that_requests_wait_for_the_kernels(tmp_path: Path) -> None:
    """The address was printed 12 s before the server accepted a connection (the kernels
    compile first), with nothing saying so."""
    from app.cli.service import start_line
    from app.settings import Settings

    settings = Settings(store="embedded", data_dir=tmp_path)
    first = start_line(settings, "127.0.0.1", 8000, first_start=True)
    assert first.startswith("crowdtally: embedded store, engine in process, http://127.0.0.1:8000")
    assert "kernels compile before the server accepts connections" in first
    assert "compile" not in start_line(settings, "127.0.0.1", 8000, first_start=False)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("CROWDTALLY_DATA_DIR", "a-file", "a-file is not a folder"),
        ("CROWDTALLY_DATABASE_URL", "nonsense", "Could not parse SQLAlchemy URL"),
        ("CROWDTALLY_DATABASE_URL", "postgresql+psycopg://nobody@127.0.0.1:5432/x",
         'cannot open the snapshot database: (psycopg.OperationalError) connection failed: '
         'connection to server at "127.0.0.1", port 5432 failed: FATAL:  role "nobody"'),
    ],
)  # fmt: skip
def test_a_data_folder_or_database_that_cannot_be_used_is_one_error_line(
    tmp_path: Path, name: str, value: str, message: str
) -> None:
    """They were tracebacks of 100-500 lines (the engine) or a failed start-up (the API). A
    PostgreSQL that answers and refuses is one line too; one that does not answer is waited
    for (tests/app/test_snapshot_db_down.py)."""
    (tmp_path / "a-file").write_text("")
    env = {**os.environ, "CROWDTALLY_STORE": "embedded", "CROWDTALLY_DATA_DIR": str(tmp_path),
           name: str(tmp_path / value) if value == "a-file" else value}  # fmt: skip
    for command in (["serve", "--port", "1"], ["engine", "--store", "embedded"]):
        run = subprocess.run([sys.executable, "-m", "app.cli", *command], env=env,
                             capture_output=True, text=True, timeout=120)  # fmt: skip
        assert run.returncode == 2, (command, run.stderr[-500:])
        assert run.stderr.startswith(f"error: {name}: ") and message in run.stderr, run.stderr


def test_a_database_a_newer_crowdtally_wrote_is_one_error_line(tmp_path: Path) -> None:
    """A schema revision this code does not know (a newer crowdtally migrated the database):
    one line naming it and the newest this code knows, where Alembic's traceback ran 305
    lines, from every command that opens the database."""
    import sqlite3

    from app.store.sql import HEAD, upgrade

    db = tmp_path / "crowdtally.sqlite3"
    upgrade(f"sqlite:///{db}", deployment="")
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE alembic_version SET version_num = '0099'")
    env = {**os.environ, "CROWDTALLY_STORE": "embedded", "CROWDTALLY_DATA_DIR": str(tmp_path)}
    for command in (["snapshots", "list"], ["engine", "--store", "embedded"]):
        run = subprocess.run([sys.executable, "-m", "app.cli", *command], env=env,
                             capture_output=True, text=True, timeout=120)  # fmt: skip
        assert run.returncode == 2 and len(run.stderr.splitlines()) == 1, run.stderr[-500:]
        assert f"revision '0099', which this crowdtally does not know (its newest is '{HEAD}')" in (
            run.stderr
        )


def test_a_redis_that_keeps_info_to_itself_is_not_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cluster-mode check reads INFO; a Redis that answers it with an error (a managed one
    may rename the command) starts as before, its mode left for the client to find."""
    import redis

    from app.cli.service import check_redis
    from tests.app.conftest import REDIS_URL

    def refused(*args: object, **kwargs: object) -> None:
        raise redis.exceptions.ResponseError("unknown command 'INFO'")

    monkeypatch.setattr(redis.Redis, "info", refused)
    check_redis(REDIS_URL, cluster=True)
    check_redis(REDIS_URL, cluster=False)


def test_a_redis_that_refuses_the_url_is_one_error_line(tmp_path: Path) -> None:
    """A database index the server lacks was a traceback of 190 lines (the engine) or a failed
    start-up (the API); a Redis that is down is still waited for."""
    from tests.app.conftest import REDIS_URL

    url = REDIS_URL.rsplit("/", 1)[0] + "/99"
    env = {**os.environ, "REDIS_URL": url, "CROWDTALLY_DATA_DIR": str(tmp_path)}
    for command in (["serve", "--store", "redis", "--no-engine", "--port", "1"],
                    ["engine", "--store", "redis"]):  # fmt: skip
        run = subprocess.run([sys.executable, "-m", "app.cli", *command], env=env,
                             capture_output=True, text=True, timeout=120)  # fmt: skip
        assert run.returncode == 2, (command, run.stderr[-500:])
        assert run.stderr.startswith(f"error: REDIS_URL: {url}: DB index is out of range")


@pytest.mark.parametrize("from_answers, maps", [(codes.MAP_FROM_ANSWERS, False), (1, True)])
def test_a_large_file_has_malloc_map_its_blocks_once_it_is_read(
    dog: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, from_answers: int, maps: bool
) -> None:
    """Freed memory goes back to the system once the file is read; from ``MAP_FROM_ANSWERS``
    answers on, malloc also maps its larger blocks from then on (the setting lasts for the
    process: a small file leaves it alone)."""
    calls: list[bool] = []
    monkeypatch.setattr(codes, "MAP_FROM_ANSWERS", from_answers)
    monkeypatch.setattr(
        codes, "release_unused_memory", lambda from_now_on=False: calls.append(from_now_on)
    )
    run = extract(dog / "answers.csv", "--predictions", tmp_path / "p.csv")
    assert run.returncode == 0, run.stderr
    assert calls == [False, maps]  # (the reader's trim of its chunks, then the command's)


def test_a_truth_header_of_other_names_is_called_a_header(dog: Path, tmp_path: Path) -> None:
    """'id,answer' was read as the gold of item 'id', and the error only said that gold label
    'answer' was not among the classes."""
    path = tmp_path / "truth.csv"
    path.write_text("id,answer\n" + (dog / "truth.csv").read_text().split("\n", 1)[1])
    run = extract(dog / "answers.csv", "--truth", path)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert f"{path}:1: gold label 'answer'" in run.stderr and "must read item,label" in run.stderr
    path.write_text("item,label\nid,answer\nid2,answer\n")  # data, not a header: no hint
    run = extract(dog / "answers.csv", "--truth", path)
    assert run.returncode == 2 and "must read item,label" not in run.stderr
