"""``crowdtally import`` and ``crowdtally export`` as a user runs them, against a local embedded
service: ``python -m bench.transfer``.

Writes ``--labels`` synthetic answers (``item,worker,label``, 5 classes, 5 answers an item) as
a plain CSV and, as the peer in the same run, the same answers with every cell quoted: quotes
send the importer down its row-by-row reader (the way it read every file before its columnar
one), so the two imports do the same work but for reading. Each import goes to a project of
its own on one fresh embedded service; then the first project is exported as CSV and as JSONL.
Reported per command: wall time (the import's is paced by the engine, through push-back),
the command's own CPU time and its peak resident memory. The exports start once the engine
has been quiet for a while (the idle sweeps of the imports done: in the embedded store the
engine shares the API's process).
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pa_csv

from bench.e2e import write_answers
from bench.freshness import service, stats
from bench.measure import ProcessRun, whole_process
from bench.service import HOST, _cli, wait_healthy
from bench.synthetic import dawid_skene


def write_quoted(plain: Path, quoted: Path) -> None:
    table = pa_csv.read_csv(plain, convert_options=pa_csv.ConvertOptions(
        column_types={c: pa.string() for c in ("item", "worker", "label")}))  # fmt: skip
    pa_csv.write_csv(table, quoted, pa_csv.WriteOptions(quoting_style="all_valid"))


def row(what: str, r: ProcessRun) -> None:
    print(f"{what:<54} {r.seconds:>7.2f} s {r.cpu_s:>7.2f} s {r.peak_mib:>6.0f} MiB", flush=True)


async def quiet(port: int, projects: list[str], key: str, for_s: float = 3.0) -> None:
    """Until the projects' logs have not moved for ``for_s`` and are applied."""
    last, since = None, time.monotonic()
    while time.monotonic() - since < for_s:
        now = []
        for p in projects:
            s = await stats(port, p, key)
            now.append((s["log_end"], s["applied"]))
        if now != last or any(applied < end for end, applied in now):
            last, since = now, time.monotonic()
        await asyncio.sleep(0.2)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.transfer", description=__doc__)
    p.add_argument("--labels", type=int, default=1_000_000, help="answers imported (5 an item)")
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/0", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    admin = "ct_" + secrets.token_urlsafe(32)
    with tempfile.TemporaryDirectory(prefix="crowdtally-transfer-") as folder:
        plain, quoted = Path(folder) / "answers.csv", Path(folder) / "quoted.csv"
        write_answers(dawid_skene(n_items=max(args.labels // 5, 1)), plain)
        write_quoted(plain, quoted)
        with service("embedded", args, "", admin) as cluster:
            asyncio.run(wait_healthy(cluster.port, cluster))
            url = ["--url", f"http://{HOST}:{cluster.port}", "--key", admin]
            cli = [*_cli()]
            print(f"{args.labels:,} answers into a fresh embedded service (wall, CPU, peak RSS)")
            for name, path in (("columns", plain), ("rows", quoted)):
                how = "columns" if name == "columns" else "rows (peer: the same answers quoted)"
                r = whole_process([*cli, "import", str(path), "-p", name, "--create-with-labels", "auto",
                         "--no-progress", *url])  # fmt: skip
                row(f"import, read in {how}", r)
            asyncio.run(quiet(cluster.port, ["columns", "rows"], admin))
            for fmt in ("csv", "jsonl"):
                out = Path(folder) / f"export.{fmt}"
                r = whole_process([*cli, "export", "-p", "columns", "-o", str(out), *url])
                with out.open() as f:
                    items = sum(1 for _ in f) - (fmt == "csv")
                row(f"export {fmt} ({items:,} items)", r)


if __name__ == "__main__":
    main()
