"""Reading item-worker-label files: CSV with a header (as in shared/datasets), or tab/space separated.

Every problem is reported as an ``InputError`` naming the file, the line and the reason.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv

from app.io.input import (
    CONTROL,
    MAX_ANSWER_WEIGHT,
    MAX_ID_LENGTH,
    InputError,
    checked_id,
    is_parquet,
    not_utf8,
    quoting_error,
    text_lines,
)
from core._numba import jit

if TYPE_CHECKING:
    import pyarrow.parquet as pq

CHUNK_BYTES = 1 << 22
"""Bytes of CSV (about 300,000 short answers) or, over 16, Parquet rows read at a time: at 16 MiB
a 1M-answer file was one chunk, read and coded with nothing to overlap, 27 MiB higher at its
peak for the same time (docs/benchmarks.md)."""
_HEADERS = (("item", "worker", "label"), ("task", "worker", "label"))  # ours, crowd-kit's
_ROLES = {"item": 0, "task": 0, "worker": 1, "label": 2, "weight": 3}
"""The column a header's name stands for: item, worker, label, weight (in that order)."""
_IGNORED = re.compile(r"id|__index_level_\d+__")
"""Columns a header may name that answers do not read: a label's id (``crowdtally import``
reads it), an index pandas wrote (``to_parquet`` of a frame whose index is not a range)."""
_TRUTH_HEADERS = (["item", "label"], ["task", "label"], ["task", "true_label"])
_TRUTH_NAMES = {name for header in _TRUTH_HEADERS for name in header}
_MAX_FIELDS = 8
"""The most columns a CSV file's fast reading takes (a header may name some not read)."""
_WHITESPACE = re.compile(r"[\t ]+")
_TABS = re.compile(r"\t+")


@dataclass(frozen=True)
class Triples:
    """Columns of an answers file; ``lines`` are 1-based line numbers for error messages."""

    items: npt.NDArray[np.str_]
    workers: npt.NDArray[np.str_]
    labels: npt.NDArray[np.str_]
    weights: npt.NDArray[np.float64] | None
    lines: npt.NDArray[np.int64]

    def __len__(self) -> int:
        return int(self.items.size)

    def ids(self) -> tuple[npt.NDArray[np.str_], npt.NDArray[np.str_], npt.NDArray[np.str_]]:
        return self.items, self.workers, self.labels


def _rows(path: Path) -> list[tuple[int, list[str]]]:
    """(line number, fields) of every non-blank line, splitting on the file's delimiter."""
    try:
        text = path.read_text(encoding="utf-8-sig")  # (a byte order mark is no part of a field)
    except FileNotFoundError:
        raise InputError(path, None, "no such file") from None
    except UnicodeDecodeError as err:
        line = text_line_of_byte(path, err.start)
        raise not_utf8(path, line) from None
    lines = text_lines(text)
    first = next((ln for ln in lines if ln.strip()), "")
    if "," in first:
        return _csv_rows(path, lines, 1)
    # tab separated where the first line holds a tab (an id may then hold a space), else spaces
    split = _TABS.split if "\t" in first else _WHITESPACE.split
    return [
        (n, [f.strip() for f in split(ln.strip())])
        for n, ln in enumerate(lines, start=1)
        if ln.strip()
    ]


def _csv_rows(path: Path, lines: list[str], first: int) -> list[tuple[int, list[str]]]:
    """(line number, fields) of the non-blank CSV records of ``lines``, numbered from
    ``first``; csv.reader keeps quoted commas inside a field. A quoted field that runs on to
    the next line is refused: it would hold a line break, which no id or label may; so is
    a quote that is not closed, or text right after a closing quote."""
    reader = csv.reader(lines, strict=True)
    out: list[tuple[int, list[str]]] = []
    rows = enumerate(reader, start=first)
    while True:
        start = first + reader.line_num  # (the line the next record starts on)
        try:
            n, row = next(rows)
        except StopIteration:
            return out
        except csv.Error as err:
            raise InputError(path, start, quoting_error(err)) from None
        if reader.line_num != n - first + 1:
            raise InputError(
                path, n, "a quoted field runs on to the next line: ids hold no line breaks"
            )
        if any(f.strip() for f in row):
            out.append((n, row))


