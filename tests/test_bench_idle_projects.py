"""bench.idle_projects: a short run prints one row per project count, both ways timed."""

from __future__ import annotations

import pytest

from bench import idle_projects


def test_the_command_prints_a_row_per_project_count(capsys: pytest.CaptureFixture[str]) -> None:
    idle_projects.main(["--projects", "3,30", "--steps", "2", "--window", "0.05"])
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[4:]]
    assert [r[0] for r in rows] == ["3", "30"]
    # lean, peer, the lean engine's worst step, metrics, its peer, readyz, its peer
    assert all(float(r[k]) > 0 for r in rows for k in (1, 2, 4, 5, 6, 7, 8))
