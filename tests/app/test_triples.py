"""Reading answers files: the columnar reader (pyarrow, vectorised checks) gives what the
line-by-line reader gives, values and errors alike, on CSV and on Parquet."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.io import triples
from app.io.input import InputError
from app.io.triples import Triples, read_triples


def outcome(read: object, path: Path) -> Triples | str:
    try:
        return read(path)  # type: ignore[operator,no-any-return]
    except InputError as err:
        return str(err)


def same(a: Triples | str, b: Triples | str) -> bool:
    if isinstance(a, str) or isinstance(b, str):
        return a == b
    columns = ("items", "workers", "labels", "lines")
    weights = (a.weights is None and b.weights is None) or (
        a.weights is not None and b.weights is not None and np.array_equal(a.weights, b.weights)
    )
    return weights and all(np.array_equal(getattr(a, k), getattr(b, k)) for k in columns)


def test_shared_datasets_read_columnar(
    datasets_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    careful = triples._CsvState.careful
    monkeypatch.setattr(triples._CsvState, "careful", None)  # clean files take the columnar path
    for path in sorted(datasets_root.glob("*/answers.csv")):
        fast = read_triples(path)
        monkeypatch.setattr(triples._CsvState, "careful", careful)
        assert same(fast, triples._read_rows(path)), path
        monkeypatch.setattr(triples._CsvState, "careful", None)


CASES = {
    "header": "item,worker,label\na,w1,x\nb,w2,y\n",
    "crowd-kit header, CRLF": "task,worker,label\r\na,w1,x\r\nb,w2,y\r\n",
    "no header, weights": "a,w1,x,0.5\nb,w2,y,2\n",
    "blank lines": "item,worker,label\n\na,w1,x\n\n\nb,w2,y\n",
    "spaces around ids": "item,worker,label\n a , w1 ,x\n",
    "empty item": "item,worker,label\na,w1,x\n,w2,y\n",
    "too long": "item,worker,label\n" + "a" * 513 + ",w1,x\n",
    "bad weight": "item,worker,label,weight\na,w1,x,heavy\n",
    "negative weight": "item,worker,label,weight\na,w1,x,-1\n",
    "field count": "item,worker,label\na,w1,x\nb,w2\n",
    "unknown column": "item,worker,label,colour\na,w1,x,red\n",
    "quoted comma": 'item,worker,label\n"a,1",w1,x\n',
    "whitespace line": "item,worker,label\na,w1,x\n   \nb,w2,y\n",
    "only a header": "item,worker,label\n",
    "tabs": "a\tw1\tx\nb\tw2\ty\n",
    "numbers": "1,2,3\n4,5,6\n",
    "non-ASCII ids": "item,worker,label\nécole,w1,x\nb,wörker,y\n",
    "long non-ASCII id": "item,worker,label\n" + "é" * 300 + ",w1,x\n",
    "no-break spaces around an id": "item,worker,label\n\u00a0a\u00a0,w1,x\n",
    "a control character at an id's end": "item,worker,label\na\x1f,w1,x\n",
    "a control character inside an id": "item,worker,label\na\x01b,w1,x\n",
    "a C1 control character inside an id": "item,worker,label\nb,w\u0090x,y\n",
    "a quoted line break": 'item,worker,label\n"a\nb",w1,x\nc,w2,y\n',
    "a line separator inside an id": "item,worker,label\na\u2028b,w1,x\nc,w\u2029,y\n",
    "a line separator in a quoted id": 'item,worker,label\n"a\u2028b",w1,x\n',
    "NEL inside an id": "item,worker,label\na\u0085b,w1,x\n",
    "a quote not closed": 'item,worker,label\na,w1,x\nb,w2,"y\n',
    "text after a closing quote": 'item,worker,label\n"a"b,w1,x\n',
    "a header in another order": "worker,item,label\nw1,a,x\nw2,b,y\n",
    "weights first": "weight,label,task,worker\n0.5,x,a,w1\n2,y,b,w2\n",
    "a column named twice": "item,worker,label,item\na,w1,x,b\n",
    "task and item": "task,worker,label,item\na,w1,x,b\n",
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_columnar_and_line_readers_agree(tmp_path: Path, name: str) -> None:
    path = tmp_path / "answers.csv"
    path.write_text(CASES[name], encoding="utf-8", newline="")
    assert same(outcome(read_triples, path), outcome(triples._read_rows, path))
    assert same(outcome(in_small_chunks, path), outcome(triples._read_rows, path))


def in_small_chunks(path: Path) -> Triples:
    """The file read a few lines at a time (chunks of at most 12 bytes, cut at line ends)."""
    return read_triples(path, chunk_bytes=12)


def test_quotes_in_a_later_chunk(tmp_path: Path) -> None:
    """From the first chunk with a quote on, the rest is read line by line: every line once."""
    rows = [f"i{n},w{n % 5},{n % 2}" for n in range(200)]
    rows[150] = '"i,150",w0,1'
    path = tmp_path / "answers.csv"
    path.write_text("item,worker,label\n" + "\n".join(rows) + "\n")
    for chunk_bytes in (50, 64, 1000):
        assert same(read_triples(path, chunk_bytes), triples._read_rows(path))


FIELDS = ["a", "b", " c", "", "0.5", "-1", "x" * 600, "w", '"q,1"']


@settings(max_examples=150, deadline=None)
@given(
    rows=st.lists(st.lists(st.sampled_from(FIELDS), min_size=2, max_size=5), max_size=6),
    header=st.booleans(),
    blank=st.booleans(),
)
def test_readers_agree_on_any_rows(
    tmp_path_factory: pytest.TempPathFactory, rows: list[list[str]], header: bool, blank: bool
) -> None:
    lines = [",".join(r) for r in rows]
    if blank and lines:
        lines.insert(len(lines) // 2, "")
    text = "\n".join((["item,worker,label"] if header else []) + lines) + "\n"
    path = tmp_path_factory.mktemp("rows") / "answers.csv"
    path.write_text(text, encoding="utf-8")
    assert same(outcome(read_triples, path), outcome(triples._read_rows, path))
    assert same(outcome(in_small_chunks, path), outcome(triples._read_rows, path))


def test_parquet_gives_the_csv_answers(tmp_path: Path, datasets_root: Path) -> None:
    csv_path = datasets_root / "dog" / "answers.csv"
    from_csv = read_triples(csv_path)
    table = pa.table({
        "task": pa.array(from_csv.items.astype(np.int64)),  # integer ids, as pandas writes them
        "worker": pa.array(from_csv.workers),
        "label": pa.array(from_csv.labels.astype(np.int64)),
    })  # fmt: skip
    path = tmp_path / "answers.parquet"
    pq.write_table(table, path)
    from_parquet = read_triples(path)
    for k in ("items", "workers", "labels"):
        assert np.array_equal(getattr(from_parquet, k), getattr(from_csv, k))
    assert from_parquet.lines.tolist() == list(range(1, len(from_csv) + 1))  # rows


def test_float_labels_read_the_same_from_csv_and_parquet(tmp_path: Path) -> None:
    """pandas writes a float 0.0 as "0.0" in a CSV file; from Parquet it is the same label
    "0.0" (arrow's own cast says "0"), in every reader: extract's columns and rows, and
    import's table and rows."""
    from app.io import importers

    labels = [0.0, 1.0, 1.0, 0.0, 2.5, -0.0]
    csv_path = tmp_path / "answers.csv"
    csv_path.write_text("item,worker,label\n" + "".join(
        f"i{k},w{k % 2},{x}\n" for k, x in enumerate(labels)))  # fmt: skip
    table = pa.table({"item": [f"i{k}" for k in range(6)], "worker": [f"w{k % 2}" for k in range(6)],
                      "label": labels})  # fmt: skip
    path = tmp_path / "answers.parquet"
    pq.write_table(table, path)
    want = ["0.0", "1.0", "1.0", "0.0", "2.5", "-0.0"]
    assert read_triples(csv_path).labels.tolist() == want
    assert read_triples(path).labels.tolist() == want
    for source in (csv_path, path):
        answers, _ = importers.read_answers(source)
        assert answers.labels.to_pylist() == want, source
    spaced = pa.table({**{k: table[k] for k in ("item", "worker")}, "label": labels,
                       "weight": [1.0, 1.0, 1.0, 1.0, 1.0, -1.0]})  # fmt: skip
    pq.write_table(spaced, path)  # (a bad weight: the rows read one by one, to name it)
    with pytest.raises(InputError, match=r"row 6|:6:"):
        read_triples(path)


def test_parquet_errors_name_the_row(tmp_path: Path) -> None:
    path = tmp_path / "answers.parquet"
    pq.write_table(pa.table({"item": ["a", ""], "worker": ["w", "w"], "label": ["x", "y"]}), path)
    with pytest.raises(InputError, match=r"answers.parquet:2: empty item"):
        read_triples(path)
    pq.write_table(pa.table({"item": ["a"], "who": ["w"], "label": ["x"]}), path)
    with pytest.raises(InputError, match="expected item,worker,label"):
        read_triples(path)
    nan = pa.table({"item": ["a", "a"], "worker": ["w", "v"], "label": [0.0, float("nan")]})
    pq.write_table(nan, path)  # (cast to text, a NaN label was the class "nan")
    with pytest.raises(InputError, match=r"answers.parquet:2: empty label"):
        read_triples(path)
    path.write_text("not parquet")
    with pytest.raises(InputError, match="not a Parquet file"):
        read_triples(path)


@pytest.mark.parametrize(
    "header",
    [
        "worker,item,label",
        "label,worker,item",
        "worker,task,label,weight",
        "item,worker,label,id",  # the layout `crowdtally import` reads ids from
        "id,worker,item,weight,label,__index_level_0__",  # and an index pandas wrote
    ],
)
def test_a_header_names_its_columns_in_any_order(tmp_path: Path, header: str) -> None:
    """Columns are taken by their names, not their places, in every chunk and on every path
    (clean chunks, chunks read line by line, Parquet); an id or pandas index is not read."""
    rng = np.random.default_rng(0)
    n = 400
    columns = {
        "item": [f"i{k}" for k in rng.integers(0, 60, n)],
        "worker": [f"w{k}" for k in rng.integers(0, 9, n)],
        "label": [str(k) for k in rng.integers(0, 3, n)],
        "weight": [str(k) for k in rng.integers(1, 4, n)],
        "id": [f"L{k}" for k in range(n)],
        "__index_level_0__": [str(k) for k in range(n)],
    }
    names = header.split(",")
    keys = ["item" if name == "task" else name for name in names]
    read = [k for k in ["item", "worker", "label", "weight"] if k in keys]
    canonical = tmp_path / "canonical.csv"
    canonical.write_text(
        ",".join(read)
        + "\n"
        + "".join(",".join(columns[k][r] for k in read) + "\n" for r in range(n))
    )
    reordered = tmp_path / "reordered.csv"
    rows = [",".join(columns[k][r] for k in keys) for r in range(n)]
    rows[300] = '"' + rows[300].replace(",", '",', 1)  # a quote: the rest line by line
    reordered.write_text(header + "\n" + "\n".join(rows) + "\n")
    want = read_triples(canonical)
    assert len(want) == n
    for chunk_bytes in (1 << 20, 100, 4096):
        assert same(read_triples(reordered, chunk_bytes), want), chunk_bytes
    assert same(triples._read_rows(reordered), want)
    spaced = tmp_path / "spaced.tsv"  # (not comma-separated: read line by line)
    spaced.write_text("\t".join(names) + "\n" + "".join(
        "\t".join(columns[k][r] for k in keys) + "\n" for r in range(n)))  # fmt: skip
    assert same(read_triples(spaced), want)
    parquet = tmp_path / "reordered.parquet"
    pq.write_table(
        pa.table({name: columns[k] for name, k in zip(names, keys, strict=True)}), parquet
    )
    from_parquet = read_triples(parquet)
    for k in ("items", "workers", "labels"):
        assert np.array_equal(getattr(from_parquet, k), getattr(want, k))


def test_a_row_with_fewer_fields_than_its_header_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "short.csv"
    path.write_text("item,worker,label,id\na,w,x,L1\nb,w,y\n")
    with pytest.raises(InputError, match=r":3: expected 4 fields \(as the header names\), got 3"):
        read_triples(path)


def test_parquet_with_a_column_it_does_not_read_is_refused(tmp_path: Path) -> None:
    """As a CSV header naming another column is: a misspelt weight column is not ignored."""
    path = tmp_path / "answers.parquet"
    table = {"item": ["a"], "worker": ["w"], "label": ["x"], "wieght": [2.0]}
    pq.write_table(pa.table(table), path)
    with pytest.raises(InputError, match=r"unknown columns \['wieght'\]"):
        read_triples(path)


def test_an_id_may_hold_a_line_separator(tmp_path: Path) -> None:
    """Lines end at LF, CRLF or CR only: U+2028 is a character of the id, as in the service."""
    path = tmp_path / "answers.csv"
    path.write_text('item,worker,label\na\u2028b,w1,x\n"c\u2029d",w2,y\n', encoding="utf-8")
    for read in (read_triples, triples._read_rows):
        got = read(path)
        assert got.items.tolist() == ["a\u2028b", "c\u2029d"] and got.lines.tolist() == [2, 3]


@pytest.mark.parametrize(
    "header", ["item,label", "label,item", "task,true_label", "true_label,task"]
)
def test_a_truth_header_names_its_columns_in_either_order(tmp_path: Path, header: str) -> None:
    path = tmp_path / "truth.csv"
    rows = {"item": ["a", "b"], "task": ["a", "b"], "label": ["1", "0"], "true_label": ["1", "0"]}
    names = header.split(",")
    path.write_text(
        header + "\n" + "".join(f"{rows[names[0]][n]},{rows[names[1]][n]}\n" for n in range(2))
    )
    assert [(item, label) for _, item, label in triples.truth_rows(path)] == [
        ("a", "1"),
        ("b", "0"),
    ]


def test_a_truth_header_with_a_misspelt_column_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "truth.csv"
    path.write_text("item,lable\na,1\n")
    with pytest.raises(InputError, match=r":1: columns \['item', 'lable'\]: expected item,label"):
        triples.truth_rows(path)


def test_a_tab_separated_file_keeps_the_spaces_inside_its_ids(tmp_path: Path) -> None:
    """Split at every run of tabs and spaces, 'a b<TAB>w1<TAB>0' was 4 fields and refused."""
    path = tmp_path / "answers.tsv"
    path.write_text("item\tworker\tlabel\na b\tw 1\t0\n c \tw2\t1\n")
    rows = triples.read_triples(path)
    assert list(rows.items) == ["a b", "c"] and list(rows.workers) == ["w 1", "w2"]
    spaced = tmp_path / "answers.txt"  # no tab on its first line: spaces separate
    spaced.write_text("a w1 0\nc w2 1\n")
    assert list(triples.read_triples(spaced).items) == ["a", "c"]
    truth = tmp_path / "truth.tsv"
    truth.write_text("a b\t1\n")
    assert [(i, label) for _, i, label in triples.truth_rows(truth)] == [("a b", "1")]
