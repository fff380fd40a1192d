"""What a user waits for: ``python -m bench.e2e``.

Whole processes first: ``crowdtally extract`` (online, one pass) and ``crowdtally extract
--batch`` on the synthetic file of 1,000,000 answers (200,000 items x 5, 2,000 workers, 5
classes, seed 0; rows in random order) that this command writes, predictions written to a
CSV file, each timed from its start to its exit with its peak memory (the command's own
high-water mark, ``bench.measure.whole_process``), median of ``--runs``; crowd-kit's DawidSkene as a whole process
on the same file (pandas reads it, predictions written the same way) as the peer; then the
same two commands on 10,000,000 answers (2,000,000 items; generated, not kept).
Fit-only figures second: online EM labels/s (with a table row for every hashed slot, and with
rows for the slots in use only, as ``extract`` and the engine hold them) and batch EM
label-iterations/s on one core, in this process, parsing excluded.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv

from bench.measure import ProcessRun, whole_process
from bench.synthetic import SyntheticSet, dawid_skene
from core.batch import BatchEM
from core.blocks import LabelBlocks
from core.hashing import worker_slots
from core.nominal import NominalConfig
from core.online import OnlineEM

PEER = """
import sys
import pandas as pd
from crowdkit.aggregation import DawidSkene
answers = pd.read_csv(sys.argv[1], dtype=str).rename(columns={"item": "task"})
DawidSkene().fit_predict(answers).to_csv(sys.argv[2])
"""


def write_answers(s: SyntheticSet, path: Path) -> None:
    """item,worker,label CSV, unquoted, rows in the set's (random) order."""
    table = pa.table({
        "item": pa.array(s.items).cast(pa.string()),
        "worker": pa.array(s.workers).cast(pa.string()),
        "label": pa.array(s.labels).cast(pa.string()),
    })  # fmt: skip
    with path.open("wb") as fh:
        fh.write(b"item,worker,label\n")
        options = pa_csv.WriteOptions(include_header=False, quoting_style="none")
        pa_csv.write_csv(table, fh, options)


def median_run(command: list[str], runs: int) -> ProcessRun:
    whole_process(command)  # warm-up: the kernels' cache, the file in the page cache
    measured = [whole_process(command) for _ in range(runs)]
    return ProcessRun(*(statistics.median(getattr(r, f) for r in measured)
                        for f in ("seconds", "cpu_s", "peak_mib")))  # fmt: skip


def extract_command(path: Path, out: Path, batch: bool) -> list[str]:
    mode = ["--batch"] if batch else []
    return [sys.executable, "-m", "app.cli", "extract", str(path), "--n-labels", "5", *mode,
            "--predictions", str(out)]  # fmt: skip


ANSWER_BYTES = 16
"""What an online ``extract`` holds for each answer: its slot and label (int32) and weight."""


def added_state_mib(answers: int, items: int, n_classes: int) -> float:
    """The state an online ``extract`` needs for ``answers`` and ``items`` more (docs/benchmarks.md,
    "Blocks of 32-bit codes"): each answer grouped by item, and per item its block's end, the
    pass's posterior, clarity and objective, its order, label count, weight and gold code, and
    its id (about 12 bytes). ``extract`` reads the label counts and weights a chunk at a time
    and holds gold codes only when given gold (docs/benchmarks.md, "What the one pass holds")."""
    item_bytes = 8 + 8 * n_classes + 8 + 8 + 4 * 8 + 12
    return (answers * ANSWER_BYTES + items * item_bytes) / 2**20


def row(what: str, run: ProcessRun, target: str = "") -> None:
    print(f"{what:<44} {run.seconds:>8.2f} s {run.peak_mib:>8.0f} MiB   {target}", flush=True)


