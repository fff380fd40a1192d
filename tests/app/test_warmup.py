"""The start-up warm-up reaches every kernel the service calls, with the argument types it
calls them with: after it, a whole session of requests adds no compiled signature."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

SESSION = textwrap.dedent(
    """
    import os, random, sys, tempfile, time
    import numba
    from fastapi.testclient import TestClient
    from app.api.main import create_app
    from app.serving.warmup import everything
    from app.settings import Settings
    import core._calibration_kernels, core._dyadic_kernels, core._kernels, core.acquisition
    import core.blocks, core.idset, core.itemlabels
    import orjson
    from app.engine.project import ProjectEngine
    from app.store.base import LogEntry, ProjectRecord

    MODULES = (core._kernels, core._dyadic_kernels, core._calibration_kernels,
               core.acquisition, core.blocks, core.idset, core.itemlabels)

    def signatures():
        return {(m.__name__, n, str(s)) for m in MODULES for n, d in vars(m).items()
                if isinstance(d, numba.core.registry.CPUDispatcher) for s in d.signatures}

    everything()
    before = signatures()
    os.environ.update(CROWDTALLY_DATA_DIR=tempfile.mkdtemp(), CROWDTALLY_REFINE_IDLE_S="0.2")
    with TestClient(create_app(Settings())) as c:
        admin = {"Authorization": "Bearer " + open(os.environ["CROWDTALLY_DATA_DIR"] + "/admin.key").read().strip()}
        for name, extra in (("n", {}), ("o", {"dyadic": {"ordinal": True}})):
            key = c.post("/v1/projects", json={"name": name, "labels": ["a", "b", "c"], **extra},
                         headers=admin).json()["api_key"]
            h = {"Authorization": "Bearer " + key}
            rng = random.Random(0)
            labels = [{"item": f"i{rng.randrange(30)}", "worker": f"w{rng.randrange(8)}",
                       "label": rng.choice("abc"), "id": f"{name}{k}"} for k in range(200)]
            for post, body in ((f"/v1/projects/{name}/labels?wait=true", labels),
                               (f"/v1/projects/{name}/gold?wait=true", [{"item": "i1", "label": "a"}]),
                               (f"/v1/projects/{name}/items?wait=true", [{"item": "new"}]),
                               (f"/v1/projects/{name}/predictions", [{"worker": "w1", "item": "i2"}]),
                               (f"/v1/projects/{name}/refit?wait=true", None)):
                assert c.post(post, json=body, headers=h).status_code < 300, post
            for get in ("items/i2", "items", "queue?limit=3", "queue?limit=3&worker=w1",
                        "workers/w1", "workers", "calibration", "summary",
                        "boundary?worker=w1", "boundary?item=i2", "export?format=csv"):
                assert c.get(f"/v1/projects/{name}/{get}", headers=h).status_code == 200, get
            deadline = time.monotonic() + 30  # the idle sweeps: refinement, dyadic passes
            while c.get(f"/v1/projects/{name}", headers=h).json()["stats"]["dyadic_passes"] < 30:
                assert time.monotonic() < deadline
                time.sleep(0.1)
    # Queued entries joined into one block of more than core.blocks.LARGE labels.
    n = 70_000
    big = ProjectEngine(ProjectRecord("big", ("a", "b", "c"), {"n_classes": 3}, 0.0))
    body = {"items": [f"i{k % 9000}" for k in range(n)], "workers": [f"w{k % 50}" for k in range(n)],
            "labels": [k % 3 for k in range(n)], "weights": None}
    big.apply(LogEntry(1, "labels", orjson.dumps(body), b""))
    added = sorted(signatures() - before)
    print(len(before), added)
    sys.exit(1 if added else 0)
    """
)


@pytest.mark.slow
def test_warm_up_reaches_every_kernel_the_service_calls() -> None:
    out = subprocess.run(
        [sys.executable, "-c", SESSION], capture_output=True, text=True, timeout=300, check=False
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert int(out.stdout.split()[0]) > 10  # the kernels were there to count


EXTRAS_THEN_ENGINE = textwrap.dedent(
    """
    from app.serving import warmup
    from core import _calibration_kernels, acquisition

    def signatures():
        return {str(s) for d in (acquisition._voi_priority_kernel, _calibration_kernels.item_log_likelihoods)
                for s in d.signatures}

    warmup.serving_extras()
    extras = signatures()
    warmup.nominal()
    print(len(extras), len(signatures() - extras))
    """
)


def test_serving_extras_are_the_signatures_the_engine_and_reads_use() -> None:
    """A first start compiles them beside the nominal model's learning: with other argument
    types the service would compile them again before answering."""
    out = subprocess.run(
        [sys.executable, "-c", EXTRAS_THEN_ENGINE], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["2", "0"]


def test_the_quick_cache_check_agrees_with_numbas(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``crowdtally serve`` decides from file names alone whether a first start's second
    process is needed; numba's own index (read by ``warmup``) must agree."""
    from app.serving import kernel_cache, warmup

    warmup.everything()  # (loaded from the cache the suite's start filled, or compiled here)
    assert kernel_cache.looks_cached() and warmup._cached()
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    assert not kernel_cache.looks_cached()
    folder = tmp_path / "some" / "checkout" / "core"
    folder.mkdir(parents=True)
    for kernel in kernel_cache.LEARNING[:-1]:
        (folder / f"{kernel}-10.py311.nbi").touch()
    assert not kernel_cache.looks_cached()  # one is missing
    (folder / f"{kernel_cache.LEARNING[-1]}-10.py311.nbi").touch()
    assert kernel_cache.looks_cached()


