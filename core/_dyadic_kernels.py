"""Numba kernels of the dyadic importance-aware model (docs/dyadic.md; seed 000 parts I-III).

One binary "scorer" predicts p = ã_r·b̃_t − k + w_r + w_t + w_c (seed 000 part II's change of
variables ã = a + 1, b̃ = b + 1, so p = a·b + 1·a + 1·b + w·x). An importance-weighted
example moves every parameter along the solution of the gradient flow (part I):

    ã(h) = e^{−η_d λ h} (ã0 cosh u + b̃0 sinh u),  b̃(h) = e^{−η_d λ h} (b̃0 cosh u + ã0 sinh u),
    w_i(h) = w_i0 + η_i x_i σ,                    u = η_d σ,   σ'(h) = −∂l/∂p,

so the prediction is a function of one scalar σ (and h through the decay):

    p(σ, h) = p0 + δ(h) · ½[S₊ expm1(2u) − S₋ expm1(−2u)] + expm1(−2η_d λ h) · c0 + Q σ,

with S₊ = ½|ã0 + b̃0|², S₋ = ½|ã0 − b̃0|², c0 = ã0·b̃0 = ½(S₊ − S₋), δ = e^{−2η_d λ h} and
Q = Σ η_i x_i². This is part II's p(s) (s = −σ) written without catastrophic cancellation:
c0 cosh 2u + ½(|ã0|² + |b̃0|²) sinh 2u = ½[S₊ e^{2u} − S₋ e^{−2u}].

With L2 on the linear weights too (μ = η λ_w): w_i(h) = e^{−μh} w_i0 + η_i x_i ψ, ψ' = σ' − μψ,
and the linear part moves by expm1(−μh)·L0 + Qψ instead of Qσ (``delta_pl``, docs/dyadic.md).

Loss codes: 0 hinge, 1 logistic, 2 squared (½(y − p)²), 3 τ-quantile.
"""

from __future__ import annotations

import math

import numpy as np

from core._numba import jit, jit_inline

HINGE, LOGISTIC, SQUARED, QUANTILE = 0, 1, 2, 3

# One-against-all and filter tree: h_min is searched up to this weight (a million labels' worth;
# inf beyond: with L2 and squared or logistic loss, each step there integrates the ODE to its cap).
H_SEARCH_MAX = 1e6
_YES, _NO = np.bool_(True), np.bool_(False)  # a literal True/False compiles a callee twice

# Hyperparameter vector layout (DyadicConfig.hyper_vector()).
(H_ETA, H_T0, H_POWER, H_L2, H_TAU, H_ADAPTIVE, H_LOSS, H_K, H_ODE_TOL, H_L2_LIN, H_DRATE) = range(
    11
)


# ---------------------------------------------------------------- the scalar dynamics


@jit
def delta_pl(sigma, psi, h, sp, sm, c0, Q, eta_d, lam, L0, mu):
    """p − p0 with L2 decay μ = η λ_w on the linear weights too (module docstring).

    The linear weights follow w_i(h) = e^{−μh} w_i0 + η_i x_i ψ with ψ' = σ' − μψ, so the
    linear part of p moves by expm1(−μh)·L0 + Qψ (L0: the linear part of p0; ψ = σ if μ = 0).
    """
    u = eta_d * sigma
    dec = -2.0 * eta_d * lam * h
    out = 0.0
    if sp != 0.0 or sm != 0.0:  # k = 0: no dyadic term (and no 0·inf far along a path)
        out = math.exp(dec) * (0.5 * (sp * math.expm1(2.0 * u) - sm * math.expm1(-2.0 * u)))
    if c0 != 0.0:
        out += math.expm1(dec) * c0
    out += Q * psi
    if mu != 0.0:
        out += math.expm1(-mu * h) * L0
    return out


@jit
def delta_p(sigma, h, sp, sm, c0, Q, eta_d, lam):
    """p(σ, h) − p0 without linear decay (module docstring); exact for any σ, careful near 0."""
    return delta_pl(sigma, sigma, h, sp, sm, c0, Q, eta_d, lam, 0.0, 0.0)


@jit
def _phi(h, mu):
    """ψ/ρ along a constant-gradient stretch: (1 − e^{−μh})/μ (h if μ = 0)."""
    if mu == 0.0:
        return h
    return -math.expm1(-mu * h) / mu


@jit
def path_p(rho, h, sp, sm, c0, Q, eta_d, lam, L0, mu):
    """p − p0 after weight h of a constant gradient ρ (hinge / quantile): σ = ρh."""
    return delta_pl(rho * h, rho * _phi(h, mu), h, sp, sm, c0, Q, eta_d, lam, L0, mu)


@jit
def _dp_dsigma(sigma, h, sp, sm, Q, eta_d, lam):
    u = eta_d * sigma
    return (
        math.exp(-2.0 * eta_d * lam * h)
        * eta_d
        * (sp * math.exp(2.0 * u) + sm * math.exp(-2.0 * u))
        + Q
    )


@jit
def _dp_dh_linear(rho, h, sp, sm, c0, Q, eta_d, lam, L0, mu):
    """d/dh of path_p: the path of hinge / quantile (σ = ρh)."""
    lin = Q * rho if mu == 0.0 else math.exp(-mu * h) * (Q * rho - mu * L0)
    if sp == 0.0 and sm == 0.0:
        return lin
    u = eta_d * rho * h
    dec = math.exp(-2.0 * eta_d * lam * h)
    e_p = math.exp(2.0 * u)
    e_m = math.exp(-2.0 * u)
    full = 0.5 * (sp * e_p - sm * e_m)
    return dec * (-2.0 * eta_d * lam * full + eta_d * rho * (sp * e_p + sm * e_m)) + lin