def whole_processes(folder: Path, runs: int, peer: bool, big: bool) -> None:
    print("whole process (start to exit, predictions written; median of runs, peak RSS)")
    small = folder / "answers-1m.csv"
    write_answers(dawid_skene(), small)
    out = folder / "predictions.csv"
    online = median_run(extract_command(small, out, batch=False), runs)
    row("1M  crowdtally extract", online, "target <= 1.0 s, <= 150 MiB")
    batch = median_run(extract_command(small, out, batch=True), runs)
    row("1M  crowdtally extract --batch", batch, "target <= 1.5 s, <= 150 MiB")
    if peer:
        theirs = median_run([sys.executable, "-c", PEER, str(small), str(out)], 1)
        row("1M  crowd-kit DawidSkene (pandas read/write)", theirs)
        print(f"batch extract vs crowd-kit DawidSkene: {theirs.seconds / batch.seconds:.1f}x "
              f"faster (target >= 8x), {batch.peak_mib / theirs.peak_mib:.2f}x its peak memory")  # fmt: skip
    small.unlink()
    if big:
        large = folder / "answers-10m.csv"
        write_answers(dawid_skene(n_items=2_000_000), large)
        online10 = median_run(extract_command(large, out, batch=False), 1)
        row("10M crowdtally extract", online10, "target <= 6 s")
        print(f"10M online peak over 1M's: {online10.peak_mib - online.peak_mib:.0f} MiB; "
              f"what the added answers and items hold: {added_state_mib(9_000_000, 1_800_000, 5):.0f} "
              "MiB (target: no more)")  # fmt: skip
        batch10 = median_run(extract_command(large, out, batch=True), 1)
        row("10M crowdtally extract --batch", batch10, "target <= 15 s")
        large.unlink()
    out.unlink(missing_ok=True)


def _one_pass(config: NominalConfig, blocks: LabelBlocks) -> float:
    model = OnlineEM(config)
    t0 = time.perf_counter()
    model.learn_many(blocks)
    return time.perf_counter() - t0


def kernels() -> None:
    """Online EM and batch EM alone, on the 1M set's integer arrays, one core."""
    print("\nfit only (this process, parsing and writing excluded, one core)")
    s = dawid_skene()
    config = NominalConfig(n_classes=s.n_classes, n_items=float(s.n_items))
    slots = worker_slots([str(w) for w in range(s.n_workers)], config.n_worker_slots)
    hashed = LabelBlocks.group(s.items, slots[s.workers], s.labels, n_blocks=s.n_items)
    exact = LabelBlocks.group(s.items, s.workers, s.labels, n_blocks=s.n_items)
    OnlineEM(config).load_kernels(hashed)
    BatchEM(config, max_iter=2).fit(exact, s.n_workers)
    used = np.unique(slots)  # extract and the engine hold the rows of these slots only
    rows = LabelBlocks.group(s.items, np.searchsorted(used, slots)[s.workers], s.labels,
                             n_blocks=s.n_items)  # fmt: skip
    compact = config.with_(n_worker_slots=used.size)
    OnlineEM(compact).load_kernels(rows)
    for what, cfg, blocks in (("every hashed slot", config, hashed),
                              ("the slots in use", compact, rows)):  # fmt: skip
        online_s = min(_one_pass(cfg, blocks) for _ in range(3))
        print(f"online EM, one pass, rows of {what}: {online_s:.3f} s = "
              f"{s.items.size / online_s:,.0f} labels/s (target >= 3M)")  # fmt: skip
    t0 = time.perf_counter()
    result, _ = BatchEM(config).fit(exact, s.n_workers)
    batch_s = time.perf_counter() - t0
    rate = result.n_iter * s.items.size / batch_s
    print(f"batch EM: {result.n_iter} E-steps in {batch_s:.3f} s = {rate:,.0f} "
          "label-iterations/s (target >= 30M)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="timed runs per command (median)")
    parser.add_argument("--no-peer", action="store_true", help="skip crowd-kit (bench extra)")
    parser.add_argument("--no-10m", action="store_true", help="skip the 10M-answer runs")
    args = parser.parse_args()
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start")
    with tempfile.TemporaryDirectory(prefix="crowdtally-e2e-") as folder:
        whole_processes(Path(folder), args.runs, not args.no_peer, not args.no_10m)
    kernels()
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
