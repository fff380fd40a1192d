"""Stored items read a page at a time in columns, their posteriors as served.

A page's packed records are read as one table (``app.store.item_records.record_table``) and
calibrated in one call (docs/model.md eq. 21, each item's n_i its label weight, which its
record carries), with no item's JSON parsed. A page holding a record written before records
carried their label counts (a Redis kept across an upgrade) is read from its items' JSON.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import orjson

from app.serving.nominal import Globals, served_posteriors, stored_posteriors
from app.store.base import Store
from app.store.item_records import record_table
from core.acquisition import BoolArray
from core.blocks import FloatArray, IntArray


@dataclass(frozen=True)
class StoredPage:
    """A page of stored items (rows in the order the store gave their names)."""

    names: list[str]
    posterior: FloatArray
    """As served: calibrated, a gold item's as stored."""
    n_labels: IntArray
    gold: IntArray
    """The gold class, -1 for none."""
    computed_at: FloatArray
    position: IntArray

    @property
    def known(self) -> BoolArray:
        """Items with evidence (labels or gold): the others have no most likely label (as
        ``has_evidence`` says of one item's JSON)."""
        known: BoolArray = (self.n_labels > 0) | (self.gold >= 0)
        return known


def stored_pages(store: Store, project: str, g: Globals, size: int) -> Iterator[StoredPage]:
    """Every stored item of ``project``, ``size`` at a time (the last page may be empty)."""
    cursor = 0
    while True:
        cursor, names, records = store.scan_records(project, cursor, size)
        yield _page(store, project, names, records, g)
        if cursor == 0:
            return


def _page(
    store: Store, project: str, names: list[str], records: list[bytes], g: Globals
) -> StoredPage:
    table = record_table(records)
    if table is None:
        return _from_json(store, project, names, g)
    posterior = served_posteriors(table["posterior"], table["weight"], table["gold"] >= 0, g)
    return StoredPage(
        names, posterior, table["n_labels"], table["gold"], table["computed_at"],
        table["position"],
    )  # fmt: skip


def _from_json(store: Store, project: str, names: list[str], g: Globals) -> StoredPage:
    """A page read from its items' JSON (records without label counts, or none)."""
    found = [(n, b) for n, b in zip(names, store.get_items(project, names), strict=True) if b]
    items = [orjson.loads(b) for _, b in found]
    return StoredPage(
        [n for n, _ in found],
        stored_posteriors(items, g),
        np.array([len(d["labels"]) for d in items], dtype=np.int64),
        np.array([-1 if d.get("gold") is None else d["gold"] for d in items], dtype=np.int64),
        np.array([d["computed_at"] for d in items], dtype=np.float64),
        np.array([d["position"] for d in items], dtype=np.int64),
    )
