"""Shared fixtures: the shared datasets and a seeded Dawid-Skene generator; at session start,
the numba kernels compiled once for every worker (tests/kernels.py) and Debian's chromium for
the dashboard test (installed if missing, see tests/chromium.py)."""

from __future__ import annotations

import gc
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from bench.datasets import find_datasets_root
from tests.chromium import ChromiumMissingError, ensure_chromium
from tests.kernels import compile_before_workers

# One BLAS thread per process: the suite runs four workers (and the services they start) on
# two cores, where OpenBLAS's own threads only spin beside them (tests/test_datasets.py: 6.6
# CPU-s with them, 4.9 without). The workers, started after this import, inherit it.
for _variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")

# Bytecode written as modules are imported, by this process and every one it starts: where
# PYTHONDONTWRITEBYTECODE is set and the packages were installed without their .pyc files (the
# README's command 2), each process would otherwise compile every module it imports, every time
# (the suite took 155 s instead of 120 s).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

REPO = Path(__file__).resolve().parents[1]
DATASETS = find_datasets_root()
DASHBOARD_TEST = REPO / "tests" / "app" / "test_dashboard.py"


def _runs_dashboard_test(config: pytest.Config) -> bool:
    """Whether the paths to run (the arguments, else testpaths) include the dashboard test."""
    for arg in config.args:
        path = (config.invocation_params.dir / arg.split("::")[0]).resolve()
        if path == DASHBOARD_TEST or path in DASHBOARD_TEST.parents:
            return True
    return False


def pytest_sessionstart(session: pytest.Session) -> None:
    config = session.config
    # Once per run: here in the controller (or the only process), before xdist starts workers.
    if hasattr(config, "workerinput"):
        return
    # chromium's install (a fresh machine's apt-get, mostly waiting on the network and dpkg)
    # goes on beside the kernels' compile, which keeps both cores busy
    with ThreadPoolExecutor(max_workers=1) as pool:
        chromium = pool.submit(_ensure_chromium, config) if _runs_dashboard_test(config) else None
        if getattr(config.option, "numprocesses", None):
            compile_before_workers(config)  # else each worker compiles the same kernels
        if chromium is not None:
            chromium.result()


def _ensure_chromium(config: pytest.Config) -> None:
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    say = reporter.write_line if reporter is not None else print
    try:
        ensure_chromium(say)
    except ChromiumMissingError as exc:
        raise pytest.UsageError(str(exc)) from None  # one line: "ERROR: chromium is ..."


@pytest.fixture(scope="session")
def datasets_root() -> Path:
    if not (DATASETS / "INDEX.md").exists():
        pytest.fail(f"shared datasets not found at {DATASETS} (set CROWDTALLY_DATASETS)")
    return DATASETS


@dataclass(frozen=True)
class Synthetic:
    items: np.ndarray
    workers: np.ndarray
    labels: np.ndarray
    truth: np.ndarray
    confusion: np.ndarray
    n_classes: int


def dawid_skene(
    n_items: int, n_workers: int, per_item: int, n_classes: int, seed: int
) -> Synthetic:
    """Items with a true class; each answered by distinct random workers from their confusion rows."""
    rng = np.random.default_rng(seed)
    prior = rng.dirichlet(np.full(n_classes, 5.0))
    truth = rng.choice(n_classes, size=n_items, p=prior)
    accuracy = rng.uniform(0.55, 0.95, size=n_workers)
    confusion = np.empty((n_workers, n_classes, n_classes))
    for w in range(n_workers):
        off = rng.dirichlet(np.ones(n_classes - 1), size=n_classes) * (1 - accuracy[w])
        for z in range(n_classes):
            confusion[w, z] = np.insert(off[z], z, accuracy[w])
    workers = np.argsort(rng.random((n_items, n_workers)), axis=1)[:, :per_item].ravel()
    items = np.repeat(np.arange(n_items), per_item)
    cum = confusion[workers, truth[items]].cumsum(axis=1)
    labels = (rng.random(items.size)[:, None] > cum).sum(axis=1)
    return Synthetic(items, workers, np.minimum(labels, n_classes - 1), truth, confusion, n_classes)


@pytest.fixture(scope="session")
def synthetic() -> Synthetic:
    return dawid_skene(n_items=3000, n_workers=40, per_item=5, n_classes=3, seed=7)


# Tests sharing a started service (a module- or session-scoped fixture): each set runs on one
# xdist worker, so that its service starts once, not once per worker or twice in a module.
SHARED_SERVICE = (
    "tests/app/test_import_export.py",  # live, service
    "tests/app/test_dashboard.py",  # served_dog
    "clients/python/tests/",  # live_server
    "tests/app/test_redis_resharding.py",  # cluster
)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Every test module imported: what they hold (numba's, llvmlite's, the web stack's
    objects, about 10^6) is frozen out of the cyclic collector's sight, as the service does
    after its warm-up, so that the collections during the run do not walk it again."""
    gc.collect()
    gc.freeze()


@pytest.hookimpl(tryfirst=True)  # before xdist's, which reads the xdist_group marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The long tests (marked ``slow``) first, then the sets sharing a service (10-25 s each
    on one worker), then the rest: under xdist (``--dist loadgroup``, each worker taking the
    next test or group as it frees up) the long units then run side by side from the start,
    instead of one of them ending the run alone on one worker."""
    grouped = set()
    for item in items:
        shared = [p for p in SHARED_SERVICE if item.nodeid.startswith(p)]
        if shared:
            item.add_marker(pytest.mark.xdist_group(shared[0]))
            grouped.add(item.nodeid)
    items.sort(
        key=lambda item: (item.get_closest_marker("slow") is None, item.nodeid not in grouped)
    )
