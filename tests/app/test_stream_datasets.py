"""Every shared dataset streamed through the HTTP API serves what the core engine computes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from app.api import create_app
from app.io.extract import accuracy
from app.store.base import Store
from bench.datasets import dataset_names
from bench.stream import core_on_stream, make_stream, serve_stream
from core.nominal import NominalConfig
from tests.app.conftest import ADMIN, service_settings

PASSES = 2


@pytest.fixture
def api(store: Store, tmp_path: Path) -> Iterator[TestClient]:
    # Sweeps start after 1 s idle: long enough never to fall between two posts of the stream.
    settings = service_settings(tmp_path, refine_passes=PASSES, refine_idle_s=1.0)
    with TestClient(
        create_app(settings, store=store), headers={"Authorization": f"Bearer {ADMIN}"}
    ) as c:
        yield c


def test_served_posteriors_match_core_on_every_dataset(
    api: TestClient, datasets_root: Path
) -> None:
    worst = 0.0
    for name in dataset_names(datasets_root):
        stream = make_stream(datasets_root / name, seed=3)
        served = serve_stream(api, stream, f"s-{name}")
        core = core_on_stream(stream, NominalConfig(n_classes=len(stream.data.classes)), PASSES)
        a_served = accuracy(served.argmax(axis=1), stream.gold)[0]
        a_core = accuracy(core.argmax(axis=1), stream.gold)[0]
        assert abs(a_served - a_core) <= 0.001, name  # the bound: 0.1 point
        worst = max(worst, float(np.abs(served - core).max()))
    assert worst < 1e-9  # in fact the same numbers, through JSON and both stores
