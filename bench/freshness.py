"""How fresh a posterior is under load, as a user sees it: ``python3 -m bench.freshness``.

For each store (``--stores embedded,redis``) it starts the service as a user would, on a free
port: embedded is one ``crowdtally serve`` (engine in the API process, SQLite, nothing else);
redis is ``crowdtally serve --no-engine`` beside one ``crowdtally engine`` on the real Redis.
One project gets ``--preload`` labels first (applied before anything is timed). Then, for each
offered rate in ``--rates`` (labels/s; 0 = idle), for ``--seconds``:

- a loader POSTs blocks of ``--block`` new labels (unique ids, the preloaded items and
  workers) on a fixed schedule, open loop over up to 16 connections, whatever the answers'
  pace; a ``429 engine_behind`` is counted and its labels are not sent again (push-back);
- a prober, every ``--probe-ms``, POSTs one label of a new item and polls
  ``GET /v1/projects/{p}/items/{item}`` until it is served (every ms for 50 ms, then every
  5 ms: ``FINE_POLL_S``): the time from the 202 to the first 200 is the label's freshness
  (a probe still unserved 10 s after its 202 counts as such, with 10 s);
- the project's stats give the labels applied during the phase (the sustained applied rate),
  and the engine's lag in labels when the phase ends; once the engine has caught up, the
  labels applied must be exactly those acknowledged (none lost, none twice).

Between phases the engine is let catch up. The load runs in this process, the service in its
own processes, all on this machine. ``--peer-code DIR`` runs each store a second time, right
after, with the service of the source tree DIR (e.g. a ``git worktree`` of the commit before):
old and new code side by side in one run, on the same machine in the same hour. Everything
of a run (Redis keys under its own prefix, SQLite files in a temporary folder) is deleted at
the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import shutil
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson
import redis

from bench.service import (
    HOST,
    ROOT,
    Cluster,
    Conn,
    add_peer_code,
    build,
    check_peer_code,
    codes_to_run,
    create_project,
    delete_keys,
    describe,
    free_port,
    make_dataset,
    pct,
    wait_healthy,
)
from bench.service import stats as project_stats

UNSERVED_S = 10.0  # a probe not served this long after its 202 counts as unserved
FINE_POLL_S, FINE_FOR_S, COARSE_POLL_S = 0.001, 0.05, 0.005
"""A probe's GETs: every ms for its first 50 ms (the targets' range: 10 ms idle, 50 ms under
load), every 5 ms after (at most 10% off there), so that a probe waiting seconds under
overload does not load the API with a thousand GETs a second on the cores it measures."""


@dataclass
class Phase:
    offered: float
    seconds: float = 0.0
    acknowledged: int = 0
    refused: int = 0  # labels answered 429 (not appended)
    applied: int = 0
    lag_labels: int = 0
    catch_up_s: float = 0.0
    fresh_ms: list[float] = field(default_factory=list)
    unserved: int = 0
    probes_acked: int = 0
    polls: int = 0  # the probes' GETs
    exactly_once: bool = False  # once caught up: every acknowledged label applied, no more

    def row(self, store: str) -> str:
        p50, p99 = pct(self.fresh_ms, 50), pct(self.fresh_ms, 99)
        low, high = p99_interval(self.fresh_ms)
        worst = max(self.fresh_ms, default=float("nan"))
        return (
            f"{store:9} {self.offered:>9,.0f} {self.acknowledged / self.seconds:>11,.0f} "
            f"{self.applied / self.seconds:>9,.0f} {self.lag_labels:>9,} {self.refused:>8,} "
            f"{len(self.fresh_ms):>6} {p50:>8.1f} {p99:>8.1f} {f'{low:.0f}-{high:.0f}':>11} "
            f"{worst:>8.1f} {self.unserved:>8} {'yes' if self.exactly_once else 'NO':>5}"
        )


HEADER = (
    f"{'store':9} {'offered/s':>9} {'acked/s':>11} {'applied/s':>9} {'lag end':>9} "
    f"{'429 lbl':>8} {'probes':>6} {'p50 ms':>8} {'p99 ms':>8} {'p99 95% ms':>11} "
    f"{'max ms':>8} {'unserved':>8} {'once':>5}"
)

P99_BLOCK = 20
"""Probes per block of the p99's bootstrap (``p99_interval``): a second of them at the default
one every 50 ms, so that a stall that delays several probes in a row is drawn whole."""


def p99_interval(
    ms: Sequence[float], block: int = P99_BLOCK, draws: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """A 95% interval for the p99 of a phase's probes: the 2.5th and 97.5th percentiles of the
    p99 over moving-block bootstrap resamples (blocks of ``block`` consecutive probes, drawn
    with replacement; Kunsch 1989). Probes in a row share the engine's steps and stalls, so
    resampling them one by one would understate the spread. NaN with fewer than two blocks."""
    x = np.asarray(ms, dtype=np.float64)
    if x.size < 2 * block:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    per_draw = -(-x.size // block)
    starts = rng.integers(0, x.size - block + 1, size=(draws, per_draw))
    index = (starts[:, :, None] + np.arange(block)).reshape(draws, -1)[:, : x.size]
    p99 = np.percentile(x[index], 99, axis=1)
    low, high = np.percentile(p99, [2.5, 97.5])
    return float(low), float(high)


# ---------------------------------------------------------------------------------- load
def load_bodies(
    items: list[str], n_workers: int, n: int, block: int, seed: int, per_new_item: int = 0
) -> list[bytes]:
    """``n`` new labels on known items and workers (ids unique to this run), in blocks; with
    ``per_new_item``, on items new to the phase instead, that many labels each (a campaign
    whose items arrive as it goes, rather than known items gathering ever more labels)."""
    rng = np.random.default_rng(seed)
    if per_new_item:
        items = [f"new-{seed}-{k}" for k in range(-(-n // per_new_item))]
        it = (np.arange(n) // per_new_item).tolist()
    else:
        it = rng.integers(0, len(items), n).tolist()
    wk = rng.integers(0, n_workers, n).tolist()
    lb = rng.integers(0, 3, n).tolist()
    rows = [
        f'{{"item":"{items[i]}","worker":"worker-{w:05d}","label":"c{z}","id":"f{seed}-{k}"}}'
        for k, (i, w, z) in enumerate(zip(it, wk, lb, strict=True))
    ]
    return [f"[{','.join(rows[s : s + block])}]".encode() for s in range(0, n, block)]


async def stats(port: int, project: str, key: str) -> dict[str, int]:
    """The project's stats, on a connection of its own (bench.service's reader)."""
    conn = await Conn(port).open()
    try:
        return await project_stats(conn, build("GET", f"/v1/projects/{project}", key))
    finally:
        conn.close()


async def wait_applied(port: int, project: str, key: str, timeout_s: float = 600.0) -> float:
    """Seconds until the engine has applied the whole log."""
    t0 = time.perf_counter()
    while True:
        s = await stats(port, project, key)
        if s["applied"] >= s["log_end"]:
            return time.perf_counter() - t0
        if time.perf_counter() - t0 > timeout_s:
            raise RuntimeError(f"the engine did not catch up in {timeout_s:.0f} s: {s}")
        await asyncio.sleep(0.02)


async def wait_dyadic(port: int, project: str, key: str, timeout_s: float = 600.0) -> float:
    """Seconds until the dyadic model has learned every applied label (none: at once)."""
    t0 = time.perf_counter()
    while True:
        s = await stats(port, project, key)
        if s.get("dyadic_position") is None or s["dyadic_position"] >= s["applied"]:
            return time.perf_counter() - t0
        if time.perf_counter() - t0 > timeout_s:
            raise RuntimeError(f"the dyadic model did not catch up in {timeout_s:.0f} s: {s}")
        await asyncio.sleep(0.02)


async def loader(port: int, project: str, key: str, bodies: list[bytes], rate_blocks: float,
                 phase: Phase, stop_at: float) -> None:  # fmt: skip
    """Open loop: block k is due at t0 + k / rate_blocks, sent on a free connection."""
    path = f"/v1/projects/{project}/labels"
    pool: asyncio.Queue[Conn] = asyncio.Queue()
    conns = [await Conn(port).open() for _ in range(16)]
    for c in conns:
        pool.put_nowait(c)
    tasks: list[asyncio.Task[None]] = []

    async def one(raw: bytes) -> None:
        conn = await pool.get()
        try:
            status, body = await conn.request_reopening(raw)  # the blocks carry ids
        finally:
            pool.put_nowait(conn)
        if status == 202:
            phase.acknowledged += orjson.loads(body)["accepted"]
        elif status == 429:
            phase.refused += raw.count(b'"id":')
        else:
            raise RuntimeError(f"POST labels: HTTP {status}: {body[:200]!r}")

    t0 = time.perf_counter()
    try:
        for k, body in enumerate(bodies):
            due = t0 + k / rate_blocks
            if due >= stop_at:
                break
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(build("POST", path, key, body))))
        await asyncio.gather(*tasks)
    finally:
        for c in conns:
            c.close()


def poll_delay(waited_s: float) -> float:
    """The wait before a probe's next GET, ``waited_s`` after its 202 (``FINE_POLL_S``)."""
    return FINE_POLL_S if waited_s < FINE_FOR_S else COARSE_POLL_S