@jit
def _root_linear_path(gap, rho, sp, sm, c0, Q, eta_d, lam, L0, mu, h_cap):
    """Smallest h in (0, h_cap] with path_p(ρ, h) = gap (sign(gap) = sign(ρ)), else inf.

    Newton with backtracking inside a maintained bracket (seed 000 part II's p^{-1}(y)); the
    path is monotone in h for λ ≤ min(τ, 1 − τ) and linear weights within [(τ−1)/λ_w, τ/λ_w]
    (docs/dyadic.md), so the bracket is valid.
    """
    s = 1.0 if rho > 0 else -1.0
    g_cap = s * (path_p(rho, h_cap, sp, sm, c0, Q, eta_d, lam, L0, mu) - gap)
    if g_cap < 0.0:
        return np.inf
    lo = 0.0
    hi = h_cap
    # initial guess: the linearised step
    d0 = s * _dp_dh_linear(rho, 0.0, sp, sm, c0, Q, eta_d, lam, L0, mu)
    x = s * gap / d0 if d0 > 0 else 0.5 * hi
    if not (x > lo and x < hi):
        x = 0.5 * (lo + hi)
    for _ in range(200):
        g = s * (path_p(rho, x, sp, sm, c0, Q, eta_d, lam, L0, mu) - gap)
        if g == 0.0:
            return x
        if g < 0.0:
            lo = x
        else:
            hi = x
        d = s * _dp_dh_linear(rho, x, sp, sm, c0, Q, eta_d, lam, L0, mu)
        nx = x - g / d if d > 0 else 0.5 * (lo + hi)
        if not (nx > lo and nx < hi):  # backtrack into the bracket
            nx = 0.5 * (lo + hi)
        if abs(nx - x) <= 1e-15 * max(abs(nx), 1e-300) or hi - lo <= 4e-16 * hi:
            return nx
        x = nx
    return x


@jit
def _neg_dloss(loss, p, y, tau):
    """−∂l/∂p at p (σ' of part I)."""
    if loss == HINGE:
        return y if y * p < 1.0 else 0.0
    if loss == LOGISTIC:
        z = y * p
        if z > 0:
            e = math.exp(-z)
            return y * e / (1.0 + e)
        return y / (1.0 + math.exp(z))
    if loss == SQUARED:
        return y - p
    # quantile
    if y > p:
        return tau
    if y < p:
        return tau - 1.0
    return 0.0


# Dormand–Prince 5(4) coefficients
_C2, _C3, _C4, _C5 = 1.0 / 5.0, 3.0 / 10.0, 4.0 / 5.0, 8.0 / 9.0


@jit
def _ode_rhs(loss, p0, y, tau, h, sigma, sp, sm, c0, Q, eta_d, lam):
    return _neg_dloss(loss, p0 + delta_p(sigma, h, sp, sm, c0, Q, eta_d, lam), y, tau)


@jit
def _stable_dt(loss, sigma, h, sp, sm, Q, eta_d, lam):
    """The largest step Dormand–Prince takes stably here: 2.5 / |∂σ'/∂σ| (its real stability
    interval reaches −3.3). Near the rest point every stage's slope is the same rounding
    residue, so the error estimate reads 0 and cannot stop the step from growing past it."""
    curvature = 1.0 if loss == SQUARED else 0.25  # max ∂²l/∂p²
    return 2.5 / (curvature * _dp_dsigma(sigma, h, sp, sm, Q, eta_d, lam))


@jit
def ode_sigma(loss, p0, y, tau, h_end, sp, sm, c0, Q, eta_d, lam, tol):
    """σ(h_end) for squared / logistic loss: the one-dimensional ODE of part I (RK45).

    Dormand–Prince with error control (rtol = atol = tol). Safety: for squared loss the
    exact flow never crosses y; if a step would, σ is cut back onto p = y by bisection.
    """
    if h_end <= 0.0:
        return 0.0
    sigma = 0.0
    h = 0.0
    dt = h_end
    f0 = _ode_rhs(loss, p0, y, tau, 0.0, 0.0, sp, sm, c0, Q, eta_d, lam)
    if f0 != 0.0:
        dt = min(h_end, 0.1 / (abs(f0) * (eta_d * (sp + sm + 1.0) + Q) + 1e-300))
    dt = min(dt, _stable_dt(loss, 0.0, 0.0, sp, sm, Q, eta_d, lam))
    k1 = f0
    for _ in range(100000):
        if h >= h_end:
            break
        if h + dt > h_end:
            dt = h_end - h
        k2 = _ode_rhs(
            loss, p0, y, tau, h + _C2 * dt, sigma + dt * (k1 / 5.0), sp, sm, c0, Q, eta_d, lam
        )
        k3 = _ode_rhs(
            loss,
            p0,
            y,
            tau,
            h + _C3 * dt,
            sigma + dt * (3.0 / 40.0 * k1 + 9.0 / 40.0 * k2),
            sp,
            sm,
            c0,
            Q,
            eta_d,
            lam,
        )
        k4 = _ode_rhs(
            loss,
            p0,
            y,
            tau,
            h + _C4 * dt,
            sigma + dt * (44.0 / 45.0 * k1 - 56.0 / 15.0 * k2 + 32.0 / 9.0 * k3),
            sp,
            sm,
            c0,
            Q,
            eta_d,
            lam,
        )
        k5 = _ode_rhs(
            loss,
            p0,
            y,
            tau,
            h + _C5 * dt,
            sigma
            + dt
            * (
                19372.0 / 6561.0 * k1
                - 25360.0 / 2187.0 * k2
                + 64448.0 / 6561.0 * k3
                - 212.0 / 729.0 * k4
            ),
            sp,
            sm,
            c0,
            Q,
            eta_d,
            lam,
        )
        k6 = _ode_rhs(
            loss,
            p0,
            y,
            tau,
            h + dt,
            sigma
            + dt
            * (
                9017.0 / 3168.0 * k1
                - 355.0 / 33.0 * k2
                + 46732.0 / 5247.0 * k3
                + 49.0 / 176.0 * k4
                - 5103.0 / 18656.0 * k5
            ),
            sp,
            sm,
            c0,
            Q,
            eta_d,
            lam,
        )
        s5 = sigma + dt * (
            35.0 / 384.0 * k1
            + 500.0 / 1113.0 * k3
            + 125.0 / 192.0 * k4
            - 2187.0 / 6784.0 * k5
            + 11.0 / 84.0 * k6
        )
        k7 = _ode_rhs(loss, p0, y, tau, h + dt, s5, sp, sm, c0, Q, eta_d, lam)
        err = dt * abs(
            71.0 / 57600.0 * k1
            - 71.0 / 16695.0 * k3
            + 71.0 / 1920.0 * k4
            - 17253.0 / 339200.0 * k5
            + 22.0 / 525.0 * k6
            - 1.0 / 40.0 * k7
        )
        scale = tol * (1.0 + abs(s5))
        if err <= scale and math.isfinite(s5):
            h += dt
            sigma = s5
            k1 = k7
            fac = 5.0 if err == 0.0 else min(5.0, 0.9 * (scale / err) ** 0.2)
            dt = min(dt * fac, _stable_dt(loss, sigma, h, sp, sm, Q, eta_d, lam))
        else:
            ratio = scale / err if math.isfinite(err) and math.isfinite(s5) else 0.0
            dt *= max(0.1, 0.9 * ratio**0.2)
    if loss == SQUARED:
        # safety: never past the label
        gap = y - p0
        if (gap - delta_p(sigma, h_end, sp, sm, c0, Q, eta_d, lam)) * gap < 0.0:
            lo = 0.0
            hi = sigma
            for _ in range(200):
                mid = 0.5 * (lo + hi)
                if (gap - delta_p(mid, h_end, sp, sm, c0, Q, eta_d, lam)) * gap < 0.0:
                    hi = mid
                else:
                    lo = mid
            sigma = lo
    return sigma


