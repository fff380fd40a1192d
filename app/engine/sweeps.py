"""A refinement sweep cut into slices, so that a posterior never waits for a whole sweep.

A sweep over a project's N items (docs/model.md eq. 14-16) is ``passes`` revisit passes over
the items in code order, then a last round that serves each item re-predicted under the
final parameters and held out (eq. 26). Its work is a sequence of units u = 0 .. (passes +
1) N - 1: unit u is item u % N in round u // N (round ``passes`` is the serving round). Each
``refine`` log entry carries the units [from, to) it applies, so the engine applies a sweep a
slice at a time, and labels logged between two slices are applied between them. (The serving
round computes every item's posterior at its first unit, since eq. 26 reads the statistics
of all of them; its slices then write the items out, a share each.) The cut is
in the log, so every replay cuts the sweep where the live engine did; applied back to back,
the slices give the whole sweep bit for bit (each unit depends only on the state before it).
Items first seen during a sweep are left to the next one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from core.blocks import IntArray


@dataclass(frozen=True)
class Slice:
    """Units [start, stop) of a sweep of ``passes`` revisit passes over ``items`` items."""

    passes: int
    items: int
    start: int
    stop: int

    @property
    def units(self) -> int:
        return (self.passes + 1) * self.items

    @property
    def last(self) -> bool:
        """This slice ends the sweep."""
        return self.stop >= self.units

    def rounds(self) -> list[tuple[int, int, int]]:
        """(round, first item, end item) of each round the slice touches, in order."""
        n = self.items
        if n == 0 or self.stop <= self.start:
            return []
        out = []
        for r in range(self.start // n, (self.stop - 1) // n + 1):
            out.append((r, max(self.start - r * n, 0), min(self.stop - r * n, n)))
        return out

    def to_dict(self) -> dict[str, int]:
        return {"passes": self.passes, "items": self.items, "from": self.start, "to": self.stop}

    @classmethod
    def of(cls, body: dict[str, Any], items_now: int) -> Slice:
        """The slice a ``refine`` entry's body names; a body with "passes" alone (as sweeps
        were logged before they were cut) is a whole sweep over the items there are."""
        passes = int(body.get("passes", 1))
        n = int(body.get("items", items_now))
        return cls(passes, n, int(body.get("from", 0)), int(body.get("to", (passes + 1) * n)))


def next_slice(label_counts: IntArray, passes: int, items: int, start: int, budget: int) -> Slice:
    """The slice from unit ``start`` whose units cost about ``budget`` labels (each unit an
    item's labels, at least 1), at least one unit and at most to the end of the sweep. (At
    most ``budget`` units, so only those are looked at: O(budget), not O(items), a slice.)"""
    end = (passes + 1) * items
    window = np.arange(start, min(start + budget, end), dtype=np.int64)
    if not window.size:
        return Slice(passes, items, start, start)
    spent = np.cumsum(np.maximum(label_counts[window % items], 1))
    within = int(np.searchsorted(spent, budget, side="right"))  # units whose total <= budget
    return Slice(passes, items, start, start + max(within, 1))
