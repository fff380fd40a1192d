"""The service's figures, end to end over HTTP: ``python3 -m bench.service``.

Starts the production layout against a real Redis, as separate processes on a free port:
one API process (``CROWDTALLY_STORE=redis crowdtally serve --no-engine``) and one engine
process (``crowdtally engine``), then drives load from this process (never the API's) with a
small asyncio HTTP/1.1 client (pre-built request bytes, kept-alive connections) and prints:

1. labels/s acknowledged (202) when POSTing blocks of 1,000 labels over ``--connections``
   concurrent connections (seeded Dawid-Skene-like data, unique label ids);
2. engine lag: seconds from the last POST's ack until ``stats.applied == stats.log_end``
   (``GET /v1/projects/{p}`` polled every ``--poll-ms``): every posterior served; and until
   ``stats.dyadic_position`` gets there too (the dyadic model, which follows the posteriors);
3. latency of ``GET /v1/projects/{p}/items/{item}`` on random posted items under an open-loop
   load of ``--rate`` requests/s for ``--seconds`` s: p50, p99, max and the achieved rate.
   Latency runs from each request's *scheduled* send time (no coordinated omission);
4. the same for ``POST /v1/projects/{p}/predictions`` of ``--predict-pairs`` random
   (worker, item) pairs at ``--predict-rate`` requests/s, and for
   ``GET /v1/projects/{p}/boundary?worker=`` (200 candidate items) at ``--boundary-rate``
   requests/s (the dyadic model; no targets).

Between 2 and 3 it waits for the engine's idle sweeps to be applied (the refinement sweep:
``CROWDTALLY_REFINE_PASSES`` passes over every item, ``CROWDTALLY_REFINE_IDLE_S`` after the last
label; then the dyadic model's passes over every label), so the GETs measure the steady
state; the sweeps' time is printed.

Everything lives under its own Redis key prefix (``benchsvc-<random>`` unless
``--redis-prefix``), deleted at the end, and the SQL snapshots in a SQLite file of the run's own
(``--database-url`` to use a real database instead); the two server processes are stopped on
every exit, Ctrl-C and SIGTERM included. ``--check`` makes a missed target exit with status 1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import redis

from bench.synthetic import distinct_workers

ROOT = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"
TARGET_LABELS_PER_S = 50_000.0
TARGET_LAG_S = 2.0
TARGET_P99_MS = 10.0
QUIET_S = 1.5  # no new sweep entry for this long: the engine is idle


# ---------------------------------------------------------------------------------- data
@dataclass(frozen=True)
class Dataset:
    bodies: list[bytes]  # one JSON array of labels per block, serialised once
    items: list[str]
    n_labels: int
    n_items: int
    n_workers: int
    classes: list[str]


def make_dataset(
    n_labels: int, per_item: int, n_workers: int, n_classes: int, block: int, seed: int
) -> Dataset:
    """Dawid-Skene answers: skewed class prior, per-worker confusion (diagonal 0.5-0.95,
    10% near-uniform spammers), ``per_item`` distinct workers per item, random arrival order."""
    rng = np.random.default_rng(seed)
    n_items = -(-n_labels // per_item)
    K = n_classes
    prior = rng.dirichlet(np.full(K, 2.0))
    truth = rng.choice(K, size=n_items, p=prior)
    diag = rng.uniform(0.5, 0.95, size=n_workers)
    diag[rng.random(n_workers) < 0.10] = 1.0 / K  # spammers
    conf = np.repeat(((1.0 - diag) / (K - 1))[:, None, None], K, axis=1).repeat(K, axis=2)
    conf[:, np.arange(K), np.arange(K)] = diag[:, None]
    workers = distinct_workers(rng, n_items, per_item, n_workers).ravel()
    items = np.repeat(np.arange(n_items), per_item)
    cdf = np.cumsum(conf[workers, truth[items]], axis=1)
    labels = np.minimum((rng.random(items.size)[:, None] >= cdf).sum(axis=1), K - 1)
    order = rng.permutation(items.size)[:n_labels]
    item_names = [f"item-{i:07d}" for i in range(n_items)]
    worker_names = [f"worker-{w:05d}" for w in range(n_workers)]
    classes = [f"c{k}" for k in range(K)]
    rows = [
        {"item": item_names[i], "worker": worker_names[w], "label": classes[z], "id": f"L{n}"}
        for n, (i, w, z) in enumerate(
            zip(items[order].tolist(), workers[order].tolist(), labels[order].tolist(), strict=True)
        )
    ]
    bodies = [orjson.dumps(rows[s : s + block]) for s in range(0, len(rows), block)]
    return Dataset(bodies, item_names, len(rows), n_items, n_workers, classes)


# ---------------------------------------------------------------------------------- HTTP
class Conn:
    """One kept-alive HTTP/1.1 connection; requests are pre-built bytes (the fast path)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> Conn:
        self.reader, self.writer = await asyncio.open_connection(HOST, self.port)
        self.writer.transport.set_write_buffer_limits(high=1 << 20)
        sock = self.writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return self

    async def request(self, raw: bytes) -> tuple[int, bytes]:
        assert self.reader is not None and self.writer is not None
        self.writer.write(raw)
        if len(raw) > 65536:
            await self.writer.drain()
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        lower = head.lower()
        at = lower.find(b"\r\ncontent-length:")
        if at < 0:
            if status == 204 or status == 304:
                return status, b""
            raise RuntimeError(f"response without Content-Length: {head[:200]!r}")
        end = lower.find(b"\r\n", at + 2)
        body = await self.reader.readexactly(int(lower[at + 17 : end]))
        return status, body

    async def request_reopening(self, raw: bytes) -> tuple[int, bytes]:
        """``request``, sent once more on a new connection if the server had closed this one
        (the API closes a connection left idle for 5 s: uvicorn's keep-alive timeout). Only
        for requests that are safe to send twice (reads, label blocks with ids)."""
        try:
            return await self.request(raw)
        except (asyncio.IncompleteReadError, ConnectionError):
            self.close()
            await self.open()
            return await self.request(raw)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def build(method: str, path: str, key: str, body: bytes = b"") -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: {HOST}\r\nAuthorization: Bearer {key}\r\n"
    if body or method == "POST":
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    return (head + "\r\n").encode() + body