def text_line_of_byte(path: Path, offset: int) -> int:
    return path.read_bytes()[:offset].count(b"\n") + 1


def string_buffers(array: pa.Array) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.uint8]]:
    """A string array's offsets (as int64, into its bytes) and its bytes, without copying the
    bytes; the bytes read-only whatever arrow's buffer was (one compiled signature of the
    kernels that read them). Other arrays are cast to strings first."""
    wide = pa.types.is_large_string(array.type)
    if not wide and not pa.types.is_string(array.type):
        array = array.cast(pa.string())
    width = np.int64 if wide else np.int32
    _, offsets_buf, data_buf = array.buffers()
    offsets = np.frombuffer(
        offsets_buf,
        dtype=width,
        count=len(array) + 1,
        offset=array.offset * np.dtype(width).itemsize,
    ).astype(np.int64)
    data = np.frombuffer(data_buf if data_buf is not None else b"", dtype=np.uint8)
    data.setflags(write=False)
    return offsets, data


def read_triples(path: str | Path, chunk_bytes: int = CHUNK_BYTES) -> Triples:
    """Read ``item,worker,label[,weight]`` rows; a header row naming those columns (or
    crowd-kit's ``task,worker,label``) is skipped. Parquet files (``is_parquet``) hold those
    columns by name. The whole file at once (``read_answer_chunks`` reads it in pieces)."""
    chunks = list(read_answer_chunks(path, chunk_bytes))
    weights = [c.weights for c in chunks if c.weights is not None]
    return Triples(
        items=_strings([c.items for c in chunks]),
        workers=_strings([c.workers for c in chunks]),
        labels=_strings([c.labels for c in chunks]),
        weights=np.concatenate(weights) if weights else None,
        lines=np.concatenate([c.lines for c in chunks if c.lines is not None]),
    )


def answer_line(path: str | Path, index: int, chunk_bytes: int = CHUNK_BYTES) -> int:
    """The line (Parquet: row) of the file's answer number ``index`` (0-based)."""
    for chunk in read_answer_chunks(path, chunk_bytes):
        if index < len(chunk):
            assert chunk.lines is not None
            return int(chunk.lines[index])
        index -= len(chunk)
    raise IndexError(index)


def _strings(parts: list[pa.Array]) -> npt.NDArray[np.str_]:
    return np.asarray(pa.chunked_array(parts, pa.string()).to_numpy(), dtype=np.str_)


@dataclass
class AnswerColumns:
    """Checked answers from consecutive lines of a file: ids stripped (arrow strings),
    weights (None: all 1), and the 1-based line of each answer (Parquet: its row)."""

    items: pa.Array
    workers: pa.Array
    labels: pa.Array
    weights: npt.NDArray[np.float64] | None
    lines: npt.NDArray[np.int64] | None
    """None when not asked for (``read_answer_chunks(..., lines=False)``)."""

    def __len__(self) -> int:
        return len(self.items)


