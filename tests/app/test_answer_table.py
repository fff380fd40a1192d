"""``crowdtally import`` reads plain tables in columns: the same answers, ids and errors as
reading them row by row, and request bodies that are the answers' JSON."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.io import answer_table, importers
from app.io.answer_table import AnswerTable
from app.io.input import hash_id

PLAIN = {
    "repeats, no ids": (
        "a.csv",
        "item,worker,label\ni1,w1,x\ni1,w1,x\ni2,w1,y\ni1,w1,x\ni1,w2,x\n",
    ),
    "some ids, weights": (
        "b.csv",
        "item,worker,label,id,weight,note\ni1,w1,x,,0.5,n\ni2,w1,y,k-2,,n\ni1,w1,x,,2,n\n"
        "i3,w2,x,k-4,1e-3,n\ni3,w2,x,,1,n\n",
    ),
    "tsv, unicode and backslashes": (
        "c.tsv",
        "item\tworker\tlabel\r\ncaf\u00e9\tw\\1\t\u65e5\u672c\r\nit'em\tw2\tx\r\n",
    ),
    "crowd-kit, an extra column": (
        "d.csv",
        "task,worker,label,note\nt1,w1,x,zz\nt2,w2,y,zz\nt1,w1,x,zz\n",
    ),
}
BY_ROWS = {
    "a cell in quotes": ("e.csv", 'item,worker,label\n"i,1",w1,x\ni2,w1,y\n'),
    "a cell to trim": ("f.csv", "item,worker,label\ni1 ,w1,x\ni2,\u00a0w1,y\n"),
    "a blank line": ("g.csv", "item,worker,label\ni1,w1,x\n\ni2,w1,y\n"),
    "a gold column": ("h.csv", "item,worker,label,gold\ni1,w1,x,\ni2,,,y\n"),
    "a weight Python reads": ("i.csv", "item,worker,label,weight\ni1,w1,x,1_0\ni2,w1,y,.5\n"),
    "a short row": ("j.csv", "item,worker,label,note\ni1,w1,x,n\ni2,w1,y\n"),
}


def by_rows(path: Path) -> AnswerTable:
    parsed = importers.read(path)
    return AnswerTable.of(parsed.format, parsed.labels)


def answers(*rows: tuple[str, str, str, str | None, float, int | None]) -> list[importers.Record]:
    return [importers.Record(i, w, lab, rid, h, line=n) for i, w, lab, rid, h, n in rows]


def same(a: AnswerTable, b: AnswerTable) -> None:
    assert a.format == b.format
    for name in ("items", "workers", "labels", "ids"):
        assert getattr(a, name).to_pylist() == getattr(b, name).to_pylist(), name
    assert (a.weights is None) == (b.weights is None)
    if a.weights is not None and b.weights is not None:
        assert a.weights.tolist() == b.weights.tolist()
    assert a.lines.tolist() == b.lines.tolist()


@pytest.mark.parametrize("case", PLAIN, ids=list(PLAIN))
def test_plain_tables_read_in_columns_equal_their_rows(tmp_path: Path, case: str) -> None:
    name, text = PLAIN[case]
    path = tmp_path / name
    path.write_bytes(text.encode())
    source = importers._source(path, "auto", None)
    assert importers._plain_table(source) is not None  # read in columns
    table, gold = importers.read_answers(path)
    assert gold == []
    same(table, by_rows(path))


def test_a_parquet_file_in_columns_equals_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"item": ["i1", "i2", "i1", "i1"], "worker": [7, 8, 7, 7],
                             "label": ["x", "y", "x", "x"], "weight": [0.5, 1.0, 1.0, 3.0]}), path)  # fmt: skip
    assert importers._plain_table(importers._source(path, "auto", None)) is not None
    table, _ = importers.read_answers(path)
    same(table, by_rows(path))
    assert table.lines.tolist() == [1, 2, 3, 4] and table.workers.to_pylist()[0] == "7"


@pytest.mark.parametrize("case", BY_ROWS, ids=list(BY_ROWS))
def test_other_tables_are_read_by_rows_with_the_same_answers_or_errors(
    tmp_path: Path, case: str
) -> None:
    name, text = BY_ROWS[case]
    path = tmp_path / name
    path.write_bytes(text.encode())
    assert importers._plain_table(importers._source(path, "auto", None)) is None
    try:
        expected: AnswerTable | str = by_rows(path)
    except importers.InputError as err:
        expected = str(err)
    try:
        got: AnswerTable | str = importers.read_answers(path)[0]
    except importers.InputError as err:
        got = str(err)
    if isinstance(expected, str) or isinstance(got, str):
        assert got == expected
    else:
        same(got, expected)


def test_a_large_file_is_read_in_columns_with_each_lines_number(tmp_path: Path) -> None:
    n = 30_000
    rng = np.random.default_rng(0)
    items, workers = rng.integers(0, 500, n), rng.integers(0, 40, n)
    rows = [f"item-{i},w{w},{'xyz'[(i + w) % 3]}" for i, w in zip(items, workers, strict=True)]
    path = tmp_path / "big.csv"
    path.write_text("item,worker,label\n" + "\n".join(rows) + "\n")
    table, _ = importers.read_answers(path)
    same(table, by_rows(path))
    assert len(set(table.ids.to_pylist())) == n and table.line(n - 1) == n + 1


def test_bodies_are_the_answers_json_in_blocks() -> None:
    rows = [
        ('i"1', "w\\1", "x", "id-1", 1.0, 2),
        ("caf\u00e9", "w2", "y", None, 0.25, 3),
        ("i3", "w3", "z", "id-3", 1e-7, 4),
        ("i4", "w4", "x", None, 3.0, None),
        ("i5", "w5", "y", "id-5", 1.0, 6),
    ]
    table = AnswerTable.of("csv", answers(*rows))

    expected = [
        [{"item": 'i"1', "worker": "w\\1", "label": "x", "id": "id-1"},
         {"item": "caf\u00e9", "worker": "w2", "label": "y", "weight": 0.25}],
        [{"item": "i3", "worker": "w3", "label": "z", "id": "id-3", "weight": 1e-7},
         {"item": "i4", "worker": "w4", "label": "x", "weight": 3.0}],
        [{"item": "i5", "worker": "w5", "label": "y", "id": "id-5"}],
    ]  # fmt: skip
    for at_once in (1 << 17, 3, 5):  # the rows' JSON written in one span, or in several
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(answer_table, "_ROWS_AT_ONCE", at_once)
            blocks = list(table.bodies(2))
        assert [(lo, hi) for lo, hi, _ in blocks] == [(0, 2), (2, 4), (4, 5)]
        assert [orjson.loads(body) for _, _, body in blocks] == expected
    with_control = AnswerTable.of("csv", answers(("a\tb", "w", "x", None, 1.0, 1), *rows))
    assert orjson.loads(next(with_control.bodies(10))[2])[0] == {
        "item": "a\tb", "worker": "w", "label": "x"
    }  # fmt: skip
    assert table.line(3) is None and table.first_label_not_in(["x", "y"]) == 2


def test_the_columns_see_every_space_that_str_strip_removes() -> None:
    """A cell with any of them at an end must go to the rows' reading, which strips it."""
    spaces = [chr(c) for c in range(0x110000) if chr(c).isspace()]
    cells = pa.array([f"{s}x" for s in spaces] + [f"x{s}" for s in spaces] + ["x\u200b", "a b"])
    edge = answer_table.pc.match_substring_regex(cells, answer_table._EDGE_SPACE).to_pylist()
    assert edge == [True] * (2 * len(spaces)) + [False, False]  # (U+200B is no space to strip)


