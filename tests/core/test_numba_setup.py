"""core/_numba.py: numba's array support loads without importing SciPy's linear algebra
(its BLAS probe, 0.25 s of every process start where SciPy is installed), numba itself
without SciPy (a version check), its typing without cffi (47 ms) and its configuration
without PyYAML (8 ms), and all of them still import as usual afterwards; a cached kernel that calls
another file's kernel is compiled again once that file changes."""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from numba.core.registry import CPUDispatcher

REPO = Path(__file__).resolve().parents[2]

CHECK = """
import sys
from core.blocks import LabelBlocks
from core.nominal import NominalConfig, NominalParams
from core.served import log_likelihoods
blocks = LabelBlocks.group([0, 0, 1], [0, 1, 0], [0, 1, 2])
log_likelihoods(NominalParams.initial(NominalConfig(n_classes=3)), blocks)  # a kernel runs
loaded = {module!r} in sys.modules
{afterwards}  # the module numba was kept from: importable as usual
print(loaded)
"""


@pytest.mark.parametrize(
    ("package", "module", "afterwards"),
    [
        ("scipy", "scipy.linalg", "import scipy.linalg.cython_blas"),
        ("scipy", "scipy", "import scipy; scipy.__version__"),  # (numba's version check)
        ("cffi", "cffi", "import cffi; cffi.FFI()"),
        ("yaml", "yaml", "import yaml; yaml.safe_load('a: 1')"),
    ],
)
def test_a_kernel_runs_without_importing_what_numba_probes_for(
    package: str, module: str, afterwards: str
) -> None:
    if importlib.util.find_spec(package) is None:
        pytest.skip(f"{package} not installed")
    script = CHECK.format(module=module, afterwards=afterwards)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


CALLEE = """from core._numba import jit


@jit
def value():
    return {}
"""
CALLER = """from callee import value
from core._numba import invalidate_on_change, jit


@jit
def call():
    return value()


invalidate_on_change(call, value)
"""


def test_a_cached_kernel_follows_a_change_of_the_kernel_it_calls(tmp_path: Path) -> None:
    """numba checks a cached kernel against its own file only; ``invalidate_on_change`` drops
    the caller's cache when the called kernel's file changes (else ``call`` would still
    return 1: the callee's old machine code is linked into the caller's)."""
    (tmp_path / "caller.py").write_text(CALLER)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"}
    env.pop("NUMBA_CACHE_DIR", None)  # the caches beside the sources, in tmp_path

    def run() -> str:
        done = subprocess.run([sys.executable, "-c", "import caller; print(caller.call())"],
                              cwd=tmp_path, env=env, capture_output=True, text=True)  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    (tmp_path / "callee.py").write_text(CALLEE.format(1))
    assert run() == "1"
    assert any((tmp_path / "__pycache__").glob("caller.call-*.nbi"))  # cached
    (tmp_path / "callee.py").write_text(CALLEE.format(22))
    assert run() == "22"
    assert run() == "22"  # (and cached again)


def test_every_kernel_module_calling_another_file_s_kernels_declares_them() -> None:
    """A module of kernels that imports another file's kernel (to call it from its own) names
    it in its ``invalidate_on_change`` call, else its caches would outlive a change of that
    file; and makes one such call (two write different records of the files called, and
    each import then dropped the module's caches)."""
    for path in sorted((REPO / "core").glob("*.py")):
        module = importlib.import_module(f"core.{path.stem}")
        if path.stem == "_numba":
            continue
        kernels = {n: v for n, v in vars(module).items() if isinstance(v, CPUDispatcher)}
        own = {n for n, v in kernels.items() if v.py_func.__code__.co_filename == str(path)}
        if not own:
            continue  # Python code calling kernels: nothing of theirs is cached here
        foreign = sorted(set(kernels) - own)
        source = path.read_text()
        for name in foreign:
            assert re.search(rf"invalidate_on_change\([^)]*\b{name}\b", source), (path.name, name)
        assert len(re.findall(r"^invalidate_on_change\(", source, re.M)) <= 1, path.name
