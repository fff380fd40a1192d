"""Stable hashing of worker ids into a fixed number of parameter slots.

Python's ``hash()`` is salted per process, so it can never be used here: the slot of a
worker must be the same in every process and after every restart, or a replayed label
log would train different parameters. We use BLAKE2b (keyed by a fixed personalisation
string) of the UTF-8 bytes, read as a little-endian unsigned 64-bit integer, modulo the
slot count. Collisions are allowed by design (bounded memory): colliding workers share a
confusion matrix, and the population prior keeps a crowded slot close to the population.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

DEFAULT_WORKER_SLOTS = 65_536
_PERSON = b"crowdtally-w1"


def worker_slot(worker_id: str, n_slots: int = DEFAULT_WORKER_SLOTS) -> int:
    """The slot of one worker id: stable across processes, platforms and restarts."""
    if n_slots < 1:
        raise ValueError(f"n_slots must be at least 1, got {n_slots}")
    digest = hashlib.blake2b(worker_id.encode("utf-8"), digest_size=8, person=_PERSON).digest()
    return int.from_bytes(digest, "little") % n_slots


def worker_slots(
    worker_ids: Iterable[str], n_slots: int = DEFAULT_WORKER_SLOTS
) -> npt.NDArray[np.int64]:
    """Slots of many worker ids (hash each distinct id once, not each label)."""
    return np.fromiter((worker_slot(w, n_slots) for w in worker_ids), dtype=np.int64)


@dataclass(frozen=True)
class CollisionReport:
    """How many distinct workers share a slot with another worker."""

    n_workers: int
    n_slots: int
    n_slots_used: int
    n_workers_colliding: int

    @property
    def collision_rate(self) -> float:
        """Fraction of workers whose slot holds at least one other worker."""
        return self.n_workers_colliding / self.n_workers if self.n_workers else 0.0

    def __str__(self) -> str:
        return (
            f"{self.n_workers} workers in {self.n_slots} slots: {self.n_slots_used} slots used, "
            f"{self.n_workers_colliding} workers share a slot ({100 * self.collision_rate:.2f}%)"
        )


def collision_report(
    slots_of_distinct_workers: npt.NDArray[np.int64], n_slots: int
) -> CollisionReport:
    """Summarise collisions given the slot of each *distinct* worker."""
    counts = np.bincount(slots_of_distinct_workers, minlength=n_slots)
    return CollisionReport(
        n_workers=int(slots_of_distinct_workers.size),
        n_slots=n_slots,
        n_slots_used=int(np.count_nonzero(counts)),
        n_workers_colliding=int(counts[counts > 1].sum()),
    )
