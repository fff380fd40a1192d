"""Reading crowdsourcing exports into label records, for ``crowdtally import``.

Formats: generic CSV / TSV / Parquet / JSONL with a column mapping, crowd-kit CSV
(``task,worker,label``), Toloka result TSV, Mechanical Turk batch results CSV and Label Studio
JSON exports. Each source row becomes a ``Record`` whose ``id`` is derived from the source (a
Toloka or MTurk assignment, a Label Studio annotation, the content of a generic row), so
importing the same file again, or a later export that repeats it, counts every answer once.

Problems raise ``app.io.input.InputError`` (``FILE:LINE: reason``), before anything is sent.
"""

from __future__ import annotations

import csv
import difflib
import io
import itertools
import json
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.io.input import (
    MAX_ID_LENGTH,
    InputError,
    checked_id,
    first_line,
    hash_id,
    is_parquet,
    not_utf8,
    quoting_error,
    text_lines,
)

if TYPE_CHECKING:
    from app.io.answer_table import AnswerTable

FORMATS = ("auto", "csv", "tsv", "parquet", "jsonl", "crowdkit", "toloka", "mturk", "labelstudio")
MAP_KEYS = ("item", "worker", "label", "id", "weight", "gold")
_SKIP_STATUS = {"REJECTED", "SKIPPED", "EXPIRED"}  # Toloka and MTurk (upper-cased)
_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off", ""}


@dataclass(frozen=True)
class Record:
    """One answer (``gold=False``) or one known answer for an item (``gold=True``, no worker)."""

    item: str
    worker: str
    label: str
    id: str | None
    weight: float = 1.0
    gold: bool = False
    line: int | None = None


@dataclass
class Parsed:
    format: str
    records: list[Record] = field(default_factory=list)
    skipped: int = 0
    skip_reasons: dict[str, int] = field(default_factory=dict)
    unread: tuple[str, ...] = ()
    """Columns of the header that no answer reads (``unread_columns``)."""

    @property
    def labels(self) -> list[Record]:
        return [r for r in self.records if not r.gold]

    @property
    def gold(self) -> list[Record]:
        return [r for r in self.records if r.gold]

    def skip(self, reason: str) -> None:
        self.skipped += 1
        self.skip_reasons[reason] = self.skip_reasons.get(reason, 0) + 1


def parse_map(text: str | None) -> dict[str, str]:
    """``item=col,worker=col,...`` into a dict (keys from ``MAP_KEYS``)."""
    out: dict[str, str] = {}
    if not text:
        return out
    for part in text.split(","):
        key, sep, column = part.partition("=")
        key, column = key.strip(), column.strip()
        if not sep or not column or key not in MAP_KEYS:
            raise InputError(
                "--map",
                None,
                f"expected key=column with key one of {', '.join(MAP_KEYS)}; got {part!r}",
            )
        if key in out:
            raise InputError("--map", None, f"{key} is mapped twice ({out[key]!r}, {column!r})")
        if column in out.values():
            raise InputError("--map", None, f"column {column!r} is mapped twice")
        out[key] = column
    return out


def _source_id(kind: str, *parts: str) -> str:
    text = f"{kind}:" + ":".join(parts)
    return text if len(text) <= MAX_ID_LENGTH else hash_id(kind, *parts)


def _name(path: Path, line: int | None, what: str, value: Any) -> str:
    """An id or label as the service takes it: text (a number written as text), stripped, 1
    to MAX_ID_LENGTH characters, no control characters (checked here, before anything is
    sent, rather than refused by the service part way through the file)."""
    if isinstance(value, (bool, dict, list)):
        kind = {bool: "true or false", dict: "an object", list: "an array"}[type(value)]
        raise InputError(path, line, f"{what} must be text or a number, got {kind}")
    return checked_id(path, line, what, "" if value is None else str(value))