# Dormand–Prince 5(4) tableau (rows: stages 2..7; the 7th row is the 5th-order solution)
_DP_A = np.array(
    [
        [1.0 / 5.0, 0.0, 0.0, 0.0, 0.0, 0.0],
        [3.0 / 40.0, 9.0 / 40.0, 0.0, 0.0, 0.0, 0.0],
        [44.0 / 45.0, -56.0 / 15.0, 32.0 / 9.0, 0.0, 0.0, 0.0],
        [19372.0 / 6561.0, -25360.0 / 2187.0, 64448.0 / 6561.0, -212.0 / 729.0, 0.0, 0.0],
        [9017.0 / 3168.0, -355.0 / 33.0, 46732.0 / 5247.0, 49.0 / 176.0, -5103.0 / 18656.0, 0.0],
        [35.0 / 384.0, 0.0, 500.0 / 1113.0, 125.0 / 192.0, -2187.0 / 6784.0, 11.0 / 84.0],
    ]
)
_DP_C = np.array([0.0, 1.0 / 5.0, 3.0 / 10.0, 4.0 / 5.0, 8.0 / 9.0, 1.0, 1.0])
_DP_E = np.array(
    [
        71.0 / 57600.0,
        0.0,
        -71.0 / 16695.0,
        71.0 / 1920.0,
        -17253.0 / 339200.0,
        22.0 / 525.0,
        -1.0 / 40.0,
    ]
)


@jit
def ode_flow(loss, p0, y, tau, h_end, sp, sm, c0, Q, eta_d, lam, L0, mu, tol):
    """(σ, ψ)(h_end) for squared / logistic loss with linear decay μ > 0 (μ = 0: ode_sigma).

    The two-dimensional ODE σ' = −∂l/∂p, ψ' = σ' − μψ (delta_pl), Dormand–Prince 5(4) with
    error control on both components (rtol = atol = tol). No cut-back onto p = y: with decay
    the regularised flow's rest point is not at the label.
    """
    if mu == 0.0:
        sg = ode_sigma(loss, p0, y, tau, h_end, sp, sm, c0, Q, eta_d, lam, tol)
        return sg, sg
    if h_end <= 0.0:
        return 0.0, 0.0
    ks = np.empty(7)
    kp = np.empty(7)
    sigma = 0.0
    psi = 0.0
    h = 0.0
    f0 = _neg_dloss(loss, p0, y, tau)
    dt = h_end
    if f0 != 0.0:
        dt = min(h_end, 0.1 / (abs(f0) * (eta_d * (sp + sm + 1.0) + Q) + 1e-300))
    dt = min(dt, _stable_dt(loss, 0.0, 0.0, sp, sm, Q, eta_d, lam))
    ks[0] = f0
    kp[0] = f0
    for _ in range(100000):
        if h >= h_end:
            break
        if h + dt > h_end:
            dt = h_end - h
        s5 = sigma
        q5 = psi
        for j in range(6):
            ss = sigma
            qq = psi
            for m in range(j + 1):
                ss += dt * _DP_A[j, m] * ks[m]
                qq += dt * _DP_A[j, m] * kp[m]
            g = _neg_dloss(
                loss,
                p0 + delta_pl(ss, qq, h + _DP_C[j + 1] * dt, sp, sm, c0, Q, eta_d, lam, L0, mu),
                y,
                tau,
            )
            ks[j + 1] = g
            kp[j + 1] = g - mu * qq
            s5 = ss
            q5 = qq
        es = 0.0
        ep = 0.0
        for m in range(7):
            es += _DP_E[m] * ks[m]
            ep += _DP_E[m] * kp[m]
        err = dt * max(abs(es) / (1.0 + abs(s5)), abs(ep) / (1.0 + abs(q5)))
        if err <= tol and math.isfinite(s5) and math.isfinite(q5):
            h += dt
            sigma = s5
            psi = q5
            ks[0] = ks[6]
            kp[0] = kp[6]
            dt *= 5.0 if err == 0.0 else min(5.0, 0.9 * (tol / err) ** 0.2)
            dt = min(dt, _stable_dt(loss, sigma, h, sp, sm, Q, eta_d, lam))
        else:
            ratio = tol / err if math.isfinite(err) and math.isfinite(s5 + q5) else 0.0
            dt *= max(0.1, 0.9 * ratio**0.2)
    return sigma, psi


