"""Engines and Redis shards side by side, as a user runs them: ``python3 -m bench.scale``.

For each layout (``--layouts``: ``redis``, the machine's single Redis; ``cluster``, a local Redis
Cluster of 6 nodes, 3 primaries and 3 replicas, started for the run) and each number of
engines (``--engines``), it starts ``crowdtally serve --no-engine`` and that many
``crowdtally engine --pool`` processes (snapshots in a fresh PostgreSQL database of the run),
creates ``--projects`` projects, and runs two phases of ``--seconds`` each:

- ``saturate``: ``--saturate`` labels/s offered across the projects (open loop, blocks of
  ``--block``; push-back off), well above what one engine applies: labels acknowledged and
  applied per second during the phase, then the time to catch up, and an exactly-once check
  (labels applied = labels acknowledged). Per label: the CPU of the API, of the engines and of
  Redis (all nodes), and Redis commands and network bytes (in + out, all nodes).
- ``fresh``: ``--rate`` labels/s offered while a prober posts one label of a new item every
  50 ms and polls it until served: the 202-to-served p50/p99 (bench.freshness's prober).

Everything of a run (Redis keys, the database, the cluster) is removed at the end. The load
runs in this process; all processes share this machine's cores, so more engines can only
show the cost of coordination here: docs/deploy.md turns the per-label costs into a model of
how many engines and shards a given rate needs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import redis

from app.store.redis_store import RedisStore
from bench.freshness import Phase, load_bodies, loader, prober, wait_applied
from bench.freshness import stats as project_stats
from bench.local_cluster import LocalCluster
from bench.service import HOST, Cluster, cpu_seconds, create_project, free_port, pct, wait_healthy

PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"


@dataclass
class RedisMeter:
    """Commands, network bytes and CPU seconds of every node of a Redis (or cluster)."""

    clients: list[redis.Redis]

    def read(self) -> tuple[int, int, float]:
        ops = net = 0
        cpu = 0.0
        for r in self.clients:
            info = r.info()
            ops += int(info["total_commands_processed"])
            net += int(info["total_net_input_bytes"]) + int(info["total_net_output_bytes"])
            cpu += float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
        return ops, net, cpu


@dataclass
class Row:
    layout: str
    engines: int
    acked_s: float = 0.0
    applied_s: float = 0.0
    catch_up_s: float = 0.0
    exactly_once: bool = False
    api_us: float = 0.0
    engine_us: float = 0.0
    redis_us: float = 0.0
    redis_ops: float = 0.0
    redis_bytes: float = 0.0
    p50_ms: float = float("nan")
    p99_ms: float = float("nan")
    hot_p99_ms: float = float("nan")

    def line(self) -> str:
        return (
            f"{self.layout:<8}{self.engines:>3}  {self.acked_s:>9,.0f} {self.applied_s:>9,.0f} "
            f"{self.catch_up_s:>7.1f} {'yes' if self.exactly_once else 'NO':>5}  "
            f"{self.api_us:>6.1f} {self.engine_us:>7.1f} {self.redis_us:>6.1f} "
            f"{self.redis_ops:>6.2f} {self.redis_bytes:>7.0f}  {self.p50_ms:>7.1f} {self.p99_ms:>7.1f}"
            + ("" if math.isnan(self.hot_p99_ms) else f" {self.hot_p99_ms:>10.1f}")
        )


HEADER = (
    "layout engines  acked/s  applied/s catch-up once  | per label: API us engine us "
    "Redis us ops  bytes | fresh p50 ms p99 ms"
)


@contextlib.contextmanager
def fresh_database(admin_url: str) -> Iterator[str]:
    """A new PostgreSQL database (dropped afterwards): its SQLAlchemy URL."""
    import psycopg

    name = f"bench_scale_{secrets.token_hex(4)}"
    admin = psycopg.connect(admin_url, autocommit=True)
    admin.execute(f'CREATE DATABASE "{name}"')
    base = admin_url.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1)
    try:
        yield f"{base}/{name}"
    finally:
        admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        admin.close()


@contextlib.contextmanager
def redis_layout(layout: str, folder: Path) -> Iterator[tuple[str, list[redis.Redis], bool]]:
    """The Redis URL, a client per node (for INFO) and whether it is a cluster."""
    if layout == "redis":
        url = "redis://127.0.0.1:6379/0"
        yield url, [redis.Redis.from_url(url)], False
        return
    cluster = LocalCluster(folder / "cluster").start()
    try:
        nodes = [redis.Redis(host=HOST, port=p) for p in cluster.ports]
        yield cluster.url, nodes, True
    finally:
        cluster.stop()


@contextlib.contextmanager
def processes(
    url: str, is_cluster: bool, engines: int, db_url: str, prefix: str, pool: bool = True
) -> Iterator[Cluster]:
    env = {**os.environ, "CROWDTALLY_STORE": "redis", "REDIS_URL": url,
           "CROWDTALLY_REDIS_CLUSTER": "true" if is_cluster else "false",
           "CROWDTALLY_REDIS_PREFIX": prefix, "CROWDTALLY_ADMIN_KEY": "bench-admin",
           "CROWDTALLY_DATABASE_URL": db_url, "CROWDTALLY_MAX_LAG_S": "0",
           "CROWDTALLY_ENGINE_LEASE_S": "2"}  # fmt: skip
    env.pop("CROWDTALLY_ENGINE_IN_PROCESS", None)
    procs = Cluster(env, free_port())
    env["CROWDTALLY_DATA_DIR"] = str(procs.logdir / "data")
    try:
        procs.start("api", ["serve", "--host", HOST, "--port", str(procs.port), "--no-engine"])
        for n in range(engines):
            procs.start(f"engine{n}", ["engine", "--pool" if pool else "--no-pool"])
        yield procs
    finally:
        procs.stop()
        store = RedisStore(url, prefix, cluster=is_cluster)
        store.flush_prefix()
        store.close()
        if os.environ.get("BENCH_KEEP_LOGS"):
            print(f"server logs: {procs.logdir}", file=sys.stderr)
        else:
            procs.remove_logs()


async def run_one(layout: str, engines: int, args: argparse.Namespace, folder: Path) -> Row:
    row = Row(layout, engines)
    prefix = f"scale-{secrets.token_hex(4)}"
    with (
        redis_layout(layout, folder) as (url, nodes, is_cluster),
        fresh_database(args.pg_admin_url) as db_url,
        processes(url, is_cluster, engines, db_url, prefix, args.pool) as procs,
    ):
        await wait_healthy(procs.port, procs, timeout=240)
        names = [f"p{n}" for n in range(args.projects)]
        keys = {p: await create_project(procs.port, "bench-admin", p, ["c0", "c1", "c2"])
                for p in names}  # fmt: skip
        items = [f"item-{i:06d}" for i in range(20_000)]
        for p in names:  # every engine has its projects, kernels loaded, before timing
            body = load_bodies(items, 500, args.block, args.block, 0)[0]
            loads = Phase(0)
            await loader(procs.port, p, keys[p], [body], 1000.0, loads, time.perf_counter() + 60)
        for p in names:
            await wait_applied(procs.port, p, keys[p])
        meter = RedisMeter(nodes)
        pids = {s.name: s.proc.pid for s in procs.servers}
        cpu0 = {n: cpu_seconds(pid) for n, pid in pids.items()}
        r0 = meter.read()
        before = [await project_stats(procs.port, p, keys[p]) for p in names]
        phase = Phase(args.saturate)
        stop_at = time.perf_counter() + args.seconds
        share = shares(len(names), args.hot)
        t0 = time.perf_counter()
        await asyncio.gather(*(
            loader(procs.port, p, keys[p],
                   load_bodies(items, 500, int(args.saturate * f * args.seconds),
                               args.block, 10 + n), args.saturate * f / args.block, phase, stop_at)
            for n, (p, f) in enumerate(zip(names, share, strict=True))
        ))  # fmt: skip
        took = time.perf_counter() - t0
        during = [await project_stats(procs.port, p, keys[p]) for p in names]
        start = time.perf_counter()
        for p in names:
            await wait_applied(procs.port, p, keys[p], timeout_s=600)
        row.catch_up_s = time.perf_counter() - start
        after = [await project_stats(procs.port, p, keys[p]) for p in names]
        applied = sum(d["n_labels"] - b["n_labels"] for b, d in zip(before, during, strict=True))
        total = sum(a["n_labels"] - b["n_labels"] for b, a in zip(before, after, strict=True))
        row.acked_s, row.applied_s = phase.acknowledged / took, applied / took
        row.exactly_once = total == phase.acknowledged
        r1 = meter.read()
        cpu1 = {n: cpu_seconds(pid) for n, pid in pids.items()}
        row.api_us = 1e6 * per_label(cpu1["api"] - cpu0["api"], total)
        row.engine_us = 1e6 * per_label(sum(cpu1[n] - cpu0[n] for n in pids if n != "api"), total)
        row.redis_us = 1e6 * per_label(r1[2] - r0[2], total)
        row.redis_ops = per_label(r1[0] - r0[0], total)
        row.redis_bytes = per_label(r1[1] - r0[1], total)
        fresh, hot = Phase(args.rate), Phase(0)
        stop_at = time.perf_counter() + args.seconds
        probed = names[1:] if args.hot else names[:1]  # with a hot project: the others
        await asyncio.gather(
            *(prober(procs.port, p, keys[p], 0.05 * len(probed), fresh, stop_at, f"scale{p}")
              for p in probed),
            *([prober(procs.port, names[0], keys[names[0]], 0.05, hot, stop_at, "hot")]
              if args.hot else []),
            *(loader(procs.port, p, keys[p],
                     load_bodies(items, 500, int(args.rate * f * args.seconds),
                                 args.block, 100 + n), args.rate * f / args.block, fresh, stop_at)
              for n, (p, f) in enumerate(zip(names, share, strict=True))),
        )  # fmt: skip
        row.p50_ms, row.p99_ms = pct(fresh.fresh_ms, 50), pct(fresh.fresh_ms, 99)
        if args.hot:
            row.hot_p99_ms = pct(hot.fresh_ms, 99)
        procs.check_alive()
    return row


def per_label(amount: float, labels: int) -> float:
    """``amount`` per label applied; NaN when none was (a rate too low for any block to be
    posted during the phase), rather than a figure divided by nothing."""
    return amount / labels if labels else float("nan")


def shares(n: int, hot: float) -> list[float]:
    """Each project's share of the offered labels: ``hot`` for the first, the rest evenly."""
    if not hot:
        return [1.0 / n] * n
    return [hot] + [(1.0 - hot) / (n - 1)] * (n - 1)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__.split("\n")[0])
    p.add_argument("--layouts", default="redis,cluster")
    p.add_argument("--engines", default="1,2,4")
    p.add_argument("--projects", type=int, default=8)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--saturate", type=float, default=40_000.0, help="labels/s offered, saturate")
    p.add_argument("--rate", type=float, default=8_000.0, help="labels/s offered, fresh")
    p.add_argument("--block", type=int, default=500)
    p.add_argument(
        "--hot", type=float, default=0.0,
        help="share of the labels offered to the first project (the rest share the others "
        "evenly); fresh p50/p99 are then the other projects', and the first one's p99 is "
        "shown after them",
    )  # fmt: skip
    p.add_argument("--pg-admin-url", default=PG_ADMIN)
    p.add_argument(
        "--pool",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="engines started with --pool (default); --no-pool: without (one engine only)",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    print(f"{args.projects} projects; saturate {args.saturate:,.0f} labels/s, fresh "
          f"{args.rate:,.0f} labels/s, {args.seconds:.0f} s each; blocks of {args.block}"
          + (f"; {args.hot:.0%} of the labels to p0 (fresh: the other projects')"
             if args.hot else ""))  # fmt: skip
    print(HEADER + (" | p0 p99 ms" if args.hot else ""), flush=True)
    try:
        for layout in args.layouts.split(","):
            for engines in (int(e) for e in args.engines.split(",")):
                row = asyncio.run(run_one(layout, engines, args, folder))
                print(row.line(), flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