def _weight(path: Path, line: int | None, value: Any) -> float:
    if value is None or (isinstance(value, str) and not value.strip()):
        return 1.0
    if isinstance(value, (bool, dict, list)):
        raise InputError(path, line, f"weight {value!r} is not a number")
    try:
        w = float(value)
    except (TypeError, ValueError):
        raise InputError(path, line, f"weight {value!r} is not a number") from None
    if not math.isfinite(w) or w < 0:
        raise InputError(path, line, f"weight {value!r} must be a finite number >= 0")
    return w


def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise InputError(path, None, "no such file") from None
    except IsADirectoryError:
        raise InputError(path, None, "is a folder, not a file") from None
    except UnicodeDecodeError as err:
        line = path.read_bytes()[: err.start].count(b"\n") + 1
        raise not_utf8(path, line) from None


def detect(path: Path, text: str) -> str:
    """The format of a file, from its first bytes, its header and its name."""
    head = text.lstrip()[:1]
    suffix = path.suffix.lower()
    if head == "[" or (suffix == ".json" and head == "{"):
        return "labelstudio"
    if head == "{" or suffix in (".jsonl", ".ndjson"):
        return "jsonl"
    first = first_line(text)  # (splitting every line took 0.12 s of a 1M-answer import)
    delimiter = "\t" if "\t" in first or suffix == ".tsv" else ","
    columns = {c.strip().strip('"') for c in next(csv.reader([first], delimiter=delimiter), [])}
    if any(c.startswith(("INPUT:", "OUTPUT:", "ASSIGNMENT:")) for c in columns):
        return "toloka"
    if {"HITId", "WorkerId", "AssignmentId"} <= columns:
        return "mturk"
    if "task" in columns and {"worker", "label"} <= columns:
        return "crowdkit"
    return "tsv" if delimiter == "\t" else "csv"


def read(path: str | Path, format: str = "auto", mapping: dict[str, str] | None = None) -> Parsed:
    """Parse ``path`` (``format`` one of ``FORMATS``) into records."""
    source = _source(path, format, mapping)
    return _checked_parsed(source.path, _parse(source))


def read_answers(
    path: str | Path,
    format: str = "auto",
    mapping: dict[str, str] | None = None,
    header: bool = True,
) -> tuple[AnswerTable, list[Record]]:
    """The answers of ``path`` as a table, and its gold records. A plain table (CSV, TSV,
    crowd-kit, Parquet) whose cells need no trimming, with no quotes, blank lines or gold
    column, is read and checked in columns (``_plain_table``); any other file, or one that
    fails a check, is read row by row (``read``), which names the line and the reason.
    Without ``header`` a CSV or TSV file's rows are all answers, item, worker, label[,
    weight] (``HEADERLESS``), as ``extract`` reads a file without a header."""
    from app.io.answer_table import AnswerTable  # pyarrow: loaded by an import only

    source = _source(path, format, mapping, header)
    if source.kind in ("csv", "tsv", "crowdkit", "parquet"):
        table = _plain_table(source)
        if table is not None:
            return table, []
    parsed = _checked_parsed(source.path, _parse(source))
    table = AnswerTable.of(parsed.format, parsed.labels, parsed.skipped, parsed.unread)
    return table, parsed.gold


def _plain_table(source: _Source) -> AnswerTable | None:
    """A plain table read in columns, or None when it needs reading row by row: cells in
    quotes, a first line that is blank, lone carriage returns, a gold column, a check
    failed (the rows' reading then names the line), or text from a pipe (read once, as
    ``source.text``: the columns' reader would read the file again)."""
    from app.io import answer_table

    path = source.path
    if source.text is not None and not path.is_file():
        return None
    if source.text is None:
        names, delimiter = answer_table.parquet_names(path), None
    else:
        text = source.text
        first = text.partition("\n")[0].rstrip("\r")
        if '"' in text or not first.strip() or text.count("\r") != text.count("\r\n"):
            return None
        delimiter = _delimiter(source.kind, text)
        names = first.split(delimiter)
        if not source.header:
            names = _headerless_names(path, 1, len(names))
    hline = None if delimiter is None or not source.header else 1
    columns = _columns(path, hline, names, source.mapping)
    if columns["gold"] is not None:
        return None
    table = answer_table.read_plain(
        path, source.kind, delimiter, columns, len(names), header=source.header
    )
    return None if table is None else replace(table, unread=unread_columns(names, columns))


