"""Many classes, few items a class (bench/many_classes.py): the model keeps up with majority
vote. With the population's prior precision fixed at 0.1 whatever K, 64 classes were served
84.5% right after one pass and 77.5% after an idle sweep where majority vote was right on
every item (the rows of Gamma grew confident in cells they had never seen answered)."""

from __future__ import annotations

import numpy as np
import pytest

from bench.many_classes import many_class_crowd
from bench.quality import accuracy, nominal_config, run_online, vote_shares


@pytest.mark.parametrize("right", [0.7, 0.5])
def test_sixty_four_classes_are_served_as_right_as_majority_vote(right: float) -> None:
    crowd = many_class_crowd(64, right)
    config = nominal_config(crowd, n_worker_slots=64)
    none = np.full(crowd.n_items, -1)
    votes = accuracy(vote_shares(crowd), crowd.gold)
    for sweeps in (0, 1):
        served = accuracy(run_online(crowd, none, 0, config, idle_passes=sweeps), crowd.gold)
        assert served >= votes - 0.02, (right, sweeps, served, votes)