def test_an_id_given_to_two_different_answers_is_found() -> None:
    def table(items: list[str], ids: list[str | None]) -> AnswerTable:
        n = len(items)
        return AnswerTable("csv", pa.array(items), pa.array(["w"] * n), pa.array(["l"] * n),
                           pa.array(ids, pa.string()), None, np.arange(n))  # fmt: skip

    ids = ["a", None, "b", "a", None, "b", "c"]
    assert table(["i", "i", "j", "i", "k", "j2", "x"], ids).id_given_twice() == (5, 2)
    assert table(["i", "i", "j", "i", "k", "j", "x"], ids).id_given_twice() is None  # repeats
    assert table(["i", "j"], [None, None]).id_given_twice() is None


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["1", "2", "i3", "é"]), st.sampled_from(["7", "w", "00"]),
                  st.sampled_from(["x", "y"]), st.sampled_from(["", "", "id1", "id2"])),
        min_size=1, max_size=30,
    ),
    st.booleans(),
)  # fmt: skip
def test_the_ids_made_for_answers_without_one_are_those_of_the_rows_reading(
    rows: list[tuple[str, str, str, str]], one_key: bool
) -> None:
    """Each answer's id, where the file gives none: ``row:`` and the SHA-256 of its item, worker,
    label and occurrence (its repeats without an id counted in the file's order), made in
    columns as the rows' reading makes it one by one; with the codes' product as one sort key
    or three."""
    given = [i for *_, i in rows]
    if len(set(filter(None, given))) < len(list(filter(None, given))):
        return  # (an id given twice is refused before: another test)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(answer_table, "KEY_LIMIT", 2**62 if one_key else 0)
        found = answer_table._ids(
            pa.array(given), *(pa.array([r[k] for r in rows]) for k in range(3))
        )
    assert found is not None
    ids, made = found
    assert made == (not any(given))
    seen: dict[tuple[str, str, str], int] = {}
    expected = []
    for item, worker, label, rid in rows:  # (answers with an id of their own not counted)
        if rid:
            expected.append(rid)
            continue
        n = seen[(item, worker, label)] = seen.get((item, worker, label), 0) + 1
        expected.append(hash_id("row", item, worker, label, str(n)))
    assert ids.to_pylist() == expected


def test_only_ids_a_file_gives_are_checked_for_naming_two_answers(tmp_path: Path) -> None:
    """Ids made here name one answer each by construction: the check (a unique over every id,
    2.5 s for 10M) is left out when the file gives none, and made for the ids it gives."""
    made, given = tmp_path / "made.csv", tmp_path / "given.csv"
    made.write_text("item,worker,label\ni1,w1,x\ni1,w1,x\ni2,w1,y\n")
    given.write_text("item,worker,label,id\ni1,w1,x,\ni2,w1,x,a\ni3,w1,x,a\n")
    table, _ = importers.read_answers(made)
    assert table.ids_made and len(set(table.ids.to_pylist())) == 3
    assert table.id_given_twice() is None
    table, _ = importers.read_answers(given)
    assert not table.ids_made
    assert table.id_given_twice() == (2, 1)
