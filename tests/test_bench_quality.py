"""bench.quality's metrics, bench.crowds' generators, and a quick end-to-end run."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from pathlib import Path

import numpy as np
import orjson
import pytest

from app.engine.project import ProjectEngine
from app.store.base import LogEntry, ProjectRecord
from bench import quality
from bench.crowds import SYNTHETIC, Crowd, load_shared, synthetic
from bench.datasets import DEFAULT_ROOT

_crowd = functools.cache(synthetic)  # seed 0, built once for the whole module

# Four items, two classes. Top-label confidences 0.9, 0.6, 0.8, 0.55 (bins 9, 6, 8, 5), the
# last two top labels wrong.
P = np.array([[0.9, 0.1], [0.4, 0.6], [0.2, 0.8], [0.55, 0.45]])
G = np.array([0, 1, 0, 1])


def test_accuracy_and_skipped_items() -> None:
    assert quality.accuracy(P, G) == 0.5
    # an item with gold -1 is not scored
    assert quality.accuracy(P, np.array([0, 1, -1, -1])) == 1.0
    assert math.isnan(quality.accuracy(P, np.full(4, -1)))


def test_ece_hand_computed() -> None:
    # each item alone in its bin: ECE = mean |correct - conf| = (0.1 + 0.4 + 0.8 + 0.55) / 4
    assert quality.ece(P, G) == pytest.approx(100 * 1.85 / 4)
    # two items in one bin (conf 0.7 and 0.75, one right): |0.5 - 0.725| = 0.225
    two = np.array([[0.7, 0.3], [0.25, 0.75]])
    assert quality.ece(two, np.array([0, 0])) == pytest.approx(22.5)
    # confidence 1 goes to the last bin
    sure = np.array([[1.0, 0.0], [0.0, 1.0]])
    assert quality.ece(sure, np.array([0, 1])) == pytest.approx(0.0)
    b = quality.reliability(sure, np.array([0, 0]))
    assert b.count[-1] == 2 and b.correct[-1] == 1
    assert b.ece() == pytest.approx(50.0)


def test_reliability_bins_pool_by_addition() -> None:
    b = quality.reliability(P, G)
    assert b.count.tolist() == [0, 0, 0, 0, 0, 1, 1, 0, 1, 1]
    pooled = b + quality.reliability(P[:2], G[:2])
    assert pooled.count.sum() == 6
    assert pooled.observed_accuracy()[9] == 1.0
    assert pooled.mean_confidence()[6] == pytest.approx(0.6)


def test_nll_and_brier_hand_computed() -> None:
    expected = -np.mean(np.log([0.9, 0.6, 0.2, 0.45]))
    assert quality.nll(P, G) == pytest.approx(expected)
    # Brier: 2 * (1 - p_gold)^2 for two classes
    assert quality.brier(P, G) == pytest.approx(np.mean([0.02, 0.32, 1.28, 0.605]))
    # clipped at 1e-12: a zero probability on the gold class costs -log(1e-12)
    assert quality.nll(np.array([[1.0, 0.0]]), np.array([1])) == pytest.approx(12 * np.log(10))


def test_vote_shares_ties_and_empty_items() -> None:
    crowd = _crowd("one_coin")
    shares = quality.vote_shares(crowd)
    assert np.allclose(shares.sum(axis=1), 1.0)
    counts = np.bincount(crowd.item, minlength=crowd.n_items)
    assert np.all(np.isclose(shares * counts[:, None], np.round(shares * counts[:, None])))


@pytest.mark.parametrize("name", list(SYNTHETIC))
def test_generators_are_seeded_and_oracle_beats_majority_vote(name: str) -> None:
    a, b, c = synthetic(name, seed=0), _crowd(name), synthetic(name, seed=1)
    assert np.array_equal(a.item, b.item) and np.array_equal(a.label, b.label)
    assert np.array_equal(a.oracle, b.oracle)
    assert not np.array_equal(a.label, c.label)
    assert a.oracle is not None and a.oracle.shape == (a.n_items, a.n_classes)
    assert np.allclose(a.oracle.sum(axis=1), 1.0)
    assert np.all(a.gold >= 0) and a.gold.max() < a.n_classes
    assert a.label.min() >= 0 and a.label.max() < a.n_classes
    assert 2000 <= a.n_items <= 5000
    oracle_acc = quality.accuracy(a.oracle, a.gold)
    assert oracle_acc > quality.accuracy(quality.vote_shares(a), a.gold)
    # the oracle is calibrated: its ECE is small
    assert quality.ece(a.oracle, a.gold) < 2.0


def test_regimes() -> None:
    sparse = ("sparse", "sparse_one_coin", "thin", "sparse_many_classes", "sparse_30_classes")
    assert all(_crowd(n).mostly_sparse and not _crowd(n).dense for n in sparse)
    assert all(_crowd(n).dense for n in SYNTHETIC if n not in sparse)
    assert np.all(np.bincount(_crowd("thin").item) == 2)
    assert _crowd("many_classes").n_classes >= 10
    imb = _crowd("imbalance")
    assert np.bincount(imb.gold).argmax() == 0 and np.mean(imb.gold == 0) > 0.6


@pytest.mark.skipif(not (DEFAULT_ROOT / "duck").exists(), reason="shared datasets absent")
def test_load_shared_duck() -> None:
    duck = load_shared("duck")
    assert (duck.n_items, duck.n_workers, duck.n_answers, duck.n_classes) == (108, 39, 4212, 2)
    assert duck.classes == ("0", "1")
    assert np.all(duck.gold >= 0)


def test_gold_choice() -> None:
    crowd: Crowd = _crowd("ds")
    given = quality.choose_gold(crowd, 0.05, 50)
    assert np.sum(given >= 0) == 50
    assert np.array_equal(given[given >= 0], crowd.gold[given >= 0])
    assert np.array_equal(given, quality.choose_gold(crowd, 0.05, 50))
    assert np.all(quality.choose_gold(crowd, 0.0, 50) == -1)


def test_gold_draws_run_every_method_on_each_draw() -> None:
    crowd = _crowd("one_coin")
    (r,) = quality.run([crowd], ["batch", "MV"], orders=1, gold_fraction=0.05, gold_draws=3)
    assert len(r.draws) == 3
    given = [g for g, _ in r.draws]
    assert not np.array_equal(given[0], given[1]) and not np.array_equal(given[1], given[2])
    for g, target in r.draws:
        assert np.all(target[g >= 0] == -1) and np.sum(target >= 0) == np.sum(crowd.gold >= 0) - 50
    assert len(r.outcomes["batch"].runs) == 3 and len(r.outcomes["MV"].runs) == 3
    mv = quality.vote_shares(crowd)  # no gold: one fit, scored on each draw's items
    assert [run["acc"] for run in r.outcomes["MV"].runs] == [
        quality.scores(mv, t)["acc"] for _, t in r.draws
    ]


def test_register_a_variant() -> None:
    try:
        quality.register("batch-x", lambda c, g, s: quality.run_batch(c, g))
        assert quality.METHODS["batch-x"].kind == "crowdtally"
        crowd = _crowd("one_coin")
        given = quality.choose_gold(crowd, 0.05, 50)
        post = quality.METHODS["batch-x"].fit(crowd, given, 0)
        assert post.shape == (crowd.n_items, 3)
        # known gold is held at its class
        assert np.all(post[given >= 0].argmax(axis=1) == given[given >= 0]) and np.allclose(
            post.sum(axis=1), 1.0
        )
    finally:
        quality.METHODS.pop("batch-x", None)


@pytest.mark.skipif(not (DEFAULT_ROOT / "duck").exists(), reason="shared datasets absent")
def test_end_to_end(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out_json = tmp_path / "q.json"
    figure = tmp_path / "q.png"
    argv = ["--datasets", "duck", "--synthetic", "one_coin", "--no-peers", "--orders", "2"]
    assert quality.main([*argv, "--json", str(out_json), "--figure", str(figure)]) == 0
    text = capsys.readouterr().out
    assert "## duck (" in text and "## syn_one_coin (synthetic, dense" in text
    rows = [line.split()[0] for line in text.splitlines() if line.strip()]
    for name in ("online", "batch", "MV", "oracle"):
        assert name in rows
    assert "DawidSkene" not in text
    assert "±" in text  # online over 2 orders
    assert "PASS" in text or "FAIL" in text
    assert "acc - oracle" in text
    assert figure.exists() and figure.stat().st_size > 1000
    data = json.loads(out_json.read_text())
    duck = data["crowds"]["duck"]["methods"]
    assert len(duck["online"]["runs"]) == 2 and len(duck["batch"]["runs"]) == 1
    assert 70 < duck["batch"]["runs"][0]["acc"] <= 100


@pytest.mark.skipif(not (DEFAULT_ROOT / "duck").exists(), reason="shared datasets absent")
def test_gold_mode_scores_only_the_others(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--datasets", "duck", "--synthetic", "none", "--no-peers", "--orders", "1"]
    quality.main([*argv, "--gold-fraction", "0.05", "--gold-max", "50"])
    text = capsys.readouterr().out
    assert "5 given as gold, scored on 103" in text
    assert "[5% gold]" in text


def test_stopping_replay_reveals_answers_until_the_target(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from bench import stopping

    crowd = load_shared("duck")
    none = np.full(crowd.n_items, -1, dtype=np.int64)
    strict, loose = (stopping.replay(crowd, t, 0, True, none) for t in (0.99, 0.6))
    assert strict.n_items == loose.n_items == crowd.n_items  # duck: gold for every item
    assert loose.n_stopped >= strict.n_stopped and loose.answers_used < strict.answers_used
    assert loose.confidence >= 0.6 and strict.confidence >= 0.99
    gold = stopping.gold_given(crowd, 0.05, 50, 0)
    assert (gold >= 0).sum() == 5
    assert stopping.replay(crowd, 0.9, 0, True, gold).n_items == crowd.n_items - 5
    assert stopping.main(["--datasets", "duck", "--seeds", "1"]) == 0
    out = capsys.readouterr().out
    assert "duck" in out and "served" in out and "raw" in out and "stopped items right" in out


def _first_items(crowd: Crowd, n: int) -> Crowd:
    """The crowd cut to its first ``n`` items and their answers."""
    keep = crowd.item < n
    return dataclasses.replace(
        crowd,
        item=crowd.item[keep],
        worker=crowd.worker[keep],
        label=crowd.label[keep],
        n_items=n,
        gold=crowd.gold[:n],
        oracle=None,
        answer_loglik=None,
    )


def test_online_idle_is_what_the_service_engine_serves_after_its_sweeps() -> None:
    crowd = _first_items(_crowd("sparse_one_coin"), 300)
    config = quality.nominal_config(crowd)
    engine = ProjectEngine(ProjectRecord("p", crowd.classes, config.to_dict(), 1.0))
    order = np.random.default_rng(5).permutation(crowd.n_items)  # run_online's order, seed 5
    names = crowd.worker_ids()
    for position, i in enumerate(order, start=1):  # one log entry per item, in that order
        mine = crowd.item == i
        body = {
            "items": [str(i)] * int(mine.sum()),
            "workers": [names[w] for w in crowd.worker[mine]],
            "labels": crowd.label[mine].tolist(),
            "weights": None,
        }
        engine.apply(LogEntry(position, "labels", orjson.dumps(body), b""))
    passes = quality.IDLE_REFINE_PASSES
    refine = orjson.dumps({"passes": passes})
    engine.apply(LogEntry(crowd.n_items + 1, "refine", refine, b""))
    none = np.full(crowd.n_items, -1)
    idle = quality.run_online(crowd, none, 5, served=False, idle_passes=passes)
    one_pass = quality.run_online(crowd, none, 5, served=False)
    # the engine codes items by arrival: its item k is the crowd's order[k]
    np.testing.assert_allclose(engine.q[: crowd.n_items], idle[order], rtol=0, atol=1e-12)
    assert np.abs(idle - one_pass).max() > 1e-3  # the sweeps do move the posteriors
    # and what it serves: each item held out (eq. 26), calibrated, as bench.quality scores it
    served = quality.run_online(crowd, none, 5, idle_passes=passes)
    codes = np.arange(crowd.n_items)
    engine.state_update()  # (where the engine calibrates)
    shown = engine.calibration.from_posteriors(engine.shown(codes), engine.weight[codes])
    np.testing.assert_allclose(shown, served[order], rtol=0, atol=1e-9)
    assert np.abs(served - quality.run_online(crowd, none, 5)).max() > 1e-3
