"""A growable list of ids or encoded bytes that the cyclic garbage collector does not walk.

A project's per-item sequences (item ids, queue members, encoded label lists) hold one entry
per item. Kept in Python lists, each full collection of the cyclic garbage collector walked
every entry (lists are always tracked), a stall of every thread about once a second under
load: 40-80 ms with 600,000 items (docs/benchmarks.md). Their entries are strings and bytes,
which hold no references, so nothing here can be part of a cycle: the entries are kept in a
NumPy object array, which the collector does not walk.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TypeVar, overload

import numpy as np
import numpy.typing as npt

T = TypeVar("T", str, bytes)


class UntrackedList(Sequence[T]):
    """The list operations the engine uses: append, extend, index, slice, take, put."""

    def __init__(self, values: Iterable[T] = ()) -> None:
        self._a: npt.NDArray[np.object_] = np.empty(16, dtype=object)
        self._n = 0
        self.extend(values)

    def __len__(self) -> int:
        return self._n

    def __iter__(self) -> Iterator[T]:
        return iter(self._a[: self._n].tolist())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, UntrackedList | list):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"UntrackedList({list(self)!r})"

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> list[T]: ...

    def __getitem__(self, index: int | slice) -> T | list[T]:
        if isinstance(index, slice):
            out: list[T] = self._a[: self._n][index].tolist()
            return out
        if not -self._n <= index < self._n:
            raise IndexError("UntrackedList index out of range")
        value: T = self._a[index % self._n]
        return value

    def __setitem__(self, index: int, value: T) -> None:
        if not -self._n <= index < self._n:
            raise IndexError("UntrackedList assignment index out of range")
        self._a[index % self._n] = value

    def append(self, value: T) -> None:
        self._room(1)
        self._a[self._n] = value
        self._n += 1

    def extend(self, values: Iterable[T]) -> None:
        new = values if isinstance(values, list) else list(values)
        self._room(len(new))
        self._a[self._n : self._n + len(new)] = new
        self._n += len(new)

    def head(self, n: int) -> npt.NDArray[np.object_]:
        """The first ``n`` entries, as an object array of their own (references copied, not
        walked by the collector either)."""
        if not 0 <= n <= self._n:
            raise IndexError("UntrackedList head past its end")
        return self._a[:n].copy()

    def take(self, indices: npt.NDArray[np.integer[Any]]) -> list[T]:
        """``[self[i] for i in indices]``, in one NumPy call."""
        if indices.size and (indices.min() < 0 or indices.max() >= self._n):
            raise IndexError("UntrackedList index out of range")
        out: list[T] = self._a[indices].tolist()
        return out

    def put(self, indices: npt.NDArray[np.integer[Any]], values: list[T]) -> None:
        """``self[i] = v`` for each pair, in one NumPy call."""
        if indices.size and (indices.min() < 0 or indices.max() >= self._n):
            raise IndexError("UntrackedList assignment index out of range")
        self._a[indices] = values

    def _room(self, more: int) -> None:
        need = self._n + more
        if need > self._a.size:
            grown = np.empty(max(need, 2 * self._a.size), dtype=object)
            grown[: self._n] = self._a[: self._n]
            self._a = grown
