"""bench.label_ids: a short run times the store's appends and the SQLite index's, row by row."""

from __future__ import annotations

import pytest

from bench import label_ids


def test_a_short_run_prints_both_costs_at_each_size(capsys: pytest.CaptureFixture[str]) -> None:
    label_ids.main(["--ids", "20000", "--block", "500"])
    lines = capsys.readouterr().out.splitlines()
    rows = [line.split() for line in lines[2:-1]]
    assert [r[0] for r in rows] == ["0", "5,000", "15,000"]  # (40 blocks: 3 distinct marks)
    for _, ours, peer, ratio in rows:
        assert float(ours) > 0 and float(peer) > 0 and ratio.endswith("x")
    assert lines[-1].startswith("opening the store again with 20,000 ids")
