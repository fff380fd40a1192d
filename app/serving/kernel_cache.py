"""Whether numba's on-disk cache looks filled, told without importing numba or the kernels.

``crowdtally serve`` asks this before its own imports, to start the warm-up's second process
only on a first start (it costs about 0.7 s of CPU to start and find nothing to do). A wrong
answer costs time, never correctness: ``warmup.warm_up`` checks the cache itself and starts
the second process then if it is needed after all.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

LEARNING = ("_kernels.learn_blocks", "_kernels.estep_tables", "_dyadic_kernels.learn_many",
            "_dyadic_kernels.h_min_many")  # fmt: skip
"""Kernels that only a first start compiles (file stem and function name)."""


def looks_cached(kernels: tuple[str, ...] = LEARNING) -> bool:
    """Whether an index file of each kernel is where numba keeps them: beside the sources in
    ``core/__pycache__``, or anywhere under ``NUMBA_CACHE_DIR`` when that is set."""
    spec = importlib.util.find_spec("core")
    if spec is None or spec.origin is None:
        return False
    user_dir = os.environ.get("NUMBA_CACHE_DIR")
    folder = Path(user_dir) if user_dir else Path(spec.origin).parent / "__pycache__"
    search = folder.rglob if user_dir else folder.glob
    return all(any(search(f"{kernel}-*.nbi")) for kernel in kernels)
