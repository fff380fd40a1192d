"""Answers that read a whole project, kept and served again: the calibration report (five
batch EM fits) and the dashboard summary's tally of every item's posterior.

One is served again while nothing has been applied to the project since it was made (it is
then the same answer), or, once it took at least ``slow_s`` to make, for ``reuse`` times what
it took (one that took 2 s is made at most every 20 s: a dashboard asking every few seconds
spends at most about a tenth of a core on it). A project deleted and created again under its
name starts afresh.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from app.store.base import Store

T = TypeVar("T")


@dataclass(frozen=True)
class _Entry(Generic[T]):
    created_at: float
    value: T
    position: int
    made_at: float
    took_s: float


class Kept(Generic[T]):
    """The latest answer made for each project of each store, and when to make it again."""

    def __init__(self, reuse: float, slow_s: float = 0.0) -> None:
        self.reuse, self.slow_s = reuse, slow_s
        self._entries: dict[tuple[int, str], _Entry[T]] = {}
        self._lock = threading.Lock()

    def get(
        self, store: Store, project: str, created_at: float, make: Callable[[], tuple[T, int]]
    ) -> T:
        """The kept answer for ``project`` (the one created at ``created_at``) while it may be
        served again, else ``make()``'s: the answer and the log position it was made at."""
        key, now = (id(store), project), time.monotonic()
        with self._lock:
            kept = self._entries.get(key)
        if kept is not None and kept.created_at == created_at:
            recent = kept.took_s >= self.slow_s and now - kept.made_at < self.reuse * kept.took_s
            if recent or store.applied_position(project) == kept.position:
                return kept.value
        value, position = make()
        with self._lock:
            self._entries[key] = _Entry(created_at, value, position, now, time.monotonic() - now)
        return value
