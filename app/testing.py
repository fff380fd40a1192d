"""A real ``crowdtally serve`` in a subprocess, for end-to-end tests (ours and the client's)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cli_command() -> list[str]:
    """The installed ``crowdtally`` script, else the module from the sources."""
    exe = shutil.which("crowdtally")
    return [exe] if exe else [sys.executable, "-m", "app.cli"]


@contextlib.contextmanager
def running_service(data_dir: Path, env: dict[str, str], timeout_s: float = 60.0) -> Iterator[str]:
    """Start ``crowdtally serve`` on a free port with ``data_dir`` as its folder and ``env``
    added to the environment; yield its URL once /healthz answers; stop it (SIGINT, then
    SIGKILL after 15 s). Its output goes to ``data_dir/server.log``."""
    port = free_port()
    log_path = data_dir / "server.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [*cli_command(), "serve", "--port", str(port)],
            env={**os.environ, "CROWDTALLY_DATA_DIR": str(data_dir), **env},
            cwd=data_dir,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_healthy(proc, url, log, log_path, timeout_s)
            yield url
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _wait_healthy(
    proc: subprocess.Popen[bytes], url: str, log: IO[bytes], log_path: Path, timeout_s: float
) -> None:
    # One client for every poll: a new one per request builds a TLS context each time
    # (about 25 ms of CPU), which a service's start took up to 70 times.
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=1) as http:
        while True:
            if proc.poll() is not None:
                log.flush()
                raise RuntimeError(f"crowdtally serve exited: {log_path.read_text()[-2000:]}")
            with contextlib.suppress(httpx.TransportError):
                if http.get(f"{url}/healthz").status_code == 200:
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"crowdtally serve did not answer /healthz in {timeout_s} s")
            time.sleep(0.1)
