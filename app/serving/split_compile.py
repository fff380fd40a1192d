"""The nominal model's learning kernel (``core._kernels.learn_blocks``), compiled by two
processes at once on a first start.

numba compiles a callee when it types the caller, and looks in the disk cache first
(``Dispatcher.compile``), so the callees that ``learn_blocks`` calls (rather than inlines) are
split in two halves: the service's process compiles one (``SERVE_HALF``) while the warm-up's
second process compiles the other (``SECOND_HALF``), waits for the first half's cache files,
then compiles ``learn_blocks`` itself, which loads both halves. The global step of a new
arrival (the label gradients, the statistics, the step) is inlined into ``learn_blocks``: a
call per item to each, passing a dozen arrays, cost about a seventh of the pass. Inlining the
per-item E-step too would save a little more but make ``learn_blocks`` alone take most of a
first start's compile. Each callee is compiled with the exact signature ``learn_blocks``
calls it with (tests/app/test_warmup.py checks them against the cache that a
real compile writes); a wrong one would only cost the time to compile it twice.
"""

from __future__ import annotations

import time
from typing import Any

from app.serving.kernel_cache import looks_cached
from core import _calibration_kernels, _dyadic_kernels, _kernels
from core._numba import compile_for

SERVE_HALF = {
    "_kernels._item_em": "I I j1 j1 f1 f1 F f2 f3 F f1 F f1 f1 f1 f1 f3 f1 f1 f2",
}
"""The per-item E-step (and the kernels it calls)."""

SECOND_HALF = {
    "_calibration_kernels.prequential_scores": "I I I j1 f1 f1 f3 f1 f1 f1 F f2",
    "_kernels._slot_newton_steps": "I I j1 f2 f3 f1 f3 f1 F f1 f1 f1 f1",
    "_kernels._revisit_step": "f1 f1 f2 f2 f1 f1 f1 F",
}
"""The prequential evidence (eq. 22) and a revisit's global step: the slots' Newton steps
and the shared parameters' step."""

_MODULES = {
    "_kernels": _kernels,
    "_calibration_kernels": _calibration_kernels,
    "_dyadic_kernels": _dyadic_kernels,
}


def kernel(name: str) -> Any:
    """The kernel of a ``"module.function"`` name (a kernel module of ``core``, as numba's
    cache files and ``kernel_cache`` name them)."""
    module, function = name.split(".")
    return getattr(_MODULES[module], function)


def compile_half(half: dict[str, str]) -> None:
    """Compile (or load from the cache) each kernel of ``half`` with its signature."""
    for name, spec in half.items():
        compile_for(kernel(name), spec)


def wait_for(half: dict[str, str], timeout_s: float) -> bool:
    """Wait until the other process has written ``half`` to the cache (False: not within
    ``timeout_s``; compiling ``learn_blocks`` then compiles what is missing itself)."""
    deadline = time.monotonic() + timeout_s
    while not looks_cached(tuple(half)):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True
