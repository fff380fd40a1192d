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


def relabelling_costs(params: NominalParams, config: NominalConfig) -> FloatArray:
    """cost[r, z]: minus the log prior of Γ's row r and the class logit r when they stand for
    class z (Γ_z ~ N(M_z, 1/λ_Γ), γ_π,z ~ N(m_z, 1/λ_π); the worker prior does not move)."""
    rows, mean = params.population, config.population_mean()
    logits, logit_mean = params.class_logits, config.class_prior_logits()
    squares = (rows**2).sum(axis=1)[:, None] + (mean**2).sum(axis=1)[None, :] - 2.0 * rows @ mean.T
    costs: FloatArray = 0.5 * config.population_prior * squares
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
    """Relabel the parameters' latent classes in place: new class z is old class ``perm[z]``
    (the answer labels, the columns, stay). The items' statistics (``counts``, the class
    totals) and posteriors stay as they are: the check runs after every learning call, so
    they were made, but for that call's (``OnlineEM`` predicts those again), under the
    labelling the parameters come back to."""
    params.class_logits[:] = params.class_logits[perm]
    params.population[:] = params.population[perm]
    params.worker[:] = params.worker[:, perm]
    if params.sums is not None:  # (its first K*K: the worker table summed over slots)
        K = perm.size
        assert params.sums.shape == (sums_size(K),)
        worker_sum = params.sums[: K * K].reshape(K, K)
        worker_sum[:] = worker_sum[perm]
