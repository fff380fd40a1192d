"""Every numba kernel the service calls, compiled (first start) or loaded (later starts)
before the service answers, so that requests and engine steps do not wait for the compiler.

On a fresh install nothing is cached, and compiling everything takes about 17 s of CPU, with
the GIL held. So the first start compiles in two processes at once, what a first posterior
needs first (``warm_up``; the learning kernel split between them, ``split_compile``), and the
service answers before the dyadic model's kernels exist (the engine queues its labels until
they are loaded); numba's cache is per source file and both processes write next to the
sources. Later starts load everything from the cache in about half a second.

The kernels are reached by running a tiny project through the same calls the engine and the
API make, with the same argument types, so the cached signatures are the ones used
(tests/app/test_warmup.py checks that a whole session adds none).
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
import time
from typing import Any

import numpy as np
import orjson

from app.engine.dyadic import DyadicTrainer, settings_for
from app.engine.project import ProjectEngine
from app.serving import split_compile
from app.serving.kernel_cache import LEARNING
from app.serving.nominal import Globals, item_slots, recompute_posterior, stored_posterior
from app.serving.predictions import warm_up as warm_up_predictions
from app.store.base import EntryKind, LogEntry, ProjectRecord
from core.acquisition import priority
from core.blocks import LARGE, LabelBlocks, canonical_order
from core.idset import IdSet, hash_ids, join_ids
from core.itemlabels import ItemLabels
from core.nominal import NominalConfig, NominalParams
from core.served import log_likelihoods

_LABELS = ("a", "b", "c")
_ITEMS = ["i0", "i0", "i0", "i1", "i1", "i2", "i2", "i2", "i3"]
_WORKERS = ["w0", "w1", "w2", "w0", "w1", "w1", "w2", "w3", "w0"]
_ANSWERS = [0, 0, 1, 2, 2, 1, 1, 0, 2]
_CONFIG = NominalConfig(n_classes=len(_LABELS), n_worker_slots=16)
_LABEL_ENTRY: tuple[EntryKind, dict[str, Any]] = (
    "labels", {"items": _ITEMS, "workers": _WORKERS, "labels": _ANSWERS, "weights": None}
)  # fmt: skip


def _engine_after(entries: list[tuple[EntryKind, dict[str, Any]]]) -> ProjectEngine:
    """A project without a dyadic model, these entries applied."""
    eng = ProjectEngine(ProjectRecord("warm-up", _LABELS, _CONFIG.to_dict(), 0.0))
    for position, (kind, body) in enumerate(entries, start=1):
        eng.apply(LogEntry(position, kind, orjson.dumps(body), b""))
    return eng


def nominal(idle: bool = True) -> None:
    """The engine's entries (labels, gold, items and, unless told not, what an idle project
    gets: refinement sweeps and a refit) and the API's reads of a posterior, on a project
    without a dyadic model."""
    entries: list[tuple[EntryKind, dict[str, Any]]] = [
        _LABEL_ENTRY,
        ("gold", {"items": ["i3"], "labels": [2]}),
        ("items", {"items": ["i4"]}),
    ]
    if idle:
        entries += [("refine", {"passes": 2}), ("refit", {})]
    eng = _engine_after(entries)
    update = eng.state_update()
    g = Globals.parse(update.globals, _CONFIG)
    item = orjson.loads(eng.item_json(eng.items.code["i0"]))
    slots, local = item_slots(item, _CONFIG.n_worker_slots)
    recompute_posterior(_CONFIG, item, g, [update.rows.get(s) for s in slots], local)
    stored_posterior(item, g)


def serving_extras() -> None:
    """What publishing the engine's state and the API's first read and write call beyond
    learning: the queue's ranking (value of information), the calibration's log-likelihoods,
    the embedded store's set of label ids (no learning needed, so the first start compiles them
    beside the nominal model's learning)."""
    K = _CONFIG.n_classes
    priority("voi", np.full((2, K), 1.0 / K), np.zeros(2), np.eye(K))
    blocks = LabelBlocks.group([0, 0, 1], [0, 1, 0], [0, 1, 2])
    log_likelihoods(NominalParams.initial(_CONFIG), blocks)
    label_ids()


def large_blocks() -> None:
    """The sort of a block of at least ``LARGE`` labels (a run of queued entries joined: up to
    ``JOIN_CAP`` blocks; a sweep's or a refit's gathering), with the engine's argument types."""
    codes = np.zeros(LARGE, dtype=np.int64)
    canonical_order(codes, codes, codes, np.ones(LARGE))


def label_ids() -> None:
    """The embedded store's set of label ids: a block's keep mask, then its ids added; then
    enough ids that the set grows and moves its rows."""
    seen, (keys, present) = IdSet(), hash_ids(join_ids(["a", None]), 2)
    seen.new_in_block(keys, present)
    seen.add(keys, present)
    seen.add(*hash_ids(join_ids([str(k) for k in range(1000)])))