def read_answer_chunks(
    path: str | Path, chunk_bytes: int = CHUNK_BYTES, lines: bool = True
) -> Iterator[AnswerColumns]:
    """The answers of a file, in order, a chunk of lines at a time (memory: one chunk).

    CSV chunks are read by pyarrow's CSV reader and checked in vectorised code; a chunk that
    reader refuses, or that fails a check, is read again line by line, which names the line
    and the reason (the same errors as reading the whole file line by line). A file that is
    not comma-separated, and the rest of a file from a chunk with quotes or lone carriage
    returns on, are read line by line. ``lines=False`` spares finding the line of each
    answer in clean CSV chunks (``answer_line`` finds one later)."""
    if str(path) == "-":
        raise InputError(path, None, "standard input is not read: give the answers' file")
    path = Path(path)
    parquet = is_parquet(path)
    if parquet:
        chunks = _parquet_chunks(path, max(1, chunk_bytes // 16))
    else:
        chunks = _csv_chunks(path, chunk_bytes, lines)
    n = 0
    for chunk in chunks:
        n += len(chunk)
        if len(chunk):
            yield chunk
    if n == 0 and parquet:
        raise InputError(path, None, "no answers in the file (only a header)")


def _csv_chunks(path: Path, chunk_bytes: int, lines: bool) -> Iterator[AnswerColumns]:
    try:
        fh = path.open("rb")
    except FileNotFoundError:
        raise InputError(path, None, "no such file") from None
    with fh:
        state = _CsvState(path, lines)
        line = 1
        blocks = _LineBlocks(fh, chunk_bytes)
        for block in blocks:
            if state.n_columns is None and not state.sniffed:
                state.sniffed = True
                if b"," not in block.lstrip(b"\r\n").split(b"\n", 1)[0]:
                    yield _columns(_read_rows(path))  # tab/space separated: line by line
                    return
            if b'"' in block or (b"\r" in block and block.count(b"\r") != block.count(b"\r\n")):
                yield state.careful(block + blocks.rest_of_file(), line)  # quotes span lines
                break
            yield state.fast(block, line)
            line += _newlines(block)
        state.finish()


def _newlines(block: bytearray) -> int:
    """``block.count(b"\\n")``, compared a vector at a time (1.2 ms a 16 MB block, not 9)."""
    return int(np.count_nonzero(np.frombuffer(block, dtype=np.uint8) == ord("\n")))


class _LineBlocks:
    """A file in blocks of about ``size`` bytes, each ending at a line end (or the file's);
    each block is read into its own buffer (no copy of it is made)."""

    def __init__(self, fh: Any, size: int) -> None:
        self.fh, self.size, self.rest = fh, size, b""

    def __iter__(self) -> Iterator[bytearray]:
        while True:
            block = bytearray(len(self.rest) + self.size)
            block[: len(self.rest)] = self.rest
            with memoryview(block) as view:
                n = self.fh.readinto(view[len(self.rest) :])
            del block[len(self.rest) + n :]
            if n == 0:
                self.rest = b""
                if block:
                    yield block
                return
            cut = block.rfind(b"\n") + 1
            self.rest = bytes(block[cut:])
            if cut:  # else a line longer than a block: read on
                del block[cut:]
                yield block

    def rest_of_file(self) -> bytes:
        """What the blocks have not yielded yet, to the end."""
        rest, self.rest = self.rest, b""
        return rest + bytes(self.fh.read())


class _CsvState:
    """What the first lines decide for the rest of a CSV file: header, weight column."""

    def __init__(self, path: Path, lines: bool) -> None:
        self.path, self.lines = path, lines
        self.sniffed = False
        self.n_columns: int | None = None  # 3 or 4, once the first answer was read
        self.width: int | None = None
        """The fields of a row when a header named them (with columns not read), else None."""
        self.header_seen = False
        self.order: tuple[int, ...] | None = None
        """Where the header puts item, worker, label (and weight): ``_header_columns``."""
        self.rows = 0

    def fast(self, block: bytearray, line: int) -> AnswerColumns:
        try:
            table = pa_csv.read_csv(
                pa.py_buffer(block),
                read_options=pa_csv.ReadOptions(autogenerate_column_names=True),
                convert_options=pa_csv.ConvertOptions(
                    column_types={f"f{k}": pa.string() for k in range(_MAX_FIELDS)},
                    strings_can_be_null=False,
                ),
            )
        except (pa.ArrowInvalid, UnicodeDecodeError):
            return self.careful(block, line)
        columns: list[Any] = [c.combine_chunks() for c in table.columns]
        header = False
        if self.n_columns is None:
            if not columns or len(columns) > _MAX_FIELDS or table.num_rows == 0:
                return self.careful(block, line)
            try:
                order = _header_columns(self.path, line, [str(c[0].as_py()) for c in columns])
            except InputError:
                return self.careful(block, line)  # (which names the header's own line)
            header = order is not None
            if len(columns) < 3 or (not header and len(columns) > 4):
                return self.careful(block, line)
            if header:
                columns = [c.slice(1) for c in columns]
                self.order, self.width = order, len(columns)
        elif len(columns) != (self.width or self.n_columns) or self.rows == 0:
            return self.careful(block, line)
        if self.order is not None:
            columns = [columns[k] for k in self.order]
        out = _checked(columns, len(columns[0]))
        if out is not None and self.lines:
            out.lines = _nonblank_line_numbers(block)[int(header) :] + (line - 1)
        if out is None:
            return self.careful(block, line)
        self.header_seen |= header
        self.n_columns = len(columns)
        self.rows += len(out)
        return out

    def careful(self, block: bytes | bytearray, line: int) -> AnswerColumns:
        """The lines of ``block`` one by one: the first problem raises, naming its line."""
        try:
            text = block.decode("utf-8")
        except UnicodeDecodeError as err:
            raise not_utf8(self.path, line + block[: err.start].count(b"\n")) from None
        rows = _csv_rows(self.path, text_lines(text), line)
        if self.n_columns is None and rows:
            order = _header_columns(self.path, *rows[0])
            if order is not None:
                self.header_seen, self.n_columns, self.order = True, len(order), order
                self.width = len(rows[0][1])
                rows = rows[1:]
        # as when reading the whole file: without a header, the first answer's 4 fields bring
        # a weight column; a header names the columns itself
        decided = self.rows > 0 or self.header_seen
        out = _row_columns(self.path, rows, self.n_columns == 4, decided, self.order, self.width)
        if len(out):
            self.n_columns = 4 if out.weights is not None else 3
        self.rows += len(out)
        return _columns(out)

    def finish(self) -> None:
        if self.rows == 0:
            only = " (only a header)" if self.header_seen else ""
            raise InputError(self.path, None, f"no answers in the file{only}")


def _columns(triples: Triples) -> AnswerColumns:
    items, workers, labels = (pa.array(x, pa.string()) for x in triples.ids())
    return AnswerColumns(items, workers, labels, triples.weights, triples.lines)


def _nonblank_line_numbers(raw: bytes | bytearray) -> npt.NDArray[np.int64]:
    """1-based numbers of the lines that are not empty (pyarrow's rows, in order)."""
    data = np.frombuffer(raw, dtype=np.uint8)
    ends = np.flatnonzero(data == ord("\n"))
    starts = np.concatenate(([0], ends + 1))
    ends = np.concatenate((ends, [data.size]))
    crlf = (ends > starts) & (data[np.maximum(ends - 1, 0)] == ord("\r"))
    out: npt.NDArray[np.int64] = np.flatnonzero(ends - crlf > starts).astype(np.int64) + 1
    return out


def parquet_file(path: Path) -> pq.ParquetFile:
    """``path`` opened as Parquet; an InputError when it is missing or not Parquet."""
    import pyarrow.parquet as pq  # (here: a CSV file's reading spares its 10-20 ms import)

    try:
        return pq.ParquetFile(path)
    except FileNotFoundError:
        raise InputError(path, None, "no such file") from None
    except pa.ArrowException as err:
        raise InputError(path, None, f"not a Parquet file ({err})") from None


def _parquet_chunks(path: Path, rows: int) -> Iterator[AnswerColumns]:
    pfile = parquet_file(path)
    names = pfile.schema_arrow.names
    order = _header_columns(path, None, names)  # (the columns' names are its header)
    if order is None:
        lower = [n.lower() for n in names]
        raise InputError(path, None, f"columns {lower}: expected item,worker,label[,weight]")
    picked = [names[k] for k in order]
    for name in picked:
        _check_parquet_type(path, name, pfile.schema_arrow.field(name).type)
    first = 1
    for batch in pfile.iter_batches(batch_size=rows, columns=picked):
        columns = list(batch.columns)
        for name, column in zip(picked, columns, strict=True):
            check_utf8(path, name, column, first)
        lines = np.arange(first, first + batch.num_rows, dtype=np.int64)
        out = _checked(columns, batch.num_rows)
        if out is not None:
            out.lines = lines
        else:  # the same checks, one row at a time, for the message ("line" = row)
            fields = zip(*(c.to_pylist() for c in columns), strict=True)
            numbered = [  # (a null, or a float NaN, is an empty cell, as in a CSV file)
                (n, ["" if x is None or x != x else str(x) for x in row])
                for n, row in zip(lines.tolist(), fields, strict=True)
            ]
            out = _columns(_row_columns(path, numbered, len(columns) == 4, decided=True))
        first += batch.num_rows
        yield out


def check_utf8(path: Path, name: str, column: pa.Array | pa.ChunkedArray, first: int = 1) -> None:
    """A Parquet column of text (or bytes, read as text) whose every value is UTF-8; else an
    InputError naming the column and its first other row (rows numbered from ``first``)."""
    kind = column.type
    try:
        if pa.types.is_string(kind) or pa.types.is_large_string(kind):
            column.validate(full=True)
        elif pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
            column.cast(pa.string())
        else:
            return
    except pa.ArrowInvalid:
        values = column.cast(pa.large_binary()).to_pylist()
        for row, value in enumerate(values, start=first):
            try:
                (value or b"").decode("utf-8")
            except UnicodeDecodeError:
                raise InputError(path, row, f"column {name!r}: not UTF-8 text") from None
        raise


def _check_parquet_type(path: Path, name: str, kind: pa.DataType) -> None:
    """A column read as text (ids, labels) or numbers (weights): of a type that casts to
    them, else an InputError naming it."""
    target = pa.float64() if name.lower() == "weight" else pa.string()
    try:
        pa.array([], type=kind).cast(target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        what = "numbers" if target == pa.float64() else "text or numbers"
        raise InputError(path, None, f"column {name!r} holds {kind}: expected {what}") from None


def as_text(column: Any) -> Any:
    """A Parquet column (an array or chunked array) cast to text; floating-point numbers as
    Python (and pandas' CSV files, and the Python client) write them: a whole number keeps its
    ".0" (0.0 is the label "0.0", as in a CSV file, not arrow's "0")."""
    text = pc.cast(column, pa.string())
    if not pa.types.is_floating(column.type):
        return text
    whole = pc.and_(pc.is_finite(column), pc.equal(column, pc.floor(column)))
    whole = pc.and_(whole, pc.less(pc.abs(column), 1e16))  # (from 1e16 on: "1e+16", as Python)
    return pc.if_else(whole, pc.binary_join_element_wise(text, ".0", ""), text)


def _checked(columns: list[Any], n_rows: int) -> AnswerColumns | None:
    """Ids stripped and non-empty, at most MAX_ID_LENGTH; weights 0 to MAX_ANSWER_WEIGHT; None
    when any check fails (the caller then reads row by row to name the line)."""
    if not n_rows:
        return None
    ids = []
    for column in columns[:3]:
        if pa.types.is_floating(column.type) and pc.any(pc.is_nan(column)).as_py():
            return None  # (cast to text, NaN is the id or label "nan")
        c = as_text(column)
        if len(c) != n_rows or c.null_count:
            return None
        if not _plain_ids(*string_buffers(c), np.int64(MAX_ID_LENGTH)):
            c = pc.utf8_trim_whitespace(c)
            lengths = pc.min_max(pc.utf8_length(c))
            if lengths["min"].as_py() in (0, None) or lengths["max"].as_py() > MAX_ID_LENGTH:
                return None
            if pc.any(pc.match_substring_regex(c, CONTROL.pattern)).as_py():
                return None
        ids.append(c)
    weights = None
    if len(columns) == 4:
        try:
            weights = np.asarray(pc.cast(columns[3], pa.float64()).to_numpy(zero_copy_only=False))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return None
        if not np.all(np.isfinite(weights) & (weights >= 0) & (weights <= MAX_ANSWER_WEIGHT)):
            return None
    return AnswerColumns(ids[0], ids[1], ids[2], weights, None)


@jit
def _plain_ids(offsets, data, max_bytes):  # type: ignore[no-untyped-def]
    """Every id is 1 to ``max_bytes`` bytes long, starts and ends with a printable ASCII
    character (not a space) and holds no control character: then trimming whitespace leaves
    it as it is and it is at most ``max_bytes`` characters long. False sends the column to the
    exact check (an id that starts or ends with a space or a byte of a multi-byte character,
    or holds a control character: below U+0020, U+007F, or U+0080 to U+009F, which UTF-8
    writes 0xC2 0x80 to 0xC2 0x9F)."""
    for v in range(offsets.size - 1):
        lo, hi = offsets[v], offsets[v + 1]
        if hi <= lo or hi - lo > max_bytes:
            return False
        first, last = data[lo], data[hi - 1]
        if first <= 32 or first >= 127 or last <= 32 or last >= 127:
            return False
        for k in range(lo, hi):
            b = data[k]
            if b < 32 or b == 127 or (b == 0xC2 and k + 1 < hi and 0x80 <= data[k + 1] <= 0x9F):
                return False
    return True


def _read_rows(path: Path) -> Triples:
    rows = _rows(path)
    if not rows:
        raise InputError(path, None, "no answers in the file")
    order = _header_columns(path, *rows[0])  # (a header decides the weight column)
    width = None if order is None else len(rows[0][1])
    if order is not None:
        rows = rows[1:]
    has_weight = order is not None and len(order) == 4
    out = _row_columns(path, rows, has_weight, order is not None, order, width)
    if not len(out):
        raise InputError(path, None, "no answers in the file (only a header)")
    return out


def _header_columns(path: Path, line: int | None, fields: list[str]) -> tuple[int, ...] | None:
    """When a first row is a header (it names item or task, worker and label, in any order):
    the field of item, worker, label and, when it names one, weight; else None (an answer).
    An ``id`` column, or an index pandas wrote, is not read. An InputError for a header with
    any other column, or one named twice."""
    head = [f.strip().lower() for f in fields]
    if sum(name in _ROLES for name in head) < 2:  # (an answer names no two columns)
        return None
    unknown = [name for name in head if name not in _ROLES and not _IGNORED.fullmatch(name)]
    if unknown:
        raise InputError(
            path, line, f"unknown columns {unknown}: expected item,worker,label[,weight][,id]"
        )
    read = [k for k, name in enumerate(head) if name in _ROLES]
    roles = [_ROLES[head[k]] for k in read]
    if len(set(roles)) < len(roles) or len(set(head)) < len(head):
        raise InputError(path, line, f"columns {head}: item (or task), worker, label, weight "
                         "and id may each be named once")  # fmt: skip
    if not {0, 1, 2} <= set(roles):
        raise InputError(path, line, f"columns {head}: item (or task), worker and label are "
                         "needed")  # fmt: skip
    return tuple(read[k] for k in sorted(range(len(roles)), key=roles.__getitem__))


def _row_columns(
    path: Path,
    rows: list[tuple[int, list[str]]],
    has_weight: bool,
    decided: bool,
    order: tuple[int, ...] | None = None,
    width: int | None = None,
) -> Triples:
    """Checked rows, their fields taken in ``order`` (None: item, worker, label, weight);
    unless ``decided``, a first row of 4 fields brings a weight column. ``width``: the fields
    of a row when a header named more than those read."""
    n_fields = width or (4 if has_weight else 3)
    items: list[str] = []
    workers: list[str] = []
    labels: list[str] = []
    weights: list[float] = []
    lines: list[int] = []
    for line, fields in rows:
        if len(fields) == 4 and not has_weight and not lines and not decided:
            has_weight, n_fields = True, 4
        if len(fields) != n_fields:
            names = "item, worker, label, weight" if has_weight else "item, worker, label"
            names = "as the header names" if n_fields > len(names.split(", ")) else names
            raise InputError(path, line, f"expected {n_fields} fields ({names}), got {len(fields)}")
        if order is not None:
            fields = [fields[k] for k in order]
        items.append(checked_id(path, line, "item", fields[0]))
        workers.append(checked_id(path, line, "worker", fields[1]))
        labels.append(checked_id(path, line, "label", fields[2]))
        if has_weight:
            weights.append(_parse_weight(path, line, fields[3]))
        lines.append(line)
    return Triples(
        items=np.array(items, dtype=np.str_),
        workers=np.array(workers, dtype=np.str_),
        labels=np.array(labels, dtype=np.str_),
        weights=np.array(weights, dtype=np.float64) if has_weight else None,
        lines=np.array(lines, dtype=np.int64),
    )


def _parse_weight(path: Path, line: int, text: str) -> float:
    if not text.strip():  # (a Parquet null reads as empty: it read "weight '' is not a number")
        raise InputError(path, line, "no weight (an empty cell, or a null in Parquet)")
    try:
        value = float(text)
    except ValueError:
        raise InputError(path, line, f"weight {text!r} is not a number") from None
    if not np.isfinite(value) or value < 0:
        raise InputError(path, line, f"weight {text!r} must be a finite number >= 0")
    if value > MAX_ANSWER_WEIGHT:
        raise InputError(path, line, f"weight {text!r} is above {MAX_ANSWER_WEIGHT:g}, the most "
                         "one answer may weigh (a weight counts as that many answers): scale "
                         "the weights down")  # fmt: skip
    return value


def read_truth(path: str | Path) -> dict[str, str]:
    """Gold labels: ``item,label`` rows (``truth_rows``), by item."""
    return {item: label for _, item, label in truth_rows(path)}


def truth_rows(path: str | Path) -> list[tuple[int, str, str]]:
    """(line, item, label) of each ``item,label`` row (header optional; crowd-kit's
    ``task,label`` or ``task,true_label`` too). An item given twice is an error."""
    path = Path(path)
    rows = _rows(path)
    first = 0  # the item's field (the label's is the other)
    if rows and (head := [f.strip().lower() for f in rows[0][1]]) in _TRUTH_HEADERS:
        rows = rows[1:]
    elif rows and head[::-1] in _TRUTH_HEADERS:  # label first
        rows, first = rows[1:], 1
    elif rows and any(name in _TRUTH_NAMES for name in head):
        raise InputError(path, rows[0][0], f"columns {head}: expected item,label (or task,label)")
    seen: dict[str, tuple[int, str]] = {}
    out = []
    for line, fields in rows:
        if len(fields) != 2:
            raise InputError(path, line, f"expected 2 fields (item, label), got {len(fields)}")
        item = checked_id(path, line, "item", fields[first])
        label = checked_id(path, line, "label", fields[1 - first])
        if item in seen:
            if seen[item][1] == label:  # (the same gold again: a repeat, as the API takes it)
                continue
            raise InputError(path, line, f"item {item!r} has gold {seen[item][1]!r} on line "
                             f"{seen[item][0]}")  # fmt: skip
        seen[item] = (line, label)
        out.append((line, item, label))
    if not out:
        raise InputError(path, None, "no gold label in it (item,label rows)")
    return out
