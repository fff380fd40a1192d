"""An item's served state as a store keeps it, and its JSON rendered on read.

The engine writes each touched item as a packed record (posterior, held-out correction,
clarity, the step's time, gold, position, the number of labels and their summed weight:
float64 and int64 fields, ``record_dtype``) and the new rows of its label list, ``[worker,
label, weight]`` as orjson writes them. The store keeps each label list as JSON text without
its closing ``]`` and appends to it, so an update of an item with n labels costs the engine
O(new labels), not O(n) (the embedded store too; Redis is sent the whole list, which it
cannot append to in place). What a read returns is the bytes ``orjson.dumps`` gives for the
item's dict ``{"posterior", "clarity", "labels", "gold", "held_out", "position",
"computed_at"}``. An export reads the records alone, in columns (``record_table``): the count
and the weight (the calibration's n_i, docs/model.md eq. 21) spare it the label lists.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from core.blocks import FloatArray, IntArray

WHOLE = b"["
"""A label text starting with this is an item's whole list (it replaces the stored one); any
other non-empty text (a comma, then rows) is appended to it."""


@dataclass
class ItemWrites:
    """A step's served items: per item its name, its packed record (``pack``) and the text to
    put in its label list (``WHOLE`` and every row, or a comma and the new rows, or nothing)."""

    names: list[str] = field(default_factory=list)
    records: list[bytes] = field(default_factory=list)
    labels: list[bytes] = field(default_factory=list)
    written: dict[str, bytearray] = field(default_factory=dict)
    """The writer's lists as it last wrote them, for a store that writes every list whole
    (Redis, which has no append to a hash's value): it grows them with ``grow_lists``. They
    live as long as the engine that sends the texts, whose first text of an item is whole."""

    def __bool__(self) -> bool:
        return bool(self.names)

    def __len__(self) -> int:
        return len(self.names)


COUNTED = 1 << 32
"""Set in a record's first field (beside its number of classes) when the record carries its
item's label count and weight. Records written before they did (kept by a Redis across an
upgrade) lack both; ``record_table`` does not read them, ``render`` does."""


@functools.cache
def record_dtype(n_classes: int, counted: bool = True) -> np.dtype:
    fields: list[tuple[str, str] | tuple[str, str, tuple[int]]] = [
        ("n_classes", "<i8"),  # (a record tells its own size: COUNTED or not, then K)
        ("posterior", "<f8", (n_classes,)),
        ("held_out", "<f8", (n_classes,)),  # a row of zeros for none
        ("clarity", "<f8"),
        ("computed_at", "<f8"),
        ("gold", "<i8"),  # -1 for none
        ("position", "<i8"),
    ]
    if counted:
        fields += [("n_labels", "<i8"), ("weight", "<f8")]  # weight: summed in list order
    return np.dtype(fields)


def pack(
    posterior: FloatArray,
    clarity: FloatArray,
    gold: IntArray,
    held_out: FloatArray,
    position: int,
    computed_at: float,
    n_labels: IntArray,
    weight: FloatArray,
) -> list[bytes]:
    """One record per row of ``posterior``, as bytes."""
    n, k = posterior.shape
    table = np.empty(n, dtype=record_dtype(k))
    table["n_classes"] = k | COUNTED
    table["posterior"], table["held_out"], table["clarity"] = posterior, held_out, clarity
    table["computed_at"], table["gold"], table["position"] = computed_at, gold, position
    table["n_labels"], table["weight"] = n_labels, weight
    return as_bytes(table)


def as_bytes(rows: npt.NDArray[Any]) -> list[bytes]:
    """Each row of ``rows`` (records, or rows of numbers of any shape) as a ``bytes`` of its
    own size, in order: numpy makes them in one C loop from a view of the rows as opaque
    items (slicing one ``tobytes`` of them in Python took 5-6 times as long)."""
    width = rows[0].nbytes if len(rows) else 0
    if width == 0:
        return [b""] * len(rows)
    table = np.ascontiguousarray(rows).reshape(len(rows), -1)
    out: list[bytes] = table.view(f"V{width}").ravel().tolist()
    return out


def _head(record: bytes) -> int:
    return int.from_bytes(record[:8], "little", signed=True)


def _kind(head: int) -> tuple[int, bool]:
    """A record's number of classes and whether it carries its label count, from its first
    field (``record_dtype``'s arguments)."""
    return head & (COUNTED - 1), bool(head & COUNTED)


def record_size(record: bytes) -> int:
    """The length of a record (or of the record a value starts with)."""
    return _layout(*_kind(_head(record))).size


def record_table(records: Sequence[bytes]) -> npt.NDArray[np.void] | None:
    """The records (of one project, each alone) as one array of ``record_dtype``; None when
    one of them predates the label counts (then read their items' JSON)."""
    if not records:
        return None
    heads = np.frombuffer(b"".join(r[:8] for r in records), dtype="<i8")
    if not np.all(heads & COUNTED):
        return None
    return np.frombuffer(b"".join(records), dtype=record_dtype(*_kind(int(heads[0]))))


def grow_lists(lists: MutableMapping[str, bytearray], items: ItemWrites) -> Callable[[], None]:
    """Apply a write's label texts to the stored lists ``lists``. An engine's first text of an
    item is its whole list, so an item appended to is there. Returns what undoes it (a write
    the store refused: the lists as the store holds them, and the same texts sent again)."""
    grown: list[tuple[bytearray, int]] = []  # (an appended list and its length before)
    replaced: dict[str, bytearray | None] = {}  # (a list made whole and what it was)

    def undo() -> None:
        for appended, length in reversed(grown):
            del appended[length:]
        for name, before in replaced.items():
            if before is None:
                lists.pop(name, None)
            else:
                lists[name] = before

    for name, text in zip(items.names, items.labels, strict=True):
        if text.startswith(WHOLE):
            replaced.setdefault(name, lists.get(name))
            lists[name] = bytearray(text)
        elif not text:
            continue
        elif name in lists:
            grown.append((lists[name], len(lists[name])))
            lists[name] += text
        else:
            undo()  # (nothing of the write applied)
            raise LookupError(f"item {name!r}: labels added to a list that was never written")
    return undo


def render(records: Sequence[bytes], labels: Sequence[bytes | bytearray | None]) -> list[bytes]:
    """Each item's JSON from its record and its stored label list (None: no labels yet); the
    records of one project (one number of classes)."""
    lists = [WHOLE if lab is None else lab for lab in labels]
    if len(records) < COLUMNS_FROM or len({_head(r) for r in records}) > 1:
        return [_item(record, lab) for record, lab in zip(records, lists, strict=True)]
    return _columns(records, lists)


COLUMNS_FROM = 32
"""From this many items on, ``render`` reads the records as one array and writes each field
of all the items with one orjson call (a page of 1,000 items: 2.5 ms, against 4.3 ms an item
at a time)."""


def _columns(records: Sequence[bytes], lists: Sequence[bytes | bytearray]) -> list[bytes]:
    table = np.frombuffer(b"".join(records), dtype=record_dtype(*_kind(_head(records[0]))))
    held_out = table["held_out"]
    held = np.any(held_out != 0.0, axis=1)
    corrections = [b"null"] * held.size
    for i, row in zip(np.flatnonzero(held).tolist(), _rows(held_out[held]), strict=True):
        corrections[i] = row
    gold = table["gold"].tolist()
    return [
        b'{"posterior":%b,"clarity":%b,"labels":%b],"gold":%b,"held_out":%b,'
        b'"position":%b,"computed_at":%b}' % fields
        for fields in zip(
            _rows(table["posterior"]),
            _numbers(table["clarity"].tolist()),
            lists,
            _numbers([g if g >= 0 else None for g in gold]),
            corrections,
            _numbers(table["position"].tolist()),
            _numbers(table["computed_at"].tolist()),
            strict=True,
        )
    ]


def _rows(matrix: FloatArray) -> list[bytes]:
    """Each row of a 2-D float array as orjson writes it, from one call: numbers hold no
    ``],[``, so the whole array's text splits into its rows. (orjson writes a float64 array
    as it writes the same numbers as Python floats, without making them.)"""
    if not matrix.shape[0]:
        return []
    text = orjson.dumps(np.ascontiguousarray(matrix), option=orjson.OPT_SERIALIZE_NUMPY)
    return [b"[%b]" % row for row in text[2:-2].split(b"],[")]


def _numbers(values: list[float] | list[int] | list[int | None]) -> list[bytes]:
    """Each number (or null) as orjson writes it, from one call."""
    return orjson.dumps(values)[1:-1].split(b",") if values else []


def _item(record: bytes, labels: bytes | bytearray) -> bytes:
    k, counted = _kind(_head(record))
    values = _layout(k, counted).unpack_from(record)  # (``record`` may go on with the labels)
    held_out = values[1 + k : 1 + 2 * k]
    clarity, computed_at, gold, position = values[1 + 2 * k : 5 + 2 * k]
    return orjson.dumps(
        {
            "posterior": values[1 : 1 + k],
            "clarity": clarity,
            "labels": orjson.Fragment(b"".join((labels, b"]"))),
            "gold": gold if gold >= 0 else None,
            "held_out": held_out if any(held_out) else None,
            "position": position,
            "computed_at": computed_at,
        }
    )


@functools.cache
def _layout(n_classes: int, counted: bool) -> struct.Struct:
    """``record_dtype`` as a struct (its fields in order, each flattened): one record read
    this way costs a tenth of a read by numpy."""
    record = record_dtype(n_classes, counted)
    fields = [record[name] for name in record.names or ()]
    codes = {"i": "q", "f": "d"}
    return struct.Struct(
        "<" + "".join(f"{int(np.prod(f.shape))}{codes[f.base.kind]}" for f in fields)
    )


def render_values(values: Sequence[bytes]) -> list[bytes]:
    """``render`` of values that each hold an item's record, then its label list."""
    cuts = [record_size(v) for v in values]
    return render(
        [v[:c] for v, c in zip(values, cuts, strict=True)],
        [v[c:] for v, c in zip(values, cuts, strict=True)],
    )
