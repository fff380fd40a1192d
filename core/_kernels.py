"""Numba kernels of the nominal model: per-item EM, the online global step, batch EM steps.

Plain loops over int-coded arrays, writing into caller-owned outputs. Labels are grouped by
block: block ``b`` owns entries ``ptr[b]:ptr[b+1]`` of ``slots``, ``labels``, ``weights``.
Equation numbers refer to docs/model.md.
"""

from __future__ import annotations

import math

import numpy as np

from core._calibration_kernels import prequential_scores, prequential_scratch
from core._numba import invalidate_on_change, jit, jit_inline
from core._softmax_rows import solve_softmax_row
from core._vecmath import exp_all, log, log_all, normalise, padded

# Layout of the hyperparameter vector built by NominalConfig.hyper_vector().
(
    H_ETA0,
    H_TAU0,
    H_RHO,
    H_NITEMS,
    H_LAM_A,
    H_LAM_G,
    H_LAM_PI,
    H_DIFF,
    H_LAM_B,
    H_TOL,
    H_MAXIT,
    H_RATE_G,
    H_RATE_PI,
) = range(13)
SCALE, STEP = 0, 1
_RESCALE_BELOW = 1e-100
_MAX_NEWTON_STEP = 1.0  # trust region of the M-step: no logit moves more than this per step
_MAX_PRIOR_SHRINK = 0.5
_MAX_LABEL_STEP = 1.0
LOG_WEIGHT_SPAN = math.log(1000.0)  # the mean weight's logs, each within 1/1000 to 1000


@jit_inline
def _logsumexp(x):
    m = -np.inf
    for v in x:
        m = max(m, v)
    if m == -np.inf:
        return m
    acc = 0.0
    for v in x:
        acc += math.exp(v - m)
    return m + math.log(acc)


@jit_inline
def _theta(population, worker, scale, s, z, theta):
    """theta = Gamma[z] + A_s[z]: slot s's logits for true class z (eq. 1)."""
    for k in range(theta.shape[0]):
        theta[k] = population[z, k] + scale * worker[s, z, k]


@jit_inline
def _softmax_scaled(theta, d, p):
    """p = softmax(d * theta); returns (m, log sum_k exp(d theta_k - m)) with m = max_k d theta_k.

    Their sum is logsumexp(d * theta); they are returned apart so that a caller taking one
    log probability, d theta_l - m - log(...), rounds as it always has.
    """
    m = -np.inf
    for k in range(theta.shape[0]):
        m = max(m, d * theta[k])
    acc = 0.0
    for k in range(theta.shape[0]):
        e = math.exp(d * theta[k] - m)
        p[k] = e
        acc += e
    for k in range(theta.shape[0]):
        p[k] /= acc
    return m, math.log(acc)


@jit_inline
def _exp_rows(population, worker, scale, s, d, x, e, top):
    """Slot s's K rows shifted and exponentiated together: x[z K + k] = d theta_zk - m_z
    (theta of eq. 1, m_z = max_k d theta_zk, as ``_softmax_scaled`` shifts a row; m_z into
    top[z]) and e = exp(x) (``exp_all``; ``x``, ``e`` of length ``padded(K * K)``, zeros past
    K * K). The learning E-step and the prediction both read a row's softmax from here, so
    they agree bit for bit."""
    K = population.shape[0]
    for z in range(K):
        m = -np.inf
        for k in range(K):
            v = d * (population[z, k] + scale * worker[s, z, k])
            x[z * K + k] = v
            m = max(m, v)
        for k in range(K):
            x[z * K + k] -= m
        top[z] = m
    exp_all(x, e, x.shape[0])


@jit_inline
def _row_sum(e, z, K):
    """sum_k exp(d theta_zk - m_z) of row z from ``_exp_rows``, in the order
    ``_softmax_scaled`` sums."""
    acc = 0.0
    for k in range(K):
        acc += e[z * K + k]
    return acc


@jit
def _log_joint(
    lo, hi, slots, labels, weights, class_logits, lse_pi, population, worker, scale, d, logq, x,
    e, probs, rows,
):  # fmt: skip
    """logq[z] = log pi_z + sum_j h_j log p(l_j | z, s_j, d)   (eq. 3).

    Also leaves p(. | z, s_j, d) in probs[j - lo, z] for the gradient (eq. 7) to reuse. A
    label's K rows come from ``_exp_rows`` (``_softmax_scaled``'s exps are libm's: the sums
    agree with its to an ulp or so; the probabilities are multiplied by the sum's
    reciprocal, not divided by it). The item's row sums go to rows[0] and their logs
    (``log_all``, once for every label) to rows[2]; rows[1] ends with log p(l_j | z, s_j, d)
    at [(j - lo) K + z], which the prequential scores read; rows[3] holds the rows' maxima
    (``rows`` 4 x ``padded(K * max labels)``; past an item's values, whatever an earlier item
    left, finite and never read).
    """
    K = logq.shape[0]
    for z in range(K):
        logq[z] = class_logits[z] - lse_pi  # (lse_pi = _logsumexp(class_logits))
    sums, picked, logs, top = rows[0], rows[1], rows[2], rows[3]
    for j in range(lo, hi):
        r = j - lo
        l = labels[j]
        _exp_rows(population, worker, scale, slots[j], d, x, e, top)
        for z in range(K):
            acc = _row_sum(e, z, K)
            inv = 1.0 / acc
            for k in range(K):
                probs[r, z, k] = e[z * K + k] * inv
            sums[r * K + z] = acc
            picked[r * K + z] = x[z * K + l]
    log_all(sums, logs, padded((hi - lo) * K))
    for j in range(lo, hi):
        r, h = j - lo, weights[j]
        for z in range(K):
            picked[r * K + z] -= logs[r * K + z]  # log p(l_j | z, s_j, d)
            logq[z] += h * picked[r * K + z]