async def prober(port: int, project: str, key: str, every_s: float, phase: Phase,
                 stop_at: float, tag: str) -> None:  # fmt: skip
    """One new item at a time: POST its label, then GET it until served (``poll_delay``;
    each probe on new connections: the API closes one left idle for 5 s, e.g. while
    refusing; the GETs' connection is opened once the POST is answered, which may take
    longer than that)."""
    k = 0
    while time.perf_counter() < stop_at:
        get = Conn(port)
        try:
            started = time.perf_counter()
            item = f"probe-{tag}-{k}"
            k += 1
            body = orjson.dumps([{"item": item, "worker": "worker-00000", "label": "c0"}])
            post = await Conn(port).open()
            try:
                status, _ = await post.request(
                    build("POST", f"/v1/projects/{project}/labels", key, body)
                )
            finally:
                post.close()
            acked = time.perf_counter()
            if status == 429:
                phase.refused += 1
            elif status != 202:
                raise RuntimeError(f"probe POST: HTTP {status}")
            else:
                phase.probes_acked += 1
                raw = build("GET", f"/v1/projects/{project}/items/{item}", key)
                await get.open()
                while True:
                    status, _ = await get.request_reopening(raw)
                    phase.polls += 1
                    now = time.perf_counter()
                    if status == 200:
                        phase.fresh_ms.append(1e3 * (now - acked))
                        break
                    if now - acked > UNSERVED_S:
                        phase.unserved += 1
                        phase.fresh_ms.append(1e3 * UNSERVED_S)
                        break
                    await asyncio.sleep(poll_delay(now - acked))
            await asyncio.sleep(max(every_s - (time.perf_counter() - started), 0.0))
        finally:
            get.close()