def dyadic_learning() -> None:
    """The dyadic model's learning, per label and in idle sweeps, nominal and ordinal."""
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
        trainer.sweep(stored, position=0)
        trainer.update(position=0)


def everything() -> None:
    nominal()
    label_ids()
    large_blocks()
    dyadic_learning()
    warm_up_predictions()  # predictions and h_min


SECOND_PROCESS = [sys.executable, "-m", "app.serving.warmup"]
"""The command of the second process: ``crowdtally serve`` starts it before its own imports."""

_second: subprocess.Popen[bytes] | None = None


def adopt(second: subprocess.Popen[bytes] | None) -> None:
    """Use this already started ``SECOND_PROCESS`` at the next ``warm_up`` (None: none)."""
    global _second
    _second = second


def second_process() -> None:
    """Compile the nominal model's learning (its callees' second half, then ``learn_blocks``
    once the service's process wrote the first half) and print a line; the dyadic model's
    learning and another line; then what only predictions, h_min, refits and large blocks
    need. With everything cached, the two lines and nothing else."""
    cached = _cached()
    if not cached:
        split_compile.compile_half(split_compile.SECOND_HALF)
        split_compile.wait_for(split_compile.SERVE_HALF, timeout_s=10.0)
        _engine_after([_LABEL_ENTRY])  # the learning, and nothing more
    print("learning", flush=True)
    if not cached:
        dyadic_learning()
    print("dyadic", flush=True)
    if not cached:
        warm_up_predictions()
        nominal()
        large_blocks()


_dyadic_loaded = threading.Event()
_dyadic_loaded.set()  # (a process that never warms up compiles what it calls, when it calls it)


def dyadic_ready() -> bool:
    """Whether the dyadic model's kernels are loaded: on a first start, only once the second
    process compiled them, after the service already answers (``EngineLoop``'s gate)."""
    return _dyadic_loaded.is_set()


def warm_up() -> float:
    """Compile or load the kernels; the seconds until the service may answer.

    Cached: everything loads here, in about half a second. Not cached (the first start): a
    second process (started by ``crowdtally serve`` before its imports, else here) and this
    one compile the nominal model's learning together (``split_compile``), this one the
    serving extras too; the service answers once the learning is there. The second process
    goes on with the dyadic model and the predictions; a thread loads the dyadic model's
    learning when it is there and opens ``dyadic_ready`` (until then the engine queues the
    dyadic model's labels), and the rest when that process is done (a prediction asked before
    compiles what it needs itself)."""
    start = time.perf_counter()
    second, first_start = _second, not _cached()
    adopt(None)
    if second is None and not first_start:
        everything()
        return time.perf_counter() - start
    if second is None:
        second = subprocess.Popen(SECOND_PROCESS, stdout=subprocess.PIPE)
    _dyadic_loaded.clear()
    split_compile.compile_half(split_compile.SERVE_HALF)
    serving_extras()
    assert second.stdout is not None
    second.stdout.readline()  # empty if it failed: then the kernels compile here below
    nominal(idle=False)  # what a first posterior needs; the second process compiles the rest
    took = time.perf_counter() - start
    threading.Thread(target=_load_the_rest, args=(second,), daemon=True).start()
    return took


def freeze_what_is_loaded() -> None:
    """Freeze the long-lived objects out of the cyclic collector's sight (after the warm-up,
    before serving). numba and llvmlite bring about 10^5-10^6 of them, and each full
    collection walked them all: a stall of 0.04-0.1 s in a request or an engine step. The
    collector runs from here on: ``crowdtally serve`` and ``crowdtally engine`` pause it while
    they load (the full collections that loading set off took 0.3 s of a 1.5 s start)."""
    gc.collect()
    gc.freeze()
    gc.enable()


def _load_the_rest(second: subprocess.Popen[bytes]) -> None:
    """Load the dyadic model's learning once the second process compiled it (then the engine
    may learn it), and the rest once that process is done."""
    assert second.stdout is not None
    second.stdout.readline()  # "dyadic" (or nothing if it failed: compiled here, then)
    dyadic_learning()
    _dyadic_loaded.set()
    second.stdout.close()  # it prints nothing more
    second.wait()
    everything()


def _cached() -> bool:
    """Whether numba's on-disk cache holds compiled code for the kernels only a first start
    compiles (``kernel_cache.LEARNING``; numba keeps no public API for this: any surprise
    reads as "not cached", which only costs a process)."""
    try:
        kernels = [split_compile.kernel(name) for name in LEARNING]
        return all(bool(k._cache._cache_file._load_index()) for k in kernels)
    except Exception:
        return False


if __name__ == "__main__":
    try:
        second_process()
    except BrokenPipeError:  # the service stopped meanwhile: nobody to tell, nothing to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # (nor at exit)
        sys.exit(1)
