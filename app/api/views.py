"""The answers' bodies, built from the served state: projects, items, workers, the queue,
predictions, the dashboard's summary and snapshots.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from app.api.deps import Service
from app.api.schemas import (
    NO_PROGRESS,
    DyadicSettingsBody,
    Hyperparameters,
    Item,
    ItemLabel,
    ProjectStats,
    QueueItem,
    RefitReport,
    Worker,
)
from app.engine.dyadic import DyadicSettings
from app.engine.queue import QueueSettings, item_of
from app.serving.kept import Kept
from app.serving.nominal import (
    Globals,
    class_priors,
    confusions,
    has_evidence,
    iso,
    item_slots,
    quality,
    recompute_posterior,
    slot_rows,
    stored_posteriors,
)
from app.serving.predictions import PairPredictions
from app.serving.stored_pages import stored_pages
from app.store.archive import SnapshotInfo
from app.store.base import Progress, ProjectRecord
from core.acquisition import priority


def project_view(
    svc: Service, record: ProjectRecord, progress: Progress | None = None
) -> dict[str, Any]:
    """The project as served; ``progress``: its positions and parameters already read (a
    listing of every project reads them for all in one round trip)."""
    cfg = dict(record.config)
    slots = cfg.pop("n_worker_slots")
    cfg.pop("n_classes")
    dyadic = DyadicSettings.of(record.config)
    hyper = {k: v for k, v in cfg.items() if k in Hyperparameters.model_fields}
    if hyper.get("class_prior") is not None:  # (a tuple in the record made here, JSON's list
        hyper["class_prior"] = list(hyper["class_prior"])  # in one read back from SQL)
    # The positions first, then the counts: the engine writes the counts with the applied
    # position (one transaction), so they are of that position or a later one, never of an
    # earlier state (stats showing the log applied with a state from before it).
    if progress is None:
        log_end, applied = svc.store.log_end(record.name), svc.store.applied_position(record.name)
        g = globals_of(svc, record)
    else:
        log_end, applied = progress.log_end, progress.applied
        g = Globals.parse(progress.globals, svc.config(record))
    return {
        "name": record.name,
        "labels": list(record.labels),
        # As saved, not checked again: a project saved before a bound was added (a first
        # step over MAX_FIRST_STEP) is still listed and read, not a 500 for every listing.
        "hyperparameters": Hyperparameters.model_construct(**hyper),
        "worker_slots": slots,
        "dyadic": dyadic_view(dyadic),
        "created_at": iso(record.created_at),
        "stats": ProjectStats(
            log_end=log_end,
            applied=applied,
            lag=max(log_end - applied, 0),
            n_items=g.n_items,
            n_workers=g.n_workers,
            n_labels=g.n_labels,
            dyadic_passes=g.dyadic_examples / g.n_labels if dyadic and g.n_labels else None,
            dyadic_position=(g.dyadic_position or 0) if dyadic else None,
            last_refit=RefitReport(**g.last_refit) if g.last_refit else None,
        ),
    }


def dyadic_view(settings: DyadicSettings | None) -> DyadicSettingsBody:
    if settings is None:
        return DyadicSettingsBody(enabled=False)
    c = settings.config
    return DyadicSettingsBody.model_construct(  # (as saved: a bound added later is for input)
        enabled=True, k=c.k, loss=c.loss, reduction=c.reduction, ordinal=c.ordinal, eta=c.eta,
        l2=c.l2, dyadic_rate=c.dyadic_rate, passes=settings.passes, rater_slots=c.rater_slots,
        task_slots=c.task_slots,
    )  # fmt: skip


def globals_of(svc: Service, record: ProjectRecord) -> Globals:
    """The project's shared parameters and calibration, as last written by the engine."""
    return Globals.parse(svc.store.get_params(record.name, [])[0], svc.config(record))


