"""What an engine step costs when most projects are quiet: ``python -m bench.idle_projects``.

A deployment holds many projects and most of them get no labels at a given moment, yet every
step of the engine looks at each. On the Redis store, each project has one entry applied;
then steps with nothing new are timed. ``lean`` is the engine as it runs: the project records
read again only when the catalogue's token changed, and one round trip telling which logs
have new entries. The peer, in the same run, is what the engine did before: every record and
one log read per project at every step. The ratio is peer over lean. ``worst``: the longest
of the lean engine's steps over QUIET_RECHECK_S and a bit more, as it runs (``poll_s`` apart),
a window that holds its re-check of every log. Then the reads behind
``/metrics`` and ``/readyz``: every project's progress in one ``Store.progress`` call, against
five reads a project; its positions in one ``Store.positions`` call, against two.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

import orjson

from app.engine.loop import QUIET_RECHECK_S, EngineLoop
from app.store.base import ProjectRecord
from app.store.redis_store import RedisStore
from core.nominal import NominalConfig

ENTRY = orjson.dumps({"items": ["i0", "i1"], "workers": ["w0", "w1"], "labels": [0, 1],
                      "weights": None})  # fmt: skip


def step_ms(store: RedisStore, steps: int, lean: bool) -> float:
    """Median ms of ``steps`` engine steps over the store's (quiet) projects."""
    if not lean:  # every record, every log read, at every step
        store.catalogue_token = lambda: None  # type: ignore[method-assign]
        store.quiet_logs = lambda heads: set()  # type: ignore[method-assign]
    loop = EngineLoop(store, refine_passes=0)
    loop.step()  # each project's entry applied
    took = []
    for _ in range(steps):
        t0 = time.perf_counter()
        loop.step()
        took.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(took)


def worst_step_ms(store: RedisStore, seconds: float) -> float:
    """The longest of the engine's quiet steps over ``seconds`` of them, ``poll_s`` apart."""
    loop = EngineLoop(store, refine_passes=0)
    loop.step()  # each project's entry applied
    loop.step()
    worst, end = 0.0, time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.perf_counter()
        loop.step()
        worst = max(worst, (time.perf_counter() - t0) * 1e3)
        time.sleep(loop.poll_s)
    return worst


def reads_ms(store: RedisStore, names: list[str], steps: int, how: str) -> float:
    """Median ms of reading every project's progress: as /metrics does (``progress``: one
    ``Store.progress`` call; ``progress-peer``: five reads a project, as it did before) or as
    /readyz does (``positions``: one ``Store.positions`` call; ``positions-peer``: two reads a
    project)."""

    def one_by_one(name: str) -> None:
        store.log_end(name), store.applied_position(name)
        if how == "progress-peer":
            store.lag_seconds(name), store.queue_size(name), store.get_params(name, [])

    took = []
    for _ in range(steps):
        t0 = time.perf_counter()
        if how == "progress":
            store.progress(names)
        elif how == "positions":
            store.positions(names)
        else:
            for name in names:
                one_by_one(name)
        took.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(took)


def measure(projects: int, steps: int, url: str, window_s: float) -> tuple[float, ...]:
    """(lean, peer) median step ms with ``projects`` quiet projects, the lean engine's worst
    step, then (lean, peer) median ms of the reads of their progress for /metrics, then for
    /readyz."""
    prefix = f"bench-idle-{uuid.uuid4().hex[:8]}"
    store = RedisStore(url, prefix)
    config = NominalConfig(3).to_dict()
    try:
        for k in range(projects):
            store.create_project(ProjectRecord(f"p{k}", ("a", "b", "c"), config, 1.0))
            store.append(f"p{k}", "labels", ENTRY)
        names = [f"p{k}" for k in range(projects)]
        return (
            step_ms(store, steps, True),
            step_ms(RedisStore(url, prefix), steps, False),
            worst_step_ms(store, window_s),
            reads_ms(store, names, steps, "progress"),
            reads_ms(store, names, min(steps, 3), "progress-peer"),
            reads_ms(store, names, steps, "positions"),
            reads_ms(store, names, min(steps, 3), "positions-peer"),
        )
    finally:
        store.flush_prefix()
        store.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.idle_projects", description=__doc__)
    parser.add_argument("--projects", default="1000,10000", help="project counts, one run each")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per run")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument(
        "--window",
        type=float,
        default=QUIET_RECHECK_S + 1.5,
        help="seconds of steps the worst one is taken over (default: the re-check's period "
        "and a bit more)",
    )
    args = parser.parse_args(argv)
    print("engine step with quiet projects (one entry each), Redis store, median ms, and the")
    print(f"lean engine's worst step over {args.window:g} s of them;")
    print("then every project's progress read as /metrics and /readyz read it, and the peer")
    print(
        f"{'projects':>9} {'lean':>9} {'peer':>9} {'peer/lean':>10} {'worst':>9} {'metrics':>9}"
        f" {'peer':>9} {'readyz':>9} {'peer':>9}"
    )
    for n in (int(x) for x in args.projects.split(",")):
        lean, peer, *reads = measure(n, args.steps, args.redis_url, args.window)
        print(
            f"{n:>9,} {lean:>9.1f} {peer:>9.1f} {peer / lean:>10.1f}"
            + "".join(f" {r:>9.1f}" for r in reads)
        )


if __name__ == "__main__":
    main()
