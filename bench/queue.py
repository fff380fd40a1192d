"""Queue latency with 200,000 items: ``python -m bench.queue``.

Starts the production layout (API process with ``--no-engine`` and an engine process) on the
real Redis, registers 200,000 items, posts 3 answers for a quarter of them (so posteriors and
worker matrices are real), waits for the engine, then times sequential ``GET /queue?limit=10``
requests (and ``&worker=``) from this process: p50, p99, max. Target: p99 <= 20 ms.
"""

from __future__ import annotations

import argparse
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time

import httpx
import numpy as np
import orjson

from app.store.redis_store import RedisStore
from app.testing import wait_healthy


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--items", type=int, default=200_000)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    args = ap.parse_args()
    prefix, admin = f"benchq-{secrets.token_hex(4)}", secrets.token_hex(8)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tmp = tempfile.mkdtemp(prefix="crowdtally-benchq-")
    env = {**os.environ, "CROWDTALLY_STORE": "redis", "REDIS_URL": args.redis_url, "CROWDTALLY_REDIS_PREFIX": prefix,
           "CROWDTALLY_ADMIN_KEY": admin, "CROWDTALLY_DATA_DIR": tmp, "CROWDTALLY_LOG_LEVEL": "WARNING"}  # fmt: skip
    cli = [sys.executable, "-m", "app.cli"]
    procs = [subprocess.Popen([*cli, "serve", "--no-engine", "--port", str(port)], env=env),
             subprocess.Popen([*cli, "engine"], env=env)]  # fmt: skip
    c = httpx.Client(
        base_url=f"http://127.0.0.1:{port}",
        headers={"Authorization": f"Bearer {admin}"},
        timeout=60,
    )
    try:
        wait_healthy(c, 30, procs[0])
        key = {
            "Authorization": f"Bearer {c.post('/v1/projects', json={'name': 'q', 'labels': list('abcde')}).json()['api_key']}"
        }
        t0 = time.perf_counter()
        for lo in range(0, args.items, 10_000):
            body = [{"item": f"item{i}"} for i in range(lo, min(args.items, lo + 10_000))]
            c.post("/v1/projects/q/items", content=orjson.dumps(body), headers=key)
        rng = np.random.default_rng(0)
        labelled = args.items // 4
        rows = [{"item": f"item{i}", "worker": f"w{int(rng.integers(300))}", "label": "abcde"[int(rng.integers(5))], "id": f"{i}-{j}"}
                for i in range(labelled) for j in range(3)]  # fmt: skip
        for lo in range(0, len(rows), 10_000):
            c.post(
                "/v1/projects/q/labels", content=orjson.dumps(rows[lo : lo + 10_000]), headers=key
            )
        while c.get("/v1/projects/q", headers=key).json()["stats"]["lag"]:
            time.sleep(0.2)
        print(
            f"{args.items:,} items registered, {len(rows):,} labels on {labelled:,} of them, applied in {time.perf_counter() - t0:.1f} s"
        )
        size = c.get("/v1/projects/q/queue", headers=key).json()["size"]
        print(f"queue size: {size:,}")
        queries: tuple[tuple[str, dict[str, str | int]], ...] = (
            ("GET /queue?limit=10", {"limit": 10}),
            ("GET /queue?limit=10&worker=w7", {"limit": 10, "worker": "w7"}),
        )
        for label, params in queries:
            times = []
            for _ in range(args.requests):
                t = time.perf_counter()
                r = c.get("/v1/projects/q/queue", params=params, headers=key)
                times.append(time.perf_counter() - t)
                assert r.status_code == 200 and len(r.json()["items"]) == 10
            ms = 1000 * np.array(times)
            p99 = np.percentile(ms, 99)
            print(f"{label:<34} p50 {np.percentile(ms, 50):6.2f} ms  p99 {p99:6.2f} ms  max {ms.max():6.2f} ms  "
                  f"(target p99 <= 20 ms: {'PASS' if p99 <= 20 else 'FAIL'})")  # fmt: skip
    finally:
        c.close()
        for p in procs:
            p.terminate()
            p.wait(timeout=10)
        RedisStore(args.redis_url, prefix).flush_prefix()


if __name__ == "__main__":
    main()