def item_view(
    svc: Service,
    record: ProjectRecord,
    item: str,
    blob: bytes,
    with_labels: bool,
    fresh: bool,
    g: Globals | None = None,
) -> Item:
    """An item as served: recomputed under the current parameters (``fresh``), or its stored
    posterior calibrated with ``g``'s calibration (read when not given)."""
    if not fresh:
        g = g if g is not None else globals_of(svc, record)
        return stored_item_views(record, [(item, blob)], g, with_labels)[0]
    d = orjson.loads(blob)
    cfg = svc.config(record)
    slots, local = item_slots(d, cfg.n_worker_slots)
    gblob, rows = svc.store.get_params(record.name, slots)
    g = Globals.parse(gblob, cfg)
    posterior = recompute_posterior(cfg, d, g, rows, local)
    return _item(record, item, d, posterior, time.time(), g.position, with_labels)


def stored_item_views(
    record: ProjectRecord, page: list[tuple[str, bytes]], g: Globals, with_labels: bool = False
) -> list[Item]:
    """Stored items as served, their posteriors calibrated with ``g``'s calibration in one
    call (a page of a listing or an export)."""
    parsed = [orjson.loads(blob) for _, blob in page]
    posteriors = stored_posteriors(parsed, g)
    return [
        _item(record, name, d, p, d["computed_at"], d["position"], with_labels)
        for (name, _), d, p in zip(page, parsed, posteriors, strict=True)
    ]


def _item(
    record: ProjectRecord,
    item: str,
    d: dict[str, Any],
    posterior: np.ndarray,
    computed_at: float,
    position: int,
    with_labels: bool,
) -> Item:
    classes = record.labels
    labels = (
        [ItemLabel(worker=w, label=classes[z], weight=x) for w, z, x in d["labels"]]
        if with_labels
        else None
    )
    return Item(
        **_fields(classes, item, d, posterior.tolist(), computed_at, position), labels=labels
    )


def _fields(
    classes: tuple[str, ...],
    item: str,
    d: dict[str, Any],
    posterior: list[float],
    computed_at: float,
    position: int,
) -> dict[str, Any]:
    """An item's served fields but its labels, in ``Item``'s order; no best label while it
    has no evidence (its posterior is then the prior)."""
    best = max(range(len(posterior)), key=posterior.__getitem__)  # (the first, on ties)
    known = has_evidence(d)
    return {
        "item": item,
        "label": classes[best] if known else None,
        "probability": posterior[best] if known else None,
        "posterior": dict(zip(classes, posterior, strict=True)),
        "n_labels": len(d["labels"]),
        "gold": classes[d["gold"]] if d.get("gold") is not None else None,
        "computed_at": iso(computed_at),
        "position": position,
    }


def within(item: Item, lo: float, hi: float) -> bool:
    """The item's probability is in [lo, hi]; an item without labels has none and is kept
    only when there is no lower bound (lo = 0)."""
    if item.probability is None:
        return lo <= 0
    return lo <= item.probability <= hi


def workers_view(
    svc: Service, record: ProjectRecord, entries: list[tuple[str, bytes]], with_confusion: bool
) -> list[Worker]:
    if not entries:
        return []
    cfg = svc.config(record)
    stats = [orjson.loads(b) for _, b in entries]
    slots = [s["slot"] for s in stats]
    uniq = sorted(set(slots))
    gblob, rows = svc.store.get_params(record.name, uniq)
    g = Globals.parse(gblob, cfg)
    conf_u = confusions(g, slot_rows(rows, cfg.n_classes))
    conf = conf_u[np.searchsorted(uniq, slots)]
    acc, info = quality(conf, class_priors(g))
    classes = record.labels
    out = []
    for n, ((name, _), s) in enumerate(zip(entries, stats, strict=True)):
        matrix = (
            {
                t: dict(zip(classes, row, strict=True))
                for t, row in zip(classes, conf[n].tolist(), strict=True)
            }
            if with_confusion
            else None
        )
        out.append(
            Worker(
                worker=name,
                accuracy=float(acc[n]),
                informativeness=float(info[n]),
                confusion=matrix,
                n_labels=s["n_labels"],
                gold_labels=s["gold_seen"],
                gold_accuracy=s["gold_right"] / s["gold_seen"] if s["gold_seen"] else None,
                slot=s["slot"],
                computed_at=iso(g.computed_at),
            )
        )
    return out


