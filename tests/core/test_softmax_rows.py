"""A softmax row's Newton system, c (diag p - p p^T) + lam I, solved in O(K) (Sherman-Morrison),
is the dense solve, and its quadratic form v^T H^-1 v (eq. 26's leverage) the dense one; batch
EM's M-step from the soft counts is the one through the dense
(W, K, K, K) Hessians it replaces."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from core import _kernels
from core._softmax_rows import softmax_row_quadratic, solve_softmax_row

ROWS = given(
    st.integers(2, 40),
    st.floats(0.0, 1e5),
    st.floats(1e-3, 1e3),
    st.floats(0.05, 5.0),
    st.integers(0, 2**32 - 1),
)
"""A row: K classes, its weight c, the prior's lam, how concentrated p is, a seed."""


def _row(
    K: int, c: float, lam: float, concentration: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """A confusion row p and its dense negative Hessian c (diag p - p p^T) + lam I, the
    diagonal built as p_k (1 - p_k), without cancelling."""
    p = rng.dirichlet(np.full(K, concentration))
    p = np.maximum(p, 1e-300)
    p /= p.sum()
    dense = -c * np.outer(p, p)
    dense[np.diag_indices(K)] = c * p * (1.0 - p) + lam
    return p, dense


@settings(max_examples=200, deadline=None)
@ROWS
def test_the_rows_solve_is_the_dense_solve(
    K: int, c: float, lam: float, concentration: float, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    p, dense = _row(K, c, lam, concentration, rng)
    rhs = rng.normal(size=K)
    got = np.empty(K)
    solve_softmax_row(c, p, lam, rhs, got)
    # backward stable: the residual is rounding's, relative to |H| |x| + |rhs| (the system's
    # condition, up to c / lam, makes the solution itself only that accurate)
    scale = np.abs(dense) @ np.abs(got) + np.abs(rhs)
    assert np.all(np.abs(dense @ got - rhs) <= 1e-12 * K * scale)
    if c / lam < 1e6:
        assert np.allclose(got, np.linalg.solve(dense, rhs), rtol=1e-6, atol=1e-9)


@settings(max_examples=200, deadline=None)
@ROWS
def test_the_rows_quadratic_form_is_the_dense_one(
    K: int, c: float, lam: float, concentration: float, seed: int
) -> None:
    """v = e_l - p, as eq. 26 takes it: v^T H^-1 v from the K-division formula, against the
    dense solve's and against v . x from ``solve_softmax_row``."""
    rng = np.random.default_rng(seed)
    p, dense = _row(K, c, lam, concentration, rng)
    v = -p
    v[rng.integers(K)] += 1.0
    got = softmax_row_quadratic(c, p, lam, v)
    assert got >= 0.0
    x = np.empty(K)
    solve_softmax_row(c, p, lam, v, x)
    assert np.isclose(got, float(v @ x), rtol=1e-9, atol=1e-12 / lam)
    if c / lam < 1e6:
        assert np.isclose(got, float(v @ np.linalg.solve(dense, v)), rtol=1e-6, atol=1e-9)


def dense_rows(
    counts: np.ndarray, population: np.ndarray, worker: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Each row's data gradient N - C p and negative Hessian C (diag p - p p^T) (eq. 12), whole:
    a (W, K, K, K) table."""
    theta = population[None] + worker
    p = np.exp(theta - theta.max(axis=2, keepdims=True))
    p /= p.sum(axis=2, keepdims=True)
    c = counts.sum(axis=2)[..., None]
    neg_hess = c[..., None] * (
        p[..., :, None] * np.eye(p.shape[2]) - p[..., :, None] * p[..., None, :]
    )
    return counts - c * p, neg_hess


def test_the_m_step_from_counts_is_the_one_through_dense_hessians() -> None:
    rng = np.random.default_rng(7)
    W, K, lam_a, lam_g = 30, 7, 1.0, 0.1
    counts = rng.gamma(0.5, 2.0, size=(W, K, K)) * (rng.random((W, K, 1)) < 0.8)
    population = 1.75 * np.eye(K) + rng.normal(0, 0.3, (K, K))
    worker = rng.normal(0, 0.5, (W, K, K))
    mean = 1.75 * np.eye(K)
    dense_pop, dense_worker = population.copy(), worker.copy()
    _kernels.newton_population(dense_pop, mean, *dense_rows(counts, dense_pop, dense_worker), lam_g)
    _kernels.newton_workers(dense_worker, *dense_rows(counts, dense_pop, dense_worker), lam_a)
    _kernels.newton_population_from_counts(counts, population, worker, mean, lam_g)
    _kernels.newton_workers_from_counts(counts, population, worker, lam_a)
    assert np.allclose(population, dense_pop, rtol=0, atol=1e-10)
    assert np.allclose(worker, dense_worker, rtol=0, atol=1e-10)
    assert not np.allclose(worker, 0.0)  # (the step moved the rows)