@jit
def _clarity_derivatives(lo, hi, slots, labels, weights, population, worker, scale, d, q, theta, p):
    """First and second derivative in b = log d of E_q[sum_j h_j log p(l_j|z,s_j,d)] (eq. 6)."""
    K = q.shape[0]
    g = 0.0
    hess = 0.0
    for j in range(lo, hi):
        s, l, h = slots[j], labels[j], weights[j]
        for z in range(K):
            _theta(population, worker, scale, s, z, theta)
            _softmax_scaled(theta, d, p)
            mean = 0.0
            second = 0.0
            for k in range(K):
                mean += p[k] * theta[k]
                second += p[k] * theta[k] * theta[k]
            u = theta[l] - mean
            var = second - mean * mean
            c = h * q[z]
            g += c * d * u
            hess += c * (d * u - d * d * var)
    return g, hess


@jit
def _item_em(
    lo,
    hi,
    slots,
    labels,
    weights,
    class_logits,
    lse_pi,
    population,
    worker,
    scale,
    hyper,
    b0,
    logq,
    q,
    theta,
    p,
    probs,
    x,
    e,
    rows,
):
    """Maximise F_i over q_i (and b_i) with the global parameters fixed (eq. 4-6).

    Returns (b_i, F_i) with F_i the item's log marginal likelihood plus log P(b_i), the
    value progressive validation reports. Without difficulty one E-step is exact.
    """
    if hyper[H_DIFF] == 0.0:
        _log_joint(
            lo,
            hi,
            slots,
            labels,
            weights,
            class_logits,
            lse_pi,
            population,
            worker,
            scale,
            1.0,
            logq,
            x,
            e,
            probs,
            rows,
        )
        return 0.0, normalise(logq, q)
    lam_b = hyper[H_LAM_B]
    b = b0
    for _ in range(int(hyper[H_MAXIT])):
        d = math.exp(b)
        _log_joint(
            lo, hi, slots, labels, weights, class_logits, lse_pi, population, worker, scale, d,
            logq, x, e, probs, rows,
        )  # fmt: skip
        normalise(logq, q)
        g, hess = _clarity_derivatives(
            lo, hi, slots, labels, weights, population, worker, scale, d, q, theta, p
        )
        g -= lam_b * b
        hess -= lam_b
        # Newton where F_i is locally concave in b, a plain gradient step elsewhere; clipped.
        step = -g / hess if hess < 0.0 else g
        step = min(1.0, max(-1.0, step))
        b += step
        if abs(step) < hyper[H_TOL]:
            break
    d = math.exp(b)
    _log_joint(
        lo, hi, slots, labels, weights, class_logits, lse_pi, population, worker, scale, d,
        logq, x, e, probs, rows,
    )  # fmt: skip
    return b, normalise(logq, q) - 0.5 * lam_b * b * b


# The global step's parts below are inlined into learn_blocks: called once per item each, with
# a dozen arrays as arguments, they cost about a seventh of a first pass (1M answers, K = 5).
@jit_inline
def _label_gradients(
    lo,
    hi,
    n_old,
    slots,
    labels,
    weights,
    population,
    worker,
    scale,
    q_new,
    d_new,
    q_old,
    d_old,
    theta,
    p,
    probs,
    grad,
):
    """grad[j-lo, z, :] = the change of label j's contribution to dF_i/dTheta_{s_j}[z] (eq. 7-8).

    New labels contribute h q(z) d (e_l - p). Labels already applied in an earlier arrival of
    the item contribute only the difference between their contribution under the new
    (q, d) and under the old one, so each label counts once in the global updates.
    ``probs`` holds p(. | z, s_j, d_new) from the item's E-step.
    """
    K = q_new.shape[0]
    for j in range(lo, hi):
        r = j - lo
        s, l, h = slots[j], labels[j], weights[j]
        for z in range(K):
            c = h * q_new[z] * d_new
            for k in range(K):
                grad[r, z, k] = -c * probs[r, z, k]
            grad[r, z, l] += c
            if r < n_old:
                if d_old != d_new:
                    _theta(population, worker, scale, s, z, theta)
                    _softmax_scaled(theta, d_old, p)
                else:
                    for k in range(K):
                        p[k] = probs[r, z, k]
                c_old = h * q_old[z] * d_old
                for k in range(K):
                    grad[r, z, k] += c_old * p[k]
                grad[r, z, l] -= c_old


