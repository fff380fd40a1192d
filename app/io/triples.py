"""Reading item-worker-label files: CSV with a header (as in shared/datasets), or tab/space separated.

Every problem is reported as an ``InputError`` naming the file, the line and the reason.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

MAX_ID_LENGTH = 512
_HEADERS = (("item", "worker", "label"), ("task", "worker", "label"))  # ours, crowd-kit's
_TRUTH_HEADERS = (["item", "label"], ["task", "label"], ["task", "true_label"])
_WHITESPACE = re.compile(r"[\t ]+")


class InputError(ValueError):
    """A malformed input file: ``path:line: reason``."""

    def __init__(self, path: str | Path, line: int | None, reason: str) -> None:
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {reason}")
        self.path, self.line, self.reason = str(path), line, reason


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


def _rows(path: Path) -> list[tuple[int, list[str]]]:
    """(line number, fields) of every non-blank line, splitting on the file's delimiter."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(path, None, "no such file") from None
    except UnicodeDecodeError as err:
        line = text_line_of_byte(path, err.start)
        raise InputError(path, line, "not UTF-8 text") from None
    lines = text.splitlines()
    first = next((ln for ln in lines if ln.strip()), "")
    if "," in first:
        # csv.reader keeps quoted commas inside a field; line numbers stay 1:1 for unquoted newlines.
        return [
            (n, row)
            for n, row in enumerate(csv.reader(lines), start=1)
            if any(f.strip() for f in row)
        ]
    return [(n, _WHITESPACE.split(ln.strip())) for n, ln in enumerate(lines, start=1) if ln.strip()]


def text_line_of_byte(path: Path, offset: int) -> int:
    return path.read_bytes()[:offset].count(b"\n") + 1


def _check_id(path: Path, line: int, kind: str, value: str) -> str:
    value = value.strip()
    if not value:
        raise InputError(path, line, f"empty {kind}")
    if len(value) > MAX_ID_LENGTH:
        raise InputError(path, line, f"{kind} is longer than {MAX_ID_LENGTH} characters")
    return value


def read_triples(path: str | Path) -> Triples:
    """Read ``item,worker,label[,weight]`` rows; a header row naming those columns (or
    crowd-kit's ``task,worker,label``) is skipped. Parquet files (``.parquet``) hold those
    columns by name.

    A CSV file is read by pyarrow's CSV reader and checked in vectorised code; a file that
    reader refuses, or that fails a check, is read again line by line, which names the line
    and the reason (the same errors either way)."""
    path = Path(path)
    if path.suffix.lower() == ".parquet":
        return _read_parquet(path)
    fast = _read_csv_columns(path)
    if fast is not None:
        return fast
    return _read_rows(path)


