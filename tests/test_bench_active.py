"""The replay bench: its policies pick real, unrevealed answers; its peers do what they say."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bench.active import (
    Campaign,
    Curve,
    _prob_largest,
    clairvoyant,
    hmin,
    load_crowd,
    main,
    opt_kg,
    replay,
)


def test_hmin_policy_reveals_unrevealed_real_answers(datasets_root: Path) -> None:
    crowd = load_crowd("duck")
    c = Campaign.start_from(crowd, 0)
    for _ in range(3):
        before = c.revealed.copy()
        items, answers = hmin(c, 5)
        assert answers is not None and items.size == 5 == np.unique(items).size
        remaining, of_item = c.remaining_answers()
        pairs = set(zip(of_item.tolist(), remaining.tolist(), strict=True))
        assert all((i, a) in pairs for i, a in zip(items.tolist(), answers.tolist(), strict=True))
        assert np.all(crowd.item[answers] == items)
        c.reveal(items, answers)
        assert np.array_equal(
            c.revealed - before, np.isin(np.arange(before.size), items).astype(np.int64)
        )
    assert c.cache["dyadic"].config.k == 2


def test_the_chance_a_class_is_largest_under_a_dirichlet() -> None:
    from scipy import stats  # (about 1 s to import: not for every worker's collection)

    rng = np.random.default_rng(0)
    alpha = np.array([[1.0, 1.0], [4.0, 2.0], [1.0, 7.0]])
    two = _prob_largest(alpha)
    assert np.allclose(two[:, 0], stats.beta.sf(0.5, alpha[:, 0], alpha[:, 1]))
    alpha3 = np.array([[1.0, 1.0, 1.0], [5.0, 3.0, 1.0], [2.0, 2.0, 6.0], [30.0, 25.0, 2.0]])
    theta = rng.dirichlet(alpha3[3], size=200_000)
    mc = np.bincount(theta.argmax(axis=1), minlength=3) / theta.shape[0]
    got = _prob_largest(alpha3)
    assert np.allclose(got[0], 1 / 3, atol=1e-3) and np.allclose(got.sum(axis=1), 1.0)
    assert np.allclose(got[3], mc, atol=5e-3)


def test_opt_kg_asks_first_where_one_answer_could_swing_the_vote() -> None:
    """Beta(1, 1) prior: a 1-1 item gains 0.1875 from one more answer (P(θ > 1/2) from 0.5 to
    0.6875), a single answer at best 0.125, a 2-0 item 0.0625 (Chen, Lin & Zhou, eq. 12)."""
    c = Campaign.start_from(load_crowd("temp"), 0)
    c.votes[:] = np.eye(2, dtype=np.int64)[c.crowd.label[c.order[c.start[:-1]]]]
    c.votes[7], c.votes[9] = [1, 1], [2, 0]
    n = c.crowd.n_items
    ranked, _ = opt_kg(c, n)
    assert ranked[0] == 7 and ranked[-1] == 9 and ranked.size == n


def test_the_clairvoyant_ceiling_asks_first_where_the_last_checkpoint_was_wrong() -> None:
    crowd = load_crowd("temp")
    c = Campaign.start_from(crowd, 0)
    c.measure()
    wrong = np.flatnonzero(c.cache["measured_labels"] != crowd.gold)
    assert 0 < wrong.size < crowd.n_items
    c.revealed[wrong[0]] += 1  # among the wrong items, the fewest answers first
    ranked, _ = clairvoyant(c, crowd.n_items)
    assert set(ranked[: wrong.size].tolist()) == set(wrong.tolist())
    assert ranked[wrong.size - 1] == wrong[0]
    assert ranked.size == crowd.n_items


def test_a_checkpoint_measures_what_a_refit_would_serve() -> None:
    """With one answer an item the service declines batch EM's one-class fit (docs/model.md,
    "A limit"), so the checkpoint reads the served model, as a requester would."""
    crowd = load_crowd("dog")
    c = Campaign.start_from(crowd, 0)  # every item's first answer
    served = c.engine.shown(c.code).argmax(axis=1)
    assert c.measure() == float(np.mean(served == crowd.gold)) > 0.6
    assert np.array_equal(c.cache["measured_labels"], served)


def test_fixed_redundancy_stops_at_r_answers_an_item() -> None:
    crowd = load_crowd("temp")
    c3 = replay(crowd, "fixed3", 0, 0.05, 0.05, 10)
    counts = np.bincount(crowd.item, minlength=crowd.n_items)
    assert c3.labels[-1] == np.minimum(counts, 3).sum()
    full = replay(crowd, "uniform", 0, 0.05, 0.05, 10)
    assert full.labels[-1] == crowd.n_answers
    assert full.labels[: len(c3.labels) - 1] == c3.labels[:-1]  # the same campaign until then


def test_the_oracle_posterior_of_every_answer_is_the_crowd_s() -> None:
    crowd = load_crowd("syn_difficulty")
    c = Campaign.start_from(crowd, 0)
    c.revealed[:] = c.counts  # (bookkeeping only: the oracle reads the revealed answers)
    assert crowd.oracle is not None and np.allclose(c.oracle(), crowd.oracle)


def test_budget_accuracy_and_labels_needed_read_the_curve() -> None:
    cv = Curve([100, 200, 300, 400], [0.70, 0.81, 0.79, 0.81])
    assert cv.at(250) == 0.81 and cv.at(99) == 0.70 and cv.at(1000) == 0.81
    assert cv.needed(0.81, sustained=False) == 200
    assert cv.needed(0.81) == 400  # it falls back at 300


def test_a_short_run_writes_its_tables_and_figure(tmp_path: Path) -> None:
    main(["--datasets", "temp", "--policies", "uniform,lookahead,fixed3", "--seeds", "2",
          "--step", "0.05", "--checkpoint", "0.05", "--jobs", "1", "--out", str(tmp_path)])  # fmt: skip
    table = (tmp_path / "active.md").read_text()
    assert "| temp | 4620 | 462 |" in table and "lookahead (the default): mean saving" in table
    assert (tmp_path / "active.png").stat().st_size > 10_000
    assert (tmp_path / "active.csv").read_text().count("temp,lookahead,1,") > 5