@jit_inline
def _mean_weight(sums, K):
    """The geometric mean weight of the labels learned so far (1 before any), each weight
    taken within 1/1000 to 1000: the labels' gradient steps are per label of that weight
    (eq. 9'), so that weights on a scale of their own step as weights of 1 do; one label far
    heavier or lighter than the rest hardly moves it."""
    kk = K * K
    logs, n = sums[kk + K + 4], sums[kk + K + 3]
    return math.exp(logs / n) if logs != 0.0 else 1.0  # (no logs: every weight 1, or none)


@jit_inline
def _step_factor(grad, first, last, z, eta):
    """1, or less where the rows first..last of one slot would move a logit of its row z by
    more than _MAX_LABEL_STEP in one item's step: then the rows are scaled down together
    (eq. 10'). A label of the mean weight moves a logit by eta_t <= 0.95 at the default
    settings and is not scaled; an answer given 5 times to one item stepped 5 times as far,
    and such steps flipped the workers' rows early on (one pass over dog: 15% right)."""
    largest = 0.0
    for k in range(grad.shape[2]):
        total = 0.0
        for r in range(first, last):
            total += grad[r, z, k]
        largest = max(largest, abs(total))
    if eta * largest <= _MAX_LABEL_STEP:
        return 1.0
    return _MAX_LABEL_STEP / (eta * largest)


@jit_inline
def _global_step(
    lo,
    hi,
    first_arrival,
    slots,
    weights,
    clarity,
    class_logits,
    class_mean,
    population,
    population_mean,
    worker,
    scalars,
    sums,
    hyper,
    q_new,
    q_old,
    grad,
    lse_pi,
):
    """alpha, gamma <- alpha, gamma + eta_t grad F_i, eta_t = eta_0 (tau_0 + t)^-rho (eq. 9-11).

    The prior enters F_i with weight 1/|I|, once per item (on its first arrival). Its
    shrinkage of every slot toward 0 is applied to the common scale of ``worker``.
    """
    K = class_logits.shape[0]
    t = scalars[STEP]
    eta = hyper[H_ETA0] * (hyper[H_TAU0] + t) ** (-hyper[H_RHO])
    n_items = hyper[H_NITEMS]
    lam_pi = hyper[H_LAM_PI] / n_items if first_arrival else 0.0
    for z in range(K):
        target = math.exp(class_logits[z] - lse_pi) if first_arrival else q_old[z]
        prior = lam_pi * (class_logits[z] - class_mean[z])
        class_logits[z] += hyper[H_RATE_PI] * eta * (q_new[z] - target - prior)
    if first_arrival:
        shrink_g = hyper[H_RATE_G] * eta * hyper[H_LAM_G] / n_items
        for z in range(K):
            for k in range(K):
                population[z, k] -= shrink_g * (population[z, k] - population_mean[z, k])
        scalars[SCALE] *= 1.0 - min(eta * hyper[H_LAM_A] / n_items, _MAX_PRIOR_SHRINK)
    scale = scalars[SCALE]
    eta_g = hyper[H_RATE_G]
    eta = eta / _mean_weight(sums, K)  # the labels' gradients: per label of the mean weight
    per_scale = eta / scale  # (one division an item, then a multiplication a value)
    # (two loops: one taking a factor f too, run by run, cost the common case 12-20%)
    if _steps_are_small(lo, hi, slots, weights, eta * clarity):
        for j in range(lo, hi):
            r = j - lo
            s = slots[j]
            for z in range(K):
                for k in range(K):
                    g = eta * grad[r, z, k]
                    population[z, k] += eta_g * g
                    step = per_scale * grad[r, z, k]
                    worker[s, z, k] += step
                    sums[z * K + k] += step
    else:
        _capped_steps(lo, hi, slots, population, worker, sums, grad, eta, eta_g, per_scale)
    scalars[STEP] = t + 1.0
    if scale < _RESCALE_BELOW:
        worker *= scale
        for m in range(K * K):
            sums[m] *= scale
        scalars[SCALE] = 1.0


@jit_inline
def _steps_are_small(lo, hi, slots, weights, limit):
    """No slot's step can reach _MAX_LABEL_STEP (eq. 10'): each label of its own slot, and
    h limit <= _MAX_LABEL_STEP for each (``limit`` = eta (d_new + d_old), a bound on how far
    a label moves a logit): the common case, taken without a look at the gradients."""
    for j in range(lo, hi):
        if weights[j] * limit > _MAX_LABEL_STEP or (j > lo and slots[j] == slots[j - 1]):
            return False
    return True


@jit_inline
def _capped_steps(lo, hi, slots, population, worker, sums, grad, eta, eta_g, per_scale):
    """The steps of eq. 10, each slot's scaled down to move a logit by at most
    _MAX_LABEL_STEP (eq. 10')."""
    K = population.shape[0]
    j = lo
    while j < hi:  # a run of labels of one slot (a block's labels are sorted by slot)
        s = slots[j]
        end = j + 1
        while end < hi and slots[end] == s:
            end += 1
        for z in range(K):
            f = _step_factor(grad, j - lo, end - lo, z, eta)
            for r in range(j - lo, end - lo):
                for k in range(K):
                    g = eta * grad[r, z, k] * f
                    population[z, k] += eta_g * g
                    step = per_scale * grad[r, z, k] * f
                    worker[s, z, k] += step
                    sums[z * K + k] += step
        j = end


