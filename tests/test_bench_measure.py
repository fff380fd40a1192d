"""bench.measure: a command's peak memory is its own, however big the process that starts it."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from bench.measure import whole_process


def test_a_commands_peak_is_its_own_not_its_parents() -> None:
    ballast = np.ones(400 * 2**20 // 8)  # this process holds 400 MiB when it starts the command
    grow = "import numpy as np; a = np.ones(150 * 2**20 // 8); print(a.sum())"
    run = whole_process([sys.executable, "-c", grow])
    assert 150 < run.peak_mib < 300, run  # the command's 150 MiB and its interpreter's
    assert run.seconds > 0 and run.cpu_s > 0
    idle = whole_process([sys.executable, "-c", "pass"])
    assert idle.peak_mib < 100, idle
    del ballast


def test_a_failing_command_raises_with_its_stderr() -> None:
    with pytest.raises(RuntimeError, match="boom"):
        whole_process([sys.executable, "-c", "raise SystemExit('boom')"])
