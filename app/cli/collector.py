"""A command that ends, run with Python's cycle collector paused."""

from __future__ import annotations

import functools
import gc
from collections.abc import Callable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


def without_cycle_collection(command: Callable[P, R]) -> Callable[P, R]:
    """``command`` run with Python's cyclic garbage collector paused (enabled again after, as
    it was). For a job that ends: loading numba and its first kernels makes several hundred
    thousand objects, and the collections their numbers set off took 70 ms of a 1 s
    ``extract`` (2 full ones, 50 ms). What the job frees, arrays among it, is freed by
    reference counts as before. The objects the job leaves alive are then frozen (as
    ``main`` freezes all at exit): the collector, enabled again, does not walk them at its
    next collection (33 ms), and a reference cycle among them is never collected."""

    @functools.wraps(command)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        enabled = gc.isenabled()
        gc.disable()
        try:
            return command(*args, **kwargs)
        finally:
            if enabled:
                gc.freeze()
                gc.enable()

    return run
