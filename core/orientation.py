"""Which way round the latent classes are: the relabelling that the priors prefer.

The likelihood of the answers is unchanged when the true classes z are relabelled, the rows
of every confusion (Γ and each A_s), the class prior and the per-class statistics permuted
together (docs/model.md, "Orientation"): only the priors tell the labellings apart, Γ's mean
c_0 I ("workers beat chance") first. EM's continuous steps cannot jump between labellings,
and on crowds whose answers carry little signal each (weak workers, many answers an item) the
online pass can drift across into the mirror image and stay there, every item's most
probable class then the wrong one. ``best_relabelling`` finds the labelling of highest prior
(swaps of two classes while one helps: exact for two classes, a local optimum beyond), and
``relabel`` moves the parameters to it; with no gold, that only raises the MAP objective.
"""

from __future__ import annotations

import numpy as np

from core.blocks import FloatArray, IntArray
from core.nominal import NominalConfig, NominalParams, sums_size

_MIN_GAIN = 0.01
"""A relabelling must raise the log prior by more than this (in nats): near-ties, as on
answers with no signal, are left alone rather than relabelled back and forth."""


DENSE_UNTIL = 10_000
"""Items learned (the step count t) up to which the labelling is checked every ``DENSE_EVERY``
items: early, where the steps are large and the rows immature, is where a pass drifts across."""
DENSE_EVERY = 64
SPARSE_EVERY = 4096
"""The check's period after ``DENSE_UNTIL``."""


def check_points(t0: int, n: int) -> list[int]:
    """The positions k in 1..n after which a run of n item steps from step count t0 checks the
    labelling: where t0 + k is a multiple of the period. They depend on t alone, so a stream
    learned in one call or in many checks at the same items (replays and the service's
    batching agree)."""
    t = t0 + np.arange(1, n + 1)
    due = np.where(t <= DENSE_UNTIL, t % DENSE_EVERY == 0, t % SPARSE_EVERY == 0)
    return (np.flatnonzero(due) + 1).tolist()


def relabelling_costs(params: NominalParams, config: NominalConfig) -> FloatArray:
    """cost[r, z]: minus the log prior of Γ's row r and the class logit r when they stand for
    class z (Γ_z ~ N(M_z, 1/λ_Γ), γ_π,z ~ N(m_z, 1/λ_π); the worker prior does not move)."""
    rows, mean = params.population, config.population_mean()
    logits, logit_mean = params.class_logits, config.class_prior_logits()
    squares = (rows**2).sum(axis=1)[:, None] + (mean**2).sum(axis=1)[None, :] - 2.0 * rows @ mean.T
    costs: FloatArray = 0.5 * config.population_precision() * squares
    costs += 0.5 * config.class_prior_strength * (logits[:, None] - logit_mean[None, :]) ** 2
    return costs


def best_relabelling(params: NominalParams, config: NominalConfig) -> IntArray | None:
    """``perm`` (new class z = old class perm[z]) of lower prior cost by more than
    ``_MIN_GAIN``, by taking the best swap of two classes while one gains that much; None when
    none does (or the parameters are not finite)."""
    costs = relabelling_costs(params, config)
    if not np.all(np.isfinite(costs)):
        return None
    K = costs.shape[0]
    # (a gain must also stand above the rounding of costs this large)
    least = _MIN_GAIN + 1e-12 * float(np.abs(costs).max())
    perm = np.arange(K)
    for _ in range(K * K):  # each swap lowers the total cost: a bound never reached
        placed = costs[perm]  # placed[a, z]: the row now at a, standing for z
        kept = np.diag(placed)
        gains = kept[:, None] + kept[None, :] - placed - placed.T  # swapping a and b
        a, b = np.unravel_index(int(np.argmax(gains)), gains.shape)
        if gains[a, b] <= least:
            break
        perm[[a, b]] = perm[[b, a]]
    return None if np.array_equal(perm, np.arange(K)) else perm


def relabel(params: NominalParams, perm: IntArray) -> None:
    """Relabel the latent classes in place, new class z being old class ``perm[z]`` (the
    answer labels, the columns, stay): the rows of γ_π, Γ and every A_s, and of the items'
    statistics (``counts``, the worker table's sum, the class totals). With the items'
    posteriors' columns permuted alike (``OnlineEM`` does it for a call's own; callers that
    keep others, the engine, for theirs), the whole state is the same model labelled the other
    way round: nothing falls out of step."""
    params.class_logits[:] = params.class_logits[perm]
    params.population[:] = params.population[perm]
    params.worker[:] = params.worker[:, perm]
    if params.counts is not None:
        params.counts[:] = params.counts[:, perm]
    if params.sums is not None:
        K = perm.size
        assert params.sums.shape == (sums_size(K),)
        worker_sum = params.sums[: K * K].reshape(K, K)
        worker_sum[:] = worker_sum[perm]
        totals = params.sums[K * K : K * K + K]
        totals[:] = totals[perm]