async def one_phase(port: int, project: str, key: str, offered: float, args: argparse.Namespace,
                    items: list[str], seed: int) -> Phase:  # fmt: skip
    phase = Phase(offered)
    n = int(offered * args.seconds)
    bodies = load_bodies(items, args.workers, n, args.block, seed, args.new_items) if n else []
    before = await stats(port, project, key)
    t0 = time.perf_counter()
    stop_at = t0 + args.seconds
    jobs = [prober(port, project, key, args.probe_ms / 1e3, phase, stop_at, str(seed))]
    if bodies:
        jobs.append(loader(port, project, key, bodies, offered / args.block, phase, stop_at))
    await asyncio.gather(*jobs)
    phase.seconds = time.perf_counter() - t0
    after = await stats(port, project, key)
    phase.applied = after["n_labels"] - before["n_labels"]
    sent = phase.acknowledged + phase.probes_acked
    phase.lag_labels = sent - phase.applied
    phase.catch_up_s = await wait_applied(port, project, key)
    final = await stats(port, project, key)
    phase.exactly_once = final["n_labels"] - before["n_labels"] == sent
    return phase


async def run_store(
    store: str, args: argparse.Namespace, cluster: Cluster, admin: str
) -> list[Phase]:
    port = cluster.port
    await wait_healthy(port, cluster, timeout=180)
    data = make_dataset(args.preload, 5, args.workers, 3, 1000, args.seed)
    key = await create_project(port, admin, "fresh", data.classes)
    conn = await Conn(port).open()
    try:
        for body in data.bodies:
            while True:  # push-back (an engine still starting): the block again, a bit later
                request = build("POST", "/v1/projects/fresh/labels", key, body)
                status, out = await conn.request(request)
                if status != 429:
                    break
                await asyncio.sleep(0.5)
            if status != 202:
                raise RuntimeError(f"preload: HTTP {status}: {out[:200]!r}")
    finally:
        conn.close()
    took = await wait_applied(port, "fresh", key)
    print(f"{store}: {args.preload:,} labels preloaded and applied ({took:.1f} s after the "
          "last POST)", flush=True)  # fmt: skip
    if args.settled:
        took = await wait_dyadic(port, "fresh", key)
        print(f"{store}: and learned by the dyadic model {took:.1f} s later", flush=True)
    phases = []
    for n, offered in enumerate(args.rates):
        cluster.check_alive()
        phase = await one_phase(port, "fresh", key, offered, args, data.items, args.seed + n + 1)
        print(phase.row(store), f"(caught up {phase.catch_up_s:.1f} s after; "
              f"{phase.polls / phase.seconds:,.0f} probe GETs/s)", flush=True)  # fmt: skip
        phases.append(phase)
    return phases


