"""The active-learning queue's settings and scores (the math is in core.acquisition).

The engine keeps every unfinished item's score up to date as labels arrive (the items an
entry touches) and at each refinement sweep (all items), and writes them to the store, which
keeps them ordered; a queue request reads the top of that order.

Items of equal score come out in the order they arrived. A store orders equal scores by member,
descending (Redis's ZREVRANGE; the embedded store does the same), so an item's member is its
arrival number counted down from the largest, at a fixed width, then its id: ``member``,
``item_of`` and ``arrival_of`` convert.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from core import acquisition
from core.blocks import FloatArray, IntArray
from core.calibration import Calibration
from core.itemlabels import grow

BoolArray = acquisition.BoolArray

Policy = acquisition.Policy

_WIDTH = 10  # hex digits of the arrival number: 16^10 - 1 items per project at most
_LAST = 16**_WIDTH - 1


def member(arrival: int, item: str) -> str:
    """The queue member of the ``arrival``-th item (0 first) of a project."""
    return f"{_LAST - arrival:0{_WIDTH}x}:{item}"


def item_of(member: str) -> str:
    """The item id of a queue member."""
    return member[_WIDTH + 1 :]


def arrival_of(member: str) -> int:
    """The arrival number of a queue member's item (0 first)."""
    arrival: int = _LAST - int(member[:_WIDTH], 16)
    return arrival


@dataclass(frozen=True)
class QueueSettings:
    """A project's queue policy and stopping rule (docs/active.md)."""

    policy: Policy = "lookahead"
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
    """Higher = label sooner (``core.acquisition.priority``); NaN = finished (gold, confident
    enough, capped, or no budget)."""
    s = acquisition.priority(settings.policy, posteriors, n_labels, confusion)
    done = settings.rule().finished(posteriors, n_labels, labels_used) | (known >= 0)
    out: FloatArray = np.where(done, np.nan, s)
    return out


def labels_to_finish(
    settings: QueueSettings,
    posteriors: FloatArray,
    n_labels: IntArray,
    confusion: FloatArray,
    model: tuple[FloatArray, FloatArray, Calibration] | None = None,
) -> FloatArray:
    """Labels each item is expected to need before it is finished (eq. A8, capped by
    ``max_labels_per_item``); 0 for an item already finished by confidence. ``model``: the
    items' untempered posteriors, label weights and the calibration that serves them, when
    ``posteriors`` are served ones: an item the calibration keeps below the target whatever
    its answers (A8') needs infinitely many."""
    target = settings.target_confidence
    need = acquisition.labels_to_confidence(posteriors, confusion, target)
    if model is not None and model[2] != Calibration():  # (served as the model's: no ceiling)
        raw, weight, calibration = model
        open_ = np.flatnonzero(need > 0)
        flat = np.zeros(raw.shape[1])  # (the prior is in the logits already)

        def served(logits: FloatArray, n: FloatArray) -> FloatArray:
            return calibration.from_log_likelihood(logits, n, flat)

        ok = acquisition.reachable(raw[open_], weight[open_], confusion, target, served)
        need[open_[~ok]] = np.inf
    cap = settings.max_labels_per_item
    if cap is not None:
        need = np.minimum(need, np.maximum(cap - np.asarray(n_labels), 0))
    return need


class Progress:
    """Where a project's campaign stands, per item as last scored: finished or not, the served
    confidence max_z q_iz, and the labels still expected (A8). Gold items are left out: the
    promise of ``target_confidence`` is about the items the model labels.

    The totals are kept as the items are rescored (the engine writes them on every step, so
    the report costs nothing per item)."""

    def __init__(self) -> None:
        self.finished: BoolArray = np.zeros(0, dtype=np.bool_)
        self.counted: BoolArray = np.zeros(0, dtype=np.bool_)
        self.confidence: FloatArray = np.zeros(0)
        self.to_go: FloatArray = np.zeros(0)
        self.n_done = self.n_open = self.n_unreachable = 0
        self.confidence_sum = self.to_go_sum = 0.0

    def update(
        self,
        codes: IntArray,
        finished: BoolArray,
        counted: BoolArray,
        confidence: FloatArray,
        to_go: FloatArray,
    ) -> None:
        """Rescored items (distinct codes) replace their earlier account."""
        n = int(codes.max()) + 1 if codes.size else 0
        if n > self.finished.size:
            cap = max(n, 2 * self.finished.size, 1024)
            self.finished = grow(self.finished, cap, False)
            self.counted = grow(self.counted, cap, False)
            self.confidence = grow(self.confidence, cap, 0.0)
            self.to_go = grow(self.to_go, cap, 0.0)
        self._tally(codes, -1)
        self.finished[codes] = finished
        self.counted[codes] = counted
        self.confidence[codes] = confidence
        self.to_go[codes] = np.where(finished, 0.0, to_go)
        self._tally(codes, 1)

    def _tally(self, codes: IntArray, sign: int) -> None:
        finished, counted = self.finished[codes], self.counted[codes]
        done, open_ = finished & counted, ~finished & counted
        to_go = self.to_go[codes][open_]
        unreachable = np.isinf(to_go)
        self.n_done += sign * int(done.sum())
        self.n_open += sign * int(open_.sum())
        self.n_unreachable += sign * int(unreachable.sum())
        self.confidence_sum += sign * float(self.confidence[codes][done].sum())
        self.to_go_sum += sign * float(to_go[~unreachable].sum())

    def report(self, budget_left: int | None = None) -> dict[str, Any]:
        """``done``: items finished; ``expected_accuracy``: the mean served confidence of those
        (the share of them expected right, if the posteriors are calibrated); ``open``: items
        not finished; ``labels_to_finish``: labels they are expected to need in all (null when
        some cannot reach the target: their answers carry no information under the model, or
        the calibration keeps them below it), at most ``budget_left``, the labels the budget
        still allows (its end finishes every item)."""
        to_go = None if self.n_unreachable else max(self.to_go_sum, 0.0)
        if budget_left is not None and self.n_open:
            to_go = float(budget_left) if to_go is None else min(to_go, float(budget_left))
        return {
            "done": self.n_done,
            "expected_accuracy": self.confidence_sum / self.n_done if self.n_done else None,
            "open": self.n_open,
            "labels_to_finish": to_go,
        }
