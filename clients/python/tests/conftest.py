"""A live ``crowdtally serve`` (a subprocess on a free port, in a temporary data folder)."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from app.testing import running_service  # the server these tests talk to
from bench.datasets import find_datasets_root

try:
    import crowdtally_client  # noqa: F401
except ImportError:  # not installed: use the sources next to these tests
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

ADMIN = "client-tests-admin-key"


@dataclass
class LiveServer:
    url: str
    admin_key: str
    data_dir: Path

    def project_name(self, stem: str) -> str:
        return f"{stem}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="session")
def live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    data = tmp_path_factory.mktemp("crowdtally-live")
    env = {
        "CROWDTALLY_ADMIN_KEY": ADMIN,
        "CROWDTALLY_STORE": "embedded",
        "CROWDTALLY_REFINE_PASSES": "1",
        "CROWDTALLY_REFINE_IDLE_S": "0.2",
    }
    with running_service(data, env) as url:
        yield LiveServer(url, ADMIN, data)


@pytest.fixture(scope="session")
def datasets_root() -> Path:
    """The shared crowdsourcing datasets with gold (``$CROWDTALLY_DATASETS``)."""
    root = find_datasets_root()
    if not (root / "INDEX.md").exists():
        pytest.fail(f"shared datasets not found at {root} (set CROWDTALLY_DATASETS)")
    return root