def queue_settings(svc: Service, project: str) -> QueueSettings:
    return _settings(svc.store.queue_settings(project))


def _settings(blob: bytes | None) -> QueueSettings:
    return QueueSettings(**orjson.loads(blob)) if blob else QueueSettings()


@dataclass(frozen=True)
class QueueRead:
    """A page of the queue with its size, settings and the parameters it was served under,
    all as of one write of the engine (``Store.queue_head``)."""

    items: list[QueueItem]
    size: int
    settings: QueueSettings
    globals: Globals


def queue_for(svc: Service, record: ProjectRecord, limit: int, worker: str | None) -> QueueRead:
    """The ``limit`` items to label next, best first; with ``worker``, those it has not
    labelled, ranked by its own confusion (voi, lookahead)."""
    want = limit if worker is None else max(5 * limit, 50)
    head = svc.store.queue_head(record.name, want)
    settings = _settings(head.settings)
    g = Globals.parse(head.globals, svc.config(record))
    items = _queue_items(svc, record, settings, limit, worker, g, head.top, want)
    return QueueRead(items, head.size, settings, g)


def _queue_items(
    svc: Service,
    record: ProjectRecord,
    settings: QueueSettings,
    limit: int,
    worker: str | None,
    g: Globals,
    members: list[tuple[str, float]],
    want: int,
) -> list[QueueItem]:
    classes = record.labels
    while True:
        top = [(item_of(m), score) for m, score in members]
        blobs = svc.store.get_items(record.name, [name for name, _ in top])
        rows = [
            (name, score, orjson.loads(b)) for (name, score), b in zip(top, blobs, strict=True) if b
        ]
        if worker is not None:
            rows = [r for r in rows if all(w != worker for w, _, _ in r[2]["labels"])]
        if len(rows) >= limit or len(top) < want:
            break
        want *= 4  # this worker labelled many of the best: look further down
        members = svc.store.read_queue(record.name, want)
    served = stored_posteriors([d for _, _, d in rows], g).tolist()
    rows = [
        (name, score, {**d, "posterior": p})
        for (name, score, d), p in zip(rows, served, strict=True)
    ]
    if worker is not None and settings.policy in ("voi", "lookahead") and rows:
        stats = svc.store.get_worker(record.name, worker)
        if stats is not None:  # rank by what this worker's answer would tell
            cfg = svc.config(record)
            slot = orjson.loads(stats)["slot"]
            gblob, row = svc.store.get_params(record.name, [slot])
            conf = confusions(Globals.parse(gblob, cfg), slot_rows(row, cfg.n_classes))[0]
            q = np.array([r[2]["posterior"] for r in rows])
            own = priority(settings.policy, q, np.zeros(len(rows)), conf)
            order = np.argsort(-own, kind="stable")
            rows = [(rows[i][0], float(own[i]), rows[i][2]) for i in order.tolist()]
    out = []
    for name, score, d in rows[:limit]:
        q = d["posterior"]
        best = int(np.argmax(q))
        known = has_evidence(d)  # registered, not labelled yet: no best label
        out.append(
            QueueItem(
                item=name,
                score=score,
                label=classes[best] if known else None,
                probability=q[best] if known else None,
                n_labels=len(d["labels"]),
            )
        )
    return out


def boundary_workers(
    svc: Service, project: str, item: str, candidates: int
) -> tuple[list[str], list[str]]:
    """(items, workers) pairs of ``item`` with the workers who have not labelled it, the
    ``candidates`` with the most labels first."""
    blob = svc.store.get_item(project, item)
    done = {w for w, _, _ in orjson.loads(blob)["labels"]} if blob else set()
    ranked = sorted(
        ((-orjson.loads(b)["n_labels"], w) for w, b in svc.store.all_workers(project)
         if w not in done)
    )  # fmt: skip
    workers = [w for _, w in ranked[:candidates]]
    return [item] * len(workers), workers


