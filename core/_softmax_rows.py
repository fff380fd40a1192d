"""The Newton system of one softmax row, solved in O(K) (docs/model.md eq. 13 and 26).

A row's negative Hessian under its Gaussian prior, c (diag p - p p^T) + lam I, is diagonal
minus rank one: batch EM's M-step, the online revisits' row steps and the held-out
corrections all solve with it, and a K x K factorisation per row (K^3) was most of their time
and memory with many classes.
"""

from __future__ import annotations

from core._numba import jit


@jit
def solve_softmax_row(c, p, lam, rhs, out):  # type: ignore[no-untyped-def]
    """Solve (c (diag p - p p^T) + lam I) x = rhs, the negative Hessian of a softmax row with
    weight c >= 0 under its N(0, 1/lam) prior (eq. 13), in O(K): row k reads
    c p_k (x_k - t) + lam x_k = rhs_k with t = p^T x, so x_k = t + (rhs_k - lam t) / a_k with
    a_k = c p_k + lam, and t = (sum_k p_k rhs_k / a_k) / (lam sum_k p_k / a_k + 1 - sum_k p_k)
    (Sherman-Morrison). Where c p_k >> lam the denominator is small, so its 1 - sum_k p_k (0
    but for rounding) is taken exactly enough: 1 minus the largest p_k first (exact when that
    is at least 1/2), then the others. A Cholesky solve of the K x K matrix costs K^3 / 3:
    300,000 flops a row at 100 classes."""
    K = p.shape[0]
    top = 0
    for k in range(1, K):
        if p[k] > p[top]:
            top = k
    along = 0.0  # sum_k p_k rhs_k / a_k
    spread = 0.0  # sum_k p_k / a_k
    residue = 1.0 - p[top]  # 1 - sum_k p_k
    for k in range(K):
        a = c * p[k] + lam
        along += p[k] * rhs[k] / a
        spread += p[k] / a
        if k != top:
            residue -= p[k]
    den = lam * spread + residue
    if den <= 0.0:
        den = lam * spread
    t = along / den
    for k in range(K):
        out[k] = t + (rhs[k] - lam * t) / (c * p[k] + lam)