# ---------------------------------------------------------------------------------- processes
@contextlib.contextmanager
def service(
    store: str, args: argparse.Namespace, prefix: str, admin: str,
    setting: dict[str, str] | None = None, code: Path = ROOT,
) -> Iterator[Cluster]:  # fmt: skip
    """The service's processes on ``store``, with ``setting`` (environment variables) over
    the bench's own, running the source tree ``code``."""
    env = dict(os.environ)
    env.update(CROWDTALLY_STORE=store, REDIS_URL=args.redis_url, CROWDTALLY_REDIS_PREFIX=prefix,
               CROWDTALLY_ADMIN_KEY=admin, **(setting or {}))  # fmt: skip
    for name in ("CROWDTALLY_ENGINE_IN_PROCESS", "CROWDTALLY_DATABASE_URL"):
        env.pop(name, None)
    cluster = Cluster(env, free_port(), code=code)
    env["CROWDTALLY_DATA_DIR"] = str(cluster.logdir / "data")
    serve = ["serve", "--host", HOST, "--port", str(cluster.port)]
    try:
        if store == "redis":
            cluster.start("api", [*serve, "--no-engine"])
            cluster.start("engine", ["engine"])
        else:
            cluster.start("api", serve)
        yield cluster
    finally:
        cluster.stop()
        if store == "redis":
            delete_keys(args.redis_url, prefix)
        shutil.rmtree(cluster.logdir, ignore_errors=True)