def test_the_split_compile_uses_the_signatures_learn_blocks_calls_its_kernels_with() -> None:
    """A first start compiles the learning kernel's callees in two processes with these
    signatures, for ``learn_blocks`` to load them: each callee's cache (written by a real
    compile of ``learn_blocks`` when the suite started, or by a first start, which then
    compiles ``learn_blocks`` too) holds exactly that one signature. A wrong signature would
    add a second one (a compile for nothing, and ``learn_blocks`` compiling the right one)."""
    from app.serving import split_compile, warmup
    from core._numba import signature

    warmup.nominal(idle=False)  # (loaded from the cache the suite's start filled)
    halves = {**split_compile.SERVE_HALF, **split_compile.SECOND_HALF}
    for name, spec in halves.items():
        index = split_compile.kernel(name)._cache._cache_file._load_index()
        assert [key[0] for key in index] == [signature(spec)], name


SECOND_STAND_IN = textwrap.dedent(
    """
    import sys, time, pathlib
    print("learning", flush=True)
    release = pathlib.Path(sys.argv[1])
    while not release.exists():
        time.sleep(0.01)
    print("dyadic", flush=True)
    """
)


def test_a_first_start_serves_posteriors_before_the_dyadic_model_is_loaded(
    tmp_path: Path,
) -> None:
    """The warm-up's second process (here a stand-in: the kernels are already cached) says
    "learning", and the service answers; the dyadic model's labels wait, its position behind
    the posteriors', until the second process says "dyadic"; then the engine learns them."""
    from fastapi.testclient import TestClient

    from app.api import create_app
    from app.serving import warmup
    from tests.app.conftest import ADMIN, service_settings

    release = tmp_path / "release"
    warmup.adopt(subprocess.Popen(
        [sys.executable, "-c", SECOND_STAND_IN, str(release)], stdout=subprocess.PIPE
    ))  # fmt: skip
    try:
        admin = {"Authorization": f"Bearer {ADMIN}"}
        with TestClient(create_app(service_settings(tmp_path / "data")), headers=admin) as c:
            assert not warmup.dyadic_ready()
            c.post("/v1/projects", json={"name": "p", "labels": ["a", "b"]})
            body = [{"item": f"i{n % 4}", "worker": f"w{n % 3}", "label": "ab"[n % 2]}
                    for n in range(12)]  # fmt: skip
            assert c.post("/v1/projects/p/labels?wait=true", json=body).json()["applied"]
            assert c.get("/v1/projects/p/items/i1").json()["n_labels"] == 3  # served
            for _ in range(25):  # and they stay so, while the dyadic model waits
                stats = c.get("/v1/projects/p").json()["stats"]
                assert stats["applied"] == 1 and stats["dyadic_position"] == 0
                time.sleep(0.02)
            release.touch()
            deadline = time.monotonic() + 30
            while c.get("/v1/projects/p").json()["stats"]["dyadic_position"] < 1:
                assert time.monotonic() < deadline, "the dyadic model never learned"
                time.sleep(0.02)
            assert warmup.dyadic_ready()
    finally:
        release.touch()
        warmup._dyadic_loaded.set()


def test_the_second_process_stops_quietly_when_the_service_is_gone() -> None:
    """Its lines go to a pipe the service no longer reads (stopped while it compiled)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "app.serving.warmup"],
            stdout=write_end, stderr=subprocess.PIPE, timeout=120, check=False,
        )  # fmt: skip
    finally:
        os.close(write_end)
    assert (done.returncode, done.stderr) == (1, b"")


def test_a_start_pauses_the_cycle_collector_until_the_freeze_and_not_while_it_waits(
    tmp_path: Path,
) -> None:
    """``serve`` and ``engine`` pause the collector while they load (its full collections were
    0.3 s of a 1.5 s start); ``freeze_what_is_loaded`` runs it again, and so does a wait for
    an unreachable store (a Redis down for hours must not leave it paused)."""
    probe = textwrap.dedent(
        """
        import gc
        from app.serving.warmup import freeze_what_is_loaded
        from app.settings import Settings
        from app.store import open_store_when_reachable

        gc.disable()
        freeze_what_is_loaded()
        print("after the freeze", gc.isenabled())
        gc.disable()
        tries = []

        def first_use(store):
            if not tries:
                tries.append(1)
                from redis.exceptions import ConnectionError
                raise ConnectionError("down")
            return gc.isenabled()

        settings = Settings(store="embedded", data_dir="{data}")
        print("after a wait", open_store_when_reachable(settings, first_use, "probe")[1])
        """
    )
    script = probe.format(data=tmp_path)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["after the freeze True", "after a wait True"]


@pytest.mark.parametrize("workers", [1, 2])
def test_serve_pauses_the_collector_only_for_a_process_that_warms_up(
    workers: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One API process pauses the collector until its warm-up's freeze enables it; with
    several, this process only watches the ones serving (started anew), so it keeps it on."""
    import gc

    import uvicorn

    from app.testing import free_port
    from tests.app.conftest import REDIS_URL
    from tests.cli_in_process import run_cli

    seen: list[tuple[bool, int]] = []
    monkeypatch.setattr(uvicorn, "run", lambda *a, **k: seen.append((gc.isenabled(), k["workers"])))
    env = {"CROWDTALLY_DATA_DIR": str(tmp_path), "REDIS_URL": REDIS_URL}
    try:
        done = run_cli("serve", "--store", "redis", "--no-engine", "--workers", str(workers),
                       "--port", str(free_port()), env=env)  # fmt: skip
    finally:
        gc.enable()  # (no warm-up ran here to enable it)
    assert done.returncode == 0, done.stderr
    assert seen == [(workers > 1, workers)]
