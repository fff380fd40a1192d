"""Answers to import, in columns, and the request bodies that post them.

A table is what ``crowdtally import`` sends: item, worker and label names, ids, weights and
the source line of each answer, in file order. Plain tables (CSV, TSV, crowd-kit, Parquet) are
read into one by pyarrow and checked in vectorised code (``app.io.importers``); the blocks'
JSON bodies are written by pyarrow's string kernels, one slice of one buffer per block, with no
Python object made per answer.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import numpy.typing as npt
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv

from app.io.codebook import Codebook
from app.io.input import CONTROL, MAX_ID_LENGTH
from app.io.sha256 import answer_digests
from app.io.triples import as_text, check_utf8, parquet_file, string_buffers

NO_LINE = -1

_CONTROL = r"[\x00-\x1f]"  # must be escaped in JSON strings: such tables take the slow road
_PY_SPACE = (
    "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
)
"""The characters ``str.strip`` removes (``str.isspace``), as a regex class body."""
_EDGE_SPACE = f"^[{_PY_SPACE}]|[{_PY_SPACE}]$"
_NUMBER = r"^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$"
"""A weight written as a plain decimal number (any other is read row by row, as ``float``)."""
_ROWS_AT_ONCE = 1 << 17  # answers whose JSON is written at once (about 12 MB)


class Answer(Protocol):
    """One answer read row by row (``app.io.importers.Record``)."""

    @property
    def item(self) -> str: ...
    @property
    def worker(self) -> str: ...
    @property
    def label(self) -> str: ...
    @property
    def id(self) -> str | None: ...
    @property
    def weight(self) -> float: ...
    @property
    def line(self) -> int | None: ...


@dataclass(frozen=True)
class AnswerTable:
    """Answers in file order; ``ids`` null where an answer has none, ``weights`` None when all
    are 1, ``lines`` the source line (or row) of each answer, NO_LINE where it has none."""

    format: str
    items: pa.Array
    workers: pa.Array
    labels: pa.Array
    ids: pa.Array
    weights: npt.NDArray[np.float64] | None
    lines: npt.NDArray[np.int64]
    skipped: int = 0
    """Source rows left out (rejected or cancelled assignments, say)."""
    ids_made: bool = False
    """Every id was made here (the file gave none): each names one answer by construction
    (its item, worker, label and occurrence), so ``id_given_twice`` has nothing to check."""
    unread: tuple[str, ...] = ()
    """Columns of the file's header that no answer reads (said after an import)."""

    @classmethod
    def of(
        cls,
        format: str,
        answers: Sequence[Answer],
        skipped: int = 0,
        unread: tuple[str, ...] = (),
    ) -> AnswerTable:
        """A table of answers read row by row (a column at a time from them)."""

        def column(name: str) -> pa.Array:
            return pa.array([getattr(a, name) for a in answers], pa.string())

        n = len(answers)
        weights = np.fromiter((a.weight for a in answers), np.float64, n)
        lines = np.fromiter((NO_LINE if a.line is None else a.line for a in answers), np.int64, n)
        return cls(
            format, column("item"), column("worker"), column("label"), column("id"),
            None if (weights == 1.0).all() else weights, lines, skipped, unread=unread,
        )  # fmt: skip

    def __len__(self) -> int:
        return len(self.items)

    def line(self, row: int) -> int | None:
        at = int(self.lines[row])
        return None if at == NO_LINE else at

    def label_names(self) -> set[str]:
        return set(pc.unique(self.labels).to_pylist())

    def answered(self, items: set[str]) -> set[str]:
        """Those of ``items`` that some answer is about."""
        given = pa.array(list(items), pa.string())
        return set(
            pc.unique(pc.filter(self.items, pc.is_in(self.items, value_set=given))).to_pylist()
        )

    def id_given_twice(self) -> tuple[int, int] | None:
        """The first answer whose id an earlier, different answer (another item, worker,
        label or weight) has, and that answer's row; None when every id names one answer
        (the same answer twice under one id is a repeat, counted once)."""
        if self.ids_made:
            return None  # (10M made ids: 2.5 s of pc.unique spared)
        if len(pc.unique(self.ids)) - (self.ids.null_count > 0) == len(self) - self.ids.null_count:
            return None  # (every id once: the common case, 0.13 s for 1M ids)
        codes = self.ids.dictionary_encode().indices
        rows = np.asarray(pc.fill_null(codes, -1).to_numpy(zero_copy_only=False), np.int64)
        named = rows >= 0  # (some id is repeated: the check above)
        repeated = np.bincount(rows[named]) > 1
        first: dict[int, int] = {}
        for row in np.flatnonzero(named & repeated[np.maximum(rows, 0)]).tolist():
            earlier = first.setdefault(int(rows[row]), row)
            if earlier != row and self._answer(earlier) != self._answer(row):
                return row, earlier
        return None

    def _answer(self, row: int) -> tuple[str, str, str, float]:
        weight = 1.0 if self.weights is None else float(self.weights[row])
        return (self.items[row].as_py(), self.workers[row].as_py(), self.labels[row].as_py(),
                weight)  # fmt: skip

    def first_label_not_in(self, names: list[str]) -> int | None:
        """The first answer whose label is none of ``names`` (None: every one is)."""
        known = pc.is_in(self.labels, value_set=pa.array(names, pa.string()))
        bad = np.flatnonzero(~known.to_numpy(zero_copy_only=False))
        return int(bad[0]) if bad.size else None

    def bodies(self, batch_size: int, first: int = 0) -> Iterator[tuple[int, int, bytes]]:
        """(first row, end row, JSON array of the answers as ``POST .../labels`` takes them) for
        each block of ``batch_size`` answers, from row ``first`` on."""
        n = len(self)
        if any(_has_control(c) for c in (self.items, self.workers, self.labels, self.ids)):
            for lo in range(first, n, batch_size):  # (rare: control characters to escape)
                hi = min(lo + batch_size, n)
                yield lo, hi, orjson.dumps(self._dicts(lo, hi))
            return
        span = batch_size * max(1, _ROWS_AT_ONCE // batch_size)  # (whole blocks per span)
        for start in range(first, n, span):
            end = min(start + span, n)
            offsets, data = string_buffers(self._rows(start, end))
            for lo in range(start, end, batch_size):
                hi = min(lo + batch_size, end)
                at, to = offsets[lo - start], offsets[hi - start] - 1
                yield lo, hi, b"[" + data[at:to].tobytes() + b"]"

    def _rows(self, start: int, end: int) -> pa.Array:
        """Answers ``start`` to ``end``, each as a JSON object followed by a comma."""
        cols = [c.slice(start, end - start) for c in (self.items, self.workers, self.labels)]
        ids = self.ids.slice(start, end - start)
        ids = pc.if_else(
            pc.is_null(ids), "", pc.binary_join_element_wise(',"id":"', _escaped(ids), '"', "")
        )  # fmt: skip
        parts = ['{"item":"', _escaped(cols[0]), '","worker":"', _escaped(cols[1]),
                 '","label":"', _escaped(cols[2]), '"', ids]  # fmt: skip
        if self.weights is not None:
            w = pa.array(self.weights[start:end])
            text = pc.binary_join_element_wise(',"weight":', pc.cast(w, pa.string()), "")
            parts.append(pc.if_else(pc.equal(w, 1.0), "", text))
        return pc.binary_join_element_wise(*parts, "},", "")

    def _dicts(self, lo: int, hi: int) -> list[dict[str, object]]:
        cols = [c[lo:hi].to_pylist() for c in (self.items, self.workers, self.labels, self.ids)]
        weights = self.weights[lo:hi].tolist() if self.weights is not None else [1.0] * (hi - lo)
        out: list[dict[str, object]] = []
        for item, worker, label, rid, w in zip(*cols, weights, strict=True):
            d: dict[str, object] = {"item": item, "worker": worker, "label": label}
            if rid is not None:
                d["id"] = rid
            if w != 1.0:
                d["weight"] = w
            out.append(d)
        return out


def _escaped(values: pa.Array) -> pa.Array:
    """The JSON string text of each value (backslashes and quotes escaped)."""
    out = pc.replace_substring(values, "\\", "\\\\")
    return pc.replace_substring(out, '"', '\\"')


def _has_control(values: pa.Array) -> bool:
    return bool(pc.any(pc.match_substring_regex(values, _CONTROL)).as_py())


def parquet_names(path: Path) -> list[str]:
    """The column names of a Parquet file."""
    return list(parquet_file(path).schema_arrow.names)


def read_plain(
    path: Path,
    format: str,
    delimiter: str | None,
    columns: dict[str, int | None],
    n_fields: int,
    header: bool = True,
) -> AnswerTable | None:
    """The answers of a CSV or TSV file (``delimiter``; rows of ``n_fields`` fields, no
    quotes, the first line a header unless not ``header``) or a Parquet file (``delimiter``
    None), from the columns ``columns`` gives for each key, checked as the rows' reading
    checks them: None when a cell would need trimming, is empty or too long, a weight is not
    a plain number >= 0, or pyarrow refuses the file (a row of another length, a blank line,
    bytes not UTF-8)."""
    try:
        cells, first_line = _cells(path, delimiter, columns, n_fields, header)
    except pa.ArrowException:
        return None
    n = len(cells["item"])
    items, workers, labels = (cells[k] for k in ("item", "worker", "label"))
    if n == 0 or not all(_plain(c) for c in (items, workers, labels)):
        return None
    plain_weights, weights = _weights(cells.get("weight"))
    if not plain_weights:
        return None
    found = _ids(cells.get("id"), items, workers, labels)
    if found is None:
        return None
    ids, made = found
    lines = np.arange(first_line, first_line + n, dtype=np.int64)
    return AnswerTable(format, items, workers, labels, ids, weights, lines, ids_made=made)


def _cells(
    path: Path,
    delimiter: str | None,
    columns: dict[str, int | None],
    n_fields: int,
    header: bool = True,
) -> tuple[dict[str, pa.Array], int]:
    """Each mapped column as text (Parquet: cast as its rows' reading casts it, a null as
    empty), and the line (or row) of the first answer."""
    wanted = {k: i for k, i in columns.items() if i is not None}
    if delimiter is None:  # (every column cast, as the rows' reading does: one it cannot
        table = parquet_file(path).read()  # cast is refused there, with its reason)
        for name, column in zip(table.column_names, table.columns, strict=True):
            check_utf8(path, name, column)
        text = [pc.fill_null(as_text(c), "") for c in table.columns]
        return {k: _flat(text[i]) for k, i in wanted.items()}, 1
    names = [f"f{i}" for i in range(n_fields)]
    table = pa_csv.read_csv(
        path,
        read_options=pa_csv.ReadOptions(skip_rows=int(header), column_names=names),
        parse_options=pa_csv.ParseOptions(
            delimiter=delimiter, quote_char=False, ignore_empty_lines=False
        ),
        convert_options=pa_csv.ConvertOptions(
            column_types={f"f{i}": pa.string() for i in wanted.values()},
            include_columns=[f"f{i}" for i in sorted(set(wanted.values()))],
            strings_can_be_null=False,
        ),
    )
    return {k: _flat(table.column(f"f{i}")) for k, i in wanted.items()}, 1 + int(header)


def _flat(column: pa.ChunkedArray) -> pa.Array:
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


def _plain(values: pa.Array) -> bool:
    """Every value non-empty, at most MAX_ID_LENGTH characters, with no space at its ends
    and no control character (else the rows' reading names the line)."""
    if not len(values):
        return True
    length = pc.utf8_length(values)
    if pc.min(length).as_py() == 0 or pc.max(length).as_py() > MAX_ID_LENGTH:
        return False
    if pc.any(pc.match_substring_regex(values, CONTROL.pattern)).as_py():
        return False
    return not pc.any(pc.match_substring_regex(values, _EDGE_SPACE)).as_py()


def _weights(raw: pa.Array | None) -> tuple[bool, npt.NDArray[np.float64] | None]:
    """Whether the weights are plain numbers >= 0 (else the rows' reading reads them), and
    they (None: no column, or all 1)."""
    if raw is None:
        return True, None
    given = pc.not_equal(raw, "")
    if not pc.all(pc.or_(pc.invert(given), pc.match_substring_regex(raw, _NUMBER))).as_py():
        return False, None
    values = pc.cast(pc.if_else(given, raw, "1"), pa.float64()).to_numpy()
    if not (np.isfinite(values) & (values >= 0)).all():
        return False, None
    return True, None if (values == 1.0).all() else values


KEY_LIMIT = 2**62
"""Answers whose codes' product is below this are sorted by one int64 key, others by three."""


def _occurrences(
    columns: tuple[pa.Array, pa.Array, pa.Array], rows: npt.NDArray[np.int64]
) -> npt.NDArray[np.int64]:
    """For each of ``rows``, how many of ``rows`` up to it hold the same item, worker and label:
    1 for an answer's first time. The three columns are coded (``Codebook``: no string is made
    of the three), then sorted stably by their codes."""
    every = rows.size == len(columns[0])
    books = [Codebook() for _ in columns]
    codes = [
        book.codes(column if every else pc.take(column, pa.array(rows)))
        for book, column in zip(books, columns, strict=True)
    ]
    sizes = [max(len(book), 1) for book in books]
    if sizes[0] * sizes[1] * sizes[2] < KEY_LIMIT:  # one int64 key a row
        key = (codes[0].astype(np.int64) * sizes[1] + codes[1]) * sizes[2] + codes[2]
        order = np.argsort(key, kind="stable")
        ranked = key[order]
        changed = ranked[1:] != ranked[:-1]
    else:
        order = np.lexsort((codes[2], codes[1], codes[0]))
        ranked = np.stack(codes)[:, order]
        changed = np.any(ranked[:, 1:] != ranked[:, :-1], axis=0)
    starts = np.flatnonzero(np.r_[True, changed])
    occurrence = np.empty(rows.size, dtype=np.int64)
    occurrence[order] = (
        np.arange(rows.size) - np.repeat(starts, np.diff(np.r_[starts, rows.size])) + 1
    )
    return occurrence


def _ids(
    given: pa.Array | None, items: pa.Array, workers: pa.Array, labels: pa.Array
) -> tuple[pa.Array, bool] | None:
    """Each answer's id: the file's, else the rows' reading's: ``row:`` and a hash of its item,
    worker, label and how many times that answer came before in the file, plus one; and
    whether every id was made so (None: a given id fails the checks)."""
    missing = np.ones(len(items), dtype=bool)
    if given is not None:
        missing = pc.equal(given, "").to_numpy(zero_copy_only=False)
        if not _plain(pc.filter(given, pa.array(~missing))):
            return None
        if not missing.any():
            return given, False
    rows = np.flatnonzero(missing)
    columns = (items, workers, labels)
    # = input.hash_id("row", item, worker, label, n), n the answer's occurrence
    hashed = answer_digests(columns, rows, _occurrences(columns, rows), "row:", 32)
    if given is None or missing.all():
        return hashed, True
    return pc.replace_with_mask(given, pa.array(missing), hashed), False
