"""The Newton system of one softmax row, solved in O(K) (docs/model.md eq. 13 and 26).

A row's negative Hessian under its Gaussian prior, c (diag p - p p^T) + lam I, is diagonal
minus rank one: batch EM's M-step, the online revisits' row steps and the held-out
corrections all solve with it, and a K x K factorisation per row (K^3) was most of their time
and memory with many classes.
"""

from __future__ import annotations

from core._numba import jit, jit_inline


@jit
def softmax_row_den(c, p, lam):  # type: ignore[no-untyped-def]
    """1 - c p^T A^-1 p for A = diag(c p + lam) (``solve_softmax_row``'s denominator), taken as
    lam sum_k p_k / (c p_k + lam) + 1 - sum_k p_k, not by a subtraction that cancels: where
    c p_k >> lam it is small, so its 1 - sum_k p_k (0 but for rounding) is taken exactly
    enough, 1 minus the largest p_k first (exact when that is at least 1/2), then the others."""
    spread = 0.0  # sum_k p_k / a_k
    for k in range(p.shape[0]):
        spread += p[k] / (c * p[k] + lam)
    return _den(p, lam, spread)


@jit_inline
def _den(p, lam, spread):  # type: ignore[no-untyped-def]
    """``softmax_row_den`` given its spread, sum_k p_k / a_k."""
    K = p.shape[0]
    top = 0
    for k in range(1, K):
        if p[k] > p[top]:
            top = k
    residue = 1.0 - p[top]  # 1 - sum_k p_k
    for k in range(K):
        if k != top:
            residue -= p[k]
    den = lam * spread + residue
    return den if den > 0.0 else lam * spread


@jit
def softmax_row_quadratic(c, p, lam, v):  # type: ignore[no-untyped-def]
    """v^T (c (diag p - p p^T) + lam I)^-1 v without solving for the vector: with a_k =
    c p_k + lam, Sherman-Morrison gives sum_k v_k^2 / a_k + c (sum_k p_k v_k / a_k)^2 / den,
    den = ``softmax_row_den`` (eq. 26's leverage). A sum of non-negative terms, K divisions."""
    squares = 0.0  # sum_k v_k^2 / a_k
    along = 0.0  # sum_k p_k v_k / a_k
    spread = 0.0  # sum_k p_k / a_k
    for k in range(p.shape[0]):
        inv = 1.0 / (c * p[k] + lam)
        squares += v[k] * v[k] * inv
        along += p[k] * v[k] * inv
        spread += p[k] * inv
    return squares + c * along * along / _den(p, lam, spread)


@jit
def solve_softmax_row(c, p, lam, rhs, out):  # type: ignore[no-untyped-def]
    """Solve (c (diag p - p p^T) + lam I) x = rhs, the negative Hessian of a softmax row with
    weight c >= 0 under its N(0, 1/lam) prior (eq. 13), in O(K): row k reads
    c p_k (x_k - t) + lam x_k = rhs_k with t = p^T x, so x_k = t + (rhs_k - lam t) / a_k with
    a_k = c p_k + lam, and t = (sum_k p_k rhs_k / a_k) / ``softmax_row_den`` (Sherman-Morrison).
    A Cholesky solve of the K x K matrix costs K^3 / 3: 300,000 flops a row at 100 classes."""
    K = p.shape[0]
    along = 0.0  # sum_k p_k rhs_k / a_k
    for k in range(K):
        along += p[k] * rhs[k] / (c * p[k] + lam)
    t = along / softmax_row_den(c, p, lam)
    for k in range(K):
        out[k] = t + (rhs[k] - lam * t) / (c * p[k] + lam)


@jit
def solve_softmax_rows(c, p, lam, rhs, out):  # type: ignore[no-untyped-def]
    """``solve_softmax_row`` for each row i: weight c[i], confusion p[i], right side rhs[i]."""
    for i in range(c.shape[0]):
        solve_softmax_row(c[i], p[i], lam, rhs[i], out[i])


@jit
def softmax_rows_den(c, p, lam, out):  # type: ignore[no-untyped-def]
    """``softmax_row_den`` for each row i: out[i] for weight c[i] and confusion p[i]."""
    for i in range(c.shape[0]):
        out[i] = softmax_row_den(c[i], p[i], lam)
