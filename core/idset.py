"""A set of ids held as 128-bit hashes in an open-addressing table (16 bytes a slot).

The ids of a block come as one newline-joined UTF-8 buffer (ids never hold a newline); each
is hashed by two independent 64-bit functions (FNV-1a, and a rotate-multiply hash with other
constants), each finished by MurmurHash3's fmix64 over the hash and the id's length. Two
distinct ids collide only if both halves do: about n^2 / 2^128 for n ids (1e-20 for a billion),
so the set answers membership exactly in practice; it is not meant to resist ids crafted to
collide. An empty segment is no id (a label sent without one): never a member, never added.

Lookups and inserts are one compiled pass over a block; the table doubles past 70% full. The
ids of the table it outgrew are moved into the new one a few rows at a time, as blocks are
added (``_MOVE_PER_ID`` rows for each id), and looked up in both meanwhile: growing never
stops an append to move every id at once (at 2.9M ids that took 280 ms, most of it mapping
the new table's pages, in the API's lock). A large table is mapped in pages of 4 KiB, not the
2 MiB pages numpy asks the kernel for: the first ids inserted land all over the new table,
and mapping (and, with the kernel's compaction, finding) a 2 MiB page for each of them cost
12-194 ms for the first 1,000 inserts into 128 MiB, against 1.6 ms.
"""

from __future__ import annotations

import mmap

import numpy as np
import numpy.typing as npt

from core._numba import jit

_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)
_SEED2 = np.uint64(0x9E3779B97F4A7C15)
_MUL2 = np.uint64(0xC2B2AE3D27D4EB4F)
_MIN_CAPACITY = 1024
_MAX_LOAD = 0.7
_MOVE_PER_ID = 4
"""Rows of the outgrown table moved for each id added: more than 1 / _MAX_LOAD, so it is empty
before the new table is full (from 70% of half its size to 70% of its size: 0.7 old sizes)."""

Keys = npt.NDArray[np.uint64]


@jit
def _fmix64(h):  # type: ignore[no-untyped-def]
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xFF51AFD7ED558CCD)
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xC4CEB93FE1A85EC5)
    h ^= h >> np.uint64(33)
    return h


@jit
def _hash_segments(buf, keys, present):  # type: ignore[no-untyped-def]
    """Hash each newline-separated segment of ``buf`` into ``keys[n]`` (two uint64, the
    first never 0: 0 marks an empty slot); ``present[n]`` is False for an empty segment."""
    n = 0
    h1, h2, length = _FNV_OFFSET, _SEED2, 0
    for i in range(buf.shape[0] + 1):
        c = np.uint64(10) if i == buf.shape[0] else np.uint64(buf[i])
        if c == np.uint64(10):
            size = np.uint64(length)
            keys[n, 0] = _fmix64(h1 ^ size) | np.uint64(1)
            keys[n, 1] = _fmix64(h2 + size)
            present[n] = length > 0
            n += 1
            h1, h2, length = _FNV_OFFSET, _SEED2, 0
        else:
            h1 = (h1 ^ c) * _FNV_PRIME
            h2 = (h2 + c) * _MUL2
            h2 = (h2 << np.uint64(31)) | (h2 >> np.uint64(33))
            length += 1
    return n


@jit
def _slot(table, k0, k1):  # type: ignore[no-untyped-def]
    """The slot holding (k0, k1), or the empty slot where it would go (linear probing)."""
    mask = table.shape[0] - 1
    s = np.int64(k0 >> np.uint64(1)) & mask
    while True:
        t0 = table[s, 0]
        if t0 == np.uint64(0) or (t0 == k0 and table[s, 1] == k1):
            return s
        s = (s + 1) & mask


@jit
def _member(table, old, k0, k1):  # type: ignore[no-untyped-def]
    """(k0, k1) is in ``table`` or in the outgrown ``old`` (one empty row when there is none)."""
    if table[_slot(table, k0, k1), 0] != np.uint64(0):
        return True
    return old[_slot(old, k0, k1), 0] != np.uint64(0)


@jit
def _new_in_block(table, old, keys, present, scratch):  # type: ignore[no-untyped-def]
    """1 for each present key neither in ``table`` (nor ``old``) nor earlier in the block, else
    0 (absent keys: 1). ``scratch`` (zeroed, power-of-two rows, more than the block's) holds the
    block's keys seen so far."""
    out = np.zeros(keys.shape[0], dtype=np.uint8)
    for n in range(keys.shape[0]):
        if not present[n]:
            out[n] = 1
            continue
        k0, k1 = keys[n, 0], keys[n, 1]
        if _member(table, old, k0, k1):
            continue
        s = _slot(scratch, k0, k1)
        if scratch[s, 0] != np.uint64(0):
            continue
        scratch[s, 0], scratch[s, 1] = k0, k1
        out[n] = 1
    return out