def _columns(
    path: Path, hline: int | None, names: list[str], mapping: dict[str, str]
) -> dict[str, int | None]:
    """The column of each of ``MAP_KEYS`` (item, worker and label required); a column used
    whose name the header gives twice is an error (which one was meant?)."""
    index = _first_of_each(names)
    defaults = {"item": ("item", "task"), "worker": ("worker",), "label": ("label",),
                "id": ("id",), "weight": ("weight",), "gold": ("gold",)}  # fmt: skip
    out: dict[str, int | None] = {}
    for key in MAP_KEYS:
        out[key] = _column(path, hline, index, mapping, key, *defaults[key])
        if key in ("item", "worker", "label"):
            _need(path, hline, out[key], key, index, _no_header_hint(names, mapping))
    stripped = [name.strip() for name in names]
    for column in out.values():
        if column is not None and stripped.count(stripped[column]) > 1:
            raise InputError(
                path, hline, f"the header names column {stripped[column]!r} twice: rename one"
            )
    for name in unread_columns(names, out):
        for key, what in (("id", "ids"), ("weight", "weights"), ("gold", "gold labels")):
            if out[key] is None and _looks_like(name, key):
                raise InputError(path, hline, f"column {name!r} would not be read: if it holds "
                                 f"the answers' {what}, name it {key!r} or pass --map "
                                 f"{key}={name}; else drop it")  # fmt: skip
    return out


PANDAS_INDEX = re.compile(r"__index_level_\d+__")
"""The column pandas writes for a frame's index (``to_parquet`` of a frame whose index is not
a range): not an answer's field, and not worth a word."""


def unread_columns(names: list[str], columns: dict[str, int | None]) -> tuple[str, ...]:
    """The header's names that no key of ``columns`` reads (but a pandas index)."""
    used = {c for c in columns.values() if c is not None}
    return tuple(
        name.strip()
        for n, name in enumerate(names)
        if n not in used and name.strip() and not PANDAS_INDEX.fullmatch(name.strip())
    )


def _looks_like(name: str, key: str) -> bool:
    """``name`` reads as a misspelt or decorated ``key`` ('wieght', 'Weight', 'weights',
    'gold_label'): its values would be dropped without a word."""
    low = name.lower()
    if low == key:
        return True
    if len(key) <= 2:  # ('id': only its capitals; 'kid' or 'idx' may be anything)
        return False
    return low.startswith(key) or difflib.SequenceMatcher(None, low, key).ratio() >= 0.8


@dataclass(frozen=True)
class _Source:
    path: Path
    kind: str
    text: str | None  # (None: Parquet)
    mapping: dict[str, str]
    header: bool = True


HEADERLESS = ("item", "worker", "label", "weight")
"""The columns of a CSV or TSV file without a header (``--no-header``): item, worker, label
and, in a file of four fields, weight; as ``extract`` reads one."""


def _headerless_names(path: Path, line: int | None, n_fields: int) -> list[str]:
    if n_fields not in (3, 4):
        raise InputError(path, line, f"{n_fields} fields: a file without a header holds "
                         "item,worker,label or item,worker,label,weight")  # fmt: skip
    return list(HEADERLESS[:n_fields])


def _source(
    path: str | Path, format: str, mapping: dict[str, str] | None, header: bool = True
) -> _Source:
    path = Path(path)
    if format not in FORMATS:
        raise InputError(
            "--format", None, f"unknown format {format!r}: one of {', '.join(FORMATS)}"
        )
    mapping = dict(mapping or {})
    if not header and mapping:
        raise InputError("--map", None, "a file without a header (--no-header) has no columns "
                         "to map: its fields are item, worker, label[, weight]")  # fmt: skip
    if format == "parquet" or (format == "auto" and is_parquet(path)):
        if not header:
            raise InputError(path, None, "a Parquet file names its columns: --no-header is "
                             "for a CSV or TSV file")  # fmt: skip
        return _Source(path, "parquet", None, mapping)
    text = _text(path)
    if not text or text.isspace():  # (not text.strip(): a copy of the whole text)
        raise InputError(path, None, "the file is empty")
    kind = detect(path, text) if format == "auto" else format
    if not header and kind not in ("csv", "tsv"):
        raise InputError(path, None, f"a {kind} file names its fields: --no-header is for a "
                         "CSV or TSV file")  # fmt: skip
    return _Source(path, kind, text, mapping, header)


