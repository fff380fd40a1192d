"""The engine is a pure function of the log, and it computes what the core computes."""

from __future__ import annotations

import itertools
from collections import defaultdict

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.engine.project import ProjectEngine
from app.engine.snapshots import capture, encode, restore
from app.store.base import LogEntry, ProjectRecord
from core.blocks import LabelBlocks, canonical_order
from core.calibration import Calibration
from core.hashing import worker_slot
from core.nominal import NominalConfig
from core.online import BlockResult, OnlineEM
from core.served import held_out_corrections
from tests.conftest import Synthetic

CONFIG = NominalConfig(n_classes=3, n_worker_slots=64)
RECORD = ProjectRecord("p", ("a", "b", "c"), CONFIG.to_dict(), 1.0)


def label_entries(data: Synthetic, cuts: list[int], seed: int = 0) -> list[LogEntry]:
    """The labels in a random order, cut into log entries."""
    order = np.random.default_rng(seed).permutation(data.items.size)
    bounds = [0, *cuts, order.size]
    entries = []
    for n, (lo, hi) in enumerate(itertools.pairwise(bounds)):
        take = order[lo:hi]
        body = {
            "items": [f"item-{i}" for i in data.items[take]],
            "workers": [f"worker-{w}" for w in data.workers[take]],
            "labels": data.labels[take].tolist(),
            "weights": None,
        }
        entries.append(LogEntry(n + 1, "labels", orjson.dumps(body), b""))
    return entries


def run(entries: list[LogEntry], record: ProjectRecord = RECORD) -> ProjectEngine:
    eng = ProjectEngine(record)
    for e in entries:
        eng.apply(e)
    return eng


def core_reference(entries: list[LogEntry], passes: int) -> tuple[OnlineEM, dict[str, np.ndarray]]:
    """The same stream through core.OnlineEM directly, written independently of the engine."""
    model = OnlineEM(CONFIG)
    labels: dict[str, list[tuple[int, int]]] = defaultdict(list)
    last: dict[str, tuple[np.ndarray, float]] = {}
    for e in entries:
        body = orjson.loads(e.payload)
        arrival: dict[str, list[tuple[int, int]]] = defaultdict(list)
        for item, worker, z in zip(body["items"], body["workers"], body["labels"], strict=True):
            arrival[item].append((worker_slot(worker, CONFIG.n_worker_slots), z))
        for item, new in arrival.items():  # first-appearance order
            s = np.array([x for x, _ in new])
            z = np.array([y for _, y in new])
            order = canonical_order(np.zeros(s.size, dtype=np.int64), s, z, np.ones(s.size))
            n_prev = len(labels[item])
            labels[item].extend(zip(s[order].tolist(), z[order].tolist(), strict=True))
            q_old, b_old = last.get(item, (np.full(3, 1 / 3), 0.0))
            block = _block(labels[item])
            prev = BlockResult(q_old[None], np.array([b_old]), np.zeros(1))
            res = model.learn_many(block, previous=prev, n_previous=[n_prev])
            last[item] = (res.posteriors[0], float(res.clarity[0]))
    for _ in range(passes):
        for item, lab in labels.items():
            q_old, b_old = last[item]
            prev = BlockResult(q_old[None], np.array([b_old]), np.zeros(1))
            res = model.learn_many(_block(lab), previous=prev, n_previous=[len(lab)])
            last[item] = (res.posteriors[0], float(res.clarity[0]))
    final = {item: model.predict_many(_block(lab)).posteriors[0] for item, lab in labels.items()}
    return model, final


def _block(lab: list[tuple[int, int]]) -> LabelBlocks:
    s, z = zip(*lab, strict=True)
    return LabelBlocks(np.array([0, len(lab)]), np.array(s), np.array(z), np.ones(len(lab)))


def test_engine_matches_core_bit_for_bit(synthetic: Synthetic) -> None:
    entries = label_entries(synthetic, [500, 1700, 1800, 6000, 11000])
    refine = LogEntry(len(entries) + 1, "refine", b'{"passes": 2}')
    eng = run([*entries, refine])
    model, final = core_reference(entries, passes=2)
    assert eng.model.params.equals(model.params)
    for item, q in final.items():
        assert np.array_equal(eng.q[eng.items.code[item]], q)


