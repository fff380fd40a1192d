"""Every shared dataset streamed through the HTTP API serves what the core engine computes.

One test per dataset and store (on Redis the smaller datasets). The core engine's posteriors do not depend on the store: they
are computed once per dataset (``core_of``), and both stores' tests of a dataset run in the same
xdist worker (one ``xdist_group``) to share them."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from _pytest.mark import ParameterSet
from fastapi.testclient import TestClient

from app.api import create_app
from app.io.extract import accuracy
from app.store.base import Store
from bench.datasets import dataset_names
from bench.stream import Stream, core_on_stream, make_stream, serve_stream
from core.blocks import FloatArray
from core.nominal import NominalConfig
from tests.app.conftest import ADMIN, STORES, service_settings
from tests.conftest import DATASETS

PASSES = 2
# Every dataset found (none found: one case, which fails on the missing datasets).
NAMES = dataset_names(DATASETS) or ["no-shared-datasets"]
# On Redis, the datasets up to 2 MB of answers (all but two, of about 95,000 answers each, which
# the embedded store streams): what the store adds (the served state's encoding, its writes
# and reads) is the same whatever the size, and the two largest took 7 of the suite's CPU-s.
REDIS_MAX_BYTES = 2_000_000


def _cases() -> list[ParameterSet]:
    cases = []
    for name in NAMES:
        answers = DATASETS / name / "answers.csv"
        small = answers.exists() and answers.stat().st_size <= REDIS_MAX_BYTES
        for kind in STORES:
            if kind == "embedded" or small:
                group = pytest.mark.xdist_group(f"stream-{name}")
                cases.append(pytest.param(kind, name, marks=group, id=f"{kind}-{name}"))
    return cases


@pytest.fixture
def api(store: Store, tmp_path: Path) -> Iterator[TestClient]:
    # No sweep may fall between two posts of the stream: the engine waits for the test's word
    # (its idle threshold set to 0 once every block is posted: ``sweep_now``).
    settings = service_settings(tmp_path, refine_passes=PASSES, refine_idle_s=3600.0)
    with TestClient(
        create_app(settings, store=store), headers={"Authorization": f"Bearer {ADMIN}"}
    ) as c:
        yield c


@functools.cache
def core_of(folder: Path) -> tuple[Stream, FloatArray]:
    """A dataset's stream and the core engine's posteriors on it."""
    # the two largest in blocks of 1,000 to 5,000 labels (every label still streamed): the
    # engine's steps, not the labels, were most of their time (8.1 s, now 6.1 s, alone)
    large = (folder / "answers.csv").stat().st_size > REDIS_MAX_BYTES
    smallest, largest = (1000, 5000) if large else (100, 1000)
    stream = make_stream(folder, seed=3, smallest=smallest, largest=largest)
    config = NominalConfig(n_classes=len(stream.data.classes))
    return stream, core_on_stream(stream, config, PASSES)


@pytest.mark.slow
@pytest.mark.parametrize(("store", "name"), _cases(), indirect=["store"])
def test_served_posteriors_match_core_on_every_dataset(
    api: TestClient, datasets_root: Path, name: str
) -> None:
    stream, core = core_of(datasets_root / name)
    engine = api.app.state.service.engine  # type: ignore[attr-defined]

    def sweep_now() -> None:
        engine.refine_idle_s = 0.0

    # (no dyadic model: it costs half the time and does not touch the posteriors)
    served = serve_stream(api, stream, f"s-{name}", dyadic=False, posted=sweep_now)
    a_served = accuracy(served.argmax(axis=1), stream.gold)[0]
    a_core = accuracy(core.argmax(axis=1), stream.gold)[0]
    assert abs(a_served - a_core) <= 0.001  # the bound: 0.1 point
    assert float(np.abs(served - core).max()) < 1e-9  # in fact the same numbers, through JSON
