"""Compiled loops over independent blocks, split among threads (the kernels release the GIL)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import numpy as np

Part = TypeVar("Part")

PARALLEL_FROM = 100_000
"""Blocks from which a pass is split among threads (below, a thread costs more than it
saves)."""


def block_ranges(n_blocks: int, threads: int) -> list[tuple[int, int]]:
    """[lo, hi) ranges of blocks, one per thread (one range when ``n_blocks`` is below
    ``PARALLEL_FROM`` or ``threads`` is 1)."""
    if threads <= 1 or n_blocks < PARALLEL_FROM:
        return [(0, n_blocks)]
    edges = np.linspace(0, n_blocks, threads + 1).astype(np.int64)
    return [(int(lo), int(hi)) for lo, hi in itertools.pairwise(edges)]


def in_threads(work: Callable[[Part], None], parts: Sequence[Part]) -> None:
    """``work(part)`` for every part: the first in this thread, each other in its own. Each
    part must write only its own blocks' outputs."""
    if len(parts) <= 1:
        for part in parts:
            work(part)
        return
    with ThreadPoolExecutor(max_workers=len(parts) - 1) as pool:
        pending = [pool.submit(work, part) for part in parts[1:]]
        work(parts[0])
        for done in pending:
            done.result()
