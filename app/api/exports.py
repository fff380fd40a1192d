"""The export's text, a page of stored items at a time (``app.serving.stored_pages``).

Each row is made by one format operation over the page's columns, with the very bytes the
item-by-item writers gave: a CSV row as ``csv.writer`` writes it (numbers ``%.6g``), a JSONL
line as ``orjson`` writes the item's dict.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from app.io.csv_fields import csv_field
from app.serving.nominal import iso
from app.serving.stored_pages import StoredPage


def csv_header(classes: Sequence[str]) -> str:
    return _csv_row(["item", "label", "probability", *classes, "n_labels", "gold", "computed_at"])


def csv_rows(page: StoredPage, classes: Sequence[str]) -> str:
    """The page's CSV rows: item, label, probability, the posterior of each class, n_labels,
    gold, computed_at; label and probability empty for an item without evidence."""
    labels = [csv_field(c) for c in classes]
    row = "%s,%s,%s," + ",".join(["%.6g"] * len(classes)) + ",%d,%s,%s\r\n"
    rows = (
        (
            csv_field(name),
            labels[b] if known else "",
            f"{p[b]:.6g}" if known else "",
            *p,
            n,
            labels[gold] if gold >= 0 else "",
            iso(at),
        )
        for name, b, known, p, n, gold, at in _columns(page)
    )
    return "".join(row % fields for fields in rows)


def jsonl_lines(page: StoredPage, classes: Sequence[str]) -> bytes:
    """The page's NDJSON: per item its fields but its labels, as ``Item`` orders them."""
    return b"".join(
        orjson.dumps(
            {
                "item": name,
                "label": classes[b] if known else None,
                "probability": p[b] if known else None,
                "posterior": dict(zip(classes, p, strict=True)),
                "n_labels": n,
                "gold": classes[gold] if gold >= 0 else None,
                "computed_at": iso(at),
                "position": position,
            }
        )
        + b"\n"
        for (name, b, known, p, n, gold, at), position in zip(
            _columns(page), page.position.tolist(), strict=True
        )
    )


def _columns(page: StoredPage) -> Any:
    """Each item's name, best class (the first on ties), evidence, posterior, label count,
    gold and time, as Python values."""
    best = page.posterior.argmax(axis=1).tolist()
    return zip(
        page.names, best, page.known.tolist(), page.posterior.tolist(), page.n_labels.tolist(),
        page.gold.tolist(), page.computed_at.tolist(), strict=True,
    )  # fmt: skip


def _csv_row(fields: Sequence[str]) -> str:
    return ",".join(csv_field(f) for f in fields) + "\r\n"
