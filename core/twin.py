"""The pooled twin of the online model: how strongly one pass pools, chosen by the answers.

On crowds whose answers carry little signal each (workers right 55-65% of the time, many
answers an item) the slot rows that one pass learns at the worker prior λ_A are mostly noise,
and the pass ends several points below majority vote; pooled toward the population
(λ_A x MAX_POOLING) it ends near the exact posterior. Elsewhere (spammers, experts, full
confusions) the pooled model loses. Batch EM chooses by the held-out answers (eq. 28,
``core.pooling``); a pass has its own held-out score: the prequential evidence of eq. 22,
each answer predicted before its item moves the model. The twin learns the same labels at
the pooled prior; ``OnlineEM.settle`` keeps whichever of the two predicted the answers better
(docs/model.md eq. 29) at a pass's end, ``OnlineEM.lead`` serves it (both kept) at a
refinement sweep's start, and once answers of weight TWIN_ANSWERS have been scored the twin
is settled for good, after which the work per label is that of one model again.
"""

from __future__ import annotations

import numpy as np

from core.evidence import RHO_GRID
from core.nominal import NominalConfig, NominalParams

MAX_POOLING = 32.0
"""The pooled worker prior is this many times the configured one (the most that batch EM's
search, ``core.pooling``, tries)."""
MAX_TWIN_CLASSES = 16
"""Models of more classes learn without a twin: its tables (S K^2 floats twice) double the
model's while it learns, and with many classes each answer carries more signal (a wrong one
is spread over K - 1 classes), so the weak crowds the twin is for are binary or few-class."""
TWIN_ANSWERS = 100_000.0
"""The twin is settled at the first orientation check point of the step count (one call or
many settle at the same item) once the model has scored answers of this much weight (eq. 22:
from there on it scores one item arrival in 8)."""


def has_twin(n_classes: int) -> bool:
    """Whether a new model of ``n_classes`` classes learns beside a pooled twin."""
    return n_classes <= MAX_TWIN_CLASSES


def pooled(config: NominalConfig) -> NominalConfig:
    """``config`` with the worker prior MAX_POOLING times stronger."""
    return config.with_(worker_prior=MAX_POOLING * config.worker_prior)


def evidence_per_answer(params: NominalParams) -> float | None:
    """The best mean log score per scored answer over the tempering grid (eq. 22), or None
    before any answer was scored."""
    ev, G = params.evidence, RHO_GRID.size
    if ev is None or not ev[G] > 0:
        return None
    return float(np.max(ev[:G] / ev[G]))


def twin_due(model: NominalParams) -> bool:
    """Whether the twin is to be settled now (at a check point): TWIN_ANSWERS scored."""
    ev = model.evidence
    return ev is not None and float(ev[RHO_GRID.size]) >= TWIN_ANSWERS


def twin_predicts_better(model: NominalParams, twin: NominalParams) -> bool:
    """Whether the twin's answers were predicted better (eq. 29): ties and a model that
    scored nothing keep the model."""
    mine, theirs = evidence_per_answer(model), evidence_per_answer(twin)
    return mine is not None and theirs is not None and theirs > mine
