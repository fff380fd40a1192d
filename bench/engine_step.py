"""What one engine step costs, without the API: ``python -m bench.engine_step``.

A project with labels already applied, then log entries of new labels, each applied and
turned into the state update the store would write (the engine's whole step but the write;
with ``--store``, the write too). Reported per entry: applying it (the per-item EM, the dyadic
model's learning), then building the update (served items, workers, queue, dyadic rows), the
store's write, and the labels per second of all three. Items are drawn from ``--items``: fewer
items means more labels per item, and an item's EM and served label list grow with its labels.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import orjson

from app.engine.dyadic import settings_for
from app.engine.project import ProjectEngine
from app.store.base import LogEntry, ProjectRecord, Store
from app.store.embedded import EmbeddedStore
from app.store.redis_store import RedisStore
from core.nominal import NominalConfig

LABELS = ("a", "b", "c")


@dataclass(frozen=True)
class StepCost:
    items: int
    dyadic: bool
    apply_ms: float
    update_ms: float
    write_ms: float
    labels_per_s: float


def _entry(
    rng: np.random.Generator, position: int, size: int, items: int, workers: int
) -> LogEntry:
    body = {
        "items": [f"i{x}" for x in rng.integers(0, items, size).tolist()],
        "workers": [f"w{x}" for x in rng.integers(0, workers, size).tolist()],
        "labels": rng.integers(0, len(LABELS), size).tolist(),
        "weights": None,
    }
    return LogEntry(position, "labels", orjson.dumps(body), b"")


def _preloaded(
    items: int, dyadic: bool, preload: int, entries: int, size: int, workers: int, seed: int,
    store: Store | None = None,
) -> tuple[ProjectEngine, list[LogEntry]]:  # fmt: skip
    """A project engine with ``preload`` labels applied and served (written to ``store``, if
    any), and the entries to time."""
    config = NominalConfig(n_classes=len(LABELS)).to_dict()
    config["dyadic"] = settings_for(len(LABELS)).to_dict() if dyadic else None
    eng = ProjectEngine(ProjectRecord("bench", LABELS, config, 0.0))
    rng = np.random.default_rng(seed)
    for position in range(1, preload // size + 1):
        eng.apply(_entry(rng, position, size, items, workers))
    update = eng.state_update()
    if store is not None:
        store.create_project(eng.record)
        store.write_state(eng.record.name, update)
    return eng, [_entry(rng, eng.position + 1 + n, size, items, workers) for n in range(entries)]


@contextlib.contextmanager
def opened(kind: str, redis_url: str) -> Iterator[Store | None]:
    """The store the steps write to: ``embedded`` (a new SQLite file), ``redis`` (keys under a
    new prefix, deleted after) or ``none``."""
    if kind == "none":
        yield None
    elif kind == "embedded":
        with tempfile.TemporaryDirectory() as folder:
            embedded = EmbeddedStore(Path(folder) / "crowdtally.sqlite3")
            yield embedded
            embedded.close()
    else:
        redis = RedisStore(redis_url, prefix=f"bench-step-{uuid.uuid4().hex[:8]}")
        try:
            yield redis
        finally:
            redis.flush_prefix()
            redis.close()


def measure(
    items: int, dyadic: bool, preload: int = 50_000, entries: int = 100, size: int = 1000,
    workers: int = 500, seed: int = 0, store: Store | None = None,
) -> StepCost:  # fmt: skip
    eng, timed = _preloaded(items, dyadic, preload, entries, size, workers, seed, store)
    applying = updating = writing = 0.0
    for entry in timed:
        start = time.perf_counter()
        eng.apply(entry)
        applied = time.perf_counter()
        update = eng.state_update()
        built = time.perf_counter()
        if store is not None:
            store.write_state(eng.record.name, update)
            writing += time.perf_counter() - built
        applying += applied - start
        updating += built - applied
    return StepCost(
        items, dyadic, 1e3 * applying / entries, 1e3 * updating / entries,
        1e3 * writing / entries, entries * size / (applying + updating + writing),
    )  # fmt: skip


def joined(
    run: int, joins: bool, items: int = 10_000, preload: int = 50_000, entries: int = 256,
    size: int = 1000, workers: int = 500, seed: int = 0,
) -> tuple[float, ProjectEngine]:  # fmt: skip
    """Labels/s of an engine applying ``entries`` entries ``run`` at a time, with a state
    update after each ``run`` (one step of the engine): as one block of labels each
    (``joins``: what the log records for blocks that queued up) or one entry after another
    (every block alone); and the engine."""
    eng, timed = _preloaded(items, True, preload, entries, size, workers, seed)
    timed = [replace(e, joins=joins and n % run > 0) for n, e in enumerate(timed)]
    start = time.perf_counter()
    for lo in range(0, entries, run):
        eng.apply_all(timed[lo : lo + run])
        eng.state_update()
    return entries * size / (time.perf_counter() - start), eng


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.engine_step", description=__doc__)
    parser.add_argument("--items", default="30000,2000", help="item counts, one run each")
    parser.add_argument("--entries", type=int, default=100, help="timed entries per run")
    parser.add_argument("--preload", type=int, default=50_000, help="labels applied first")
    parser.add_argument(
        "--store", choices=("none", "embedded", "redis"), default="none",
        help="write each step's update to this store (timed as the write)",
    )  # fmt: skip
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument(
        "--runs", default="", help="entries a step, e.g. 1,4,16,64: queued blocks learned as "
        "one against one at a time (10,000 items, dyadic on), instead of the table per entry",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.runs:
        print("engine steps of n entries of 1,000 labels after 50,000 (10,000 items, 500 "
              "workers, 3 classes, dyadic on), labels/s: the entries learned as one block "
              "(joined) against one after another (alone)")  # fmt: skip
        print(f"{'n':>4} {'alone':>10} {'joined':>10} {'ratio':>6}")
        joined(1, False, entries=4)  # (the kernels loaded before the first timed run)
        for run in (int(x) for x in args.runs.split(",")):
            alone, together = joined(run, False)[0], joined(run, True)[0]
            print(f"{run:>4} {alone:>10,.0f} {together:>10,.0f} {together / alone:>6.2f}")
        return
    print(f"engine step, entries of 1,000 labels after {args.preload:,} (500 workers, 3 classes), "
          f"store: {args.store}")  # fmt: skip
    print(f"{'items':>7} {'dyadic':>6} {'apply ms':>9} {'update ms':>10} {'write ms':>9} "
          f"{'labels/s':>10}")  # fmt: skip
    for items in (int(x) for x in args.items.split(",")):
        for dyadic in (True, False):
            with opened(args.store, args.redis_url) as store:
                c = measure(items, dyadic, args.preload, args.entries, store=store)
            print(
                f"{c.items:>7,} {'on' if c.dyadic else 'off':>6} {c.apply_ms:>9.1f} "
                f"{c.update_ms:>10.1f} {c.write_ms:>9.1f} {c.labels_per_s:>10,.0f}"
            )


if __name__ == "__main__":
    main()