@jit_inline
def _slot_is_empty(counts, s):
    """No label has been counted for slot s yet."""
    K = counts.shape[1]
    for z in range(K):
        for k in range(K):
            if counts[s, z, k] != 0.0:
                return False
    return True


@jit_inline
def _add_counts(lo, hi, n_old, slots, labels, weights, counts, sums, q_new, q_old):
    """Statistics of the labels under the item's latest posterior (eq. 14).

    counts[s, z, l] += h (q_new(z) - q_old(z)) for labels already counted, h q_new(z) for new
    ones; the class totals likewise per item; the item count, the label weight and the
    number of slots with labels grow with new items and labels (layout: ``sums_layout``).
    """
    K = q_new.shape[0]
    kk = K * K
    if n_old == 0:
        sums[kk + K] += 1.0
        for z in range(K):
            sums[kk + z] += q_new[z]
    else:
        for z in range(K):
            sums[kk + z] += q_new[z] - q_old[z]
    for j in range(lo, hi):
        s, l, h = slots[j], labels[j], weights[j]
        if j - lo < n_old:
            for z in range(K):
                counts[s, z, l] += h * (q_new[z] - q_old[z])
        else:
            if h > 0.0:
                if _slot_is_empty(counts, s):
                    sums[kk + K + 2] += 1.0
                sums[kk + K + 3] += 1.0
                if h != 1.0:  # (log 1 = 0: the common weight costs no logarithm)
                    sums[kk + K + 4] += min(max(math.log(h), -LOG_WEIGHT_SPAN), LOG_WEIGHT_SPAN)
            sums[kk + K + 1] += h
            for z in range(K):
                counts[s, z, l] += h * q_new[z]


@jit
def _slot_newton_steps(
    lo, hi, slots, population, worker, scalars, counts, sums, lam_a, theta, p, rhs, step
):
    """One Newton step per row of every slot in the block, on its own statistics (eq. 15).

    The slot's term sum_z sum_l N[s,z,l] log softmax(Gamma_z + A_sz)_l - lam_A |A_s|^2 / 2,
    row by row as in batch EM's M-step (eq. 12-13), steps clipped to 1 in the max norm.
    Labels are sorted by slot: each slot is stepped once; rows without statistics are left.
    """
    K = population.shape[0]
    scale = scalars[SCALE]
    prev = -1
    for j in range(lo, hi):
        s = slots[j]
        if s == prev:
            continue
        prev = s
        for z in range(K):
            _theta(population, worker, scale, s, z, theta)
            _softmax_scaled(theta, 1.0, p)
            c = 0.0
            for k in range(K):
                c += counts[s, z, k]
            if c <= 0.0:  # no statistics (e.g. parameters mapped from batch EM): leave the row
                continue
            for k in range(K):
                rhs[k] = counts[s, z, k] - c * p[k] - lam_a * scale * worker[s, z, k]
            solve_softmax_row(c, p, lam_a, rhs, step)
            _clip_step(step)
            for k in range(K):
                worker[s, z, k] += step[k] / scale
                sums[z * K + k] += step[k] / scale


@jit
def _revisit_step(class_logits, class_mean, population, population_mean, scalars, sums, hyper, w):
    """Shared parameters on a revisit (eq. 16): an MM step of gamma_pi on the class totals,
    and the w / (total label weight) share of a profile Newton step of Gamma."""
    K = class_logits.shape[0]
    kk = K * K
    n = sums[kk + K]
    lam_pi = hyper[H_LAM_PI]
    lse_pi = _logsumexp(class_logits)
    inv = 1.0 / (0.5 * n + lam_pi)
    for z in range(K):
        pi = math.exp(class_logits[z] - lse_pi)
        class_logits[z] += inv * (
            sums[kk + z] - n * pi - lam_pi * (class_logits[z] - class_mean[z])
        )
    lam_a, lam_g = hyper[H_LAM_A], hyper[H_LAM_G]
    total = sums[kk + K + 1]
    if total > 0.0:
        frac = w / total / (lam_a * sums[kk + K + 2] + lam_g)
        scale = scalars[SCALE]
        for z in range(K):
            for k in range(K):
                m = z * K + k
                population[z, k] += frac * (
                    lam_a * scale * sums[m] - lam_g * (population[z, k] - population_mean[z, k])
                )
    scalars[STEP] += 1.0


# Eq. 22's evidence is a mean per scored answer: once EVIDENCE_FULL answers' weight is
# scored, one arrival in EVIDENCE_EVERY is (by the step count t, so replays agree), each of its
# scores counted EVIDENCE_EVERY times: the same mean, unbiased, for an eighth of the work.
EVIDENCE_FULL = 100_000.0
EVIDENCE_EVERY = 8.0


@jit_inline
def _evidence_share(evidence, scalars):
    """How many times this arrival's prequential scores count (0: not scored)."""
    if evidence[evidence.shape[0] - 1] < EVIDENCE_FULL:
        return 1.0
    return EVIDENCE_EVERY if scalars[STEP] % EVIDENCE_EVERY == 0.0 else 0.0


