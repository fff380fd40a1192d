"""Answers files as integer codes, read a chunk at a time: no string column outlives its chunk."""

from __future__ import annotations

import contextlib
import ctypes
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from app.io.codebook import Codebook, Codes
from app.io.triples import CHUNK_BYTES, read_answer_chunks


def use_system_allocator() -> None:
    """Let pyarrow allocate with malloc: its default pool (mimalloc) keeps the pages of freed
    chunks, about 100 MB more peak memory over a 1M-answer file (a process that reads one
    file, such as ``crowdtally extract``, calls this first)."""
    pa.set_memory_pool(pa.system_memory_pool())


M_MMAP_THRESHOLD = -3
"""glibc's ``mallopt`` parameter (malloc.h)."""

MAP_FROM_ANSWERS = 2_000_000
"""Files of this many answers and more have malloc map its larger blocks once they are read
(``release_unused_memory``): there the freed temporaries are tens of MiB; below, a few (1M
answers: 7 MiB), and the setting, which lasts for the process, would only cost the mapping of
each block in a process that goes on (the test suite calls ``extract`` in its workers)."""


def release_unused_memory(from_now_on: bool = False) -> None:
    """Give the memory freed since the file was read back to the system (malloc's trim, through
    pyarrow's system pool). ``from_now_on``: also have malloc map every later block of 1 MiB
    or more on its own, and unmap it when freed. glibc serves a block below its mmap threshold
    from its heaps and raises the threshold (up to 32 MiB) whenever it frees a larger mapped
    block, so numpy's temporaries of a few MiB stay in the heaps once freed and count in the
    peak (10M answers: ``extract --batch`` 1,254 -> 1,107 MiB). Not while reading: mapping
    each chunk's buffers cost a 1M-answer ``extract`` 8% more time. Without glibc, only the
    trim."""
    pa.default_memory_pool().release_unused()
    if from_now_on:
        with contextlib.suppress(OSError, AttributeError):  # (AttributeError: no mallopt)
            ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, 1 << 20)


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
    """Read and check a file (``read_answer_chunks``), keeping only the codes of its answers.

    The item column, the one with the most distinct ids, is coded in a second thread while
    this one codes the workers and labels and reads the next chunk: the hash table's loop
    releases the GIL, and each codebook is used by one thread, chunk after chunk."""
    books = Codebook(), Codebook(), Codebook()
    parts: list[list[Codes]] = [[], [], []]
    weights: list[npt.NDArray[np.float64]] = []
    with ThreadPoolExecutor(max_workers=1) as items_coder:
        pending: Future[Codes] | None = None
        for chunk in read_answer_chunks(path, chunk_bytes, lines=False):
            if pending is not None:  # (one chunk's items in flight at most)
                parts[0].append(pending.result())
            pending = items_coder.submit(books[0].codes, chunk.items)
            parts[1].append(books[1].codes(chunk.workers))
            parts[2].append(books[2].codes(chunk.labels))
            if chunk.weights is not None:  # a file has a weight column throughout, or none
                weights.append(chunk.weights)
        if pending is not None:
            parts[0].append(pending.result())
    rank, worker_names = books[1].sorted_codes()
    release_unused_memory()  # the chunks' memory
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
