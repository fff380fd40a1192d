"""bench.scale end to end, small: one API and two pool engines on the real Redis, two
projects (one taking 60% of the labels), a second and a half per phase; every acknowledged
label applied once, figures filled in."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest

from bench.scale import parse_args, per_label, run_one, shares


@pytest.mark.slow
def test_a_short_scale_run_applies_every_label_once(tmp_path: Path) -> None:
    args = parse_args(["--projects", "2", "--seconds", "1.5", "--saturate", "4000",
                       "--rate", "1000", "--block", "200", "--hot", "0.6"])  # fmt: skip
    row = asyncio.run(run_one("redis", 2, args, tmp_path))
    assert row.exactly_once and row.acked_s > 0 and row.applied_s > 0
    assert row.redis_ops > 0 and row.redis_bytes > 0 and row.engine_us > 0
    assert not math.isnan(row.p99_ms) and row.p99_ms < 10_000
    assert not math.isnan(row.hot_p99_ms) and row.hot_p99_ms < 10_000
    assert f"{row.hot_p99_ms:.1f}" in row.line()


def test_shares_give_the_hot_project_its_part_and_the_rest_evenly() -> None:
    assert shares(4, 0.0) == [0.25] * 4
    hot = shares(5, 0.6)
    assert hot[0] == 0.6 and math.isclose(sum(hot), 1.0) and len(set(hot[1:])) == 1


def test_per_label_figures_are_nan_when_no_label_was_applied() -> None:
    assert per_label(3.0, 2) == 1.5
    assert math.isnan(per_label(3.0, 0))