def _parse(source: _Source) -> Parsed:
    path, kind, text, mapping = source.path, source.kind, source.text, source.mapping
    if text is None:
        return _tabular(path, _parquet_rows(path), mapping, "parquet")
    if kind in ("csv", "tsv", "crowdkit"):
        rows = _rows(path, text, _delimiter(kind, text))
        return _tabular(path, rows, mapping, kind, source.header)
    if kind == "jsonl":
        return _jsonl(path, text, mapping)
    if kind == "toloka":
        return _toloka(path, text, mapping)
    if kind == "mturk":
        return _mturk(path, text, mapping)
    return _labelstudio(path, text, mapping)


def _delimiter(kind: str, text: str) -> str:
    return "\t" if kind == "tsv" or (kind == "crowdkit" and _tabbed(text)) else ","


def _checked_parsed(path: Path, parsed: Parsed) -> Parsed:
    if not parsed.records:
        raise InputError(
            path, None, f"no answers found ({parsed.format} format; {parsed.skipped} rows skipped)"
        )
    _check_gold(path, parsed.records)
    return parsed


def _tabbed(text: str) -> bool:
    return "\t" in text.split("\n", 1)[0]


def _check_gold(path: Path, records: list[Record]) -> None:
    seen: dict[str, Record] = {}
    for r in records:
        if not r.gold:
            continue
        before = seen.setdefault(r.item, r)
        if before.label != r.label:
            raise InputError(
                path,
                r.line,
                f"item {r.item!r} has gold {r.label!r} here and {before.label!r} on line {before.line}",
            )


# ---------------------------------------------------------------------- tables


def _rows(path: Path, text: str, delimiter: str) -> Iterator[tuple[int, list[str]]]:
    """(line number where the row starts, fields) of every non-blank row; an InputError for a
    quote that is not closed or text right after a closing quote."""
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, strict=True)
    start = 1
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as err:
            raise InputError(path, start, quoting_error(err)) from None
        if any(f.strip() for f in row):
            yield start, row
        start = reader.line_num + 1


def _first_of_each(names: list[str]) -> dict[str, int]:
    """The column of each name of a header (its first, for a name given twice)."""
    index: dict[str, int] = {}
    for n, name in enumerate(names):
        index.setdefault(name.strip(), n)
    return index


def _header(
    path: Path, rows: Iterator[tuple[int | None, list[str]]]
) -> tuple[int | None, list[str]]:
    """The header's line and its names."""
    try:
        line, names = next(rows)
    except StopIteration:
        raise InputError(path, None, "no header row") from None
    return line, names


def _column(
    path: Path,
    line: int | None,
    index: dict[str, int],
    mapping: dict[str, str],
    key: str,
    *defaults: str,
) -> int | None:
    """The column for ``key``: the mapped name (which must exist) or the first default present."""
    if key in mapping:
        name = mapping[key]
        if name not in index:
            raise InputError(
                path, line, f"--map {key}={name}: no such column (columns: {', '.join(index)})"
            )
        return index[name]
    return next((index[d] for d in defaults if d in index), None)


def _need(
    path: Path, line: int | None, col: int | None, key: str, index: dict[str, int], hint: str = ""
) -> int:
    if col is None:
        raise InputError(
            path,
            line,
            f"no {key} column: name it with --map {key}=COLUMN (columns: {', '.join(index)})"
            + hint,
        )
    return col


