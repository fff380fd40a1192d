"""Answers files as integer codes, read a chunk at a time: no string column outlives its chunk."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from app.io.triples import CHUNK_BYTES, read_answer_chunks

Codes = npt.NDArray[np.int32]


def use_system_allocator() -> None:
    """Let pyarrow allocate with malloc: its default pool (mimalloc) keeps the pages of freed
    chunks, about 100 MB more peak memory over a 1M-answer file (a process that reads one
    file, such as ``crowdtally extract``, calls this first)."""
    pa.set_memory_pool(pa.system_memory_pool())


class Codebook:
    """Distinct ids in order of first appearance, grown chunk by chunk; an id's code is its
    position. Hashing is pyarrow's: once per answer of a chunk, once per distinct id of it."""

    def __init__(self) -> None:
        self.names: pa.Array = pa.nulls(0, pa.string())

    def __len__(self) -> int:
        return len(self.names)

    def codes(self, values: pa.Array) -> Codes:
        encoded = pc.dictionary_encode(values)  # the chunk's distinct ids, first seen first
        found = pc.index_in(encoded.dictionary, value_set=self.names)
        known = numpy_values(found, np.int32).copy()
        new = ~valid(found)
        if new.any():
            known[new] = np.arange(len(self), len(self) + int(new.sum()), dtype=np.int32)
            fresh = encoded.dictionary.take(arrow_ints(np.flatnonzero(new)))
            self.names = pa.concat_arrays([self.names, fresh])
        out: Codes = known[numpy_values(encoded.indices, np.int32)]
        return out

    def sorted_codes(self) -> tuple[Codes, pa.Array]:
        """The code each id would have in sorted order (by code point), and the sorted ids."""
        order = numpy_values(pc.array_sort_indices(self.names), np.uint64).astype(np.int64)
        rank = np.empty(order.size, dtype=np.int32)
        rank[order] = np.arange(order.size, dtype=np.int32)
        return rank, self.names.take(arrow_ints(order))


# pyarrow's own conversions to and from numpy (Array.to_numpy, pa.array) import pandas, which
# costs a command about 0.3 s: these read and make the buffers directly.


def numpy_values(array: pa.Array, dtype: type[np.generic]) -> npt.NDArray[Any]:
    """The values buffer of a fixed-width arrow array (whatever sits under its nulls)."""
    size = np.dtype(dtype).itemsize
    assert array.type.byte_width == size, (array.type, dtype)
    return np.frombuffer(
        array.buffers()[1], dtype=dtype, count=len(array), offset=array.offset * size
    )


def valid(array: pa.Array) -> npt.NDArray[np.bool_]:
    """Which entries of an arrow array are not null."""
    bitmap = array.buffers()[0]
    if bitmap is None:
        return np.ones(len(array), dtype=bool)
    bits = np.unpackbits(np.frombuffer(bitmap, dtype=np.uint8), bitorder="little")
    out: npt.NDArray[np.bool_] = bits[array.offset : array.offset + len(array)].astype(bool)
    return out


def arrow_ints(values: npt.NDArray[np.integer]) -> pa.Array:
    """A numpy integer array as an arrow array, zero-copy (``pa.array`` would import pandas)."""
    values = np.ascontiguousarray(values, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), values.size, [None, pa.py_buffer(values)])


@dataclass(frozen=True)
class AnswerCodes:
    """A file's answers as codes: items numbered by first appearance, workers by sorted id,
    labels by first appearance of their text (``label_names``); weights None when all 1."""

    item_names: pa.Array
    worker_names: pa.Array
    label_names: pa.Array
    items: Codes
    workers: Codes
    labels: Codes
    weights: npt.NDArray[np.float64] | None

    def __len__(self) -> int:
        return int(self.items.size)


def read_codes(path: str | Path, chunk_bytes: int = CHUNK_BYTES) -> AnswerCodes:
    """Read and check a file (``read_answer_chunks``), keeping only the codes of its answers."""
    books = Codebook(), Codebook(), Codebook()
    parts: list[list[Codes]] = [[], [], []]
    weights: list[npt.NDArray[np.float64]] = []
    for chunk in read_answer_chunks(path, chunk_bytes, lines=False):
        for book, part, column in zip(
            books, parts, (chunk.items, chunk.workers, chunk.labels), strict=True
        ):
            part.append(book.codes(column))
        if chunk.weights is not None:  # a file has a weight column throughout, or none
            weights.append(chunk.weights)
    rank, worker_names = books[1].sorted_codes()
    pa.default_memory_pool().release_unused()  # the chunks' memory, back to the system
    return AnswerCodes(
        item_names=books[0].names,
        worker_names=worker_names,
        label_names=books[2].names,
        items=_joined(parts[0]),
        workers=rank[_joined(parts[1])],
        labels=_joined(parts[2]),
        weights=np.concatenate(weights) if weights else None,
    )


def _joined(parts: list[Codes]) -> Codes:
    return parts[0] if len(parts) == 1 else np.concatenate(parts)
