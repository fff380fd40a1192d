"""A live ``crowdtally serve`` (a subprocess on a free port, in a temporary data folder)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

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
    process: subprocess.Popen[bytes]

    def project_name(self, stem: str) -> str:
        return f"{stem}-{uuid.uuid4().hex[:8]}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _command() -> list[str]:
    exe = shutil.which("crowdtally")
    return [exe] if exe else [sys.executable, "-m", "app.cli"]


@pytest.fixture(scope="session")
def live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    data = tmp_path_factory.mktemp("crowdtally-live")
    port = free_port()
    env = {
        **os.environ,
        "CROWDTALLY_DATA_DIR": str(data),
        "CROWDTALLY_ADMIN_KEY": ADMIN,
        "CROWDTALLY_STORE": "embedded",
        "CROWDTALLY_REFINE_PASSES": "1",
        "CROWDTALLY_REFINE_IDLE_S": "0.2",
    }
    log = (data / "server.log").open("wb")
    proc = subprocess.Popen(
        [*_command(), "serve", "--port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=data,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                log.flush()
                pytest.fail(f"crowdtally serve exited: {(data / 'server.log').read_text()[-2000:]}")
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("crowdtally serve did not answer /healthz within 60 s")
            time.sleep(0.1)
        yield LiveServer(url, ADMIN, data, proc)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