def prediction_rows(
    record: ProjectRecord,
    workers: list[str],
    items: list[str],
    p: PairPredictions,
    order: list[int] | None = None,
) -> list[dict[str, Any]]:
    """The answer's rows (plain dicts: the response model validates them once), in ``order``."""
    classes = record.labels
    labels, scores, h, trained = p.labels.tolist(), p.scores.tolist(), p.h_min, p.trained
    return [
        {
            "worker": workers[n],
            "item": items[n],
            "label": classes[labels[n]],
            "scores": dict(zip(classes, scores[n], strict=True)),
            "h_min": float(h[n]) if np.isfinite(h[n]) else None,
            "trained": bool(trained[n]),
        }
        for n in (range(len(workers)) if order is None else order)
    ]


def nearest_first(
    workers: list[str], items: list[str], p: PairPredictions, limit: int
) -> list[int]:
    """The ``limit`` smallest h_min first (inf: cannot flip, last); ties by worker, item."""
    h = p.h_min.tolist()
    return sorted(range(len(h)), key=lambda n: (h[n], workers[n], items[n]))[:limit]


SPAMMER_INFORMATIVENESS = 0.1


@dataclass(frozen=True)
class _Tally:
    """The items' confidence histogram (``EDGES``) and most likely labels."""

    counts: list[int]
    best: list[int]


EDGES = np.linspace(0.0, 1.0, 21)
TALLIES: Kept[_Tally] = Kept(reuse=10.0, slow_s=0.25)
"""The tallies of every item's posterior kept (``app.serving.kept``): one that took 0.25 s
or more is served again for ten times what it took (a summary of a project of 6.86M items
took 23 s, and a dashboard asks every few seconds)."""


def _tally(svc: Service, record: ProjectRecord) -> tuple[_Tally, int]:
    """A new tally of the project's items, and the log position it read."""
    g = globals_of(svc, record)
    K = len(record.labels)
    top = []
    best = np.zeros(K, dtype=np.int64)
    for page in stored_pages(svc.store, record.name, g, 2000):
        q = page.posterior[page.known]  # items without labels have no most likely label
        if q.size:
            top.append(q.max(axis=1))
            best += np.bincount(q.argmax(axis=1), minlength=K)
    counts = np.histogram(np.concatenate(top) if top else np.zeros(0), bins=EDGES)[0]
    return _Tally(counts.tolist(), best.tolist()), g.position


def summary(svc: Service, record: ProjectRecord, n_workers: int) -> dict[str, Any]:
    tally = TALLIES.get(svc.store, record.name, record.created_at, lambda: _tally(svc, record))
    views = workers_view(svc, record, svc.store.all_workers(record.name), with_confusion=True)
    views.sort(key=lambda w: (w.informativeness, -w.n_labels, w.worker))
    view = project_view(svc, record)
    queue = queue_for(svc, record, 10, None)
    return {
        "queue": queue.items,
        "queue_size": queue.size,
        "queue_progress": queue.globals.queue or NO_PROGRESS,
        "project": record.name,
        "labels": list(record.labels),
        "stats": view["stats"],
        "confidence_histogram": {"edges": EDGES.tolist(), "counts": tally.counts},
        "label_counts": dict(zip(record.labels, tally.best, strict=True)),
        "workers": [
            {**w.model_dump(), "likely_spammer": w.informativeness < SPAMMER_INFORMATIVENESS}
            for w in views[:n_workers]
        ],
        "computed_at": iso(time.time()),
    }


def snapshot_view(info: SnapshotInfo) -> dict[str, Any]:
    return {
        **info.as_dict(),
        "created_at": iso(info.created_at),
        "age_s": time.time() - info.created_at,
    }