@jit
def learn_blocks(
    ptr,
    order,
    slots,
    labels,
    weights,
    n_old,
    q_old,
    b_old,
    update,
    class_logits,
    class_mean,
    population,
    population_mean,
    worker,
    counts,
    sums,
    scalars,
    hyper,
    known,
    q_out,
    b_out,
    f_out,
    grid,
    evidence,
):
    """Process blocks in ``order``: per-item EM, then (if ``update``) the global step.

    When learning, each new label is first scored against the labels of its item before it,
    for every tempering rho of ``grid``, into ``evidence`` (eq. 22; an empty ``grid`` skips it).

    ``n_old[b]`` labels at the head of block b were applied in an earlier arrival whose
    posterior and clarity were ``q_old[b]``, ``b_old[b]``; arrays of one row stand for every
    block (a first arrival of all: 0 labels, the uniform posterior, clarity 0), so that a
    first pass over many items allocates none per item. ``known[b]`` >= 0 is block b's
    true class (a gold item): its posterior is that class with certainty. Outputs are
    indexed by block.
    """
    K = class_logits.shape[0]
    max_len = 0
    for b in range(ptr.shape[0] - 1):
        max_len = max(max_len, ptr[b + 1] - ptr[b])
    logq = np.empty(K)
    q = np.empty(K)
    theta = np.empty(K)
    p = np.empty(K)
    grad = np.empty((max(max_len, 1), K, K))
    probs = np.empty((max(max_len, 1), K, K))
    x = np.zeros(padded(K * K))  # a label's shifted rows, exponentiated into e (_log_joint)
    e = np.empty(x.shape[0])
    rows = np.ones((4, padded(max(max_len, 1) * K)))  # the labels' row sums, logs (_log_joint)
    q_prev = np.empty(K)
    rhs = np.empty(K)
    step = np.empty(K)
    log_prior = np.empty(K)
    scored = prequential_scratch(K, grid.shape[0])
    every = n_old.shape[0] == 1  # (one row for every block)
    for b in order:
        lo, hi = ptr[b], ptr[b + 1]
        old = 0 if every else b
        scale = scalars[SCALE]
        lse_pi = _logsumexp(class_logits)  # (unchanged until the item's global step)
        b_new, f = _item_em(
            lo,
            hi,
            slots,
            labels,
            weights,
            class_logits,
            lse_pi,
            population,
            worker,
            scale,
            hyper,
            b_old[old],
            logq,
            q,
            theta,
            p,
            probs,
            x,
            e,
            rows,
        )
        share = _evidence_share(evidence, scalars) if update and grid.shape[0] > 0 else 0.0
        if share > 0.0 and n_old[old] < hi - lo:
            # eq. 22 from the E-step's p(l_j | z, s_j), before the parameters move
            for z in range(K):
                log_prior[z] = class_logits[z] - lse_pi
            prequential_scores(
                lo,
                hi,
                n_old[old],
                labels,
                weights,
                log_prior,
                probs,
                rows[1],
                grid,
                evidence,
                share,
                scored,
            )
        if known[b] >= 0:
            for z in range(K):
                q[z] = 1.0 if z == known[b] else 0.0
        for z in range(K):
            q_prev[z] = q_old[old, z]  # read before q_out is written: they may be one array
        d_prev = math.exp(b_old[old])
        for z in range(K):  # not q_out[b, :] = q: a slice copy costs ~1.7 s of compile
            q_out[b, z] = q[z]
        b_out[b] = b_new
        f_out[b] = f
        if update:
            n_prev = n_old[old]
            again = hi > lo and n_prev == hi - lo  # a revisit: every label counted before
            # a later arrival (labels of an item already learned, eq. 8') is an incremental-EM
            # step on the counts, as a revisit is (eq. 14-16)
            revisit = n_prev > 0 and hyper[H_DIFF] == 0.0
            # with difficulty a revisit is a plain step (eq. 10) along the whole item gradient
            plain = again and hyper[H_DIFF] != 0.0
            _add_counts(lo, hi, n_prev, slots, labels, weights, counts, sums, q, q_prev)
            d_new = math.exp(b_new)
            if revisit:
                w = 0.0
                for j in range(lo, hi):
                    w += weights[j]
                _revisit_step(
                    class_logits, class_mean, population, population_mean, scalars, sums, hyper, w
                )
                # a later arrival steps the slots of its new labels (a partial M-step: the
                # others' counts moved a little, and they step at their own next arrival)
                _slot_newton_steps(
                    lo if again else lo + n_prev, hi, slots, population, worker, scalars,
                    counts, sums, hyper[H_LAM_A], theta, p, rhs, step,
                )  # fmt: skip
            else:  # (a revisit's steps read the counts, not the labels' gradients)
                _label_gradients(
                    lo, hi, 0 if again else n_prev, slots, labels, weights, population, worker,
                    scale, q, d_new, q_prev, d_prev, theta, p, probs, grad,
                )  # fmt: skip
                _global_step(
                    lo,
                    hi,
                    n_prev == 0 or plain,
                    slots,
                    weights,
                    d_new + (d_prev if n_prev > 0 and not again else 0.0),
                    class_logits,
                    class_mean,
                    population,
                    population_mean,
                    worker,
                    scalars,
                    sums,
                    hyper,
                    q,
                    q_prev,
                    grad,
                    lse_pi,
                )


