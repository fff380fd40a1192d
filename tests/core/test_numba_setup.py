"""core/_numba.py: numba's array support loads without importing SciPy's linear algebra (its
BLAS probe, 0.25 s of every process start where SciPy is installed), and SciPy still imports
as usual afterwards."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

CHECK = """
import sys
from core.blocks import LabelBlocks
from core.nominal import NominalConfig, NominalParams
from core.served import log_likelihoods
blocks = LabelBlocks.group([0, 0, 1], [0, 1, 0], [0, 1, 2])
log_likelihoods(NominalParams.initial(NominalConfig(n_classes=3)), blocks)  # a kernel runs
probed = "scipy.linalg" in sys.modules
import scipy.linalg.cython_blas  # the module the probe was kept from: importable as usual
print(probed)
"""


@pytest.mark.skipif(importlib.util.find_spec("scipy") is None, reason="SciPy not installed")
def test_a_kernel_runs_without_importing_scipy_linalg() -> None:
    done = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
