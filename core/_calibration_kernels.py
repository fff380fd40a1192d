"""Numba kernels of the calibration layer (docs/model.md, "Calibrated posteriors", eq. 21-25).

Plain loops over int-coded label blocks, as in ``core._kernels``.
"""

from __future__ import annotations

import math

import numpy as np

from core._numba import invalidate_on_change, jit, jit_inline
from core._softmax_rows import softmax_row_quadratic
from core._vecmath import exp_all, log_all, normalise, padded


@jit
def _log_probs(population, worker, scale, s, l, out):
    """out[z] = log p(l | z, s) = log softmax(Gamma_z + scale A_{s,z})_l for every class z."""
    K = population.shape[0]
    for z in range(K):
        m = -np.inf
        for k in range(K):
            m = max(m, population[z, k] + scale * worker[s, z, k])
        acc = 0.0
        for k in range(K):
            acc += math.exp(population[z, k] + scale * worker[s, z, k] - m)
        out[z] = population[z, l] + scale * worker[s, z, l] - m - math.log(acc)


@jit
def prequential_block(
    lo, hi, n_prev, slots, labels, weights, log_prior, population, worker, scale, grid, evidence
):
    """Score each new label of one block against the labels before it (eq. 22).

    Labels ``lo .. lo + n_prev`` arrived earlier; each later label k is predicted from the
    item's tempered posterior over the labels before it (eq. 21), for every rho of ``grid``:
    evidence[g] += h_k log sum_z q_rho(z) p(l_k | z, s_k), and evidence[G] += h_k (the weight
    scored). Nothing is scored while an item has at most one answer before it (its
    prediction does not depend on rho then). Read-only on the parameters: call it before the item's update.
    """
    K = population.shape[0]
    probs = np.zeros((max(hi - lo, 1), K, K))
    logp = np.empty(max(hi - lo, 1) * K)
    lp = np.empty(K)
    for j in range(lo, hi):
        _log_probs(population, worker, scale, slots[j], labels[j], lp)
        for z in range(K):
            probs[j - lo, z, labels[j]] = math.exp(lp[z])
            logp[(j - lo) * K + z] = lp[z]
    prequential_scores(
        lo, hi, n_prev, labels, weights, log_prior, probs, logp, grid, evidence, 1.0,
        prequential_scratch(K, grid.shape[0]),
    )  # fmt: skip


@jit
def prequential_scratch(K, G):
    """Working rows for ``prequential_scores`` with K classes and G values of rho."""
    return np.ones((6, padded(max(G * K, K))))


@jit
def prequential_scores(
    lo, hi, n_prev, labels, weights, log_prior, probs, logp, grid, evidence, share, scratch
):  # fmt: skip
    """``prequential_block`` given probs[j - lo, z, l_j] = p(l_j | z, s_j) for the block's
    labels and logp[(j - lo) K + z] its log (the online E-step leaves them there: no second
    pass over the parameters); each score
    counts ``share`` times (the block stands for that many: eq. 22's sample). ``scratch``:
    ``prequential_scratch``'s rows, which a caller scoring many blocks allocates once."""
    K = log_prior.shape[0]
    G = grid.shape[0]
    x, e = scratch[0], scratch[1]  # (lq - m) / T for every rho and class, and its exp
    ratio, logs = scratch[2], scratch[3]  # each rho's predictive and its log
    ell, lq = scratch[4], scratch[5]
    for z in range(K):
        ell[z] = 0.0  # sum over earlier labels of h_j log p(l_j | z, s_j)
    seen = 0.0
    for j in range(lo, hi):
        h = weights[j]
        if h <= 0.0:
            continue
        r, lab = j - lo, labels[j]
        # with one answer before it (seen <= 1) every rho predicts alike: nothing to score
        if j >= lo + n_prev and seen > 1.0:
            m = -np.inf
            for z in range(K):
                lq[z] = log_prior[z] + ell[z]
                m = max(m, lq[z])
            for g in range(G):
                inv_t = 1.0 / (1.0 + grid[g] * (seen - 1.0))
                for z in range(K):
                    x[g * K + z] = (lq[z] - m) * inv_t
            exp_all(x, e, x.shape[0])
            for g in range(G):
                norm = 0.0
                pred = 0.0
                for z in range(K):
                    norm += e[g * K + z]
                    pred += e[g * K + z] * probs[r, z, lab]
                # (floored as the scores were: exp is 0 below -708, where a label's every
                # class can put it; its log would make the sum -inf for good)
                ratio[g] = max(pred / norm, 1e-300)
            log_all(ratio, logs, padded(G))
            for g in range(G):
                evidence[g] += share * h * logs[g]
            evidence[G] += share * h
        for z in range(K):
            ell[z] += h * logp[r * K + z]
        seen += h


@jit
def prequential_blocks(
    ptr, order, n_old, slots, labels, weights, log_prior, population, worker, scale, grid, evidence
):
    """``prequential_block`` for each block of ``order`` at fixed parameters."""
    for b in order:
        prequential_block(
            ptr[b], ptr[b + 1], n_old[b], slots, labels, weights, log_prior,
            population, worker, scale, grid, evidence,
        )  # fmt: skip


@jit
def item_log_likelihoods(ptr, slots, labels, weights, population, worker, scale, ell, n):
    """ell[b, z] = sum_j h_j log p(l_j | z, s_j) and n[b] = sum_j h_j over block b's labels."""
    K = population.shape[0]
    lp = np.empty(K)
    for b in range(ptr.shape[0] - 1):
        for z in range(K):
            ell[b, z] = 0.0
        n[b] = 0.0
        for j in range(ptr[b], ptr[b + 1]):
            h = weights[j]
            if h <= 0.0:
                continue
            _log_probs(population, worker, scale, slots[j], labels[j], lp)
            for z in range(K):
                ell[b, z] += h * lp[z]
            n[b] += h


