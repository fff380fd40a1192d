"""The layout of the online model's prequential evidence (eq. 22): one log-score sum per
tempering value rho of ``RHO_GRID``, then the weight scored. Its own module, free of numba, so
that what only sizes or stores the vector (the model's parameters, model files, snapshots)
does not load the calibration's kernels."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

RHO_GRID: npt.NDArray[np.float64] = np.array([0.0, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0])
"""The tempering values whose prequential evidence the online model keeps (eq. 22)."""


def evidence_size() -> int:
    """Length of the evidence vector: one sum per rho of RHO_GRID, then the weight scored."""
    return int(RHO_GRID.size) + 1
