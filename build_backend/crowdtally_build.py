"""crowdtally's build backend: setuptools', and an editable install compiles the kernels.

``pip install -e .`` runs ``build_editable`` in pip's build environment, which holds numba
and numpy (asked for by ``get_requires_for_build_editable``) before the service's own
dependencies are installed. After setuptools has built the wheel, ``core.warmup`` compiles
every kernel into numba's on-disk cache next to the sources, which the installed package
then imports: the first ``crowdtally serve`` loads compiled kernels instead of compiling
them (about 20 s of CPU). Numba's cache is keyed by numba's version and the sources, so the
build environment's numba must be the version installed beside the package (both are the
newest that fit pyproject.toml, unless an older numba was already installed); when they
differ, or anything here fails, the install still succeeds and the service compiles on its
first start, as it does without this step.

A wheel for elsewhere (``pip wheel``, ``pip install .``) is setuptools' alone: its sources
are not the ones that will run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

from setuptools import build_meta as _setuptools
from setuptools.build_meta import (  # noqa: F401 (the rest of PEP 517's hooks, as they are)
    build_sdist,
    build_wheel,
    get_requires_for_build_sdist,
    get_requires_for_build_wheel,
    prepare_metadata_for_build_editable,
    prepare_metadata_for_build_wheel,
)

KERNEL_REQUIREMENTS = ["numba>=0.60", "numpy>=1.26"]  # as in pyproject.toml's dependencies
SKIP = "CROWDTALLY_SKIP_KERNEL_BUILD"
"""Set (to anything) to install without compiling, e.g. where numba's cache is not wanted."""


def get_requires_for_build_editable(config_settings: dict[str, Any] | None = None) -> list[str]:
    needed: list[str] = _setuptools.get_requires_for_build_editable(config_settings)
    return needed if os.environ.get(SKIP) else needed + KERNEL_REQUIREMENTS


def build_editable(
    wheel_directory: str,
    config_settings: dict[str, Any] | None = None,
    metadata_directory: str | None = None,
) -> str:
    name: str = _setuptools.build_editable(wheel_directory, config_settings, metadata_directory)
    if not os.environ.get(SKIP):
        compile_kernels()
    return name


def compile_kernels() -> None:
    """``core.warmup`` in two processes at once (the nominal model in the second); a failure
    is reported, never raised."""
    start = time.perf_counter()
    run = [sys.executable, "-c"]
    try:
        halves = [
            subprocess.Popen([*run, f"import core.warmup as w; w.{half}()"], stderr=subprocess.PIPE)
            for half in ("nominal", "dyadic")
        ]
        failed = [p.communicate()[1].decode(errors="replace") for p in halves if p.wait() != 0]
    except OSError as error:
        failed = [str(error)]
    took = time.perf_counter() - start
    if failed:
        print(
            f"crowdtally: kernels not compiled at install ({took:.0f} s); the service will "
            f"compile them on its first start:\n{failed[0][-2000:]}",
            file=sys.stderr,
        )
    else:
        print(f"crowdtally: kernels compiled in {took:.0f} s", file=sys.stderr)