def test_each_arrival_counts_once_whatever_the_cuts(synthetic: Synthetic) -> None:
    # Different cuts give different (each valid) online paths, but every label is learned
    # exactly once: the engine's item tables hold every label once.
    eng = run(label_entries(synthetic, [100, 2000, 9000]))
    assert eng.labels.n_labels == synthetic.items.size
    assert int(eng.learned[: eng.items_count].sum()) == synthetic.items.size
    assert int(eng.worker_labels.sum()) == synthetic.items.size


@settings(max_examples=15, deadline=None)
@given(cuts=st.lists(st.integers(1, 14_999), max_size=6, unique=True), seed=st.integers(0, 9))
def test_replay_is_bit_identical(synthetic: Synthetic, cuts: list[int], seed: int) -> None:
    entries = label_entries(synthetic, sorted(cuts), seed)
    a, b = run(entries), run(entries)
    assert a.model.params.equals(b.model.params)
    n = a.items_count
    assert np.array_equal(a.q[:n], b.q[:n])
    items_a, items_b = a.state_update().items, b.state_update().items
    assert items_a.names == items_b.names and items_a.labels == items_b.labels
    codes = np.arange(n, dtype=np.int64)
    for x, y in zip(a.items_json(codes), b.items_json(codes), strict=True):
        x, y = orjson.loads(x), orjson.loads(y)
        del x["computed_at"], y["computed_at"]  # wall-clock time, not state
        assert x == y


def test_items_render_together_as_each_alone(synthetic: Synthetic) -> None:
    eng = run(label_entries(synthetic, [100, 2000]))
    codes = np.array([5, 0, eng.items_count - 1, 5], dtype=np.int64)
    together = [orjson.loads(x) for x in eng.items_json(codes)]
    alone = [orjson.loads(eng.item_json(int(c))) for c in codes]
    for x in (*together, *alone):
        del x["computed_at"]  # wall-clock time
    assert together == alone


def test_duplicate_marks_are_skipped(synthetic: Synthetic) -> None:
    entries = label_entries(synthetic, [300])
    first = entries[0]
    again = LogEntry(2, "labels", first.payload, b"0" * 300)
    partly = LogEntry(3, "labels", first.payload, b"1" + b"0" * 299)
    eng = run([first, again, partly])
    assert eng.labels.n_labels == 301


def test_gold_sets_posterior_and_worker_gold_accuracy() -> None:
    body = {
        "items": ["i1", "i1", "i2"],
        "workers": ["w1", "w2", "w1"],
        "labels": [0, 1, 2],
        "weights": None,
    }
    eng = run(
        [
            LogEntry(1, "labels", orjson.dumps(body)),
            LogEntry(2, "gold", orjson.dumps({"items": ["i1"], "labels": [1]})),
        ]
    )
    item = orjson.loads(eng.item_json(eng.items.code["i1"]))
    assert item["gold"] == 1 and item["posterior"] == [0.0, 1.0, 0.0]
    w1 = orjson.loads(eng.worker_json(eng.workers.code["w1"]))
    w2 = orjson.loads(eng.worker_json(eng.workers.code["w2"]))
    assert (w1["gold_seen"], w1["gold_right"]) == (1, 0)
    assert (w2["gold_seen"], w2["gold_right"]) == (1, 1)
    # Changing the gold answer replaces the old one in the counts.
    eng.apply(LogEntry(3, "gold", orjson.dumps({"items": ["i1"], "labels": [0]})))
    w1 = orjson.loads(eng.worker_json(eng.workers.code["w1"]))
    assert (w1["gold_seen"], w1["gold_right"]) == (1, 1)


@given(st.lists(st.tuples(*[st.integers(0, 2**53 - 1)] * 4), min_size=1, max_size=20))
def test_a_worker_s_record_is_the_json_orjson_writes(
    records: list[tuple[int, int, int, int]],
) -> None:
    eng = ProjectEngine(RECORD)
    n = len(records)
    eng.workers.encode([f"w{k}" for k in range(n)])
    eng.worker_slot, eng.worker_labels, eng.worker_gold_seen, eng.worker_gold_right = (
        np.array(column, dtype=np.int64) for column in zip(*records, strict=True)
    )
    written = eng.workers_json(np.arange(n, dtype=np.int64))
    fields = ("slot", "n_labels", "gold_seen", "gold_right")
    assert written == {
        f"w{k}": orjson.dumps(dict(zip(fields, r, strict=True))) for k, r in enumerate(records)
    }


