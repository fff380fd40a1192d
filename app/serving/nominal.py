"""What the API serves, computed from stored state under the current parameters.

An item's posterior is recomputed on read from its labels and the current parameters of the
slots involved (docs/architecture.md, "Consistent posteriors"), so a GET never serves a
posterior older than the parameters. Lists and exports serve the engine's stored posteriors,
each with the time it was computed.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np
import orjson

from core.acquisition import BoolArray
from core.blocks import FloatArray, LabelBlocks
from core.calibration import Calibration
from core.hashing import worker_slot
from core.nominal import NominalConfig, NominalParams
from core.online import OnlineEM
from core.served import held_out_posteriors


@functools.lru_cache(maxsize=4096)
def iso(ts: float) -> str:
    """``ts`` in ISO 8601, UTC, to the millisecond (cached: the items a step wrote share it)."""
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class Globals:
    class_logits: FloatArray
    population: FloatArray
    scalars: FloatArray
    position: int
    computed_at: float
    n_items: int
    n_workers: int
    n_labels: int
    dyadic_examples: int = 0
    calibration: Calibration = field(default_factory=Calibration)
    evidence: FloatArray | None = None
    """The prequential evidence of the calibration's tempering (docs/model.md eq. 22)."""
    queue: dict[str, Any] | None = None
    """The campaign's progress under the stopping rule (``app.engine.queue.Progress``)."""
    dyadic_position: int | None = None
    """The log position the dyadic model has learned up to (None: no dyadic model)."""
    last_refit: dict[str, Any] | None = None
    """The last refit's position, agreement with the served labels, and whether it was
    adopted (``ProjectEngine._refit``); None before the first."""
    n_gold: int | None = None
    """Items with gold as of the calibration served (None: written by an older engine)."""

    @classmethod
    def parse(cls, blob: bytes | None, config: NominalConfig) -> Globals:
        if blob is None:  # nothing applied yet: the prior means
            p = NominalParams.initial(config.with_(n_worker_slots=1))
            return cls(p.class_logits, p.population, p.scalars, 0, 0.0, 0, 0, 0, n_gold=0)
        d = orjson.loads(blob)
        return cls(
            np.asarray(d["class_logits"]),
            np.asarray(d["population"]),
            np.asarray(d["scalars"]),
            d["position"],
            d["computed_at"],
            d["n_items"],
            d["n_workers"],
            d["n_labels"],
            d.get("dyadic_examples", 0),
            Calibration.from_dict(d.get("calibration")),
            np.asarray(d["evidence"]) if d.get("evidence") else None,
            d.get("queue"),
            d.get("dyadic_position"),
            d.get("last_refit"),
            d.get("n_gold"),
        )


def slot_rows(rows: list[bytes | None], K: int) -> FloatArray:
    """Stored (scaled) deviation rows; a slot never written is at its prior mean, 0."""
    out = np.zeros((len(rows), K, K))
    for n, r in enumerate(rows):
        if r is not None:
            out[n] = np.frombuffer(r, dtype=np.float64).reshape(K, K)
    return out


def item_slots(item: dict[str, Any], n_slots: int) -> tuple[list[int], list[int]]:
    """Distinct slots of the item's workers and each label's index into them."""
    slot_of: dict[str, int] = {}
    index: dict[int, int] = {}
    local: list[int] = []
    for w, _, _ in item["labels"]:
        s = slot_of.get(w)
        if s is None:
            s = slot_of[w] = worker_slot(w, n_slots)
        local.append(index.setdefault(s, len(index)))
    return list(index), local