@jit
def predict_blocks(
    ptr, order, slots, labels, weights, class_logits, population, worker, scale, known, q_out,
    b_out, f_out,
):  # fmt: skip
    """``learn_blocks`` without updates and without difficulty (d = 1), the softmax of each
    slot row computed once instead of once per label: the same operations on the same
    numbers as ``_item_em``'s E-step (eq. 3), so the results are bit-identical."""
    K = class_logits.shape[0]
    S = worker.shape[0]
    row_max = np.empty((S, K))  # m of _softmax_scaled for slot s, class z
    row_log = np.empty((S, K))  # its log sum_k exp(theta_k - m)
    ready = np.zeros(S, dtype=np.bool_)
    x = np.zeros(padded(K * K))  # a slot's rows shifted, exponentiated into e (_exp_rows)
    e = np.empty(x.shape[0])
    logq = np.empty(K)
    q = np.empty(K)
    lse_pi = _logsumexp(class_logits)
    for b in order:
        for z in range(K):
            logq[z] = class_logits[z] - lse_pi
        for j in range(ptr[b], ptr[b + 1]):
            s, l, h = slots[j], labels[j], weights[j]
            if not ready[s]:
                _exp_rows(population, worker, scale, s, 1.0, x, e, row_max[s])
                for z in range(K):
                    row_log[s, z] = log(_row_sum(e, z, K))  # (_log_joint's log_all, one by one)
                ready[s] = True
            for z in range(K):
                theta_l = population[z, l] + scale * worker[s, z, l]
                logq[z] += h * (1.0 * theta_l - row_max[s, z] - row_log[s, z])
        f = normalise(logq, q)
        if b < known.shape[0] and known[b] >= 0:  # (no codes at all: no gold)
            for z in range(K):
                q[z] = 1.0 if z == known[b] else 0.0
        for z in range(K):
            q_out[b, z] = q[z]
        b_out[b] = 0.0
        f_out[b] = f


# ----------------------------------------------------------------------------------------
# Batch EM (exact worker indices, scale 1): E-step tables and Newton M-steps.


@jit
def log_confusion_table(population, worker, out):
    """out[w, z, l] = log softmax(Gamma[z] + A_w[z])_l."""
    W, K = worker.shape[0], population.shape[0]
    theta = np.empty(K)
    p = np.empty(K)
    for w in range(W):
        for z in range(K):
            _theta(population, worker, 1.0, w, z, theta)
            m, log_acc = _softmax_scaled(theta, 1.0, p)
            lse = m + log_acc
            for k in range(K):
                out[w, z, k] = theta[k] - lse


_ESTEP_ITEMS = 64  # items whose softmaxes estep_tables takes together


@jit
def estep_tables(ptr, workers, labels, weights, known, log_pis, log_tables, q_out, data_out):
    """One sweep over the items: the exact E-step without difficulty (3) at each of C parameter
    sets (batch EM: C = 1; the Newton sweeps: their candidate steps).

    log_pis (C, K), log_tables (C, W, K, K); q_out[c, i] the posteriors, data_out[c] the data
    term sum_i log p(D_i) (for a gold item, log p(D_i, z*), its posterior held at z*). The
    softmaxes of ``_ESTEP_ITEMS`` items are taken together (``exp_all``, ``log_all``: one
    vectorised loop each), and each item's term is added in item order.
    """
    C, K = log_pis.shape[0], log_pis.shape[1]
    B = _ESTEP_ITEMS
    shifted = np.zeros(padded(B * K))  # log q - max, item by item
    e = np.empty(shifted.shape[0])
    sums = np.ones(padded(B))
    logs = np.empty(sums.shape[0])
    top = np.empty(B)
    n = ptr.shape[0] - 1
    for c in range(C):
        data_out[c] = 0.0
    for first in range(0, n, B):
        last = min(first + B, n)
        for c in range(C):
            for i in range(first, last):
                o = (i - first) * K
                for z in range(K):
                    shifted[o + z] = log_pis[c, z]
                for j in range(ptr[i], ptr[i + 1]):
                    w, l, h = workers[j], labels[j], weights[j]
                    for z in range(K):
                        shifted[o + z] += h * log_tables[c, w, z, l]
                m = -np.inf
                for z in range(K):
                    m = max(m, shifted[o + z])
                top[i - first] = m
                if known[i] >= 0:
                    m = 0.0  # (kept as it is: the term is log p(D_i, z*))
                elif m == -np.inf:  # no class possible: q is undefined
                    m = 0.0
                for z in range(K):
                    shifted[o + z] -= m
            exp_all(shifted, e, padded((last - first) * K))
            for i in range(first, last):
                o = (i - first) * K
                acc = 0.0
                for z in range(K):
                    acc += e[o + z]
                sums[i - first] = acc
            log_all(sums, logs, padded(last - first))
            for i in range(first, last):
                o = (i - first) * K
                m = top[i - first]
                if known[i] >= 0:
                    data_out[c] += shifted[o + known[i]]
                    for z in range(K):
                        q_out[c, i, z] = 0.0
                    q_out[c, i, known[i]] = 1.0
                elif m == -np.inf:
                    data_out[c] += m
                    for z in range(K):
                        q_out[c, i, z] = np.nan
                else:
                    acc = sums[i - first]
                    for z in range(K):
                        q_out[c, i, z] = e[o + z] / acc
                    data_out[c] += m + logs[i - first]


