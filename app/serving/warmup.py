"""Every numba kernel the service calls, compiled (first start) or loaded (later starts) before
the service answers, so that no request or engine step waits for the compiler.

On a fresh install nothing is cached: compiling the nominal model's kernels and the dyadic
model's takes about as long each, and the compiler holds the GIL, so the dyadic ones compile in
a second process while this one compiles the nominal ones (numba's cache is per source file;
both land next to the sources). This process then loads the dyadic ones from that cache.
Later starts load everything from the cache in about a second.

The kernels are reached by running a tiny project through the same calls the engine and the
API make, with the same argument types, so the cached signatures are the ones used.
"""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

import numpy as np
import orjson

from app.engine.dyadic import DyadicTrainer, settings_for
from app.engine.project import ProjectEngine
from app.serving.nominal import Globals, item_slots, recompute_posterior, stored_posterior
from app.serving.predictions import warm_up as warm_up_predictions
from app.store.base import EntryKind, LogEntry, ProjectRecord
from core import _dyadic_kernels
from core.itemlabels import ItemLabels
from core.nominal import NominalConfig

_LABELS = ("a", "b", "c")
_ITEMS = ["i0", "i0", "i0", "i1", "i1", "i2", "i2", "i2", "i3"]
_WORKERS = ["w0", "w1", "w2", "w0", "w1", "w1", "w2", "w3", "w0"]
_ANSWERS = [0, 0, 1, 2, 2, 1, 1, 0, 2]


def nominal() -> None:
    """The engine's entries (labels, gold, items, refinement sweeps, refit) and the API's
    reads of a posterior, on a project without a dyadic model."""
    config = NominalConfig(n_classes=len(_LABELS), n_worker_slots=16)
    eng = ProjectEngine(ProjectRecord("warm-up", _LABELS, config.to_dict(), 0.0))
    entries: list[tuple[EntryKind, dict[str, Any]]] = [
        ("labels", {"items": _ITEMS, "workers": _WORKERS, "labels": _ANSWERS, "weights": None}),
        ("gold", {"items": ["i3"], "labels": [2]}),
        ("items", {"items": ["i4"]}),
        ("refine", {"passes": 2}),
        ("refit", {}),
    ]
    for position, (kind, body) in enumerate(entries, start=1):
        eng.apply(LogEntry(position, kind, orjson.dumps(body), b""))
    update = eng.state_update()
    g = Globals.parse(update.globals, config)
    item = orjson.loads(update.items["i0"])
    slots, local = item_slots(item, config.n_worker_slots)
    recompute_posterior(config, item, g, [update.rows.get(s) for s in slots], local)
    stored_posterior(item, g)


def dyadic() -> None:
    """The dyadic model's learning (per label and idle sweeps), predictions and h_min, for
    nominal and ordinal labels."""
    for ordinal in (False, True):
        trainer = DyadicTrainer(settings_for(len(_LABELS), ordinal=ordinal))
        trainer.add_workers(sorted(set(_WORKERS)))
        trainer.add_items(sorted(set(_ITEMS)))
        workers = np.array([int(w[1:]) for w in _WORKERS], dtype=np.int64)
        items = np.array([int(i[1:]) for i in _ITEMS], dtype=np.int64)
        labels = np.asarray(_ANSWERS, dtype=np.int64)
        trainer.learn(workers, items, labels, np.ones(labels.size))
        stored = ItemLabels()
        stored.add_items(int(items.max()) + 1)
        stored.append(items, workers, labels, np.ones(labels.size), workers)
        trainer.sweep(stored)
        trainer.update()
    warm_up_predictions()


def warm_up() -> float:
    """Compile or load every kernel (the dyadic model's in a second process at the same time
    when they are not cached yet); the seconds it took."""
    start = time.perf_counter()
    child = None
    if not _cached(_dyadic_kernels.learn_many, _dyadic_kernels.h_min_many):
        child = subprocess.Popen(
            [sys.executable, "-c", "from app.serving.warmup import dyadic; dyadic()"],
            stdout=subprocess.DEVNULL,
        )
    nominal()
    if child is not None:
        child.wait()  # had it failed, the same kernels compile below and fail here
    dyadic()
    return time.perf_counter() - start


def _cached(*kernels: Any) -> bool:
    """Whether numba's on-disk cache holds compiled code for these kernels (numba keeps no
    public API for this: any surprise reads as "not cached", which only costs a process)."""
    try:
        return all(bool(k._cache._cache_file._load_index()) for k in kernels)
    except Exception:
        return False