@jit_inline
def _population_pull(l, c, p, lam, g_ll, gu, ugu, up, beta):
    """lam^2 x^T G_z x for x = S (e_l - p), S the row's covariance (eq. 26'): x = e_l / a_l +
    c_l u with c_l = beta (u_l - u^T p) - 1, so x^T G x = G_ll / a_l^2 + 2 c_l (G u)_l / a_l +
    c_l^2 u^T G u."""
    a_l = c * p[l] + lam
    c_l = beta * (p[l] / a_l - up) - 1.0
    return lam * lam * (g_ll / (a_l * a_l) + 2.0 * c_l * gu[l] / a_l + c_l * c_l * ugu)


@jit
def held_out_corrections(
    ptr, rows, labels, weights, q, totals, probs, lam, population_cov, terms, excess, out
):
    """Eq. 26: out[b, z] = sum_j h_j^2 q_b(z) (e_l - p)^T V (e_l - p) over block b's labels,
    for row z of the label's slot r_j: C = totals[r_j, z], p = probs[r_j, z], D = diag p -
    p p^T, V = S + lam^2 S G_z S with S = ((C - h_j q_b(z)) D + lam I)^-1 (the row without the
    label) in its first term and the whole row's in its second, G_z = ``population_cov[z]``
    (eq. 26'; ``terms`` = (gu, ugu, up, beta) of ``core.served.population_pull``; a huge
    lambda_Gamma there holds Gamma); plus sum_j h_j excess[r_j, z, l_j] when ``excess`` has rows
    (eq. 27: log p - log p~ of each row's labels)."""
    K = q.shape[1]
    laplace = excess.shape[0] > 0
    gu, ugu, up, beta = terms
    v = np.empty(K)  # e_l - p
    for b in range(ptr.shape[0] - 1):
        for z in range(K):
            out[b, z] = 0.0
        for j in range(ptr[b], ptr[b + 1]):
            h = weights[j]
            if h <= 0.0:
                continue
            r, l = rows[j], labels[j]
            for z in range(K):
                pull = h * q[b, z]
                without = max(totals[r, z] - pull, 0.0)  # the row's weight without the label
                p = probs[r, z]
                for k in range(K):
                    v[k] = -p[k]
                v[l] += 1.0
                leverage = softmax_row_quadratic(without, p, lam, v)  # O(K): no K x K inverse
                leverage += _population_pull(
                    l, totals[r, z], p, lam, population_cov[z, l, l], gu[r, z], ugu[r, z],
                    up[r, z], beta[r, z],
                )  # fmt: skip
                out[b, z] += h * pull * leverage
                if laplace:
                    out[b, z] += h * excess[r, z, l]


@jit
def laplace_root(p, c, lam, inv_root, v):
    """A square root L of a confusion row's Laplace covariance S = (C D + lambda I)^-1, D =
    diag p - p p^T (eq. 27), in O(K): fills inv_root = a^-1/2 and v = p / a, a = C p + lambda,
    and returns gamma, so that L e_k = inv_root_k e_k + gamma u_k v with u = p inv_root.

    S^-1 = diag(a) - C p p^T (diagonal minus rank one), so by Sherman-Morrison
    S = A^-1/2 (I + beta u u^T) A^-1/2 with beta = C / (1 - C u^T u), where
    1 - C u^T u = lambda sum_k p_k / a_k > 0 (taken in that form: as a difference it cancels
    for rows of many answers), and L = A^-1/2 (I + gamma u u^T), gamma = beta / (1 +
    sqrt(1 + beta u^T u)), is its symmetric square root."""
    uu = 0.0
    rest = 0.0  # 1 - C u^T u
    for k in range(p.shape[0]):
        a = c * p[k] + lam
        inv_root[k] = 1.0 / math.sqrt(a)
        v[k] = p[k] / a
        uu += p[k] * v[k]
        rest += lam * v[k]
    beta = c / rest
    return beta / (1.0 + math.sqrt(1.0 + beta * uu))


@jit
def laplace_predictive_rows(theta, totals, lam, out):
    """Eq. 27 for confusion rows ``theta`` (rows, K) of weights ``totals`` (rows,): out[r] is
    E[softmax(theta_r + e)], e ~ N(0, S), by the unscented transform over the 2K points
    theta_r +- sqrt(K) L e_k, L the square root of ``laplace_root``: O(K) a direction, O(K^2) a
    row, where an eigendecomposition of D cost O(K^3). The points match the mean and
    covariance of e (the all-ones direction, along which softmax does not move, included)."""
    R, K = theta.shape
    p = np.empty(K)
    inv_root = np.empty(K)
    v = np.empty(K)
    step = np.empty(K)
    point = np.empty(K)
    root_k = math.sqrt(K)
    for r in range(R):
        normalise(theta[r], p)
        gamma = laplace_root(p, totals[r], lam, inv_root, v)
        out[r] = 0.0
        for k in range(K):  # step = sqrt(K) L e_k
            g = root_k * gamma * p[k] * inv_root[k]
            for j in range(K):
                step[j] = g * v[j]
            step[k] += root_k * inv_root[k]
            for sign in (1.0, -1.0):
                for j in range(K):
                    point[j] = theta[r, j] + sign * step[j]
                normalise(point, point)
                for j in range(K):
                    out[r, j] += point[j]
        for j in range(K):
            out[r, j] /= 2.0 * K


# (one call a module: each writes the record of the files its kernels call)
invalidate_on_change(
    held_out_corrections, softmax_row_quadratic, exp_all, log_all, normalise, padded
)
