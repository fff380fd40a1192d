"""The labelling of the latent classes: relabelling keeps the likelihood, raises the prior,
and keeps crowds of weak workers from ending in the mirror image (core/orientation.py)."""

from __future__ import annotations

import numpy as np
import pytest

from core.batch import BatchEM
from core.blocks import LabelBlocks
from core.nominal import STEP, NominalConfig, NominalParams
from core.online import OnlineEM
from core.orientation import (
    DENSE_EVERY,
    DENSE_UNTIL,
    SPARSE_EVERY,
    best_relabelling,
    check_points,
    relabel,
    relabelling_costs,
)


def weak_binary(
    seed: int, per_item: int = 15, accuracy_range: tuple[float, float] = (0.55, 0.65)
) -> tuple[LabelBlocks, np.ndarray, np.ndarray]:
    """1,400 binary items, each answered by ``per_item`` of 300 workers whose accuracy is
    uniform in ``accuracy_range``: little signal an answer, much redundancy. Blocks with exact
    worker codes, the truth, and majority vote's labels."""
    rng = np.random.default_rng(seed)
    n_items, n_workers = 1400, 300
    accuracy = rng.uniform(*accuracy_range, n_workers)
    truth = rng.integers(0, 2, n_items)
    workers = np.argsort(rng.random((n_items, n_workers)), axis=1)[:, :per_item].ravel()
    items = np.repeat(np.arange(n_items), per_item)
    right = rng.random(items.size) < accuracy[workers]
    labels = np.where(right, truth[items], 1 - truth[items])
    votes = np.bincount(items, weights=labels, minlength=n_items) / per_item
    blocks = LabelBlocks.group(items, workers, labels, n_blocks=n_items)
    return blocks, truth, (votes > 0.5).astype(np.int64)


def test_one_pass_over_weak_workers_never_ends_in_the_mirror_image() -> None:
    """Without the relabelling, 6 of these 8 orders ended 28.7-40.8% right (below chance, the
    classes swapped), with majority vote at 78.4%."""
    blocks, truth, _ = weak_binary(0)
    config = NominalConfig(n_classes=2, n_items=float(truth.size), n_worker_slots=512)
    right = []
    for order in range(8):
        em = OnlineEM(config)
        em.learn_many(blocks, order=np.random.default_rng(order).permutation(truth.size))
        em.orient()  # the pass's end, as crowdtally extract checks it
        q = em.predict_many(blocks).posteriors
        right.append(float(np.mean(q.argmax(axis=1) == truth)))
        assert em.params.population[0, 0] > em.params.population[0, 1]  # workers beat chance
        assert em.params.population[1, 1] > em.params.population[1, 0]
    assert min(right) > 0.55 and np.mean(right) > 0.65, right


def test_batch_em_with_a_strong_worker_prior_keeps_the_classes_the_right_way_round() -> None:
    """Pooled toward the population (lambda_A = 20), batch EM on weak workers reached the
    mirror image's fixed point (22.1% right on this crowd before the relabelling)."""
    blocks, truth, votes = weak_binary(0)
    config = NominalConfig(n_classes=2, n_items=float(truth.size), worker_prior=20.0)
    result, _ = BatchEM(config).fit(blocks, 300)
    right = np.mean(result.probas.argmax(axis=1) == truth)
    assert right > np.mean(votes == truth) - 0.05


def _random_params(rng: np.random.Generator, K: int, S: int) -> NominalParams:
    config = NominalConfig(n_classes=K, n_worker_slots=S)
    params = NominalParams.initial(config)
    params.class_logits[:] = rng.normal(size=K)
    params.population[:] = rng.normal(size=(K, K)) + 3.0 * np.eye(K)[np.roll(np.arange(K), 1)]
    params.worker[:] = rng.normal(scale=0.5, size=(S, K, K))
    assert params.counts is not None and params.sums is not None
    params.counts[:] = rng.random((S, K, K))
    params.sums[:] = rng.random(params.sums.size)
    return params