def recompute_posterior(
    config: NominalConfig,
    item: dict[str, Any],
    g: Globals,
    rows: list[bytes | None],
    local: list[int],
) -> FloatArray:
    """The item's posterior under the current parameters, calibrated as served
    (docs/model.md eq. 21; gold items are certain)."""
    K = config.n_classes
    if item.get("gold") is not None:
        out: FloatArray = np.eye(K)[item["gold"]]
        return out
    labels = item["labels"]
    n = len(labels)
    cfg = config.with_(n_worker_slots=max(len(rows), 1))
    params = NominalParams(
        g.class_logits,
        g.population,
        slot_rows(rows, K) if rows else np.zeros((1, K, K)),
        g.scalars.copy(),
    )
    blocks = LabelBlocks(
        np.array([0, n], dtype=np.int64),
        np.asarray(local, dtype=np.int64),
        np.fromiter((z for _, z, _ in labels), dtype=np.int64, count=n),
        np.fromiter((x for _, _, x in labels), dtype=np.float64, count=n),
    )
    raw = OnlineEM(cfg, params).predict_many(blocks).posteriors
    if item.get("held_out") is not None:  # scored without its own pull since a sweep (eq. 26)
        raw = held_out_posteriors(raw, np.array([item["held_out"]], dtype=np.float64))
    posterior: FloatArray = g.calibration.from_posteriors(raw, [blocks.weights.sum()])[0]
    return posterior


def has_evidence(item: dict[str, Any]) -> bool:
    """The item has labels or a gold answer, so a most probable label to serve. An item
    registered for the queue and not labelled yet has none: its posterior is the prior."""
    return bool(item["labels"]) or item.get("gold") is not None


def stored_posterior(item: dict[str, Any], g: Globals) -> FloatArray:
    """A stored item's posterior (the engine's latest, under the parameters it was computed
    with) as served: calibrated with the project's current calibration (eq. 21)."""
    out: FloatArray = stored_posteriors([item], g)[0]
    return out


def stored_posteriors(items: list[dict[str, Any]], g: Globals) -> FloatArray:
    """``stored_posterior`` of many items, calibrated in one call (rows as ``items``)."""
    if not items:
        return np.empty((0, g.class_logits.shape[0]))
    q = np.array([d["posterior"] for d in items], dtype=np.float64)
    n = [sum(x for _, _, x in d["labels"]) for d in items]
    gold = np.array([d.get("gold") is not None for d in items])
    return served_posteriors(q, np.asarray(n, dtype=np.float64), gold, g)


def served_posteriors(q: FloatArray, weight: FloatArray, gold: BoolArray, g: Globals) -> FloatArray:
    """Stored posteriors ``q`` as served: calibrated with ``g``'s calibration (eq. 21, n_i
    the items' label ``weight``), a ``gold`` item's as stored (certain)."""
    out: FloatArray = g.calibration.from_posteriors(q, weight)
    out[gold] = q[gold]
    return out


def confusions(g: Globals, rows: FloatArray) -> FloatArray:
    """P(answer l | true class z) of each slot: softmax over l of Gamma + scale * A_s."""
    logits = g.population[None] + g.scalars[0] * rows
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    out: FloatArray = e / e.sum(axis=-1, keepdims=True)
    return out


def class_priors(g: Globals) -> FloatArray:
    e = np.exp(g.class_logits - g.class_logits.max())
    out: FloatArray = e / e.sum()
    return out


def quality(confusion: FloatArray, prior: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Expected accuracy sum_z pi_z C[z, z], and informativeness: the mutual information
    between true class and answer over the entropy of the class prior (0 for a spammer whose
    answers do not depend on the truth, 1 for a perfect worker)."""
    acc: FloatArray = np.einsum("z,wzz->w", prior, confusion)
    joint = prior[None, :, None] * confusion
    answer = joint.sum(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(joint > 0, joint * np.log(joint / (prior[None, :, None] * answer)), 0.0)
    seen = prior[prior > 0]  # (0 log 0 = 0: a class whose prior underflowed to 0)
    h = -(seen * np.log(seen)).sum()
    info: FloatArray = terms.sum(axis=(1, 2)) / h if h > 0 else np.zeros(len(confusion))
    return acc, np.clip(info, 0.0, 1.0)
