"""Snapshot cost on 1,000,000 labels over 200,000 items: ``python -m bench.snapshot``.

Builds a project's engine state (the API's defaults: the dyadic model on) from the synthetic
million answers (bench.synthetic), then
times (a) the capture, the only part that runs in the engine's thread and so stalls the
engine (in the embedded mode, the ingest thread shares the process too), with the dyadic model
as far behind the posteriors as a loaded engine lets it be (``DYADIC_BACKLOG``), and (b) the encoding
and the SQL write (archive + snapshot row), on a SQLite file and on PostgreSQL. Then restores
the snapshot and checks it is the same state. Targets: write <= 5 s, stall <= 50 ms.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import uuid

import numpy as np
import orjson

from app.engine.dyadic import settings_for
from app.engine.loop import DYADIC_BACKLOG
from app.engine.project import ProjectEngine
from app.engine.snapshots import capture, encode, restore
from app.store.archive import SnapshotDB
from app.store.base import LogEntry, ProjectRecord
from app.store.sql import sql_engine, upgrade
from bench.synthetic import dawid_skene
from core.nominal import NominalConfig


def build(n_items: int, per_item: int, seed: int) -> tuple[ProjectEngine, list[LogEntry]]:
    K = 5
    data = dawid_skene(n_items, per_item, 2000, K, seed)
    items, workers, labels = data.items, data.workers, data.labels
    order = np.random.default_rng(seed).permutation(items.size)
    config = {**NominalConfig(n_classes=K).to_dict(), "dyadic": settings_for(K).to_dict()}
    record = ProjectRecord("bench", tuple("abcde"), config, 1.0)  # the API's defaults
    eng = ProjectEngine(record)
    entries = []
    item_ids = np.char.add("item-", items.astype(str))
    worker_ids = np.char.add("worker-", workers.astype(str))
    for n, lo in enumerate(range(0, order.size, 10_000)):
        take = order[lo : lo + 10_000]
        body = {
            "items": item_ids[take].tolist(),
            "workers": worker_ids[take].tolist(),
            "labels": labels[take].tolist(),
            "weights": None,
        }
        entries.append(LogEntry(n + 1, "labels", orjson.dumps(body)))
        eng.apply(entries[-1])
    return eng, entries


def _same_dyadic(a: ProjectEngine, b: ProjectEngine) -> bool:
    assert a.dyadic is not None and b.dyadic is not None
    ours, theirs = a.dyadic.hashed_model().arrays(), b.dyadic.hashed_model().arrays()
    return all(np.array_equal(v, theirs[k]) for k, v in ours.items())


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--items", type=int, default=200_000)
    ap.add_argument("--per-item", type=int, default=5)
    ap.add_argument("--pg", default="postgresql+psycopg://postgres@127.0.0.1:5432/postgres",
                    help="a PostgreSQL server URL whose database may be created/dropped")  # fmt: skip
    args = ap.parse_args()
    t0 = time.perf_counter()
    eng, entries = build(args.items, args.per_item, seed=1)
    print(f"state: {eng.labels.n_labels:,} labels over {eng.items_count:,} items, {len(eng.workers.names):,} workers "
          f"(built in {time.perf_counter() - t0:.1f} s)")  # fmt: skip
    # as a loaded engine holds it: the dyadic model DYADIC_BACKLOG labels behind the posteriors
    eng.dyadic_update(max(0, eng.dyadic_backlog - DYADIC_BACKLOG))
    queued = eng.dyadic_backlog
    stalls = []
    for _ in range(5):
        t = time.perf_counter()
        cap = capture(eng)
        stalls.append(time.perf_counter() - t)
    print(f"the dyadic model {queued:,} labels behind; after the captures: {eng.dyadic_backlog:,}")
    t = time.perf_counter()
    blob = encode(cap)
    t_encode = time.perf_counter() - t
    print(
        f"capture (engine stall): median {1000 * np.median(stalls):.1f} ms, max {1000 * max(stalls):.1f} ms  (target <= 50 ms)"
    )
    print(f"encode: {t_encode:.2f} s, {len(blob) / 2**20:.1f} MiB")
    import psycopg

    pg_admin = args.pg.replace("+psycopg", "")
    name = f"ct_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_admin, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    try:
        with tempfile.TemporaryDirectory() as tmp:
            targets = {
                "sqlite": f"sqlite:///{tmp}/snap.sqlite3",
                "postgresql": args.pg.rsplit("/", 1)[0] + f"/{name}",
            }
            for label, url in targets.items():
                upgrade(url)
                db = SnapshotDB(sql_engine(url))
                t = time.perf_counter()
                blob = encode(cap)
                info = db.write(cap, blob, entries, keep=3)
                t_write = time.perf_counter() - t
                t = time.perf_counter()
                latest = db.latest("bench")
                assert latest is not None
                back = restore(eng.record, latest[1])
                t_restore = time.perf_counter() - t
                same = (
                    back.model.params.equals(eng.model.params)
                    and np.array_equal(back.q[: eng.items_count], eng.q[: eng.items_count])
                    and _same_dyadic(back, eng)
                )
                print(f"{label:<11} encode + write (with a {len(entries)}-entry archive of the 1M labels): {t_write:.2f} s  "
                      f"(target <= 5 s), {info.size_bytes / 2**20:.1f} MiB; restore {t_restore:.2f} s, identical: {same}")  # fmt: skip
                db.close()
    finally:
        with psycopg.connect(pg_admin, autocommit=True) as c:
            c.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


if __name__ == "__main__":
    main()
