"""Trust-region Newton passes on F (docs/model.md, "Later passes by trust-region Newton")."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core import newton
from core.batch import BatchEM
from core.blocks import LabelBlocks
from core.newton import _Curvature, _evaluate, _Layout, newton_passes, steihaug
from core.nominal import NominalConfig, NominalParams

from ..conftest import Synthetic
from .test_batch import sparse_blocks


def problem(
    synthetic: Synthetic, per_item: int = 3
) -> tuple[NominalConfig, LabelBlocks, NominalParams]:
    """A sparse set (few labels per item: much missing information) and a rough start."""
    cfg = NominalConfig(n_classes=3, n_worker_slots=40, n_items=3000.0)
    blocks = sparse_blocks(synthetic, per_item)
    rng = np.random.default_rng(1)
    start = NominalParams(
        cfg.class_prior_logits() + 0.3 * rng.standard_normal(3),
        cfg.population_mean() + 0.3 * rng.standard_normal((3, 3)),
        0.5 * rng.standard_normal((40, 3, 3)),
    )
    return cfg, blocks, start


def objective_and_gradient(
    cfg: NominalConfig, blocks: LabelBlocks, layout: _Layout, x: np.ndarray
) -> tuple[float, _Curvature]:
    known = np.full(blocks.n_blocks, -1, dtype=np.int64)
    (f,), q = _evaluate(blocks, layout, cfg, known, [x])
    return f, _Curvature(blocks, layout, cfg, x, q[0])


def test_gradient_and_hessian_match_finite_differences(synthetic: Synthetic) -> None:
    cfg, blocks, start = problem(synthetic)
    layout = _Layout(3, 40)
    x = layout.pack(start)
    _, curv = objective_and_gradient(cfg, blocks, layout, x)
    rng = np.random.default_rng(2)
    v = rng.standard_normal(x.size)
    eps = 1e-5
    f_plus, c_plus = objective_and_gradient(cfg, blocks, layout, x + eps * v)
    f_minus, c_minus = objective_and_gradient(cfg, blocks, layout, x - eps * v)
    # eq. 17: the gradient of the observed-data F (the envelope of the E-step)
    assert curv.gradient @ v == pytest.approx((f_plus - f_minus) / (2 * eps), rel=1e-6)
    # eq. 18: -Hessian v = (B + prior) v - (missing information) v
    numeric = -(c_plus.gradient - c_minus.gradient) / (2 * eps)
    np.testing.assert_allclose(curv.neg_hessian(v), numeric, rtol=1e-5, atol=1e-5)
    # the preconditioner inverts (B + prior)
    np.testing.assert_allclose(curv.precondition(curv.information(v)), v, rtol=1e-8, atol=1e-8)


def test_steihaug_stays_in_the_region_and_the_model_rises(synthetic: Synthetic) -> None:
    cfg, blocks, start = problem(synthetic)
    layout = _Layout(3, 40)
    _, curv = objective_and_gradient(cfg, blocks, layout, layout.pack(start))
    radii = (0.1, 1.0, 10.0, 1e6)
    for radius, d in zip(radii, steihaug(curv, radii), strict=True):
        assert curv.norm(d) <= radius * (1 + 1e-9)
        # one CG run for all radii gives what a run for this radius alone gives
        np.testing.assert_array_equal(d, steihaug(curv, (radius,))[0])
        model_gain = curv.gradient @ d - 0.5 * d @ curv.neg_hessian(d)
        assert model_gain > 0


def test_newton_passes_never_lower_f_and_reach_the_batch_optimum(synthetic: Synthetic) -> None:
    cfg, blocks, start = problem(synthetic)
    batch, _ = BatchEM(cfg, tol=1e-10, max_iter=5000).improve(blocks, 40, start)
    layout = _Layout(3, 40)
    f_batch, _ = objective_and_gradient(cfg, blocks, layout, layout.pack(batch))
    result = newton_passes(cfg, blocks, start, 12)
    assert np.all(np.diff(result.objective) >= 0)
    assert result.objective[-1] == pytest.approx(f_batch, abs=1e-6 * abs(f_batch))
    batch_q = objective_and_gradient(cfg, blocks, layout, layout.pack(batch))[1].q
    assert np.array_equal(result.posteriors.argmax(1), batch_q.argmax(1))


def test_a_step_makes_at_most_the_capped_number_of_missing_information_products(
    synthetic: Synthetic, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each M v product is a pass over the labels: a sweep's work is bounded (eq. 19-20)."""
    cfg, blocks, start = problem(synthetic)
    layout = _Layout(3, 40)
    near = newton_passes(cfg, blocks, start, 3).params  # where F is concave: CG runs long
    _, curv = objective_and_gradient(cfg, blocks, layout, layout.pack(near))
    products = 0
    neg_hessian = curv.neg_hessian

    def counted(v: np.ndarray) -> np.ndarray:
        nonlocal products
        products += 1
        return neg_hessian(v)

    monkeypatch.setattr(curv, "neg_hessian", counted)
    monkeypatch.setattr(newton, "_CG_MAX_ITER", 1000)
    steihaug(curv, (1e6,))
    uncapped, products = products, 0
    assert uncapped > 8, uncapped  # this point needs more iterations than the cap allows
    monkeypatch.setattr(newton, "_CG_MAX_ITER", 8)
    capped = steihaug(curv, (1e6,))[0]
    assert products == 8
    assert curv.gradient @ capped - 0.5 * capped @ neg_hessian(capped) > 0