def test_refit_swaps_in_batch_parameters(synthetic: Synthetic) -> None:
    entries = label_entries(synthetic, [5000])
    eng = run([*entries, LogEntry(len(entries) + 1, "refit", b"{}")])
    n = eng.items_count
    truth = {f"item-{i}": int(t) for i, t in enumerate(synthetic.truth)}
    predicted = eng.q[:n].argmax(axis=1)
    gold = np.array([truth[name] for name in eng.items.names])
    assert (predicted == gold).mean() > 0.9


def test_a_refit_that_only_breaks_ties_otherwise_keeps_the_served_labels() -> None:
    eng = ProjectEngine(RECORD)
    body = {"items": ["i0", "i0", "i1", "i1"], "workers": ["x", "y", "x", "y"],
            "labels": [0, 1, 1, 2], "weights": None}  # fmt: skip
    eng.apply(LogEntry(1, "labels", orjson.dumps(body), b""))
    served = eng.shown(np.arange(2, dtype=np.int64))
    # every class as likely, but for rounding in the last digits: no label of its own
    tied = np.tile([1 / 3, 1 / 3, 1 / 3], (2, 1)) * (1.0 + 1e-13 * np.eye(3)[[2, 2]])
    assert eng.refit_verdict(tied, 2)["agreement"] == 1.0
    other = np.eye(3)[served.argmin(axis=1)]  # on both items a label the served one ranks last
    assert eng.refit_verdict(other, 2) == {"position": 2, "adopted": False, "agreement": 0.0}
    assert eng.refit_verdict(served, 2) == {"position": 2, "adopted": True, "agreement": 1.0}


def test_gold_teaches_the_model(synthetic: Synthetic) -> None:
    entries = label_entries(synthetic, [6000])
    truth = {
        "items": [f"item-{i}" for i in range(0, 3000, 10)],
        "labels": synthetic.truth[::10].tolist(),
    }
    with_gold = run([*entries, LogEntry(3, "gold", orjson.dumps(truth))])
    without = run(entries)
    assert not with_gold.model.params.equals(without.model.params)  # the workers moved
    # gold given before the labels arrive is used when they are learned
    early = run(
        [
            LogEntry(1, "gold", orjson.dumps(truth)),
            *(LogEntry(e.position + 1, e.kind, e.payload) for e in entries),
        ]
    )
    i = early.items.code["item-0"]
    assert np.array_equal(early.q[i], np.eye(3)[synthetic.truth[0]])
    n = early.items_count
    codes = np.array([int(name.split("-")[1]) for name in early.items.names])
    unknown = codes % 10 != 0
    acc = lambda e: (e.q[:n].argmax(1) == synthetic.truth[codes])[unknown].mean()  # noqa: E731
    assert acc(early) >= acc(without) - 0.003


def test_after_a_sweep_items_are_served_held_out_until_their_next_labels(
    synthetic: Synthetic,
) -> None:
    """A refinement sweep fits the rows to every item: each item is then served as scored by
    rows fitted without it (docs/model.md eq. 26), which lowers the confidence and leaves EM's
    own posteriors (what the statistics count) alone; its next labels serve EM's again."""
    entries = label_entries(synthetic, [3000, 9000])
    refine = LogEntry(len(entries) + 1, "refine", b'{"passes": 2}')
    eng = run([*entries, refine])
    n = eng.items_count
    codes = np.arange(n, dtype=np.int64)
    shown = eng.shown(codes)
    assert np.all(eng.held_out[:n] >= 0) and np.all(eng.held_out[:n].max(axis=1) > 0)
    assert shown.max(axis=1).mean() < eng.q[:n].max(axis=1).mean()
    assert np.mean(shown.argmax(axis=1) == eng.q[:n].argmax(axis=1)) > 0.99
    stored = orjson.loads(eng.item_json(0))
    assert stored["posterior"] == shown[0].tolist() and stored["held_out"] is not None
    again = restore(RECORD, encode(capture(eng)))  # a snapshot keeps the corrections
    assert np.array_equal(again.held_out[:n], eng.held_out[:n])
    assert orjson.loads(again.item_json(0))["posterior"] == stored["posterior"]
    name = eng.items.names[0]
    body = {"items": [name], "workers": ["worker-new"], "labels": [0], "weights": None}
    eng.apply(LogEntry(refine.position + 1, "labels", orjson.dumps(body), b""))
    assert np.all(eng.held_out[0] == 0) and np.array_equal(eng.shown(codes[:1]), eng.q[:1])
    assert orjson.loads(eng.item_json(0))["held_out"] is None


