"""All numba machinery lives here: kernels elsewhere are plain loops decorated with `jit`.

`cache=True` writes compiled machine code next to each module (``__pycache__``) so that a
second process (a test worker, the CLI, the service) loads it instead of compiling again.
Numba's cache is safe for concurrent readers; concurrent first compiles of the same kernel
by several processes may each compile (numba issue 4807) but produce the same file.

Numba checks a cached kernel against its own source file only: a kernel that calls one from
another file keeps the callee's old machine code once that file changes (numba's documented
"cache invalidation" limitation), with wrong results or worse. A module whose kernels call
another file's declares it with ``invalidate_on_change``.

A kernel called from another kernel is compiled once per distinct argument type, and numba
types a literal argument (``f(x, -1)``, ``f(x, 0)``) as its own type, ``Literal[int](-1)``:
each such call compiles the callee, and everything it calls, once more. Kernels pass
``np.int64(-1)`` and the like instead (compiled once; results bit-identical).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _import_without(module: str, *probes: str) -> None:
    """Import numba's ``module`` with its optional dependencies ``probes`` answered "absent"
    for that import only (importing them later, as any other code may, works as usual).
    Nothing is done when ``module`` is imported already; a probe imported already, or whose
    package is not installed (it then fails at once: nothing to save), is left as it is."""
    if module in sys.modules:
        return
    absent = [
        p
        for p in probes
        if p not in sys.modules and importlib.util.find_spec(p.split(".")[0]) is not None
    ]
    for probe in absent:
        sys.modules[probe] = None  # type: ignore[assignment]  # "import probe" raises ImportError
    try:
        importlib.import_module(module)
    finally:
        for probe in absent:
            del sys.modules[probe]


# At numba's import:
# - ``numba.core.config`` imports PyYAML when it is installed (a dependency of other packages
#   here), to read a ``.numba_config.yaml`` in the working folder: 8 ms of every process
#   start. Numba's settings here come from its environment variables only.
# - ``numba._ensure_critical_deps`` imports SciPy when it is installed, only to check that its
#   version is at least 1.0: 20-50 ms of every process start (no kernel here uses SciPy).
_import_without("numba", "yaml", "scipy")

import numba  # noqa: E402  (after numba's import above, which this one reuses)
from numba import types  # noqa: E402

# At its first compile or cache load, numba imports these, and they probe for optional
# packages that no kernel here uses:
# - ``numba.np.arraymath`` probes for BLAS by importing ``scipy.linalg`` when SciPy is
#   installed: 0.25 s of every process start. No kernel calls BLAS (``np.dot`` or ``@``); one
#   that did would fail to compile with numba's "scipy 0.16+ is required" error.
# - ``numba.core.typing.cffi_utils`` imports cffi and builds a ``cffi.FFI()`` (pycparser)
#   when cffi is installed (a dependency of other packages here): 47 ms. No kernel calls a
#   cffi function; numba then types none (``cffi_utils.SUPPORTED`` is False).
_import_without("numba.np.arraymath", "scipy.linalg.cython_blas")
_import_without("numba.core.typing.cffi_utils", "cffi")


def jit(func: Callable[..., Any]) -> Any:
    """Compile ``func`` in nopython mode, cached on disk, releasing the GIL.

    ``fastmath`` stays off: replays must be bit-identical and NaN/inf checks must hold.
    """
    return numba.njit(cache=True, nogil=True, error_model="numpy")(func)


def jit_inline(func: Callable[..., Any]) -> Any:
    """``jit``, and inlined into the kernels that call it (numba IR inlining, ``inline="always"``).

    For small helpers called once per label and class in the hot loops, where a call costs
    as much as the work; the operations, and so the results, are those of ``jit``.
    """
    return numba.njit(cache=True, nogil=True, error_model="numpy", inline="always")(func)


_TYPES = {
    "I": types.int64,
    "F": types.float64,
    "B": types.boolean,
    "i1": types.int64[::1],
    "j1": types.int32[::1],
    "f1": types.float64[::1],
    "f2": types.float64[:, ::1],
    "f3": types.float64[:, :, ::1],
}
"""Scalars (upper case) and C-contiguous arrays of int64 (i), int32 (j: blocks' slot and label
codes) or float64 (f) by dimension."""


def signature(spec: str) -> tuple[Any, ...]:
    """The argument types of a spec such as ``"I I i1 f3 F"`` (one letter code per argument)."""
    return tuple(_TYPES[t] for t in spec.split())


def compile_for(kernel: Any, spec: str) -> None:
    """Compile ``kernel`` (a ``jit`` function) for the argument types of ``spec``, or load
    that signature from the disk cache, as a call with such arguments would."""
    kernel.compile(signature(spec))


def invalidate_on_change(kernel: Any, *called: Any) -> None:
    """Drop the cached machine code of every kernel in ``kernel``'s source file when the source
    of a file holding one of the ``called`` kernels (kernels of other files that this file's
    kernels call) is not what it was when that code was cached. Call it once, at the end of
    the calling module, before any of its kernels runs (they load from the cache on first
    call): a second call would write another record of the files called, and each import
    would then drop the module's caches.

    The record is a digest of the called files beside the caches (``<module>.called``);
    without it, or with another one, the module's caches are removed and compile again on
    first use. A read-only cache directory is left as it is."""
    cache_path = getattr(getattr(kernel, "_cache", None), "_cache_path", None)
    if cache_path is None:  # (numba's internals moved: leave its caches to numba)
        return
    folder = Path(cache_path)
    stem = Path(kernel.py_func.__code__.co_filename).stem
    files = sorted({d.py_func.__code__.co_filename for d in called})
    digest = hashlib.sha256(b"".join(Path(f).read_bytes() for f in files)).hexdigest()
    record = folder / f"{stem}.called"
    try:
        if record.read_text() == digest:
            return
    except OSError:
        pass
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for cached in [*folder.glob(f"{stem}.*.nbi"), *folder.glob(f"{stem}.*.nbc")]:
            cached.unlink(missing_ok=True)
        fresh = folder / f"{stem}.called.{os.getpid()}"
        fresh.write_text(digest)
        fresh.replace(record)
    except OSError:
        return