@jit
def step_flow(loss, p0, y, tau, h, sp, sm, c0, Q, eta_d, lam, L0, mu, tol):
    """(σ, ψ, h_eff) of one importance-weighted update; h_eff ≤ h is where the flow stopped.

    Hinge and τ-quantile: constant gradient ρ, σ = ρh, ψ = ρ(1 − e^{−μh})/μ (part I / III)
    until the boundary y·p = 1 (hinge) or p = y (quantile), found by Newton with
    backtracking; then the dynamics halt (part III). Squared and logistic: the ODE.
    """
    if h <= 0.0:
        return 0.0, 0.0, 0.0
    if loss == HINGE or loss == QUANTILE:  # noqa: SIM109 (numba)
        if loss == HINGE:
            if y * p0 >= 1.0:
                return 0.0, 0.0, 0.0
            rho = y
            gap = y - p0
        else:
            if y == p0:
                return 0.0, 0.0, 0.0
            rho = tau if y > p0 else tau - 1.0
            gap = y - p0
        hs = _root_linear_path(gap, rho, sp, sm, c0, Q, eta_d, lam, L0, mu, h)
        if hs < h:
            return rho * hs, rho * _phi(hs, mu), hs
        return rho * h, rho * _phi(h, mu), h
    sg, ps = ode_flow(loss, p0, y, tau, h, sp, sm, c0, Q, eta_d, lam, L0, mu, tol)
    return sg, ps, h


@jit
def step_sigma(loss, p0, y, tau, h, sp, sm, c0, Q, eta_d, lam, tol):
    """(σ, h_eff) of step_flow without linear decay (σ = ψ)."""
    sg, _, he = step_flow(loss, p0, y, tau, h, sp, sm, c0, Q, eta_d, lam, 0.0, 0.0, tol)
    return sg, he


# ---------------------------------------------------------------- h_min (part II)


@jit
def _p_inverse(gap, sp, sm, Q, eta_d):
    """σ with delta_p(σ, 0) = gap (λ = 0): part II's p^{-1}, safeguarded Newton (monotone)."""
    if gap == 0.0:
        return 0.0
    s = 1.0 if gap > 0 else -1.0
    # bracket s·σ ∈ [0, |gap|/Q]: the dyadic part moves p the same way as the linear part
    a = 0.0
    b = abs(gap) / Q
    x = abs(gap) / (Q + eta_d * (sp + sm))
    for _ in range(200):
        g = s * (delta_p(s * x, 0.0, sp, sm, 0.0, Q, eta_d, 0.0) - gap)
        if g == 0.0:
            return s * x
        if g < 0.0:
            a = x
        else:
            b = x
        d = _dp_dsigma(s * x, 0.0, sp, sm, Q, eta_d, 0.0)
        nx = x - g / d
        if not (nx > a and nx < b):
            nx = 0.5 * (a + b)
        if abs(nx - x) <= 1e-15 * nx or b - a <= 4e-16 * b:
            return s * nx
        x = nx
    return s * x


# 15-point Gauss–Kronrod nodes / weights and the embedded 7-point Gauss weights
_XGK = np.array(
    [
        0.991455371120812639206854697526329,
        0.949107912342758524526189684047851,
        0.864864423359769072789712788640926,
        0.741531185599394439863864773280788,
        0.586087235467691130294144845693013,
        0.405845151377397166906606412076961,
        0.207784955007898467600689403773245,
        0.000000000000000000000000000000000,
    ]
)
_WGK = np.array(
    [
        0.022935322010529224963732008058970,
        0.063092092629978553290700663189204,
        0.104790010322250183839876322541518,
        0.140653259715525918745189590510238,
        0.169004726639267902826583426598550,
        0.190350578064785409913256402421014,
        0.204432940075298892414161999234649,
        0.209482141084727828012999174891714,
    ]
)
_WG = np.array(
    [
        0.129484966168869693270611432679082,
        0.279705391489276667901467771423780,
        0.381830050505118944950369775488975,
        0.417959183673469387755102040816327,
    ]
)


@jit
def _inv_rate(loss, p0, y, tau, sigma, sp, sm, Q, eta_d):
    """1 / σ'(σ) = dh/dσ (the integrand of part II's s^{-1}), λ = 0."""
    return 1.0 / _neg_dloss(loss, p0 + delta_p(sigma, 0.0, sp, sm, 0.0, Q, eta_d, 0.0), y, tau)


