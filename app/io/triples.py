"""Reading item-worker-label files: CSV with a header (as in shared/datasets), or tab/space separated.

Every problem is reported as an ``InputError`` naming the file, the line and the reason.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

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
    crowd-kit's ``task,worker,label``) is skipped."""
    path = Path(path)
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
