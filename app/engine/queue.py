"""The active-learning queue's settings and scores (the math is in core.acquisition).

The engine keeps every unfinished item's score up to date as labels arrive (the items an
entry touches) and at each refinement sweep (all items), and writes them to the store, which
keeps them ordered; a queue request reads the top of that order.

Items of equal score come out in the order they arrived. A store orders equal scores by member,
descending (Redis's ZREVRANGE; the embedded store does the same), so an item's member is its
arrival number counted down from the largest, at a fixed width, then its id: ``member`` and
``item_of`` convert.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np

from core import acquisition
from core.blocks import FloatArray, IntArray

Policy = Literal["voi", "uncertainty", "entropy", "margin", "uniform"]

_WIDTH = 10  # hex digits of the arrival number: 16^10 - 1 items per project at most
_LAST = 16**_WIDTH - 1


def member(arrival: int, item: str) -> str:
    """The queue member of the ``arrival``-th item (0 first) of a project."""
    return f"{_LAST - arrival:0{_WIDTH}x}:{item}"


def item_of(member: str) -> str:
    """The item id of a queue member."""
    return member[_WIDTH + 1 :]


@dataclass(frozen=True)
class QueueSettings:
    """A project's queue policy and stopping rule (docs/active.md)."""

    policy: Policy = "voi"
    target_confidence: float = 0.95
    max_labels_per_item: int | None = None
    budget: int | None = None

    def __post_init__(self) -> None:
        self.rule()  # validates

    def rule(self) -> acquisition.StoppingRule:
        return acquisition.StoppingRule(
            self.target_confidence, self.max_labels_per_item, self.budget
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def scores(
    settings: QueueSettings,
    posteriors: FloatArray,
    n_labels: IntArray,
    known: IntArray,
    labels_used: int,
    confusion: FloatArray,
) -> FloatArray:
    """Higher = label sooner; NaN = finished (gold, confident enough, capped, or no budget)."""
    q = posteriors
    policy = settings.policy
    if policy == "voi":
        s = acquisition.value_of_information(q, confusion)
    elif policy == "uncertainty":
        s = acquisition.error_probability(q)
    elif policy == "entropy":
        s = acquisition.entropy(q)
    elif policy == "margin":
        s = -acquisition.margin(q)
    else:  # uniform: fewest labels first (ties: the order items came in, see ``member``)
        s = -n_labels.astype(np.float64)
    done = settings.rule().finished(q, n_labels, labels_used) | (known >= 0)
    out: FloatArray = np.where(done, np.nan, s)
    return out
