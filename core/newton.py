"""Later passes by trust-region Newton on the observed-data objective F (docs/model.md,
"Later passes by trust-region Newton", eq. 17-20).

Each pass evaluates F at a few candidate steps from the last accepted point in one sweep
over the items (eq. 20) and keeps the best, whose posteriors give the gradient and the
curvature for the next step; the step itself needs one more pass over the labels for the soft
counts and one per conjugate-gradient iteration (a product with the missing information, at
most ``_CG_MAX_ITER``). The step maximises the quadratic model of F within a trust
region (Steihaug's conjugate gradients), preconditioned by the complete-data information, so
the first conjugate-gradient direction is an EM step and later ones add what EM misses: the
missing information that makes EM crawl (eq. 18).

The state is x = (gamma_pi, Gamma, Theta_s for every slot with labels), Theta_s = Gamma + A_s.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from core import _kernels
from core._softmax_rows import softmax_rows_den, solve_softmax_rows
from core.blocks import FloatArray, IntArray, LabelBlocks
from core.nominal import NominalConfig, NominalParams, log_softmax

CANDIDATE_RADII = (0.25, 0.5, 1.0, 2.0, 4.0)
"""The candidate steps of a pass: trust-region solves at these multiples of the radius."""
_CG_MAX_ITER = 8
"""Conjugate-gradient iterations per step (products M v); 200 measured no better and slower
(docs/model.md, eq. 20)."""
_CG_RTOL = 1e-8


@dataclass(frozen=True)
class NewtonResult:
    params: NominalParams
    """The last accepted point (A = Theta - Gamma, scale 1)."""
    posteriors: FloatArray
    """The items' posteriors at it (the E-step of its pass)."""
    objective: list[float]
    """F at the accepted point after each pass."""


class _Layout:
    """x = (gamma_pi, Gamma, Theta) as one flat vector; views into it by name."""

    def __init__(self, n_classes: int, n_slots: int) -> None:
        K = n_classes
        self.K, self.W = K, n_slots
        self.size = K + K * K + n_slots * K * K

    def split(self, x: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray]:
        K, W = self.K, self.W
        return x[:K], x[K : K + K * K].reshape(K, K), x[K + K * K :].reshape(W, K, K)

    def pack(self, params: NominalParams) -> FloatArray:
        theta = params.worker_logits(np.arange(params.worker.shape[0]))
        return np.concatenate([params.class_logits, params.population.ravel(), theta.ravel()])

    def unpack(self, x: FloatArray) -> NominalParams:
        g_pi, gamma, theta = self.split(x)
        return NominalParams(g_pi.copy(), gamma.copy(), theta - gamma[None])