def _no_header_hint(names: list[str], mapping: dict[str, str]) -> str:
    """For a first line that names no column an answer reads (a file without a header, which
    ``extract`` reads as item, worker, label[, weight]): how to give it one."""
    known = {*MAP_KEYS, "task"}
    if mapping or any(n.strip().lower() in known for n in names) or len(names) not in (3, 4):
        return ""
    return "; a file without a header: pass --no-header, or give it a first line " + (
        "item,worker,label" + (",weight" if len(names) == 4 else "")
    )


def _cell(row: list[str], col: int | None) -> str:
    return row[col].strip() if col is not None and col < len(row) else ""


def _parquet_rows(path: Path) -> Iterator[tuple[int | None, list[str]]]:
    """A Parquet file as ``_rows`` gives a CSV: its column names (at no line), then each row's
    cells as text (numbers written plainly, a null as empty), numbered from 1 (a row, not a
    line)."""
    import pyarrow as pa  # (only for Parquet files)

    from app.io.triples import as_text, check_utf8, parquet_file

    table = parquet_file(path).read()
    yield None, list(table.column_names)
    columns = []
    for name, column in zip(table.column_names, table.columns, strict=True):
        check_utf8(path, name, column)
        try:
            columns.append(as_text(column).to_pylist())
        except pa.ArrowException:
            raise InputError(path, None, f"column {name!r} holds {column.type}: expected text "
                             "or numbers (every column is read)") from None  # fmt: skip
    for n, row in enumerate(zip(*columns, strict=True), start=1):
        yield n, ["" if x is None else x for x in row]


def _tabular(
    path: Path,
    rows: Iterator[tuple[int | None, list[str]]],
    mapping: dict[str, str],
    kind: str,
    header: bool = True,
) -> Parsed:
    hline, names = _header(path, rows)
    if not header:  # (the first row is an answer: read with the rest)
        rows = itertools.chain([(hline, names)], rows)
        hline, names = None, _headerless_names(path, hline, len(names))
    n_fields = len(names)
    columns = _columns(path, hline, names, mapping)
    item_c, worker_c, label_c = columns["item"], columns["worker"], columns["label"]
    id_c, weight_c, gold_c = columns["id"], columns["weight"], columns["gold"]
    parsed = Parsed(kind, unread=unread_columns(names, columns))
    seen: dict[tuple[str, str, str], int] = {}
    for line, row in rows:
        if len(row) != n_fields:  # (a field the header does not name would be lost)
            raise InputError(path, line, f"expected {n_fields} fields, got {len(row)}")
        item = _name(path, line, "item", _cell(row, item_c))
        gold = _cell(row, gold_c)
        if gold:
            parsed.records.append(
                Record(item, "", _name(path, line, "gold", gold), None, gold=True, line=line)
            )
        raw_label = _cell(row, label_c)
        if not raw_label and gold:
            continue  # a gold-only row
        worker = _name(path, line, "worker", _cell(row, worker_c))
        label = _name(path, line, "label", raw_label)
        given = _cell(row, id_c)
        if given:
            rid = _name(path, line, "id", given)
        else:  # the n-th occurrence of this answer in the file
            n = seen[item, worker, label] = seen.get((item, worker, label), 0) + 1
            rid = hash_id("row", item, worker, label, str(n))
        weight = _weight(path, line, _cell(row, weight_c)) if weight_c is not None else 1.0
        parsed.records.append(Record(item, worker, label, rid, weight, line=line))
    return parsed


