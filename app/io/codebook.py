"""Ids as integer codes: each distinct id numbered by its first appearance, chunk after chunk
(a compiled hash table of the ids' bytes, or an array indexed by the id while every id is a
plain number); and pyarrow arrays to and from numpy without pandas."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from app.io.triples import string_buffers
from core._numba import jit

Codes = npt.NDArray[np.int32]


class Codebook:
    """Distinct ids in order of first appearance, grown chunk by chunk; an id's code is its
    position, looked up in a compiled hash table of every id seen so far (FNV-1a over the
    bytes, open addressing), so that each chunk costs its own size, not the size of
    everything read before it.

    While every id is a number written plainly (decimal digits, no sign, no leading zero,
    below ``NUMBER_LIMIT`` and within 8 slots an id), as item and worker ids often are, its
    code is read from an array indexed by the number instead: no hash and no comparison of
    bytes (bench.e2e's 10M answers, 2M item ids: 0.7 s instead of 2.1 s). The first id that is
    not builds the hash table of every id so far, which codes the rest."""

    def __init__(self) -> None:
        self._offsets = np.zeros(17, dtype=np.int64)  # id k's bytes: data[offsets[k]:offsets[k+1]]
        self._data = np.empty(256, dtype=np.uint8)
        self._hashes = np.empty(16, dtype=np.uint64)
        self._table: npt.NDArray[np.int64] | None = None
        self._by_number: npt.NDArray[np.int32] | None = _grown_to(_NO_NUMBERS, 1023)
        self._n = 0
        self._names: pa.Array | None = None

    def __len__(self) -> int:
        return self._n

    def codes(self, values: pa.Array) -> Codes:
        offsets, data = string_buffers(values)
        out: Codes = np.empty(offsets.size - 1, dtype=np.int32)
        done = 0
        while self._by_number is not None and done < out.size:
            self._n, done, stop = _number_codes(
                offsets, data, np.int64(done), self._by_number, self._offsets, self._data,
                np.int64(self._n), out,
            )  # fmt: skip
            if stop == _ROOM:
                self._make_room(int(offsets[done + 1] - offsets[done]))
            elif stop == _BEYOND and (number := _number_at(offsets, data, done)) < self._bound(
                out.size
            ):
                self._by_number = _grown_to(self._by_number, number)
            elif stop != _DONE:  # (not a plain number, or too large: the hash table from here)
                self._start_table()
        while done < out.size:  # the kernel stops where the next new id would not fit
            assert self._table is not None
            self._n, done = _intern(
                offsets, data, np.int64(done), self._table, self._offsets, self._data,
                self._hashes, np.int64(self._n), out,
            )  # fmt: skip
            if done < out.size:
                self._make_room(int(offsets[done + 1] - offsets[done]))
        self._names = None
        return out

    def _bound(self, chunk: int) -> int:
        """Numbers below this keep the array: 8 slots an id of the ids so far and the chunk's
        (the array, grown by doubling, at most twice that: 64 bytes an id)."""
        return min(NUMBER_LIMIT, max(1 << 20, 8 * (self._n + chunk)))

    def _start_table(self) -> None:
        """The hash table of every id so far; it codes every id from now on."""
        self._by_number = None
        size = 16
        while size < 2 * (self._n + 1):
            size *= 2
        self._table = _empty_table(size)
        if self._hashes.size < self._n + 1:
            self._hashes = _grown(self._hashes, self._n + 1)
        _hash_all(self._offsets, self._data, np.int64(self._n), self._hashes)
        _rehash(self._hashes, np.int64(self._n), self._table)

    @property
    def names(self) -> pa.Array:
        """The ids, in code order."""
        if self._names is None:
            end = int(self._offsets[self._n])
            wide = end >= 2**31  # arrow's string offsets are int32
            offsets = self._offsets[: self._n + 1].astype(np.int64 if wide else np.int32)
            self._names = pa.Array.from_buffers(
                pa.large_string() if wide else pa.string(),
                self._n,
                [None, pa.py_buffer(offsets), pa.py_buffer(self._data[:end].copy())],
            )
        return self._names

    def _make_room(self, size: int) -> None:
        """Room for one more id of ``size`` bytes: each store doubles when full (the table at
        most half full)."""
        need = self._n + 1
        if need >= self._hashes.size:
            self._offsets = _grown(self._offsets, need + 1)
            self._hashes = _grown(self._hashes, need)
        used = int(self._offsets[self._n])
        if used + size > self._data.size:
            self._data = _grown(self._data, used + size)
        if self._table is not None and 2 * need > self._table.size:
            self._table = _empty_table(2 * self._table.size)
            _rehash(self._hashes, np.int64(self._n), self._table)

    def sorted_codes(self) -> tuple[Codes, pa.Array]:
        """The code each id would have in sorted order (by code point), and the sorted ids."""
        names = self.names
        order = numpy_values(pc.array_sort_indices(names), np.uint64).astype(np.int64)
        rank = np.empty(order.size, dtype=np.int32)
        rank[order] = np.arange(order.size, dtype=np.int32)
        return rank, names.take(arrow_ints(order))


NUMBER_LIMIT = 1 << 28
"""Plain numbers from this one on are coded by the hash table (the array would be 1 GiB)."""


def _number_at(offsets: npt.NDArray[np.int64], data: npt.NDArray[np.uint8], v: int) -> int:
    """The number id ``v`` writes (a plain number of at most 9 digits)."""
    return int(bytes(data[offsets[v] : offsets[v + 1]]))


_NO_NUMBERS = np.empty(0, dtype=np.int32)


def _grown_to(a: npt.NDArray[np.int32], number: int) -> npt.NDArray[np.int32]:
    """``a`` (codes by number, -1 where none) with a slot for ``number``, at least doubled,
    never past ``NUMBER_LIMIT``."""
    out = np.full(min(max(number + 1, 2 * a.size), NUMBER_LIMIT), -1, dtype=np.int32)
    out[: a.size] = a
    return out


def _empty_table(size: int) -> npt.NDArray[np.int64]:
    """``size`` slots (a power of 2), each an id's code in its low 32 bits and the high 32 bits
    of its hash above them (a probe compares bytes only when those match); -1 where empty."""
    return np.full(size, -1, dtype=np.int64)


def _grown(a: npt.NDArray[Any], need: int) -> npt.NDArray[Any]:
    out = np.empty(max(need, 2 * a.size), dtype=a.dtype)
    out[: a.size] = a
    return out


_FNV_OFFSET = np.uint64(14695981039346656037)
_FNV_PRIME = np.uint64(1099511628211)


@jit
def _hash(data, lo, hi):  # type: ignore[no-untyped-def]
    h = _FNV_OFFSET
    for k in range(lo, hi):
        h = (h ^ np.uint64(data[k])) * _FNV_PRIME
    return h ^ (h >> np.uint64(32))  # the high bits into the low ones the table's mask keeps


_LOW = np.int64(0xFFFFFFFF)


# Strings are looked up a batch at a time: a first loop hashes the batch and touches the
# table slot, id offsets and bytes each string will read (loads independent of one another,
# so the processor overlaps their cache and TLB misses); the exact loop then finds them warm.
_BATCH = 64


@jit
def _intern(offsets, data, done, table, ids, text, hashes, n, out):  # type: ignore[no-untyped-def]
    """Codes of the strings ``data[offsets[v]:offsets[v+1]]``, from v = ``done`` on, into
    ``out``; a string not in the table is appended (its bytes to ``text``, its end to
    ``ids``). Stops before a new string that would not fit (``hashes`` or ``ids`` full, the
    table half full or ``text`` too short). Returns the count of ids and where it stopped."""
    mask = np.uint64(table.size - 1)
    end = offsets.size - 1
    batch = np.empty(_BATCH, dtype=np.uint64)
    for first in range(done, end, _BATCH):
        last = min(first + _BATCH, end)
        _warm(offsets, data, first, last, table, ids, text, mask, batch)
        for v in range(first, last):
            lo, hi = offsets[v], offsets[v + 1]
            h = batch[v - first]
            tag = np.int64(h >> np.uint64(32)) << np.int64(32)
            slot = h & mask
            while True:
                entry = table[slot]
                if entry == -1:  # not seen: a new code
                    if (
                        n + 1 >= hashes.size
                        or n + 2 > ids.size
                        or 2 * (n + 1) > table.size
                        or ids[n] + hi - lo > text.size
                    ):
                        return n, v
                    start = ids[n]
                    for k in range(hi - lo):
                        text[start + k] = data[lo + k]
                    ids[n + 1] = start + hi - lo
                    hashes[n] = h
                    table[slot] = tag | n
                    out[v] = n
                    n += 1
                    break
                code = entry & _LOW
                if entry - code == tag and _same(data, lo, hi, text, ids[code], ids[code + 1]):
                    out[v] = code
                    break
                slot = (slot + np.uint64(1)) & mask
    return n, end


@jit
def _warm(offsets, data, first, last, table, ids, text, mask, batch):  # type: ignore[no-untyped-def]
    """Hash strings ``first``..``last`` into ``batch`` and read what their lookups will: the
    table entry of each, then the offsets and first byte of the id that entry holds."""
    touched = 0
    for v in range(first, last):
        h = _hash(data, offsets[v], offsets[v + 1])
        batch[v - first] = h
        touched += table[h & mask]
    for v in range(first, last):
        entry = table[batch[v - first] & mask]
        if entry != -1:
            start = ids[entry & _LOW]
            touched += start + (text[start] if start < text.size else 0)
    return touched


@jit
def _same(a, a_lo, a_hi, b, b_lo, b_hi):  # type: ignore[no-untyped-def]
    if a_hi - a_lo != b_hi - b_lo:
        return False
    for k in range(a_hi - a_lo):  # noqa: SIM110 (a loop numba compiles; all() of a generator no)
        if a[a_lo + k] != b[b_lo + k]:
            return False
    return True


@jit
def _rehash(hashes, n, table):  # type: ignore[no-untyped-def]
    mask = np.uint64(table.size - 1)
    for code in range(n):
        h = hashes[code]
        slot = h & mask
        while table[slot] != -1:
            slot = (slot + np.uint64(1)) & mask
        table[slot] = (np.int64(h >> np.uint64(32)) << np.int64(32)) | code


_DONE, _ROOM, _BEYOND, _NOT_A_NUMBER = 0, 1, 2, 3
"""Why ``_number_codes`` stopped."""


@jit
def _number_codes(offsets, data, done, by_number, ids, text, n, out):  # type: ignore[no-untyped-def]
    """Codes of the strings from v = ``done`` on, while each is a plain number (1 to 9
    decimal digits, no leading zero but "0" itself) below ``by_number.size``: its code is
    ``by_number[number]``; a new one is appended as ``_intern`` appends. Returns the count of
    ids, where it stopped and why: ``_DONE``, ``_ROOM`` (a new id that does not fit),
    ``_BEYOND`` (a number past the array) or ``_NOT_A_NUMBER``."""
    end = offsets.size - 1
    for v in range(done, end):
        lo, hi = offsets[v], offsets[v + 1]
        if hi - lo < 1 or hi - lo > 9 or (data[lo] == 48 and hi - lo > 1):
            return n, v, _NOT_A_NUMBER
        number = np.int64(0)
        for k in range(lo, hi):
            digit = np.int64(data[k]) - 48
            if digit < 0 or digit > 9:
                return n, v, _NOT_A_NUMBER
            number = number * 10 + digit
        if number >= by_number.size:
            return n, v, _BEYOND
        code = by_number[number]
        if code < 0:
            if n + 2 > ids.size or ids[n] + hi - lo > text.size:
                return n, v, _ROOM
            start = ids[n]
            for k in range(hi - lo):
                text[start + k] = data[lo + k]
            ids[n + 1] = start + hi - lo
            code = n
            by_number[number] = n
            n += 1
        out[v] = code
    return n, end, _DONE


@jit
def _hash_all(ids, text, n, hashes):  # type: ignore[no-untyped-def]
    for code in range(n):
        hashes[code] = _hash(text, ids[code], ids[code + 1])


# pyarrow's own conversions to and from numpy (Array.to_numpy, pa.array) import pandas, which
# costs a command about 0.3 s: these read and make the buffers directly.


def numpy_values(array: pa.Array, dtype: type[np.generic]) -> npt.NDArray[Any]:
    """The values buffer of a fixed-width arrow array (whatever sits under its nulls)."""
    size = np.dtype(dtype).itemsize
    assert array.type.byte_width == size, (array.type, dtype)
    return np.frombuffer(
        array.buffers()[1], dtype=dtype, count=len(array), offset=array.offset * size
    )


def arrow_ints(values: npt.NDArray[np.integer]) -> pa.Array:
    """A numpy integer array as an arrow array, zero-copy (``pa.array`` would import pandas)."""
    values = np.ascontiguousarray(values, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), values.size, [None, pa.py_buffer(values)])