def _read_csv_columns(path: Path) -> Triples | None:
    """The columns of a clean comma-separated file, or None (read it line by line)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise InputError(path, None, "no such file") from None
    first = raw.lstrip(b"\r\n").split(b"\n", 1)[0]
    if b"," not in first or b'"' in raw or raw.count(b"\r") != raw.count(b"\r\n"):
        return None  # not CSV, quoted fields, lone CRs: the careful reader
    try:
        table = pa_csv.read_csv(
            pa.py_buffer(raw),
            read_options=pa_csv.ReadOptions(autogenerate_column_names=True),
            convert_options=pa_csv.ConvertOptions(
                column_types={f"f{k}": pa.string() for k in range(4)}, strings_can_be_null=False
            ),
        )
    except (pa.ArrowInvalid, UnicodeDecodeError):
        return None
    columns: list[Any] = list(table.columns)
    if not columns or len(columns) > 4 or table.num_rows == 0:
        return None
    head = [str(c[0].as_py()).strip().lower() for c in columns]
    header = tuple(head[:3]) in _HEADERS
    if header:
        columns = [c.slice(1) for c in columns]
    if (len(columns) == 4 and header and head[3] != "weight") or len(columns) < 3:
        return None
    lines = _nonblank_line_numbers(raw)[int(header) :]
    return _checked(columns, lines)


def _nonblank_line_numbers(raw: bytes) -> npt.NDArray[np.int64]:
    """1-based numbers of the lines that are not empty (pyarrow's rows, in order)."""
    data = np.frombuffer(raw, dtype=np.uint8)
    ends = np.flatnonzero(data == ord("\n"))
    starts = np.concatenate(([0], ends + 1))
    ends = np.concatenate((ends, [data.size]))
    crlf = (ends > starts) & (data[np.maximum(ends - 1, 0)] == ord("\r"))
    out: npt.NDArray[np.int64] = np.flatnonzero(ends - crlf > starts).astype(np.int64) + 1
    return out


def _read_parquet(path: Path) -> Triples:
    try:
        table = pq.read_table(path)
    except FileNotFoundError:
        raise InputError(path, None, "no such file") from None
    except pa.ArrowException as err:
        raise InputError(path, None, f"not a Parquet file ({err})") from None
    names = [n.lower() for n in table.column_names]
    want = next((h for h in _HEADERS if set(h) <= set(names)), None)
    if want is None:
        raise InputError(path, None, f"columns {names}: expected item,worker,label[,weight]")
    picked = [*want, "weight"] if "weight" in names else list(want)
    columns = [table.column(names.index(n)) for n in picked]
    out = _checked(columns, np.arange(1, table.num_rows + 1, dtype=np.int64))
    if out is None:  # the same checks, one row at a time, for the message ("line" = row)
        rows = zip(*(c.to_pylist() for c in columns), strict=True)
        numbered = [(n, [str(x) for x in row]) for n, row in enumerate(rows, start=1)]
        return _from_rows(path, numbered, has_weight=len(columns) == 4)
    return out


def _checked(columns: list[Any], lines: npt.NDArray[np.int64]) -> Triples | None:
    """Ids stripped and non-empty, at most MAX_ID_LENGTH; weights finite numbers >= 0; None
    when any check fails (the caller then reads row by row to name the line)."""
    ids = []
    for column in columns[:3]:
        c = pc.utf8_trim_whitespace(pc.cast(column, pa.string()))
        lengths = pc.min_max(pc.utf8_length(c))
        if len(c) != lines.size or c.null_count or lengths["min"].as_py() in (0, None):
            return None
        if lengths["max"].as_py() > MAX_ID_LENGTH:
            return None
        ids.append(c.to_numpy(zero_copy_only=False).astype(np.str_))
    weights = None
    if len(columns) == 4:
        try:
            weights = np.asarray(pc.cast(columns[3], pa.float64()).to_numpy(zero_copy_only=False))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return None
        if not np.all(np.isfinite(weights) & (weights >= 0)):
            return None
    return Triples(ids[0], ids[1], ids[2], weights, lines)


def _read_rows(path: Path) -> Triples:
    rows = _rows(path)
    if not rows:
        raise InputError(path, None, "no answers in the file")
    has_weight = False
    head = [f.strip().lower() for f in rows[0][1]]
    if tuple(head[:3]) in _HEADERS:
        has_weight = head[3:] == ["weight"]
        if head[3:] and not has_weight:
            raise InputError(
                path, rows[0][0], f"unknown columns {head[3:]}: expected item,worker,label[,weight]"
            )
        rows = rows[1:]
    return _from_rows(path, rows, has_weight)


def _from_rows(path: Path, rows: list[tuple[int, list[str]]], has_weight: bool) -> Triples:
    n_fields = 4 if has_weight else 3
    items: list[str] = []
    workers: list[str] = []
    labels: list[str] = []
    weights: list[float] = []
    lines: list[int] = []
    for line, fields in rows:
        if len(fields) == 4 and not has_weight and not lines:
            has_weight, n_fields = True, 4
        if len(fields) != n_fields:
            names = "item, worker, label, weight" if has_weight else "item, worker, label"
            raise InputError(path, line, f"expected {n_fields} fields ({names}), got {len(fields)}")
        items.append(_check_id(path, line, "item", fields[0]))
        workers.append(_check_id(path, line, "worker", fields[1]))
        labels.append(_check_id(path, line, "label", fields[2]))
        if has_weight:
            weights.append(_parse_weight(path, line, fields[3]))
        lines.append(line)
    if not lines:
        raise InputError(path, None, "no answers in the file (only a header)")
    return Triples(
        items=np.array(items, dtype=np.str_),
        workers=np.array(workers, dtype=np.str_),
        labels=np.array(labels, dtype=np.str_),
        weights=np.array(weights, dtype=np.float64) if has_weight else None,
        lines=np.array(lines, dtype=np.int64),
    )


def _parse_weight(path: Path, line: int, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise InputError(path, line, f"weight {text!r} is not a number") from None
    if not np.isfinite(value) or value < 0:
        raise InputError(path, line, f"weight {text!r} must be a finite number >= 0")
    return value


def read_truth(path: str | Path) -> dict[str, str]:
    """Gold labels: ``item,label`` rows (header optional; crowd-kit's ``task,label`` or
    ``task,true_label`` too). An item given twice is an error."""
    path = Path(path)
    rows = _rows(path)
    if rows and [f.strip().lower() for f in rows[0][1]] in _TRUTH_HEADERS:
        rows = rows[1:]
    truth: dict[str, str] = {}
    for line, fields in rows:
        if len(fields) != 2:
            raise InputError(path, line, f"expected 2 fields (item, label), got {len(fields)}")
        item = _check_id(path, line, "item", fields[0])
        if item in truth:
            raise InputError(path, line, f"item {item!r} has a gold label already")
        truth[item] = _check_id(path, line, "label", fields[1])
    return truth