@jit
def _gk15(loss, p0, y, tau, a, b, sp, sm, Q, eta_d):
    c = 0.5 * (a + b)
    hw = 0.5 * (b - a)
    fc = _inv_rate(loss, p0, y, tau, c, sp, sm, Q, eta_d)
    rk = fc * _WGK[7]
    rg = fc * _WG[3]
    for j in range(7):
        dx = hw * _XGK[j]
        f1 = _inv_rate(loss, p0, y, tau, c - dx, sp, sm, Q, eta_d)
        f2 = _inv_rate(loss, p0, y, tau, c + dx, sp, sm, Q, eta_d)
        rk += _WGK[j] * (f1 + f2)
        if j % 2 == 1:
            rg += _WG[j // 2] * (f1 + f2)
    return rk * hw, abs((rk - rg) * hw)


@jit
def separation_integral(loss, p0, y, tau, sigma_end, sp, sm, Q, eta_d, rtol):
    """h(σ) = ∫_0^σ dσ' / σ'(σ') (part II's separation of variables), adaptive Gauss–Kronrod."""
    if sigma_end == 0.0:
        return 0.0
    stack_a = np.empty(200)
    stack_b = np.empty(200)
    top = 1
    stack_a[0] = 0.0
    stack_b[0] = sigma_end
    total = 0.0
    first, _ = _gk15(loss, p0, y, tau, 0.0, sigma_end, sp, sm, Q, eta_d)
    target = rtol * abs(first)
    while top > 0:
        top -= 1
        a = stack_a[top]
        b = stack_b[top]
        val, err = _gk15(loss, p0, y, tau, a, b, sp, sm, Q, eta_d)
        if (
            err <= target * abs(b - a) / abs(sigma_end)
            or top >= 198
            or abs(b - a) < 1e-14 * abs(sigma_end)
        ):
            total += val
        else:
            m = 0.5 * (a + b)
            stack_a[top] = m
            stack_b[top] = b
            stack_a[top + 1] = a
            stack_b[top + 1] = m
            top += 2
    return total


@jit
def h_min_scalar(loss, p0, y, tau, x, sp, sm, c0, Q, eta_d, lam, tol):
    """h_min_flow without linear decay."""
    return h_min_flow(loss, p0, y, tau, x, sp, sm, c0, Q, eta_d, lam, 0.0, 0.0, tol)


@jit
def h_min_flow(loss, p0, y, tau, x, sp, sm, c0, Q, eta_d, lam, L0, mu, tol):
    """Smallest importance weight moving the prediction from p0 to x for label y (part II).

    Returns 0 if p0 is already at x, inf if an update with label y never reaches x (x on the
    wrong side of p0, or beyond the label where the dynamics halt / never arrive). L0 is the
    linear part of p0 and μ the linear weights' decay rate (0: no L2 on them).
    """
    gap = x - p0
    if gap == 0.0:
        return 0.0
    if loss == HINGE or loss == QUANTILE:  # noqa: SIM109 (numba)
        if loss == HINGE:
            if y * p0 >= 1.0 or gap * y <= 0.0 or y * x > 1.0:
                return np.inf
            rho = y
        else:
            if y == p0 or gap * (y - p0) <= 0.0 or abs(gap) > abs(y - p0):
                return np.inf
            rho = tau if y > p0 else tau - 1.0
        if lam == 0.0 and mu == 0.0:
            # closed form in σ: h = p^{-1}(x) / ρ (part II: h_min = −p^{-1}(x)/(η y) in s units)
            return _p_inverse(gap, sp, sm, Q, eta_d) / rho
        hb = _h_bracket(gap, rho, sp, sm, c0, Q, eta_d, lam, L0, mu)
        if hb == np.inf:
            return np.inf
        return _root_linear_path(gap, rho, sp, sm, c0, Q, eta_d, lam, L0, mu, hb)
    # squared / logistic
    if loss == SQUARED:
        if gap * (y - p0) <= 0.0 or abs(gap) >= abs(y - p0):
            return np.inf
    elif gap * y <= 0.0:
        return np.inf
    if lam == 0.0 and mu == 0.0:
        sig = _p_inverse(gap, sp, sm, Q, eta_d)
        return separation_integral(loss, p0, y, tau, sig, sp, sm, Q, eta_d, 1e-12)
    # λ > 0 or μ > 0: the flow is not autonomous; bracket by doubling, then bisect on the
    # ODE's path (inf if the path has not reached x by h = 1e12)
    s = 1.0 if gap > 0 else -1.0
    hi = 1e-3
    found = False
    for _ in range(60):
        sg, ps = ode_flow(loss, p0, y, tau, hi, sp, sm, c0, Q, eta_d, lam, L0, mu, tol)
        if s * (delta_pl(sg, ps, hi, sp, sm, c0, Q, eta_d, lam, L0, mu) - gap) >= 0.0:
            found = True
            break
        hi *= 2.0
    if not found:
        return np.inf
    lo = 0.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        sg, ps = ode_flow(loss, p0, y, tau, mid, sp, sm, c0, Q, eta_d, lam, L0, mu, tol)
        if s * (delta_pl(sg, ps, mid, sp, sm, c0, Q, eta_d, lam, L0, mu) - gap) >= 0.0:
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-13 * hi:
            break
    return hi


@jit
def _h_bracket(gap, rho, sp, sm, c0, Q, eta_d, lam, L0, mu):
    """An h at which the hinge / quantile path has reached gap (inf if it never does)."""
    hi = abs(gap / (Q * rho)) + 1e-300
    s = 1.0 if rho > 0 else -1.0
    for _ in range(2000):
        if s * (path_p(rho, hi, sp, sm, c0, Q, eta_d, lam, L0, mu) - gap) >= 0.0:
            return hi
        if hi > 1e200:
            break
        hi *= 2.0
    return np.inf


# ---------------------------------------------------------------- the model's tables


@jit_inline
def _slot(ident, n):
    m = ident % n
    return m + n if m < 0 else m


@jit_inline
def _rates(hyper, G, GWR, GWT, GC, GA, GB, s, r, t, grad2, h, bnorm2, anorm2, update):
    """(η_d, η_r, η_t, η_c): global decaying rate, or per-coordinate adaptive rates (003).

    η_d carries the factor ``dyadic_rate`` (H_DRATE) in both modes.
    Adaptive: η_i = η / sqrt(Σ h g_i²) per linear coordinate (AdaGrad, seed 003 slide);
    the dyadic rows share one rate per example, η / sqrt(mean of their rows' accumulators),
    so that ã and b̃ keep a common u and the closed form of part I still applies.
    """
    eta = hyper[H_ETA]
    if hyper[H_ADAPTIVE] == 0.0:
        e = eta * (hyper[H_T0] / (hyper[H_T0] + G[0])) ** hyper[H_POWER]
        return hyper[H_DRATE] * e, e, e, e
    k = hyper[H_K]
    if update:
        GWR[r, s] += h * grad2
        GWT[t, s] += h * grad2
        GC[s] += h * grad2
        if k > 0:
            GA[r, s] += h * grad2 * bnorm2 / k
            GB[t, s] += h * grad2 * anorm2 / k
    er = eta / math.sqrt(1.0 + GWR[r, s])
    et = eta / math.sqrt(1.0 + GWT[t, s])
    ec = eta / math.sqrt(1.0 + GC[s])
    ed = hyper[H_DRATE] * eta / math.sqrt(1.0 + 0.5 * (GA[r, s] + GB[t, s]))
    return ed, er, et, ec


@jit_inline
def _stats(A, B, s, r, t):
    """(S₊, S₋, c0) of scorer s at (r, t)."""
    sp = 0.0
    sm = 0.0
    c0 = 0.0
    for d in range(A.shape[2]):
        a = A[r, s, d]
        b = B[t, s, d]
        sp += (a + b) * (a + b)
        sm += (a - b) * (a - b)
        c0 += a * b
    return 0.5 * sp, 0.5 * sm, c0


@jit_inline
def _pair_stats(A, B, si, sj, r, t):
    """(S₊, S₋, c0) of p = f_si − f_sj at (r, t) (sj < 0: p = f_si); all 0 when k = 0.

    f_sj's factors move with −u, so its S₊ and S₋ trade places in the sum.
    """
    if A.shape[2] == 0:
        return 0.0, 0.0, 0.0
    sp, sm, c0 = _stats(A, B, si, r, t)
    if sj >= 0:
        sp2, sm2, c2 = _stats(A, B, sj, r, t)
        sp += sm2
        sm += sp2
        c0 -= c2
    return sp, sm, c0


@jit_inline
def _predict1(A, B, WR, WT, WC, s, r, t):
    p = WR[r, s] + WT[t, s] + WC[s]
    for d in range(A.shape[2]):
        p += A[r, s, d] * B[t, s, d] - 1.0
    return p


@jit_inline
def _lin1(WR, WT, WC, s, r, t):
    return WR[r, s] + WT[t, s] + WC[s]


@jit_inline
def _apply(A, B, WR, WT, WC, s, r, t, u, dec, ldec, sig_r, sig_t, sig_c):
    cu = math.cosh(u)
    su = math.sinh(u)
    for d in range(A.shape[2]):
        a = A[r, s, d]
        b = B[t, s, d]
        A[r, s, d] = dec * (a * cu + b * su)
        B[t, s, d] = dec * (b * cu + a * su)
    if ldec == 1.0:
        WR[r, s] += sig_r
        WT[t, s] += sig_t
        WC[s] += sig_c
    else:
        WR[r, s] = ldec * WR[r, s] + sig_r
        WT[t, s] = ldec * WT[t, s] + sig_t
        WC[s] = ldec * WC[s] + sig_c


@jit_inline
def _norm2(M, s, i):
    acc = 0.0
    for d in range(M.shape[2]):
        acc += M[i, s, d] * M[i, s, d]
    return acc


@jit
def update_pair(A, B, WR, WT, WC, G, GWR, GWT, GC, GA, GB, hyper, si, sj, r, t, y, h):
    """One importance-weighted update of p = f_si − f_sj (sj < 0: p = f_si) toward label y."""
    loss = int(hyper[H_LOSS])
    tau = hyper[H_TAU]
    lam = hyper[H_L2]
    sp, sm, c0 = _pair_stats(A, B, si, sj, r, t)
    p0 = _predict1(A, B, WR, WT, WC, si, r, t)
    if sj >= 0:
        p0 -= _predict1(A, B, WR, WT, WC, sj, r, t)
    g = _neg_dloss(loss, p0, y, tau)
    if g == 0.0:
        return
    adaptive = hyper[H_ADAPTIVE] != 0.0
    bn = _norm2(B, si, t) if adaptive else 0.0
    an = _norm2(A, si, r) if adaptive else 0.0
    ed, er, et, ec = _rates(hyper, G, GWR, GWT, GC, GA, GB, si, r, t, g * g, h, bn, an, _YES)
    Q = er + et + ec
    if sj >= 0:
        bn2 = _norm2(B, sj, t) if adaptive else 0.0
        an2 = _norm2(A, sj, r) if adaptive else 0.0
        ed2, er2, et2, ec2 = _rates(
            hyper, G, GWR, GWT, GC, GA, GB, sj, r, t, g * g, h, bn2, an2, _YES
        )
        ed = 0.5 * (ed + ed2)
        Q += er2 + et2 + ec2
    else:
        er2 = et2 = ec2 = 0.0
    mu = hyper[H_L2_LIN] * er  # linear decay rate (one linear rate: adaptive needs λ_w = 0)
    L0 = 0.0
    if mu != 0.0:
        L0 = _lin1(WR, WT, WC, si, r, t)
        if sj >= 0:
            L0 -= _lin1(WR, WT, WC, sj, r, t)
    sigma, psi, h_eff = step_flow(
        loss, p0, y, tau, h, sp, sm, c0, Q, ed, lam, L0, mu, hyper[H_ODE_TOL]
    )
    if sigma == 0.0 and h_eff == 0.0:
        return
    u = ed * sigma
    dec = math.exp(-ed * lam * h_eff)
    ldec = math.exp(-mu * h_eff)
    _apply(A, B, WR, WT, WC, si, r, t, u, dec, ldec, er * psi, et * psi, ec * psi)
    if sj >= 0:
        _apply(A, B, WR, WT, WC, sj, r, t, -u, dec, ldec, -er2 * psi, -et2 * psi, -ec2 * psi)


@jit
def _best_in(A, B, WR, WT, WC, r, t, lo, hi, K):
    best = -1
    bv = -np.inf
    for c in range(lo, min(hi, K)):
        v = _predict1(A, B, WR, WT, WC, c, r, t)
        if v > bv:
            bv = v
            best = c
    return best


# reduction codes
BINARY, OAA, TREE, ORDINAL = 0, 1, 2, 3


@jit_inline
def learn_one(A, B, WR, WT, WC, G, GWR, GWT, GC, GA, GB, hyper, reduction, K, r, t, lab, h):
    """Learn one example (rater slot r, task slot t, class lab, weight h > 0)."""
    if reduction != TREE:
        # binary and ordinal: one scorer; one-against-all: scorer c learns "lab == c"
        alone = np.int64(-1)  # (not the literal -1: one compiled specialization, see _numba)
        for c in range(K if reduction == OAA else 1):
            if reduction == ORDINAL:
                y = float(lab)
            elif reduction == BINARY:
                y = 1.0 if lab == 1 else -1.0
            else:
                y = 1.0 if c == lab else -1.0
            update_pair(A, B, WR, WT, WC, G, GWR, GWT, GC, GA, GB, hyper, c, alone, r, t, y, h)
    else:
        # scoring filter tree (seed 000, "Cost Sensitive Multi Label"): label lab meets the
        # winner of the sibling subtree at each level; the node's classifier is
        # 1[f_lab > f_opp], trained as p = f_lab − f_opp with label +1; training stops
        # at the first level the label loses (the importance weights above it are 0).
        width = 1
        while True:
            if width >= K:
                break
            base = (lab // (2 * width)) * (2 * width)
            sib = base + width if (lab - base) < width else base
            opp = _best_in(A, B, WR, WT, WC, r, t, sib, sib + width, K)
            if opp >= 0:
                update_pair(
                    A, B, WR, WT, WC, G, GWR, GWT, GC, GA, GB, hyper, lab, opp, r, t, 1.0, h
                )
                if _predict1(A, B, WR, WT, WC, lab, r, t) <= _predict1(A, B, WR, WT, WC, opp, r, t):
                    break
            width *= 2
    G[0] += h


@jit
def _learn_one_compiled(
    A, B, WR, WT, WC, G, GWR, GWT, GC, GA, GB, hyper, reduction, K, r, t, lab, h
):
    """``learn_one`` as a call: h_min's searches call it, so that their kernels hold one copy
    of it, not one inlined per call site."""
    learn_one(A, B, WR, WT, WC, G, GWR, GWT, GC, GA, GB, hyper, reduction, K, r, t, lab, h)


@jit
def learn_many(
    A, B, WR, WT, WC, G, GWR, GWT, GC, GA, GB, hyper, reduction, K, raters, tasks, labels, weights
):
    """Learn examples in array order (deterministic: sequential, no fastmath)."""
    R = A.shape[0]
    T = B.shape[0]
    for n in range(raters.shape[0]):
        h = weights[n]
        if h <= 0.0:
            continue
        r = _slot(raters[n], R)
        t = _slot(tasks[n], T)
        learn_one(
            A, B, WR, WT, WC, G, GWR, GWT, GC, GA, GB, hyper, reduction, K, r, t, labels[n], h
        )


@jit
def predict_many(A, B, WR, WT, WC, raters, tasks, out):
    """out[n, s] = f_s(rater n, task n) for every scorer s."""
    R = A.shape[0]
    T = B.shape[0]
    for n in range(raters.shape[0]):
        r = _slot(raters[n], R)
        t = _slot(tasks[n], T)
        for s in range(out.shape[1]):
            out[n, s] = _predict1(A, B, WR, WT, WC, s, r, t)


@jit
def _load_pair(A, B, WR, WT, WC, G, GWR, GWT, GC, GA, GB, r, t, one):
    """Copy the parameters that an example (r, t) reads or moves into the one-slot tables
    ``one`` (slot 0 for both the rater and the task)."""
    a1, b1, wr1, wt1, wc1, g1, gwr1, gwt1, gc1, ga1, gb1 = one
    _copy2(a1[0], A[r])
    _copy2(b1[0], B[t])
    _copy1(wr1[0], WR[r])
    _copy1(wt1[0], WT[t])
    _copy1(wc1, WC)
    g1[0] = G[0]
    _copy1(gc1, GC)
    if GWR.shape[0] > 0:
        _copy1(gwr1[0], GWR[r])
        _copy1(gwt1[0], GWT[t])
        _copy1(ga1[0], GA[r])
        _copy1(gb1[0], GB[t])


@jit
def _copy1(dst, src):
    """``dst[:] = src`` written out: numba's sliced assignment compiles the formatting of its
    shape-mismatch message, seconds of compile time for a copy."""
    for i in range(src.shape[0]):
        dst[i] = src[i]


@jit
def _copy2(dst, src):
    for i in range(src.shape[0]):
        for j in range(src.shape[1]):
            dst[i, j] = src[i, j]


@jit
def _margin_after(A, B, WR, WT, WC, G, GWR, GWT, GC, GA, GB, hyper, reduction, K, r, t, tg, h, one):
    """(f_tg − max_{c≠tg} f_c, whether tg is predicted: argmax, first on ties) after the
    model really learns the example (r, t, tg) with weight h: the learner's own step on
    copied rows."""
    _load_pair(A, B, WR, WT, WC, G, GWR, GWT, GC, GA, GB, r, t, one)
    a1, b1, wr1, wt1, wc1, g1, gwr1, gwt1, gc1, ga1, gb1 = one
    row = np.int64(0)  # (not the literal 0: one compiled specialization, see _numba)
    _learn_one_compiled(
        a1, b1, wr1, wt1, wc1, g1, gwr1, gwt1, gc1, ga1, gb1, hyper, reduction, K, row, row, tg, h
    )
    f = _predict1(a1, b1, wr1, wt1, wc1, tg, row, row)
    margin = np.inf
    wins = True
    for c in range(K):
        if c == tg:
            continue
        v = _predict1(a1, b1, wr1, wt1, wc1, c, row, row)
        margin = min(margin, f - v)
        if v > f or (v == f and c < tg):
            wins = False
    return margin, wins


# h_min's search: weights SEARCH_RATIO apart from 1e-6; around a sampled peak of the margin, a
# golden-section search until its bracket is PEAK_RATIO wide.
SEARCH_RATIO = 2.0
PEAK_RATIO = 1.0 + 1e-4
_GOLD = 0.5 * (math.sqrt(5.0) - 1.0)


@jit
def _win_near_peak(
    A, B, WR, WT, WC, G, GWR, GWT, GC, GA, GB, hyper, reduction, K, r, t, tg, lo, mid, hi, one
):
    """A weight in (lo, hi) at which tg is predicted, or 0: a golden-section search (on log h)
    for the largest margin, whose samples bracket it at mid (margin(mid) above both ends)."""
    a, b, c = math.log(lo), math.log(mid), math.log(hi)
    fb = _margin_after(
        A, B, WR, WT, WC, G, GWR, GWT, GC, GA, GB, hyper, reduction, K, r, t, tg, mid, one
    )[0]
    while c - a > math.log(PEAK_RATIO):
        x = b + (1.0 - _GOLD) * (c - b) if c - b > b - a else b - (1.0 - _GOLD) * (b - a)
        fx, wins = _margin_after(
            A, B, WR, WT, WC, G, GWR, GWT, GC, GA, GB, hyper, reduction, K, r, t, tg,
            math.exp(x), one,
        )  # fmt: skip
        if wins:
            return math.exp(x)
        if fx > fb:  # the peak's bracket narrows around x
            if x > b:
                a = b
            else:
                c = b
            b, fb = x, fx
        elif x > b:
            c = x
        else:
            a = x
    return 0.0


@jit
def _first_win(A, B, WR, WT, WC, G, GWR, GWT, GC, GA, GB, hyper, reduction, K, r, t, tg, one):
    """The first crossing of "tg predicted after learning (r, t, tg) with weight h": doubling
    from 1e-6 (SEARCH_RATIO), then bisection to 1e-12 relative (at most 200 halvings);
    the largest weight found *not* to flip; inf when no weight up to ``H_SEARCH_MAX`` flips
    it. Where the sampled margin (f_tg − the best other) rises then falls, a golden-section
    search looks for a range of winning weights between the samples: with L2 decay a win
    need not last (docs/dyadic.md). (Not checked at the bound first: for squared loss the
    flip need not persist to large weights.)"""
    lo = 0.0  # the largest weight sampled that does not flip it
    h_a = m_a = h_b = m_b = -np.inf  # the two samples before
    hi = 1e-6
    while True:
        m, wins = _margin_after(
            A, B, WR, WT, WC, G, GWR, GWT, GC, GA, GB, hyper, reduction, K, r, t, tg, hi, one
        )
        if not wins and m_a > -np.inf and m_b > m_a and m_b >= m:
            w = _win_near_peak(
                A, B, WR, WT, WC, G, GWR, GWT, GC, GA, GB, hyper, reduction, K, r, t, tg,
                h_a, h_b, hi, one,
            )  # fmt: skip
            if w > 0.0:
                lo, hi, wins = h_a, w, True
        if wins:
            break
        if hi >= H_SEARCH_MAX:
            return np.inf
        lo = hi
        h_a, m_a, h_b, m_b = h_b, m_b, hi, m
        hi *= SEARCH_RATIO
    for _ in range(200):
        if hi - lo <= 1e-12 * hi:
            break
        mid = 0.5 * (lo + hi)
        if _margin_after(
            A, B, WR, WT, WC, G, GWR, GWT, GC, GA, GB, hyper, reduction, K, r, t, tg, mid, one
        )[1]:
            hi = mid
        else:
            lo = mid
    return lo  # 0 when every positive weight flips it (target tied with the best)


@jit
def h_min_many(
    A, B, WR, WT, WC, G, GWR, GWT, GC, GA, GB, hyper, reduction, K, raters, tasks, targets, out
):
    """Smallest importance weight of an example (r, t, target) that makes target predicted.

    Binary and ordinal: part II's h_min(x, y) with x the decision boundary (ordinal: the
    edge of the target code's cell on the predicted code's side, target ∓ ½). One-against-all and filter tree:
    the first weight at which the learner's own step (``learn_one`` on copied rows) makes
    target the argmax, found by doubling then bisection (``_first_win``).
    """
    R = A.shape[0]
    T = B.shape[0]
    S = A.shape[1]
    one = (
        np.empty((1, S, A.shape[2])), np.empty((1, S, B.shape[2])), np.empty((1, S)),
        np.empty((1, S)), np.empty(S), np.empty(1), np.empty((min(GWR.shape[0], 1), S)),
        np.empty((min(GWT.shape[0], 1), S)), np.empty(S), np.empty((min(GA.shape[0], 1), S)),
        np.empty((min(GB.shape[0], 1), S)),
    )  # fmt: skip
    loss = int(hyper[H_LOSS])
    tau = hyper[H_TAU]
    lam = hyper[H_L2]
    tol = hyper[H_ODE_TOL]
    first, alone = np.int64(0), np.int64(-1)  # (not literals: see _numba)
    for n in range(raters.shape[0]):
        r = _slot(raters[n], R)
        t = _slot(tasks[n], T)
        tg = targets[n]
        if reduction == BINARY or reduction == ORDINAL:  # noqa: SIM109 (numba)
            p0 = _predict1(A, B, WR, WT, WC, first, r, t)
            if reduction == BINARY:
                pred = 1 if p0 > 0.0 else 0
                if pred == tg:
                    out[n] = 0.0
                    continue
                y = 1.0 if tg == 1 else -1.0
                x = 0.0
            else:
                pred = min(max(math.floor(p0 + 0.5), 0), K - 1)
                if pred == tg:
                    out[n] = 0.0
                    continue
                y = float(tg)
                x = tg - 0.5 if tg > pred else tg + 0.5  # the edge of target's cell
            sp, sm, c0 = _pair_stats(A, B, first, alone, r, t)
            ed, er, et, ec = _rates(
                hyper, G, GWR, GWT, GC, GA, GB, first, r, t, 0.0, 0.0, 0.0, 0.0, _NO
            )
            mu = hyper[H_L2_LIN] * er
            L0 = _lin1(WR, WT, WC, first, r, t)
            out[n] = h_min_flow(loss, p0, y, tau, x, sp, sm, c0, er + et + ec, ed, lam, L0, mu, tol)
            continue
        best = _best_in(A, B, WR, WT, WC, r, t, first, K, K)
        if best == tg:
            out[n] = 0.0
            continue
        out[n] = _first_win(
            A, B, WR, WT, WC, G, GWR, GWT, GC, GA, GB, hyper, reduction, K, r, t, tg, one
        )


# ---------------------------------------------------------------- initial factors
_SM_GAMMA, _SM_M1, _SM_M2 = (
    np.uint64(0x9E3779B97F4A7C15),
    np.uint64(0xBF58476D1CE4E5B9),
    np.uint64(0x94D049BB133111EB),
)


@jit
def initial_factors(slots, base, init_scale, out):
    """out[n, j] = 1 + init_scale (2u − 1), u = the top 53 bits of splitmix64(base +
    slots[n]·width + j) over 2^53 (width = out.shape[1]; uint64 arithmetic wraps)."""
    width = out.shape[1]
    w = np.uint64(width)
    for n in range(slots.shape[0]):
        start = base + np.uint64(slots[n]) * w
        for j in range(width):
            z = start + np.uint64(j) + _SM_GAMMA
            z = (z ^ (z >> np.uint64(30))) * _SM_M1
            z = (z ^ (z >> np.uint64(27))) * _SM_M2
            z = z ^ (z >> np.uint64(31))
            u = np.float64(z >> np.uint64(11)) * (1.0 / 9007199254740992.0)
            out[n, j] = 1.0 + init_scale * (2.0 * u - 1.0)