def _jsonl(path: Path, text: str, mapping: dict[str, str]) -> Parsed:
    parsed = Parsed("jsonl")
    keys = {k: mapping.get(k, k) for k in MAP_KEYS}
    seen: dict[tuple[str, str, str], int] = {}
    for line, raw in enumerate(text_lines(text), start=1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise InputError(path, line, f"not JSON: {exc.msg}") from None
        if not isinstance(obj, dict):
            raise InputError(path, line, "expected a JSON object per line")
        item_v = obj.get(keys["item"], obj.get("task") if "item" not in mapping else None)
        item = _name(path, line, "item", item_v)
        if obj.get(keys["gold"]) not in (None, ""):
            gold = _name(path, line, "gold", obj[keys["gold"]])
            parsed.records.append(Record(item, "", gold, None, gold=True, line=line))
            if obj.get(keys["label"]) in (None, ""):
                continue
        worker = _name(path, line, "worker", obj.get(keys["worker"]))
        label = _name(path, line, "label", obj.get(keys["label"]))
        if obj.get(keys["id"]) not in (None, ""):
            rid = _name(path, line, "id", obj[keys["id"]])
        else:
            n = seen[item, worker, label] = seen.get((item, worker, label), 0) + 1
            rid = hash_id("row", item, worker, label, str(n))
        weight = _weight(path, line, obj.get(keys["weight"]))
        parsed.records.append(Record(item, worker, label, rid, weight, line=line))
    return parsed


# ---------------------------------------------------------------------- Toloka


def _only(path: Path, line: int | None, index: dict[str, int], prefix: str, key: str) -> str:
    names = [c for c in index if c.startswith(prefix)]
    if len(names) != 1:
        found = ", ".join(names) or "none"
        raise InputError(
            path,
            line,
            f"cannot tell the {key} column among the {prefix} columns ({found}): give --map {key}=COLUMN",
        )
    return names[0]


def _toloka(path: Path, text: str, mapping: dict[str, str]) -> Parsed:
    rows = _rows(path, text, "\t")
    hline, names = _header(path, rows)
    index = _first_of_each(names)
    m = dict(mapping)
    m.setdefault("item", _only(path, hline, index, "INPUT:", "item"))
    m.setdefault("label", _only(path, hline, index, "OUTPUT:", "label"))
    m.setdefault("worker", "ASSIGNMENT:worker_id")
    item_c = _column(path, hline, index, m, "item")
    label_c = _column(path, hline, index, m, "label")
    worker_c = _column(path, hline, index, m, "worker")
    golden = "GOLDEN:" + m["label"].removeprefix("OUTPUT:")
    gold_c = _column(path, hline, index, m, "gold", golden)
    id_c = _column(path, hline, index, m, "id", "ASSIGNMENT:assignment_id")
    task_c = index.get("ASSIGNMENT:task_id")
    status_c = index.get("ASSIGNMENT:status")
    parsed = Parsed("toloka")
    for line, row in rows:
        item = _name(path, line, "item", _cell(row, item_c))
        gold = _cell(row, gold_c)
        if gold:
            parsed.records.append(Record(item, "", gold, None, gold=True, line=line))
        status = _cell(row, status_c).upper()
        label = _cell(row, label_c)
        if status in _SKIP_STATUS:
            parsed.skip(status.lower())
            continue
        if not label:
            parsed.skip("no answer")
            continue
        worker = _name(path, line, "worker", _cell(row, worker_c))
        assignment = _cell(row, id_c)
        if not assignment:
            raise InputError(path, line, "no assignment id (ASSIGNMENT:assignment_id)")
        rid = _source_id("toloka", assignment, _cell(row, task_c) or item)
        parsed.records.append(
            Record(item, worker, _name(path, line, "label", label), rid, line=line)
        )
    return parsed


# ---------------------------------------------------------------------- Mechanical Turk


def _answer_columns(index: dict[str, int]) -> list[str]:
    return [c for c in index if c.startswith("Answer.")]


def _radio_name(column: str) -> str:
    name = column.removeprefix("Answer.").removesuffix(".on")
    return name.rsplit(".", 1)[-1]


def _task_answers(path: Path, line: int, value: str) -> str:
    """``Answer.taskAnswers`` of crowd-html-elements: ``[{"q": {"label": "x"}}]`` or radio ``on``s."""
    try:
        data = json.loads(value)
    except json.JSONDecodeError:
        raise InputError(path, line, "Answer.taskAnswers is not JSON") from None
    if isinstance(data, list):
        data = data[0] if data else {}
    if not isinstance(data, dict):
        raise InputError(path, line, "Answer.taskAnswers: expected an object")
    chosen = [k for k, v in data.items() if isinstance(v, dict) and v.get("on") is True]
    labels = [v["label"] for v in data.values() if isinstance(v, dict) and "label" in v]
    plain = [
        v for v in data.values() if isinstance(v, str | int | float) and not isinstance(v, bool)
    ]
    found = chosen or labels or plain
    if len(found) != 1:
        raise InputError(
            path,
            line,
            f"Answer.taskAnswers: expected one answer, found {len(found)}: give --map label=Answer.<field>",
        )
    return str(found[0])


def _mturk(path: Path, text: str, mapping: dict[str, str]) -> Parsed:
    rows = list(_rows(path, text, ","))
    if not rows:
        raise InputError(path, None, "no header row")
    hline, names = rows[0]
    index = {n.strip(): k for k, n in reversed(list(enumerate(names)))}
    body = rows[1:]
    item_c = _need(
        path, hline, _column(path, hline, index, mapping, "item", "HITId"), "item", index
    )
    worker_c = _need(
        path, hline, _column(path, hline, index, mapping, "worker", "WorkerId"), "worker", index
    )
    id_c = _need(
        path, hline, _column(path, hline, index, mapping, "id", "AssignmentId"), "id", index
    )
    gold_c = _column(path, hline, index, mapping, "gold")
    status_c = index.get("AssignmentStatus")
    label_c: int | None = _column(path, hline, index, mapping, "label")
    radios: list[str] = []
    if label_c is None:
        answers = _answer_columns(index)
        if not answers:
            raise InputError(path, hline, "no Answer.* column")
        boolean = all(
            _cell(row, index[c]).lower() in _TRUE | _FALSE for c in answers for _, row in body
        )
        if len(answers) > 1 and boolean:
            radios = answers  # one radio button per column, true on the chosen one
        elif len(answers) == 1:
            label_c = index[answers[0]]
        else:
            raise InputError(
                path,
                hline,
                f"several answer columns ({', '.join(answers)}): give --map label=COLUMN",
            )
    json_answers = label_c is not None and names[label_c].strip() == "Answer.taskAnswers"
    parsed = Parsed("mturk")
    for line, row in body:
        item = _name(path, line, "item", _cell(row, item_c))
        gold = _cell(row, gold_c)
        if gold:
            parsed.records.append(Record(item, "", gold, None, gold=True, line=line))
        status = _cell(row, status_c).upper()
        if status in _SKIP_STATUS:
            parsed.skip(status.lower())
            continue
        if radios:
            chosen = [c for c in radios if _cell(row, index[c]).lower() in _TRUE]
            if len(chosen) > 1:
                raise InputError(path, line, f"{len(chosen)} answers chosen: {', '.join(chosen)}")
            label = _radio_name(chosen[0]) if chosen else ""
        elif json_answers:
            value = _cell(row, label_c)
            label = _task_answers(path, line, value) if value else ""
        else:
            label = _cell(row, label_c)
        if not label:
            parsed.skip("no answer")
            continue
        worker = _name(path, line, "worker", _cell(row, worker_c))
        rid = _source_id("mturk", _name(path, line, "assignment id", _cell(row, id_c)))
        parsed.records.append(
            Record(item, worker, _name(path, line, "label", label), rid, line=line)
        )
    return parsed


# ---------------------------------------------------------------------- Label Studio


def _json_array(path: Path, text: str) -> Iterator[tuple[int, Any]]:
    """(line of the element's start, element) of a top-level JSON array (or one object),
    element by element; anything but white space after it is an error (a second array was
    silently left out)."""
    decoder = json.JSONDecoder()

    def line(at: int) -> int:
        return text.count("\n", 0, at) + 1

    pos = _after_space(text, 0)
    if text[pos : pos + 1] == "{":  # a single task
        obj, end = _decode(path, text, decoder, pos)
        yield line(pos), obj
        _nothing_after(path, text, end, line)
        return
    if text[pos : pos + 1] != "[":
        raise InputError(path, line(pos), "expected a JSON array of tasks (or one task)")
    pos = _after_space(text, pos + 1)
    if text[pos : pos + 1] == "]":
        _nothing_after(path, text, pos + 1, line)
        return
    while True:
        obj, end = _decode(path, text, decoder, pos)
        yield line(pos), obj
        pos = _after_space(text, end)
        if text[pos : pos + 1] == ",":
            pos = _after_space(text, pos + 1)
        elif text[pos : pos + 1] == "]":
            _nothing_after(path, text, pos + 1, line)
            return
        elif pos >= len(text):
            raise InputError(path, line(pos), "the JSON array is not closed")
        else:
            raise InputError(path, line(pos), "expected ',' or ']' after a task")


def _after_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos


def _nothing_after(path: Path, text: str, pos: int, line: Callable[[int], int]) -> None:
    rest = _after_space(text, pos)
    if rest < len(text):
        raise InputError(path, line(rest), "more after the JSON array of tasks: one array only")


def _decode(path: Path, text: str, decoder: json.JSONDecoder, pos: int) -> tuple[Any, int]:
    try:
        return decoder.raw_decode(text, pos)
    except json.JSONDecodeError as exc:
        raise InputError(path, exc.lineno, f"not JSON: {exc.msg}") from None


def _annotator(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("email") or value.get("id")
    return None if value is None else str(value)


def _choice(path: Path, line: int, results: Any, control: str | None) -> str | None:
    if not isinstance(results, list):
        raise InputError(path, line, "annotation 'result' is not a list")
    found = [
        r
        for r in results
        if isinstance(r, dict)
        and isinstance(r.get("value"), dict)
        and "choices" in r["value"]
        and (control is None or r.get("from_name") == control)
    ]
    if not found:
        return None
    controls = {r.get("from_name") for r in found}
    if len(controls) > 1:
        raise InputError(
            path,
            line,
            f"choices from several controls ({', '.join(map(str, controls))}): give --map label=<from_name>",
        )
    choices = found[0]["value"]["choices"]
    if not isinstance(choices, list) or len(choices) != 1:
        raise InputError(
            path,
            line,
            f"{len(choices) if isinstance(choices, list) else 'no'} choices in one answer: one label per answer is supported",
        )
    return str(choices[0])


def _labelstudio(path: Path, text: str, mapping: dict[str, str]) -> Parsed:
    parsed = Parsed("labelstudio")
    item_key = mapping.get("item")
    control = mapping.get("label")
    for line, task in _json_array(path, text):
        if not isinstance(task, dict):
            raise InputError(path, line, "expected a Label Studio task object")
        if item_key is None:
            raw_item = task.get("id")
        else:
            key = item_key.removeprefix("data.")
            raw_item = (task.get("data") or {}).get(key, task.get(item_key))
        item = _name(path, line, "item (the task id, or --map item=data.FIELD)", raw_item)
        annotations = task.get("annotations", task.get("completions", []))
        if not isinstance(annotations, list):
            raise InputError(path, line, "'annotations' is not a list")
        for k, ann in enumerate(annotations):
            if not isinstance(ann, dict):
                raise InputError(path, line, f"annotation {k} is not an object")
            if ann.get("was_cancelled"):
                parsed.skip("cancelled")
                continue
            label = _choice(path, line, ann.get("result", []), control)
            if label is None:
                parsed.skip("no choice")
                continue
            label = _name(path, line, "label", label)
            if ann.get("ground_truth"):
                parsed.records.append(Record(item, "", label, None, gold=True, line=line))
                continue
            worker = _annotator(ann.get("completed_by"))
            if worker is None:
                raise InputError(path, line, f"annotation {k} has no completed_by")
            ann_id = ann.get("id")
            key = str(ann_id) if ann_id is not None else f"{task.get('id')}.{k}"
            rid = _source_id("labelstudio", str(task.get("id", item)), key)
            parsed.records.append(
                Record(item, _name(path, line, "worker", worker), label, rid, line=line)
            )
    return parsed