@pytest.mark.parametrize("K", [2, 3, 5])
def test_relabelling_keeps_the_likelihood_and_raises_the_prior(K: int) -> None:
    rng = np.random.default_rng(K)
    S = 16
    config = NominalConfig(n_classes=K, n_worker_slots=S)
    params = _random_params(rng, K, S)
    slots, labels = rng.integers(0, S, 400), rng.integers(0, K, 400)
    blocks = LabelBlocks.group(rng.integers(0, 40, 400), slots, labels, n_blocks=40)
    before = OnlineEM(config, params).predict_many(blocks)
    prior_before = config.log_prior(params.class_logits, params.population, params.worker)
    cost_before = np.trace(relabelling_costs(params, config))
    perm = best_relabelling(params, config)
    assert perm is not None  # the population's diagonal was put on a permutation
    counts, sums = params.counts.copy(), params.sums.copy()  # type: ignore[union-attr]
    relabel(params, perm)
    after = OnlineEM(config, params).predict_many(blocks)
    np.testing.assert_allclose(after.posteriors, before.posteriors[:, perm], atol=1e-12)
    np.testing.assert_allclose(after.objective, before.objective, rtol=1e-12)
    prior_after = config.log_prior(params.class_logits, params.population, params.worker)
    gain = cost_before - np.trace(relabelling_costs(params, config))
    assert gain > 0 and prior_after - prior_before == pytest.approx(gain, rel=1e-9)
    np.testing.assert_array_equal(params.counts, counts[:, perm])  # the statistics follow
    np.testing.assert_array_equal(params.sums[: K * K], sums[: K * K].reshape(K, K)[perm].ravel())
    np.testing.assert_array_equal(params.sums[K * K : K * K + K], sums[K * K : K * K + K][perm])
    np.testing.assert_array_equal(params.sums[K * K + K :], sums[K * K + K :])  # (counters)
    assert best_relabelling(params, config) is None  # no swap helps any more


def test_gold_anchors_the_classes() -> None:
    """A check point reached by a run with gold relabels nothing (gold's likelihood would
    change), nor does a check asked for on a model that learned gold."""
    rng = np.random.default_rng(1)
    config = NominalConfig(n_classes=2, n_worker_slots=8)
    params = _random_params(rng, 2, 8)
    params.population[:] = [[0.0, 2.0], [2.0, 0.0]]  # the mirror image
    params.scalars[STEP] = DENSE_EVERY - 1  # the next item reaches a check point
    blocks = LabelBlocks.group(np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64),
                               np.zeros(1, dtype=np.int64), n_blocks=1)  # fmt: skip
    em = OnlineEM(config, params)
    em.learn_many(blocks, known=np.array([0]))
    assert em.relabelled is None and em.params.population[0, 1] > em.params.population[0, 0]
    assert em.orient(anchored=True) is None
    perm = em.orient()
    assert perm is not None and list(perm) == [1, 0]


def test_check_points_depend_on_the_step_count_alone() -> None:
    """One call over n items or many calls over parts of them check at the same items."""
    whole = check_points(37, 20_000)
    parts, t = [], 37
    for n in (5, 300, 9_000, 10_695):
        parts += [t - 37 + k for k in check_points(t, n)]
        t += n
    assert parts == whole
    assert whole[:2] == [DENSE_EVERY - 37, 2 * DENSE_EVERY - 37]
    assert all((37 + k) % SPARSE_EVERY == 0 for k in whole if 37 + k > DENSE_UNTIL)


def test_a_stream_learned_in_one_call_or_many_ends_in_the_same_state() -> None:
    """Relabellings happen at the same items however the arrivals are grouped into calls, and
    the posteriors kept by the caller follow them: the same state either way."""
    blocks, truth, _ = weak_binary(0)
    config = NominalConfig(n_classes=2, n_items=float(truth.size), n_worker_slots=512)
    order = np.random.default_rng(5).permutation(truth.size)
    one = OnlineEM(config)
    whole = one.learn_many(blocks, order=order)
    many, kept = OnlineEM(config), np.full((truth.size, 2), 0.5)
    relabelled = False
    for lo in range(0, truth.size, 70):
        part = order[lo : lo + 70]
        out = many.learn_many(blocks, order=part)
        if (perm := many.relabelled) is not None:
            kept[:] = kept[:, perm]
            relabelled = True
        kept[part] = out.posteriors[part]
    assert relabelled
    np.testing.assert_array_equal(many.params.population, one.params.population)
    np.testing.assert_array_equal(many.params.worker, one.params.worker)
    np.testing.assert_array_equal(kept, whole.posteriors)