@jit
def soft_counts(ptr, workers, labels, weights, q, counts):
    """counts[w, z, l] = sum over worker w's answers l of h q_i(z): DS sufficient statistics.
    Each worker's block is summed by answer first (counts[w] read as [l, z]: an answer adds K
    contiguous values, not K strided ones), then transposed in place: each cell's sum is taken
    in the same order, so the same bits, and no second table."""
    W, K = counts.shape[0], q.shape[1]
    counts[:] = 0.0
    for i in range(ptr.shape[0] - 1):
        for j in range(ptr[i], ptr[i + 1]):
            w, l, h = workers[j], labels[j], weights[j]
            for z in range(K):
                counts[w, l, z] += h * q[i, z]
    block = np.empty((K, K))
    for w in range(W):
        for l in range(K):
            for z in range(K):
                block[z, l] = counts[w, l, z]
        for z in range(K):
            for l in range(K):
                counts[w, z, l] = block[z, l]


@jit_inline
def _row(counts, population, worker, w, z, theta, p):
    """p = softmax(Theta_w[z]) (``theta`` scratch); returns the row's weight C_wz (eq. 12)."""
    _theta(population, worker, 1.0, w, z, theta)
    _softmax_scaled(theta, 1.0, p)
    c = 0.0
    for k in range(theta.shape[0]):
        c += counts[w, z, k]
    return c


@jit
def grad_hess_from_labels(
    ptr, workers, labels, weights, q, clarity, population, worker, grad, neg_hess
):
    """Gradient and negative Hessian of the data term per row Theta_w[z] (eq. 12), with each
    item's clarity d_i scaling the logits (eq. 12'): per answer, so the rows' Hessians are
    sums over answers of different p (without difficulty, see ``newton_workers_from_counts``)."""
    grad[:] = 0.0
    neg_hess[:] = 0.0
    K = population.shape[0]
    theta = np.empty(K)
    p = np.empty(K)
    for i in range(ptr.shape[0] - 1):
        d = math.exp(clarity[i])
        for j in range(ptr[i], ptr[i + 1]):
            w, l, h = workers[j], labels[j], weights[j]
            for z in range(K):
                c = h * q[i, z]
                if c == 0.0:
                    continue
                _theta(population, worker, 1.0, w, z, theta)
                _softmax_scaled(theta, d, p)
                for k in range(K):
                    grad[w, z, k] -= c * d * p[k]
                    for m in range(K):
                        neg_hess[w, z, k, m] -= c * d * d * p[k] * p[m]
                    neg_hess[w, z, k, k] += c * d * d * p[k]
                grad[w, z, l] += c * d


@jit
def _solve_spd(a, b, out):
    """Solve a x = b for a small symmetric positive definite a (Cholesky; a is overwritten)."""
    n = b.shape[0]
    for i in range(n):
        for j in range(i + 1):
            acc = a[i, j]
            for k in range(j):
                acc -= a[i, k] * a[j, k]
            if i == j:
                a[i, i] = math.sqrt(max(acc, 1e-300))
            else:
                a[i, j] = acc / a[j, j]
    for i in range(n):
        acc = b[i]
        for k in range(i):
            acc -= a[i, k] * out[k]
        out[i] = acc / a[i, i]
    for i in range(n - 1, -1, -1):
        acc = out[i]
        for k in range(i + 1, n):
            acc -= a[k, i] * out[k]
        out[i] = acc / a[i, i]


@jit
def _clip_step(step):
    """Shrink a Newton step so no coordinate moves more than _MAX_NEWTON_STEP."""
    big = 0.0
    for v in step:
        big = max(big, abs(v))
    if big > _MAX_NEWTON_STEP:
        for k in range(step.shape[0]):
            step[k] *= _MAX_NEWTON_STEP / big


@jit
def newton_workers_from_counts(counts, population, worker, lam):
    """``newton_workers`` on the rows' soft counts (no difficulty): each row's gradient
    N - C p and negative Hessian C (diag p - p p^T) (eq. 12) at the current parameters, solved in O(K)
    (``solve_softmax_row``) instead of through a K x K matrix per row."""
    W, K = worker.shape[0], population.shape[0]
    theta = np.empty(K)
    p = np.empty(K)
    rhs = np.empty(K)
    step = np.empty(K)
    for w in range(W):
        for z in range(K):
            c = _row(counts, population, worker, w, z, theta, p)
            for k in range(K):
                rhs[k] = counts[w, z, k] - c * p[k] - lam * worker[w, z, k]
            solve_softmax_row(c, p, lam, rhs, step)
            _clip_step(step)
            for k in range(K):
                worker[w, z, k] += step[k]


