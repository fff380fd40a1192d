"""What a block of new label ids costs the embedded store as its log grows:
``python -m bench.label_ids``.

Blocks of ``--block`` random label ids are appended to a fresh ``EmbeddedStore`` (a
temporary SQLite file) until it holds ``--ids``; the time of each append is reported at a
few sizes, as the median of the blocks around them. The peer, in the same run: SQLite's own
index of every id (a ``label_id`` primary key, each block inserted and committed as the
store did before it kept the ids in its log entries and found repeats in ``core.idset``).
Last, opening the store again: the set of seen ids is rebuilt from the log.
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from app.store.base import ProjectRecord
from app.store.embedded import EmbeddedStore

CHECKPOINTS = (0.01, 0.1, 0.25, 0.5, 1.0)  # shares of --ids at which a row is printed
AROUND = 10  # blocks whose median a row reports


def random_ids(rng: np.random.Generator, block: int, n: int) -> list[str | None]:
    return [f"label-{x:016x}-{n}-{k}" for k, x in enumerate(rng.integers(0, 1 << 62, block))]


def sqlite_index(path: Path) -> Callable[[list[str | None]], None]:
    """The peer: every id inserted into a SQLite primary key, one transaction a block."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute("CREATE TABLE ids (project TEXT, label_id TEXT, PRIMARY KEY (project, label_id))")

    def append(ids: list[str | None]) -> None:
        db.execute("BEGIN")
        db.executemany("INSERT INTO ids VALUES ('p', ?)", [(i,) for i in ids])
        db.execute("COMMIT")

    return append


def per_block_ms(
    append: Callable[[list[str | None]], object], ids: int, block: int, seed: int
) -> dict[int, float]:
    """Median ms of the appends around each checkpoint, by the ids held before them."""
    rng = np.random.default_rng(seed)
    blocks = ids // block
    marks = {max(AROUND, int(share * blocks)) - AROUND for share in CHECKPOINTS}
    timed: dict[int, list[float]] = {}
    for n in range(blocks):
        batch = random_ids(rng, block, n)
        t0 = time.perf_counter()
        append(batch)
        took = 1e3 * (time.perf_counter() - t0)
        start = next((m for m in marks if m <= n < m + AROUND), None)
        if start is not None:
            timed.setdefault(start * block, []).append(took)
    return {held: statistics.median(ms) for held, ms in sorted(timed.items())}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.label_ids", description=__doc__)
    p.add_argument("--ids", type=int, default=1_000_000, help="ids appended in all")
    p.add_argument("--block", type=int, default=1_000, help="ids per block")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="crowdtally-ids-") as folder:
        store = EmbeddedStore(Path(folder) / "store.sqlite3")
        store.create_project(ProjectRecord("p", ("a", "b"), {}, time.time()))
        ours = per_block_ms(
            lambda ids: store.append("p", "labels", b"{}", ids), args.ids, args.block, args.seed
        )
        store.close()
        t0 = time.perf_counter()
        EmbeddedStore(Path(folder) / "store.sqlite3").close()
        reopen_s = time.perf_counter() - t0
        peer = per_block_ms(sqlite_index(Path(folder) / "peer.sqlite3"), args.ids, args.block,
                            args.seed)  # fmt: skip
    print(f"appending blocks of {args.block:,} new label ids, ms per block (median of {AROUND})")
    print(f"{'ids held':>10} {'embedded store':>15} {'SQLite index (peer)':>20} {'ratio':>7}")
    for held, ms in ours.items():
        print(f"{held:>10,} {ms:>15.2f} {peer[held]:>20.2f} {peer[held] / ms:>6.1f}x")
    print(f"opening the store again with {args.ids:,} ids: {reopen_s:.2f} s")


if __name__ == "__main__":
    main()