def test_a_refit_serves_items_under_the_rows_laplace_predictives_and_a_sweep_does_not(
    synthetic: Synthetic,
) -> None:
    """A refit is batch EM's optimum: its items are served held out (eq. 26) and under each
    slot row's Laplace predictive (eq. 27); a refinement sweep's rows are short of an optimum,
    and its items are served held out alone."""
    entries = label_entries(synthetic, [3000, 9000])
    for kind, laplace in (("refit", True), ("refine", False)):
        eng = run([*entries, LogEntry(len(entries) + 1, kind, b"{}")])
        n = eng.items_count
        blocks, _ = eng.labels.gather(np.arange(n, dtype=np.int64))
        lam = eng.refit_worker_prior if laplace else eng.config.worker_prior  # (eq. 28)
        assert lam is not None
        prior = eng.config.population_precision()
        want = held_out_corrections(
            eng.online.params, blocks, eng.q[:n], lam, laplace=laplace, population_precision=prior
        )
        np.testing.assert_array_equal(eng.held_out[:n], want)


def test_with_gold_the_whole_queue_is_scored_again_only_once_the_calibration_moved(
    synthetic: Synthetic,
) -> None:
    """With gold the calibration (eq. 25) moves a little at every step: the touched items are
    scored under the current one, the whole queue only once rho or epsilon moved past their
    tolerances, so every queued item's served confidence is within about that of today's."""
    from app.engine.project import QUEUE_EPS_TOLERANCE, QUEUE_RHO_TOLERANCE

    entries = label_entries(synthetic, [2000, 4000, 6000, 8000, 9000, 10000, 11000, 12000])
    eng = ProjectEngine(RECORD)
    eng.apply_all(entries[:2])
    gold = {"items": [f"item-{i}" for i in range(40)], "labels": synthetic.truth[:40].tolist()}
    eng.apply(LogEntry(3, "gold", orjson.dumps(gold)))
    assert eng.state_update().queue_replace  # (a first update scores every item)
    replaced = 0
    for n, e in enumerate(entries[2:]):
        scored_with = eng._queue_calibration
        eng.apply(LogEntry(4 + n, "labels", e.payload))
        update = eng.state_update()
        now = eng.calibration
        assert now.components  # (with gold: the posterior mean over (rho, eps))
        moved = (
            abs(now.rho - scored_with.rho) > QUEUE_RHO_TOLERANCE
            or abs(now.eps - scored_with.eps) > QUEUE_EPS_TOLERANCE
        )
        assert (eng._queue_calibration is not scored_with) == moved
        if moved:  # (in one slice: fewer items than QUEUE_SLICE)
            assert len(update.queue) + len(update.queue_remove) == eng.items_count
        replaced += moved
        shown, w = eng.shown(np.arange(eng.items_count)), eng.weight[: eng.items_count]
        queued = eng._queue_calibration.from_posteriors(shown, w).max(axis=1)
        today = now.from_posteriors(shown, w).max(axis=1)
        assert np.abs(queued - today).max() < 0.01
    assert replaced < len(entries) - 2  # (every step did, before)


def test_once_the_calibration_moved_the_queue_is_scored_again_a_slice_a_step(
    synthetic: Synthetic, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not all at once (that held every posterior back): QUEUE_SLICE items a step, beside
    the items whose labels changed, until every item is scored as a whole re-scoring would
    score it; a move meanwhile starts over."""
    from app.engine import project

    monkeypatch.setattr(project, "QUEUE_SLICE", 700)
    entries = label_entries(synthetic, [5000, 10000])
    eng = ProjectEngine(RECORD)
    eng.apply_all(entries)
    assert eng.state_update().queue_replace and not eng.queue_rescoring
    eng._queue_calibration = Calibration(rho=0.9)  # as if the calibration moved from there
    scored: dict[str, float] = {}
    finished: set[str] = set()
    steps = 0
    while True:
        update = eng.state_update()
        steps += 1
        assert not update.queue_replace
        assert len(update.queue) + len(update.queue_remove) <= 700
        scored.update(update.queue)
        finished.update(update.queue_remove)
        if not eng.queue_rescoring:
            break
    assert steps == -(-3000 // 700) and len(scored) + len(finished) == 3000
    eng._queue_all = True  # the whole queue at once, for comparison
    whole = eng.state_update()
    assert whole.queue == scored and set(whole.queue_remove) == finished
    eng._queue_calibration = Calibration(rho=0.9)
    eng.state_update()
    assert eng.queue_rescoring  # (after the first slice)
    eng._queue_calibration = Calibration(rho=0.8)  # moved again: from the first item
    eng.state_update()
    assert eng._rescore_from == 700
