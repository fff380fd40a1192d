"""bench.engine_step: a short run times every entry and prints one row per configuration."""

from __future__ import annotations

import numpy as np
import pytest

from bench import engine_step


def test_a_short_run_times_both_halves_of_a_step_without_a_store() -> None:
    cost = engine_step.measure(items=200, dyadic=True, preload=2000, entries=5, size=100)
    assert cost.apply_ms > 0 and cost.update_ms > 0 and cost.write_ms == 0
    total_s = 5 * (cost.apply_ms + cost.update_ms) / 1e3
    assert cost.labels_per_s == pytest.approx(500 / total_s)


def test_the_command_prints_a_row_per_item_count_and_model(
    capsys: pytest.CaptureFixture[str],
) -> None:
    engine_step.main(["--items", "300", "--entries", "2", "--preload", "1000"])
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[2:]]
    assert [(r[0], r[1]) for r in rows] == [("300", "on"), ("300", "off")]


def test_entries_learned_as_one_block_take_every_label_and_learn_otherwise() -> None:
    small = {"items": 200, "preload": 2000, "entries": 6, "size": 100}
    alone_rate, alone = engine_step.joined(3, False, **small)
    joined_rate, joined = engine_step.joined(3, True, **small)
    assert alone_rate > 0 and joined_rate > 0
    assert alone.position == joined.position and alone.labels.n_labels == joined.labels.n_labels
    n = alone.items_count
    assert not np.array_equal(alone.q[:n], joined.q[:n])  # each item's new labels at once


@pytest.mark.parametrize("kind", ["embedded", "redis"])
def test_with_a_store_each_step_is_written_and_served(kind: str) -> None:
    with engine_step.opened(kind, "redis://127.0.0.1:6379/0") as store:
        assert store is not None
        cost = engine_step.measure(
            items=200, dyadic=False, preload=2000, entries=5, size=100, store=store
        )
        assert store.applied_position("bench") == 25  # 20 preloaded entries, then 5
        assert store.get_item("bench", "i0") is not None
    assert cost.write_ms > 0
    total_s = 5 * (cost.apply_ms + cost.update_ms + cost.write_ms) / 1e3
    assert cost.labels_per_s == pytest.approx(500 / total_s)