_STORES = {"both": ("embedded", "redis")}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python3 -m bench.freshness", description=__doc__.split("\n")[0]
    )
    p.add_argument("--stores", default="embedded,redis",
                   help="embedded, redis, both, or a comma-separated list of them")  # fmt: skip
    p.add_argument("--rates", default="0,20000,50000,100000",
                   help="offered labels/s, one phase each (0: idle)")  # fmt: skip
    p.add_argument("--seconds", type=float, default=20.0, help="length of each phase")
    p.add_argument("--preload", type=int, default=50_000, help="labels applied before timing")
    p.add_argument("--workers", type=int, default=500, help="distinct workers")
    p.add_argument("--block", type=int, default=1_000, help="labels per POST of the loader")
    p.add_argument("--probe-ms", type=float, default=50.0, help="one probe label every so often")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--new-items", type=int, default=0, metavar="R",
                   help="the load's labels go to items new to each phase, R labels each "
                   "(default 0: to the preloaded items, which gather ever more labels)")  # fmt: skip
    p.add_argument("--settled", action="store_true",
                   help="start the first phase once the dyadic model has learned the preload "
                   "(an idle project; by default the first phase starts while it learns)")  # fmt: skip
    p.add_argument("--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    p.add_argument("--vs", default="", metavar="NAME=VALUE[,...]",
                   help="each store also with each of these service settings, in turn, in the "
                   "same run: the peer of a change that has a setting (e.g. "
                   "CROWDTALLY_JOIN_QUEUED_LABELS=false)")  # fmt: skip
    add_peer_code(p)
    args = p.parse_args(argv)
    check_peer_code(p, args)
    try:
        args.vs = settings_to_compare(args.vs)
    except ValueError as exc:
        p.error(str(exc))
    named = [s.strip() for s in args.stores.split(",") if s.strip()]
    args.stores = list(dict.fromkeys(x for s in named for x in _STORES.get(s, (s,))))
    args.rates = [float(r) for r in args.rates.split(",") if r.strip()]
    if not set(args.stores) <= {"embedded", "redis"} or not args.stores:
        p.error(f"--stores: embedded, redis or both, not {','.join(named) or 'nothing'}")
    if any(r < 0 for r in args.rates) or args.preload < 1000 or args.workers < 5:
        p.error("need rates >= 0, --preload >= 1000, --workers >= 5")
    return args


def settings_to_compare(text: str) -> list[dict[str, str]]:
    """``--vs``: the service's defaults first, then one setting each (``NAME=VALUE``)."""
    out: list[dict[str, str]] = [{}]
    for part in (x.strip() for x in text.split(",") if x.strip()):
        name, sep, value = part.partition("=")
        if not sep or not name.startswith("CROWDTALLY_"):
            raise ValueError(f"--vs: {part!r} is not CROWDTALLY_NAME=VALUE")
        out.append({name: value})
    return out


def _sigterm(*_: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if "redis" in args.stores:
        r = redis.Redis.from_url(args.redis_url)
        try:
            r.ping()
        except redis.RedisError as exc:
            print(f"error: Redis at {args.redis_url}: {exc}", file=sys.stderr)
            return 2
        finally:
            r.close()
    signal.signal(signal.SIGTERM, _sigterm)
    admin = "bench-admin-" + secrets.token_hex(16)
    print(f"crowdtally freshness bench: {args.preload:,} labels preloaded ({args.workers} "
          f"workers, 3 classes), phases of {args.seconds:g} s at {args.rates} labels/s offered "
          f"(blocks of {args.block:,}), a probe label every {args.probe_ms:g} ms"
          + (f", the load on new items ({args.new_items} labels each)" if args.new_items else ""),
          flush=True)  # fmt: skip
    print(HEADER, flush=True)
    codes = codes_to_run(args)
    for store in args.stores:
        for setting in args.vs:
            for code in codes:
                said = [" ".join(f"{k}={v}" for k, v in setting.items()) or "the defaults"]
                if len(codes) > 1:
                    said.append(f"the code of {code} ({describe(code)})")
                if len(args.vs) > 1 or len(codes) > 1:
                    print(f"{store}, {', '.join(said)}:", flush=True)
                prefix = f"benchfresh-{secrets.token_hex(4)}"
                with service(store, args, prefix, admin, setting, code) as cluster:
                    asyncio.run(run_store(store, args, cluster, admin))
    print("acked/s: labels answered 202 per second; applied/s: labels the engine applied during "
          "the phase per second; lag end: labels acknowledged but not applied when the phase "
          "ended; 429 lbl: labels refused (engine behind); p50/p99/max: ms from a probe "
          "label's 202 to its item served; p99 95%: the p99's 95% interval (moving-block "
          f"bootstrap over a second's probes); unserved: probes not served {UNSERVED_S:g} s after; "
          "once: after catching up, the labels applied are exactly those acknowledged")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
