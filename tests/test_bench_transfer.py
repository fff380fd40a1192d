"""bench.transfer: a short run imports both files into a real embedded service and exports."""

from __future__ import annotations

import pytest

from bench import transfer


@pytest.mark.slow
def test_a_short_run_times_both_imports_and_both_exports(
    capsys: pytest.CaptureFixture[str],
) -> None:
    transfer.main(["--labels", "1000"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("1,000 answers into a fresh embedded service")
    rows = lines[1:]
    assert [r.split(",")[0].split(" (")[0] for r in rows] == [
        "import", "import", "export csv", "export jsonl"
    ]  # fmt: skip
    assert "read in columns" in rows[0] and "read in rows" in rows[1]
    assert "(200 items)" in rows[2] and "(200 items)" in rows[3]
    for r in rows:
        wall, cpu, peak = (float(x) for x in r.split()[-6::2])
        assert wall > 0 and cpu > 0 and 10 < peak < 2000