class _Curvature:
    """F's gradient at a point and two operators on directions v: (B + prior) v, the
    complete-data information (eq. 17), and (B + prior - M) v = -Hessian(F) v (eq. 18)."""

    def __init__(
        self,
        items: LabelBlocks,
        layout: _Layout,
        config: NominalConfig,
        x: FloatArray,
        q: FloatArray,
    ) -> None:
        self.items, self.layout, self.config, self.q = items, layout, config, q
        W, eye = layout.W, np.eye(layout.K)
        g_pi, gamma, theta = layout.split(x)
        self.pi = np.exp(log_softmax(g_pi))
        self.p = np.exp(log_softmax(theta))
        counts = np.empty_like(theta)
        _kernels.soft_counts(items.ptr, items.slots, items.labels, items.weights, q, counts)
        self.c = counts.sum(axis=2)  # C_{s,z}
        n = float(q.shape[0])
        lam_a, lam_g, lam_pi = (
            config.worker_prior,
            config.population_precision(),
            config.class_prior_strength,
        )
        a = theta - gamma[None]
        # each row's data gradient N - C p (eq. 12); its information C (diag p - p p^T) plus
        # the prior, diagonal minus rank one, is inverted in O(K) (``_row_solve``)
        data_grad = counts - self.c[..., None] * self.p
        self.gradient = np.concatenate([
            q.sum(axis=0) - n * self.pi - lam_pi * (g_pi - config.class_prior_logits()),
            (lam_a * a.sum(axis=0) - lam_g * (gamma - config.population_mean())).ravel(),
            (data_grad - lam_a * a).ravel(),
        ])  # fmt: skip
        self.class_block = n * (np.diag(self.pi) - np.outer(self.pi, self.pi)) + lam_pi * eye
        # row (s, z)'s inverse is diag(1 / a) + (C / den) u u^T with a = C p + lam_A, u = p / a
        self.diag = self.c[..., None] * self.p + lam_a
        u = self.p / self.diag
        self.den = np.empty(self.c.size)
        softmax_rows_den(self.c.ravel(), self.p.reshape(-1, layout.K), lam_a, self.den)
        self.den = self.den.reshape(self.c.shape)
        # Gamma couples to every Theta_s through the prior: its Schur complement per row z
        weighted = u * (self.c / self.den)[..., None]
        rows_inv_sum = np.einsum("szk,szm->zkm", weighted, u, optimize=True)
        diagonal = np.arange(layout.K)
        rows_inv_sum[:, diagonal, diagonal] += (1.0 / self.diag).sum(axis=0)
        schur = (lam_a * W + lam_g) * eye - lam_a**2 * rows_inv_sum
        self.schur_inv = np.linalg.inv(schur)
        self.class_inv = np.linalg.inv(self.class_block)

    def _row_solve(self, r: FloatArray) -> FloatArray:
        """Each row's (C (diag p - p p^T) + lam_A I)^-1 r, in O(K) (``core._softmax_rows``)."""
        K = self.layout.K
        out = np.empty(r.shape)
        solve_softmax_rows(
            self.c.ravel(), self.p.reshape(-1, K), self.config.worker_prior,
            np.ascontiguousarray(r, dtype=np.float64).reshape(-1, K), out.reshape(-1, K),
        )  # fmt: skip
        return out

    def information(self, v: FloatArray) -> FloatArray:
        """(B + prior) v: the complete-data information plus the prior's precision."""
        cfg, lay = self.config, self.layout
        v_pi, v_gamma, v_theta = lay.split(v)
        lam_a = cfg.worker_prior
        pv = np.einsum("szk,szk->sz", self.p, v_theta)
        o_theta = self.c[..., None] * self.p * (v_theta - pv[..., None]) + lam_a * (
            v_theta - v_gamma[None]
        )
        o_gamma = (
            lam_a * (lay.W * v_gamma - v_theta.sum(axis=0)) + cfg.population_precision() * v_gamma
        )
        return np.concatenate([self.class_block @ v_pi, o_gamma.ravel(), o_theta.ravel()])

    def neg_hessian(self, v: FloatArray) -> FloatArray:
        """-Hessian(F) v = (B + prior) v - M v, M the missing information (eq. 18)."""
        out = self.information(v)
        lay, it = self.layout, self.items
        v_pi, _, v_theta = lay.split(v)
        m_pi, m_theta = np.zeros(lay.K), np.zeros((lay.W, lay.K, lay.K))
        _kernels.missing_information_product(
            it.ptr, it.slots, it.labels, it.weights, self.q, self.p, self.pi,
            v_pi, v_theta, m_pi, m_theta,
        )  # fmt: skip
        o_pi, _, o_theta = lay.split(out)
        o_pi -= m_pi
        o_theta -= m_theta
        return out

    def precondition(self, r: FloatArray) -> FloatArray:
        """(B + prior)^-1 r: per row, with Gamma eliminated through its Schur complement."""
        lay, lam_a = self.layout, self.config.worker_prior
        r_pi, r_gamma, r_theta = lay.split(r)
        y = self._row_solve(r_theta)
        x_gamma = np.einsum("zkm,zm->zk", self.schur_inv, r_gamma + lam_a * y.sum(axis=0))
        x_theta = y + lam_a * self._row_solve(np.broadcast_to(x_gamma, r_theta.shape))
        return np.concatenate([self.class_inv @ r_pi, x_gamma.ravel(), x_theta.ravel()])

    def norm(self, v: FloatArray) -> float:
        return math.sqrt(max(float(v @ self.information(v)), 0.0))


def steihaug(curv: _Curvature, radii: tuple[float, ...]) -> list[FloatArray]:
    """For each radius, approximately maximise g.d - d.H d / 2 over ||d|| <= radius in the
    (B + prior) norm (eq. 19): preconditioned conjugate gradients, stopped at the boundary or
    at a direction of non-negative curvature of F (Steihaug 1983). The CG iterates do not
    depend on the radius, so one run serves every radius (in increasing order)."""
    g = curv.gradient
    steps: list[FloatArray] = []
    d = np.zeros_like(g)
    r = g.copy()
    y = curv.precondition(r)
    direction = y
    ry = float(r @ y)
    r0 = math.sqrt(max(ry, 0.0))
    if r0 == 0.0:  # a stationary point: no step
        return [d] * len(radii)
    for _ in range(_CG_MAX_ITER):
        hd = curv.neg_hessian(direction)
        kappa = float(direction @ hd)
        if kappa <= 0.0:
            break
        alpha = ry / kappa
        trial = d + alpha * direction
        length = curv.norm(trial)
        while len(steps) < len(radii) and length >= radii[len(steps)]:
            steps.append(_to_boundary(curv, d, direction, radii[len(steps)]))
        if len(steps) == len(radii):
            return steps
        d = trial
        r = r - alpha * hd
        y = curv.precondition(r)
        ry_next = float(r @ y)
        if math.sqrt(max(ry_next, 0.0)) <= _CG_RTOL * r0:
            return steps + [d] * (len(radii) - len(steps))
        direction = y + (ry_next / ry) * direction
        ry = ry_next
    else:
        return steps + [d] * (len(radii) - len(steps))
    return steps + [_to_boundary(curv, d, direction, rad) for rad in radii[len(steps) :]]