@jit
def _insert(table, old, keys, present):  # type: ignore[no-untyped-def]
    """Add the present keys that are members of neither table to ``table``; returns how many
    they were (a member of ``old`` reaches ``table`` when its row is moved)."""
    added = 0
    for n in range(keys.shape[0]):
        if present[n]:
            k0, k1 = keys[n, 0], keys[n, 1]
            s = _slot(table, k0, k1)
            if table[s, 0] == np.uint64(0) and old[_slot(old, k0, k1), 0] == np.uint64(0):
                table[s, 0], table[s, 1] = k0, k1
                added += 1
    return added


@jit
def _move(old, lo, hi, table):  # type: ignore[no-untyped-def]
    """Copy the keys in rows ``lo:hi`` of ``old`` into ``table`` (where none of them is yet)."""
    for r in range(lo, hi):
        k0 = old[r, 0]
        if k0 != np.uint64(0):
            s = _slot(table, k0, old[r, 1])
            table[s, 0], table[s, 1] = k0, old[r, 1]


def hash_ids(joined: bytes, n: int | None = None) -> tuple[Keys, npt.NDArray[np.bool_]]:
    """The keys of a newline-joined block of ``n`` ids (by default one more than its newlines:
    ``n`` tells an empty block from one label without an id), and which segments hold an id."""
    segments = joined.count(b"\n") + 1
    if n is None:
        n = segments
    elif n and segments != n:
        raise ValueError(f"{n} ids joined into {segments} lines: an id holds a newline")
    keys = np.empty((n, 2), dtype=np.uint64)
    present = np.empty(n, dtype=np.bool_)
    if n:
        _hash_segments(np.frombuffer(joined, dtype=np.uint8), keys, present)
    return keys, present


def join_ids(ids: list[str | None]) -> bytes:
    """A block's ids as one buffer: newline-joined UTF-8, an empty segment for no id."""
    if None in ids:
        return "\n".join(["" if i is None else i for i in ids]).encode()
    return "\n".join(ids).encode()  # type: ignore[arg-type]


def _no_table() -> Keys:
    return np.zeros((1, 2), dtype=np.uint64)


def _zeroed(rows: int) -> Keys:
    """An empty table: an anonymous mapping (zero pages, mapped when first written) in small
    pages once it is large."""
    nbytes = rows * 16
    if nbytes < 1 << 20:
        return np.zeros((rows, 2), dtype=np.uint64)
    memory = mmap.mmap(-1, nbytes)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        memory.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(memory, dtype=np.uint64).reshape(rows, 2)


class IdSet:
    """The ids seen so far (by their 128-bit hashes)."""

    def __init__(self) -> None:
        self._table = _zeroed(_MIN_CAPACITY)
        self._old = _no_table()  # the table outgrown, its rows moved up to _moved
        self._moved = 0
        self.size = 0

    def new_in_block(self, keys: Keys, present: npt.NDArray[np.bool_]) -> bytes:
        """The keep mask of a block, in the log's form: b'1' for an id not seen before nor
        earlier in the block (or no id), b'0' for a repeat."""
        rows = 1 << max(4, int(2 * keys.shape[0]).bit_length())
        scratch = np.zeros((rows, 2), dtype=np.uint64)
        mask: npt.NDArray[np.uint8] = _new_in_block(self._table, self._old, keys, present, scratch)
        return (mask + ord("0")).tobytes()

    def add(self, keys: Keys, present: npt.NDArray[np.bool_]) -> None:
        self._fit(self.size + int(keys.shape[0]))
        self.size += int(_insert(self._table, self._old, keys, present))
        self._move_rows(_MOVE_PER_ID * max(int(keys.shape[0]), 1))

    def _fit(self, size: int) -> None:
        capacity = self._table.shape[0]
        if size <= _MAX_LOAD * capacity:
            return
        self._move_rows(self._old.shape[0])  # (a block larger than the moves so far)
        while size > _MAX_LOAD * capacity:
            capacity *= 2
        self._old, self._moved = self._table, 0
        self._table = _zeroed(capacity)

    def _move_rows(self, rows: int) -> None:
        """Move the outgrown table's next ``rows`` rows; drop it once all are moved."""
        if self._old.shape[0] == 1:
            return
        hi = min(self._moved + rows, self._old.shape[0])
        _move(self._old, self._moved, hi, self._table)
        self._moved = hi
        if hi == self._old.shape[0]:
            self._old, self._moved = _no_table(), 0

    @property
    def nbytes(self) -> int:
        moving = self._old.nbytes if self._old.shape[0] > 1 else 0
        return int(self._table.nbytes + moving)