def test_a_stationary_point_takes_no_step(synthetic: Synthetic) -> None:
    cfg, blocks, start = problem(synthetic)
    layout = _Layout(3, 40)
    _, curv = objective_and_gradient(cfg, blocks, layout, layout.pack(start))
    curv.gradient = np.zeros_like(curv.gradient)
    assert all(not d.any() for d in steihaug(curv, (1.0, 2.0)))


def test_newton_passes_are_deterministic_and_hold_known_items(synthetic: Synthetic) -> None:
    cfg, blocks, start = problem(synthetic)
    known = np.full(blocks.n_blocks, -1, dtype=np.int64)
    known[:30] = (synthetic.truth[:30] + 1) % 3  # deliberately wrong gold
    a = newton_passes(cfg, blocks, start, 4, known)
    b = newton_passes(cfg, blocks, start, 4, known)
    assert a.params.equals(b.params) and np.array_equal(a.posteriors, b.posteriors)
    assert np.array_equal(a.posteriors[:30].argmax(1), known[:30])
    assert np.allclose(a.posteriors[:30].max(1), 1.0)


def test_newton_passes_refuse_difficulty(synthetic: Synthetic) -> None:
    _, blocks, start = problem(synthetic)
    with pytest.raises(ValueError, match="difficulty"):
        newton_passes(
            NominalConfig(n_classes=3, n_worker_slots=40, difficulty=True), blocks, start, 2
        )


@settings(max_examples=25, deadline=None)
@given(
    n_classes=st.integers(2, 4),
    n_workers=st.integers(2, 6),
    n_items=st.integers(5, 40),
    seed=st.integers(0, 2**16),
)
def test_sweeps_never_lower_f_on_any_data(
    n_classes: int, n_workers: int, n_items: int, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    per_item = rng.integers(1, 5, size=n_items)
    items = np.repeat(np.arange(n_items), per_item)
    blocks = LabelBlocks.group(
        items, rng.integers(0, n_workers, items.size), rng.integers(0, n_classes, items.size)
    )
    cfg = NominalConfig(n_classes=n_classes, n_worker_slots=n_workers, n_items=float(n_items))
    K = n_classes
    start = NominalParams(
        rng.standard_normal(K), cfg.population_mean() + rng.standard_normal((K, K)),
        rng.standard_normal((n_workers, K, K)),
    )  # fmt: skip
    result = newton_passes(cfg, blocks, start, 5)
    assert np.all(np.diff(result.objective) >= 0)
    np.testing.assert_allclose(result.posteriors.sum(axis=1), 1.0, rtol=1e-12)
    assert np.all(np.isfinite(result.params.worker))