def _to_boundary(
    curv: _Curvature, d: FloatArray, direction: FloatArray, radius: float
) -> FloatArray:
    """d + tau direction with tau >= 0 on the trust region's boundary."""
    pd = curv.information(direction)
    a, b = float(direction @ pd), 2.0 * float(d @ pd)
    c = float(d @ curv.information(d)) - radius**2
    tau = (-b + math.sqrt(max(b * b - 4.0 * a * c, 0.0))) / (2.0 * a)
    return d + tau * direction


def _evaluate(
    items: LabelBlocks,
    layout: _Layout,
    config: NominalConfig,
    known: IntArray,
    xs: list[FloatArray],
) -> tuple[list[float], FloatArray]:
    """One sweep over the items: F (with the prior) and the posteriors at each x in xs."""
    K, W = layout.K, layout.W
    log_pis, tables = np.empty((len(xs), K)), np.empty((len(xs), W, K, K))
    priors = []
    for c, x in enumerate(xs):
        g_pi, gamma, theta = layout.split(x)
        log_pis[c] = log_softmax(g_pi)
        tables[c] = log_softmax(theta)
        priors.append(config.log_prior(g_pi, gamma, theta - gamma[None]))
    q, data = np.empty((len(xs), items.n_blocks, K)), np.empty(len(xs))
    _kernels.estep_tables(
        items.ptr, items.slots, items.labels, items.weights, known, log_pis, tables, q, data
    )
    return [float(d) + p for d, p in zip(data, priors, strict=True)], q


def newton_passes(
    config: NominalConfig,
    items: LabelBlocks,
    start: NominalParams,
    passes: int,
    known: IntArray | None = None,
    progress: Callable[[int, float], None] | None = None,
) -> NewtonResult:
    """``passes`` sweeps over ``items`` (one block per item, slots coded 0..W-1 with
    ``start.worker`` of shape (W, K, K)) from ``start``: the first takes the E-step there, each
    later one evaluates the candidate steps and keeps the best if it raises F (eq. 20).
    ``known[i]`` >= 0 holds item i's posterior at that class. ``progress(sweep, F)`` is called
    after each sweep with F at the accepted point. Deterministic."""
    if config.difficulty:
        raise ValueError("Newton passes need a model without difficulty")
    layout = _Layout(config.n_classes, start.worker.shape[0])
    known_a = np.full(items.n_blocks, -1, dtype=np.int64) if known is None else known
    x = layout.pack(start)
    (f,), q = _evaluate(items, layout, config, known_a, [x])
    curv = _Curvature(items, layout, config, x, q[0])
    radius = curv.norm(curv.precondition(curv.gradient))  # the EM step's length
    history = [f]
    if progress is not None:
        progress(1, f)
    point = (x, f, q[0], curv)
    for _ in range(passes - 1):
        x, f, _, curv = point
        steps: list[FloatArray] = []
        lengths: list[float] = []
        for step in steihaug(curv, tuple(factor * radius for factor in CANDIDATE_RADII)):
            length = curv.norm(step)
            if lengths and abs(length - lengths[-1]) <= 1e-9 * max(length, 1.0):
                continue  # the Newton point lies inside: larger radii give the same step
            steps.append(step)
            lengths.append(length)
        values, posteriors = _evaluate(items, layout, config, known_a, [x + s for s in steps])
        best = int(np.argmax(values))
        if values[best] > f:
            x_new = x + steps[best]
            point = (
                x_new,
                values[best],
                posteriors[best],
                _Curvature(items, layout, config, x_new, posteriors[best]),
            )
            radius = max(lengths[best], CANDIDATE_RADII[0] * radius)
        else:
            radius *= CANDIDATE_RADII[0] ** 2
        history.append(point[1])
        if progress is not None:
            progress(len(history), point[1])
    return NewtonResult(layout.unpack(point[0]), point[2], history)