def pct(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if len(values) else float("nan")


# ---------------------------------------------------------------------------------- processes
def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        port: int = s.getsockname()[1]
        return port


def _cli() -> list[str]:
    exe = shutil.which("crowdtally")
    return [exe] if exe else [sys.executable, "-c", "from app.cli import main; main()"]


@dataclass
class Server:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    def tail(self, n: int = 30) -> str:
        try:
            lines = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(f"  {self.name}| {x}" for x in lines[-n:])


@dataclass
class Cluster:
    """The API and engine processes, each in its own session (Ctrl-C reaches only us)."""

    env: dict[str, str]
    port: int
    servers: list[Server] = field(default_factory=list)
    logdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="benchsvc-")))
    code: Path = ROOT
    """The source tree the processes run (another one: first on their PYTHONPATH, and their
    working directory, so that ``app`` is imported from it whichever way they start)."""

    def start(self, name: str, args: list[str]) -> Server:
        log = self.logdir / f"{name}.log"
        env = self.env
        if self.code != ROOT:
            paths = [str(self.code), env.get("PYTHONPATH", "")]
            env = {**env, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [*_cli(), *args],
                env=env,
                cwd=self.code,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        server = Server(name, proc, log)
        self.servers.append(server)
        return server

    def check_alive(self) -> None:
        for s in self.servers:
            if s.proc.poll() is not None:
                raise RuntimeError(
                    f"the {s.name} process exited with status {s.proc.returncode}:\n{s.tail()}"
                )

    def stop(self) -> None:
        for s in self.servers:
            if s.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(s.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for s in self.servers:
            try:
                s.proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(s.proc.pid, signal.SIGKILL)
                s.proc.wait()

    def remove_logs(self) -> None:
        shutil.rmtree(self.logdir, ignore_errors=True)


def delete_keys(url: str, prefix: str) -> int:
    r = redis.Redis.from_url(url)
    n = 0
    try:
        for pattern in (f"{prefix}:*", f"{{{prefix}:*"):
            batch = list(r.scan_iter(match=pattern, count=1000))
            for s in range(0, len(batch), 500):
                n += int(r.delete(*batch[s : s + 500]))
    finally:
        r.close()
    return n


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process, its reaped children excluded (Linux /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy_seconds() -> float:
    """CPU seconds spent busy by the whole machine, all cores (Linux /proc/stat)."""
    try:
        ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return float("nan")
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
    return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU share (% of one core) of named processes over a phase, and of everything else
    on the machine ("others": a busy neighbour skews every figure)."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.t0 = 0.0
        self.c0: dict[str, float] = {}
        self.m0 = 0.0

    def __enter__(self) -> CpuMeter:
        self.t0 = time.monotonic()
        self.c0 = {n: cpu_seconds(p) for n, p in self.pids.items()}
        self.m0 = machine_busy_seconds()
        return self

    def __exit__(self, *exc: object) -> None:
        dt = time.monotonic() - self.t0
        used = {n: cpu_seconds(p) - self.c0[n] for n, p in self.pids.items()}
        self.share = {n: 100.0 * v / dt if dt > 0 else float("nan") for n, v in used.items()}
        others = machine_busy_seconds() - self.m0 - sum(v for v in used.values() if v == v)
        self.share["others"] = max(100.0 * others / dt, 0.0) if dt > 0 else float("nan")

    def line(self) -> str:
        return "  ".join(f"{n} {v:.0f}%" for n, v in self.share.items() if v == v)


@contextlib.contextmanager
def profiled(out: Path | None, pids: dict[str, int], phase: str) -> Iterator[None]:
    """``--py-spy DIR``: sample the API and engine during a phase into
    ``DIR/<phase>-<process>.txt`` (collapsed stacks; ``py-spy`` must be installed)."""
    if out is None:
        yield
        return
    out.mkdir(parents=True, exist_ok=True)
    spy = ["py-spy", "record", "-r", "200", "--nonblocking", "-f", "raw"]
    spies = [
        subprocess.Popen(
            [*spy, "-p", str(pid), "-o", str(out / f"{phase}-{name}.txt")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for name, pid in pids.items()
        if name in ("api", "engine")
    ]
    time.sleep(0.3)  # let py-spy attach
    try:
        yield
    finally:
        for p in spies:
            p.send_signal(signal.SIGINT)
        for p in spies:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


# ---------------------------------------------------------------------------------- phases
@dataclass
class Latencies:
    """An open-loop phase: latency from each request's scheduled send, and on the wire."""

    from_due_ms: list[float] = field(default_factory=list)
    wire_ms: list[float] = field(default_factory=list)
    errors: int = 0
    rate: float = float("nan")

    def line(self) -> str:
        return (
            f"{len(self.from_due_ms):,} requests, {self.errors} errors, achieved "
            f"{self.rate:.1f}/s; from scheduled send p50 {pct(self.from_due_ms, 50):.2f} ms, "
            f"p99 {pct(self.from_due_ms, 99):.2f} ms, max "
            f"{max(self.from_due_ms, default=float('nan')):.2f} ms; on the wire p50 "
            f"{pct(self.wire_ms, 50):.2f} ms, p99 {pct(self.wire_ms, 99):.2f} ms"
        )


@dataclass
class Results:
    labels_per_s: float = float("nan")
    post_seconds: float = float("nan")
    post_ms: list[float] = field(default_factory=list)
    accepted: int = 0
    duplicates: int = 0
    refused: int = 0
    """Blocks refused by push-back (429 engine_behind), sent again after RETRY_S."""
    lag_s: float = float("nan")
    dyadic_lag_s: float = float("nan")
    """Seconds from the last ack until the dyadic model had learned every label."""
    behind_at_ack: int = 0
    refine_s: float | None = None
    sweeps: int = 0
    get: Latencies = field(default_factory=Latencies)
    predict: Latencies = field(default_factory=Latencies)
    boundary: Latencies = field(default_factory=Latencies)
    cpu: dict[str, str] = field(default_factory=dict)


async def call(port: int, raw: bytes, expect: int) -> Any:
    conn = await Conn(port).open()
    try:
        status, body = await conn.request(raw)
    finally:
        conn.close()
    if status != expect:
        raise RuntimeError(f"HTTP {status} (expected {expect}): {body[:300]!r}")
    return orjson.loads(body) if body else None


async def wait_healthy(port: int, cluster: Cluster, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        cluster.check_alive()
        with contextlib.suppress(OSError, RuntimeError, asyncio.IncompleteReadError):
            await call(port, build("GET", "/healthz", ""), 200)
            return
        await asyncio.sleep(0.1)
    raise RuntimeError("the API did not answer /healthz in time")


async def create_project(port: int, admin: str, name: str, classes: list[str]) -> str:
    body = orjson.dumps({"name": name, "labels": classes})
    created = await call(port, build("POST", "/v1/projects", admin, body), 201)
    key: str = created["api_key"]
    return key


async def stats(conn: Conn, raw: bytes) -> dict[str, int]:
    status, body = await conn.request(raw)
    if status != 200:
        raise RuntimeError(f"GET project: HTTP {status}: {body[:300]!r}")
    out: dict[str, int] = orjson.loads(body)["stats"]
    return out


async def warm_up(port: int, admin: str, cluster: Cluster, data: Dataset) -> None:
    """A throw-away project: the engine loads (or compiles) its numba kernels, the API its
    GET path, before anything is timed."""
    name = "warmup"
    key = await create_project(port, admin, name, data.classes)
    conn = await Conn(port).open()
    try:
        status, body = await conn.request(
            build("POST", f"/v1/projects/{name}/labels", key, data.bodies[0])
        )
        if status != 202:
            raise RuntimeError(f"warm-up POST: HTTP {status}: {body[:300]!r}")
        position = orjson.loads(body)["position"]
        raw = build("GET", f"/v1/projects/{name}", key)
        deadline = time.monotonic() + 180
        while (await stats(conn, raw))["applied"] < position:
            cluster.check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError("the engine did not apply the warm-up block in 180 s")
            await asyncio.sleep(0.05)
        item = orjson.loads(data.bodies[0])[0]["item"]
        for _ in range(20):
            status, body = await conn.request(
                build("GET", f"/v1/projects/{name}/items/{item}", key)
            )
            if status != 200:
                raise RuntimeError(f"warm-up GET item: HTTP {status}: {body[:300]!r}")
    finally:
        conn.close()
    await call(port, build("DELETE", f"/v1/projects/{name}", admin), 204)


RETRY_S = 1.0
"""A block refused with 429 is sent again after this long (the shortest Retry-After)."""


async def post_phase(
    port: int, project: str, key: str, data: Dataset, connections: int, res: Results
) -> int:
    path = f"/v1/projects/{project}/labels?wait=false"
    requests = [build("POST", path, key, b) for b in data.bodies]
    conns = [await Conn(port).open() for _ in range(connections)]
    todo = iter(range(len(requests)))
    positions: list[int] = []
    last_ack = 0.0

    async def worker(conn: Conn) -> None:
        nonlocal last_ack
        for n in todo:
            t = time.perf_counter()
            status, body = await conn.request(requests[n])
            while status == 429:  # push-back: as a client would, send it again later
                res.refused += 1
                await asyncio.sleep(RETRY_S)
                status, body = await conn.request(requests[n])
            last_ack = time.perf_counter()
            if status != 202:
                raise RuntimeError(f"POST block {n}: HTTP {status}: {body[:300]!r}")
            ack = orjson.loads(body)
            res.post_ms.append(1e3 * (last_ack - t))
            res.accepted += ack["accepted"]
            res.duplicates += ack["duplicates"]
            positions.append(ack["position"])

    t0 = time.perf_counter()
    try:
        await asyncio.gather(*(worker(c) for c in conns))
    finally:
        for c in conns:
            c.close()
    res.post_seconds = last_ack - t0
    res.labels_per_s = res.accepted / res.post_seconds
    return max(positions)


async def lag_phase(
    port: int, project: str, key: str, last_position: int, poll_s: float, res: Results
) -> None:
    t_ack = time.perf_counter()  # called right after the last ack
    conn = await Conn(port).open()
    raw = build("GET", f"/v1/projects/{project}", key)
    try:
        first = True
        while True:
            s = await stats(conn, raw)
            if first:
                res.behind_at_ack, first = s["log_end"] - s["applied"], False
            now = time.perf_counter()
            caught_up = s["applied"] == s["log_end"] and s["applied"] >= last_position
            if caught_up and math.isnan(res.lag_s):
                res.lag_s = now - t_ack
            if (s.get("dyadic_position") or 0) >= last_position:
                res.dyadic_lag_s = now - t_ack
                if caught_up:
                    return
            if time.perf_counter() - t_ack > 300:
                raise RuntimeError(f"the engine did not catch up in 300 s: {s}")
            await asyncio.sleep(poll_s)
    finally:
        conn.close()


async def settle_phase(
    port: int, project: str, key: str, last_position: int, timeout_s: float, res: Results
) -> None:
    """Wait for the engine's idle sweeps (log entries after the labels: the refinement sweep,
    then the dyadic passes) to be applied, and the log to stay quiet for QUIET_S."""
    t0 = time.perf_counter()
    conn = await Conn(port).open()
    raw = build("GET", f"/v1/projects/{project}", key)
    done_at, end = 0.0, -1
    try:
        while time.perf_counter() - t0 < timeout_s:
            s = await stats(conn, raw)
            now = time.perf_counter()
            if s["log_end"] > last_position and s["applied"] == s["log_end"]:
                if s["log_end"] != end:
                    done_at, end = now, s["log_end"]
                elif now - done_at >= QUIET_S:
                    res.refine_s = done_at - t0
                    res.sweeps = end - last_position
                    return
            await asyncio.sleep(0.05)
    finally:
        conn.close()


async def open_loop(port: int, requests: list[bytes], rate: float, out: Latencies) -> None:
    """Send ``requests`` at ``rate``/s whatever the answers' pace (no coordinated omission)."""
    pool: asyncio.Queue[Conn] = asyncio.Queue()
    conns = [await Conn(port).open() for _ in range(32)]
    for c in conns:
        pool.put_nowait(c)
    tasks: list[asyncio.Task[None]] = []
    last_done = 0.0

    async def one(raw: bytes, due: float) -> None:
        nonlocal last_done
        conn = await pool.get()
        sent = time.perf_counter()
        try:
            status, _ = await conn.request(raw)
        finally:
            pool.put_nowait(conn)
        done = time.perf_counter()
        last_done = max(last_done, done)
        if status != 200:
            out.errors += 1
        out.from_due_ms.append(1e3 * (done - due))
        out.wire_ms.append(1e3 * (done - sent))

    t0 = time.perf_counter() + 0.05
    try:
        for k, raw in enumerate(requests):
            due = t0 + k / rate
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(raw, due)))
        await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()
        for c in conns:
            c.close()
    out.rate = len(out.from_due_ms) / (last_done - t0) if last_done > t0 else float("nan")


def get_requests(project: str, key: str, data: Dataset, n: int, seed: int) -> list[bytes]:
    picks = np.random.default_rng(seed + 1).integers(0, data.n_items, size=n).tolist()
    return [build("GET", f"/v1/projects/{project}/items/{data.items[i]}", key) for i in picks]


def boundary_requests(project: str, key: str, data: Dataset, n: int, seed: int) -> list[bytes]:
    """GET /boundary for random workers (200 candidate items each, the 10 nearest)."""
    workers = np.random.default_rng(seed + 3).integers(0, data.n_workers, size=n).tolist()
    path = f"/v1/projects/{project}/boundary?limit=10&candidates=200&worker=worker-"
    return [build("GET", f"{path}{w:05d}", key) for w in workers]


def predict_requests(
    project: str, key: str, data: Dataset, n: int, pairs: int, seed: int
) -> list[bytes]:
    """POST /predictions of ``pairs`` random (worker, item) pairs each."""
    rng = np.random.default_rng(seed + 2)
    out = []
    for _ in range(n):
        items = rng.integers(0, data.n_items, size=pairs).tolist()
        workers = rng.integers(0, data.n_workers, size=pairs).tolist()
        body = [
            {"worker": f"worker-{w:05d}", "item": data.items[i]}
            for w, i in zip(workers, items, strict=True)
        ]
        out.append(build("POST", f"/v1/projects/{project}/predictions", key, orjson.dumps(body)))
    return out


async def run(args: argparse.Namespace, cluster: Cluster, admin: str, res: Results) -> None:
    from app.settings import Settings

    engine_settings = Settings(_env_file=None)
    data = make_dataset(args.labels, 5, args.workers, args.classes, args.block, args.seed)
    port = cluster.port
    await wait_healthy(port, cluster)
    await warm_up(port, admin, cluster, data)
    project = "bench"
    key = await create_project(port, admin, project, data.classes)
    pids = {s.name: s.proc.pid for s in cluster.servers} | {"loadgen": os.getpid()}
    with contextlib.suppress(Exception):
        r = redis.Redis.from_url(args.redis_url)
        info = r.info("server")
        r.close()
        if Path(f"/proc/{info['process_id']}").exists() and HOST in args.redis_url:
            pids["redis"] = int(info["process_id"])

    spy = args.py_spy
    with CpuMeter(pids) as m, profiled(spy, pids, "post"):
        last_position = await post_phase(port, project, key, data, args.connections, res)
    res.cpu["POST"] = m.line()
    with CpuMeter(pids) as m, profiled(spy, {"engine": pids["engine"]}, "lag"):
        await lag_phase(port, project, key, last_position, args.poll_ms / 1e3, res)
    res.cpu["lag"] = m.line()
    cluster.check_alive()
    if engine_settings.refine_passes > 0:
        timeout = engine_settings.refine_idle_s + 120
        await settle_phase(port, project, key, last_position, timeout, res)
    n = max(int(args.rate * args.seconds), 1)
    with CpuMeter(pids) as m, profiled(spy, pids, "get"):
        await open_loop(port, get_requests(project, key, data, n, args.seed), args.rate, res.get)
    res.cpu["GET"] = m.line()
    cluster.check_alive()
    if args.predict_rate > 0:
        n = max(int(args.predict_rate * args.seconds), 1)
        raws = predict_requests(project, key, data, n, args.predict_pairs, args.seed)
        with CpuMeter(pids) as m:
            await open_loop(port, raws, args.predict_rate, res.predict)
        res.cpu["predict"] = m.line()
        cluster.check_alive()
    if args.boundary_rate > 0:
        n = max(int(args.boundary_rate * args.seconds), 1)
        raws = boundary_requests(project, key, data, n, args.seed)
        with CpuMeter(pids) as m:
            await open_loop(port, raws, args.boundary_rate, res.boundary)
        res.cpu["boundary"] = m.line()
        cluster.check_alive()


# ---------------------------------------------------------------------------------- report
def report(args: argparse.Namespace, res: Results) -> bool:
    rows: list[tuple[str, str, str, str]] = []

    def verdict(ok: bool) -> str:
        return "PASS" if ok else "FAIL"

    ok_rate = res.labels_per_s >= TARGET_LABELS_PER_S
    ok_lag = res.lag_s <= TARGET_LAG_S
    p99 = pct(res.get.from_due_ms, 99)
    ok_p99 = p99 <= TARGET_P99_MS and res.get.errors == 0
    rows.append(
        (
            f"POST labels/s acknowledged ({args.block:,}/block, {args.connections} conns)",
            f"{res.labels_per_s:,.0f}",
            f">= {TARGET_LABELS_PER_S:,.0f}",
            verdict(ok_rate),
        )
    )
    rows.append(
        (
            "engine lag after last ack (s)",
            f"{res.lag_s:.2f}",
            f"<= {TARGET_LAG_S:g}",
            verdict(ok_lag),
        )
    )
    rows.append(
        (
            f"GET item p99 (ms) at {args.rate:g}/s open loop",
            f"{p99:.2f}",
            f"<= {TARGET_P99_MS:g}",
            verdict(ok_p99),
        )
    )
    w = [
        max(len(r[i]) for r in [("measure", "value", "target", "result"), *rows]) for i in range(4)
    ]
    line = "  ".join
    print()
    print(line(h.ljust(w[i]) for i, h in enumerate(("measure", "value", "target", "result"))))
    print(line("-" * x for x in w))
    for r in rows:
        print(line((r[0].ljust(w[0]), r[1].rjust(w[1]), r[2].ljust(w[2]), r[3])))
    print()
    print(
        f"POST: {res.accepted:,} labels accepted ({res.duplicates:,} duplicates"
        f"{f'; {res.refused:,} blocks refused by push-back, sent again' if res.refused else ''}) in "
        f"{res.post_seconds:.2f} s; per-block latency p50 {pct(res.post_ms, 50):.1f} ms, "
        f"p99 {pct(res.post_ms, 99):.1f} ms; CPU {res.cpu.get('POST', '?')}"
    )
    print(
        f"lag: {res.behind_at_ack} log entries behind at the last ack; the dyadic model had "
        f"learned every label {res.dyadic_lag_s:.2f} s after it; CPU {res.cpu.get('lag', '?')}"
    )
    if res.refine_s is not None:
        print(f"{res.sweeps} idle sweeps (refinement, dyadic passes) applied {res.refine_s:.2f} s "
              "after catching up (before the GETs)")  # fmt: skip
    print(f"GET item: {res.get.line()}; CPU {res.cpu.get('GET', '?')}")
    if res.predict.from_due_ms:
        print(
            f"POST predictions ({args.predict_pairs} pairs each, {args.predict_rate:g}/s open "
            f"loop): {res.predict.line()}; CPU {res.cpu.get('predict', '?')}"
        )
    if res.boundary.from_due_ms:
        print(
            f"GET boundary (a worker, 200 candidates, {args.boundary_rate:g}/s open loop): "
            f"{res.boundary.line()}; CPU {res.cpu.get('boundary', '?')}"
        )
    return ok_rate and ok_lag and ok_p99 and res.predict.errors == 0 and res.boundary.errors == 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python3 -m bench.service", description=__doc__.split("\n")[0])
    p.add_argument("--labels", type=int, default=200_000, help="labels to POST (5 per item)")
    p.add_argument("--block", type=int, default=1_000, help="labels per POST")
    p.add_argument("--workers", type=int, default=500, help="distinct workers")
    p.add_argument("--classes", type=int, default=5, help="classes")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--connections", type=int, default=8, help="concurrent POST connections")
    p.add_argument("--rate", type=float, default=500.0, help="GET item requests/s (open loop)")
    p.add_argument(
        "--predict-rate", type=float, default=200.0, help="POST predictions/s (open loop; 0: skip)"
    )
    p.add_argument("--predict-pairs", type=int, default=10, help="pairs per predictions request")
    p.add_argument(
        "--boundary-rate", type=float, default=20.0, help="GET boundary/s (open loop; 0: skip)"
    )
    p.add_argument("--seconds", type=float, default=10.0, help="length of the GET phase")
    p.add_argument("--poll-ms", type=float, default=5.0, help="stats poll interval for the lag")
    p.add_argument(
        "--redis-url",
        default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
        help="Redis for the API and engine processes",
    )
    p.add_argument(
        "--redis-prefix",
        default=None,
        help="key prefix for this run (default benchsvc-<random>); its keys are deleted after",
    )
    p.add_argument(
        "--database-url",
        default=None,
        help="snapshot database of the API and engine (default: a SQLite file of this run's own)",
    )
    p.add_argument("--port", type=int, default=0, help="API port (default: a free one)")
    p.add_argument("--keep-logs", action="store_true", help="keep the server logs")
    p.add_argument(
        "--py-spy",
        type=Path,
        default=None,
        metavar="DIR",
        help="profile the API and engine per phase with py-spy (collapsed stacks in DIR)",
    )
    p.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    add_peer_code(p)
    args = p.parse_args(argv)
    if args.labels < args.block or args.workers < 5 or args.classes < 2:
        p.error("need --labels >= --block, --workers >= 5, --classes >= 2")
    check_peer_code(p, args)
    return args


def add_peer_code(p: argparse.ArgumentParser) -> None:
    """``--peer-code DIR``: the bench again with the service of another source tree."""
    p.add_argument("--peer-code", type=Path, default=None, metavar="DIR",
                   help="the same measurement again, right after, with the service of the "
                   "source tree DIR (e.g. a git worktree of the commit before): old and new "
                   "code side by side in one run")  # fmt: skip


def check_peer_code(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.peer_code is not None:
        args.peer_code = args.peer_code.resolve()
        if not (args.peer_code / "app" / "cli" / "__init__.py").is_file():
            p.error(f"--peer-code: {args.peer_code} is not a crowdtally source tree (no app/cli)")


def codes_to_run(args: argparse.Namespace) -> list[Path]:
    """This tree, then ``--peer-code``'s."""
    return [ROOT] if args.peer_code is None else [ROOT, args.peer_code]


def describe(code: Path) -> str:
    """The commit a source tree is at (``git describe``), or "not a git tree"."""
    out = subprocess.run(
        ["git", "-C", str(code), "describe", "--always", "--dirty"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return out.stdout.strip() or "not a git tree"


def _sigterm(*_: object) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def running(
    args: argparse.Namespace, prefix: str, admin: str, code: Path = ROOT
) -> Iterator[Cluster]:
    env = dict(os.environ)
    env.update(
        CROWDTALLY_STORE="redis",
        REDIS_URL=args.redis_url,
        CROWDTALLY_REDIS_URL=args.redis_url,
        CROWDTALLY_REDIS_PREFIX=prefix,
        CROWDTALLY_ADMIN_KEY=admin,
    )
    env.pop("CROWDTALLY_ENGINE_IN_PROCESS", None)
    cluster = Cluster(env, args.port or free_port(), code=code)
    # Snapshots and the label archive: a SQLite file of this run's own (deleted after) unless
    # --database-url names a database (never the default data dir of the working directory).
    env["CROWDTALLY_DATA_DIR"] = str(cluster.logdir / "data")
    if args.database_url:
        env["CROWDTALLY_DATABASE_URL"] = args.database_url
    else:
        env.pop("CROWDTALLY_DATABASE_URL", None)
    ok = False
    try:
        cluster.start("api", ["serve", "--host", HOST, "--port", str(cluster.port), "--no-engine"])
        cluster.start("engine", ["engine"])
        yield cluster
        ok = True
    finally:
        cluster.stop()
        removed = delete_keys(args.redis_url, prefix)
        shutil.rmtree(cluster.logdir / "data", ignore_errors=True)
        print(f"stopped the API and engine; deleted {removed} Redis keys under {prefix!r}")
        if ok and not args.keep_logs:
            cluster.remove_logs()
        else:
            print(f"server logs: {cluster.logdir}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    prefix = args.redis_prefix or f"benchsvc-{secrets.token_hex(4)}"
    r = redis.Redis.from_url(args.redis_url)
    try:
        r.ping()
        for taken in prefixes(prefix, args):
            if next(r.scan_iter(match=f"{taken}:*", count=1000), None) is not None:
                print(f"error: Redis keys under {taken!r} exist; pick another --redis-prefix")
                return 2
    except redis.RedisError as exc:
        print(f"error: Redis at {args.redis_url}: {exc}", file=sys.stderr)
        return 2
    finally:
        r.close()
    admin = "bench-admin-" + secrets.token_hex(16)
    signal.signal(signal.SIGTERM, _sigterm)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with it ignored
    print(
        f"crowdtally service bench: {args.labels:,} labels ({-(-args.labels // 5):,} items x 5, "
        f"{args.workers} workers, {args.classes} classes, seed {args.seed}), redis {args.redis_url}, "
        f"prefix {prefix}",
        flush=True,
    )
    met = []
    for n, code in enumerate(codes_to_run(args)):
        if args.peer_code is not None:
            print(f"\n== the code of {code} ({describe(code)})", flush=True)
        status = measure_code(args, prefixes(prefix, args)[n], admin, code)
        if status not in (None, 1):  # interrupted
            return status
        met.append(status is None)
    return 1 if args.check and not met[0] else 0  # (--check: this tree's code)


def prefixes(prefix: str, args: argparse.Namespace) -> list[str]:
    """The Redis key prefix of each measurement (``codes_to_run``'s): each run's own."""
    return [prefix] + [f"{prefix}-{n}" for n in range(1, len(codes_to_run(args)))]


def measure_code(args: argparse.Namespace, prefix: str, admin: str, code: Path) -> int | None:
    """One measurement with the service of the source tree ``code``: None when its targets
    were met, 1 when missed, else the exit status of a failed or interrupted run."""
    res = Results()
    try:
        with running(args, prefix, admin, code) as cluster:
            print(
                f"API pid {cluster.servers[0].proc.pid} on :{cluster.port} (--no-engine), "
                f"engine pid {cluster.servers[1].proc.pid}; load from pid {os.getpid()}",
                flush=True,
            )
            try:
                import uvloop

                runner: Any = uvloop.run
            except ImportError:
                runner = asyncio.run
            try:
                runner(run(args, cluster, admin, res))
            except Exception as exc:
                print(f"error: {exc}", file=sys.stderr)
                for s in cluster.servers:
                    print(s.tail(), file=sys.stderr)
                raise SystemExit(2) from None
            passed = report(args, res)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return None if passed else 1


if __name__ == "__main__":
    sys.exit(main())