@jit_inline
def _newton_row(a, rhs, step, row):
    """row += the Newton step a^-1 rhs (a symmetric positive definite), clipped (eq. 13)."""
    _solve_spd(a, rhs, step)
    _clip_step(step)
    for k in range(row.shape[0]):
        row[k] += step[k]


@jit_inline
def _population_prior(population, population_mean, lam, z, a, rhs):
    """Row Gamma[z]'s Newton system before the data: a = lam I, rhs = -lam (Gamma_z - mean)."""
    K = population.shape[0]
    for k in range(K):
        rhs[k] = -lam * (population[z, k] - population_mean[z, k])
        for m in range(K):
            a[k, m] = 0.0
        a[k, k] = lam


@jit
def newton_population_from_counts(counts, population, worker, population_mean, lam):
    """``newton_population`` on the rows' soft counts (no difficulty), each worker's gradient
    and negative Hessian summed as it is computed: no (W, K, K, K) table of them."""
    W, K = worker.shape[0], population.shape[0]
    theta = np.empty(K)
    p = np.empty(K)
    a = np.empty((K, K))
    rhs = np.empty(K)
    step = np.empty(K)
    for z in range(K):
        _population_prior(population, population_mean, lam, z, a, rhs)
        for w in range(W):
            c = _row(counts, population, worker, w, z, theta, p)
            for k in range(K):
                rhs[k] += counts[w, z, k] - c * p[k]
                for m in range(K):
                    a[k, m] -= c * p[k] * p[m]
                a[k, k] += c * p[k]
        _newton_row(a, rhs, step, population[z])


@jit
def newton_workers(worker, grad, neg_hess, lam):
    """One Newton step per row A_w[z] on data + N(0, 1/lam) prior (eq. 13)."""
    W, K = worker.shape[0], worker.shape[1]
    a = np.empty((K, K))
    rhs = np.empty(K)
    step = np.empty(K)
    for w in range(W):
        for z in range(K):
            for k in range(K):
                rhs[k] = grad[w, z, k] - lam * worker[w, z, k]
                for m in range(K):
                    a[k, m] = neg_hess[w, z, k, m]
                a[k, k] += lam
            _newton_row(a, rhs, step, worker[w, z])


@jit
def newton_population(population, population_mean, grad, neg_hess, lam):
    """One Newton step per row Gamma[z]: data summed over workers + N(Gamma_0, 1/lam) prior."""
    W, K = grad.shape[0], population.shape[0]
    a = np.empty((K, K))
    rhs = np.empty(K)
    step = np.empty(K)
    for z in range(K):
        _population_prior(population, population_mean, lam, z, a, rhs)
        for w in range(W):
            for k in range(K):
                rhs[k] += grad[w, z, k]
                for m in range(K):
                    a[k, m] += neg_hess[w, z, k, m]
        _newton_row(a, rhs, step, population[z])


# Later passes by trust-region Newton on F (docs/model.md, eq. 17-20).


@jit
def missing_information_product(
    ptr, workers, labels, weights, q, p, pi, v_pi, v_theta, out_pi, out_theta
):
    """out += sum_i Cov_{q_i}[grad_x log p(D_i, z)] v (eq. 18), v = (v_pi, v_theta).

    grad log p(D_i, z) is e_z - pi for gamma_pi and sum_{j: s_j = s} h_j (e_{l_j} - p_{s,z})
    for row z of slot s; with t_z its product with v and tbar = sum_z q_z t_z, the item adds
    sum_z q_z (t_z - tbar) grad log p(D_i, z).
    """
    W, K = p.shape[0], p.shape[1]
    pv = np.empty((W, K))
    for s in range(W):
        for z in range(K):
            acc = 0.0
            for k in range(K):
                acc += p[s, z, k] * v_theta[s, z, k]
            pv[s, z] = acc
    pi_v = 0.0
    for k in range(K):
        pi_v += pi[k] * v_pi[k]
    mass = np.zeros((W, K))
    class_sum = np.zeros(K)
    t = np.empty(K)
    c = np.empty(K)
    for i in range(ptr.shape[0] - 1):
        for z in range(K):
            t[z] = v_pi[z] - pi_v
        for j in range(ptr[i], ptr[i + 1]):
            s, l, h = workers[j], labels[j], weights[j]
            for z in range(K):
                t[z] += h * (v_theta[s, z, l] - pv[s, z])
        tbar = 0.0
        for z in range(K):
            tbar += q[i, z] * t[z]
        for z in range(K):
            c[z] = q[i, z] * (t[z] - tbar)
            class_sum[z] += c[z]
        for j in range(ptr[i], ptr[i + 1]):
            s, l, h = workers[j], labels[j], weights[j]
            for z in range(K):
                out_theta[s, z, l] += c[z] * h
                mass[s, z] += c[z] * h
    total = 0.0
    for z in range(K):
        total += class_sum[z]
    for z in range(K):
        out_pi[z] += class_sum[z] - total * pi[z]
    for s in range(W):
        for z in range(K):
            for k in range(K):
                out_theta[s, z, k] -= mass[s, z] * p[s, z, k]


invalidate_on_change(
    learn_blocks,
    prequential_scores,
    prequential_scratch,
    solve_softmax_row,
    exp_all,
    log,
    log_all,
    normalise,
    padded,
)
