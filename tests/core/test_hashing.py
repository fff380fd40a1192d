import os
import subprocess
import sys

import numpy as np

from core.hashing import collision_report, worker_slot, worker_slots

IDS = ["A1OT3A29R9N1DG", "w1", "", "ünïcødé", "x" * 500]


def test_slot_is_pinned() -> None:
    # Pinned values: changing the hash silently re-maps every stored model, so it must fail here.
    assert [worker_slot(w) for w in IDS[:2]] == PINNED


def test_same_slots_in_another_process_with_another_hash_seed() -> None:
    code = f"from core.hashing import worker_slots; print(list(worker_slots({IDS!r})))"
    env = dict(os.environ, PYTHONHASHSEED="12345")
    other = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert other.stdout.strip() == str(list(worker_slots(IDS)))


def test_slots_in_range_and_spread() -> None:
    slots = worker_slots([f"worker-{i}" for i in range(20_000)], 1024)
    assert slots.min() >= 0 and slots.max() < 1024
    counts = np.bincount(slots, minlength=1024)
    assert counts.min() > 0  # 20k ids fill every one of 1024 slots
    assert counts.max() < 60  # mean 19.5: no gross clumping


def test_collision_report() -> None:
    report = collision_report(np.array([0, 0, 1, 5, 5, 5]), 8)
    assert (report.n_workers, report.n_slots_used, report.n_workers_colliding) == (6, 3, 5)
    assert report.collision_rate == 5 / 6
    assert "5 workers share a slot" in str(report)


PINNED = [18276, 33293]
