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
from typing import Protocol

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
            try:
                with httpx.Client(base_url=url) as http:
                    wait_healthy(http, timeout_s, proc)
            except ServiceStartError as exc:
                log.flush()
                raise ServiceStartError(f"{exc}: {log_path.read_text()[-2000:]}") from None
            yield url
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


class ServiceStartError(RuntimeError):
    """A service did not answer /healthz in time, or its process exited first."""


class _Polled(Protocol):
    def poll(self) -> int | None: ...


def wait_healthy(client: httpx.Client, timeout_s: float, process: _Polled | None = None) -> None:
    """Poll ``client``'s /healthz (its base URL the service's) until it answers 200; raise
    ``ServiceStartError`` after ``timeout_s``, or at once if ``process`` exits. One client for
    every poll: a new one per request builds a TLS context each time (about 25 ms of CPU),
    and a first start takes up to 70 polls."""
    deadline = time.monotonic() + timeout_s
    while True:
        if process is not None and process.poll() is not None:
            raise ServiceStartError(f"the service exited with code {process.poll()}")
        with contextlib.suppress(httpx.TransportError):
            if client.get("/healthz", timeout=1).status_code == 200:
                return
        if time.monotonic() > deadline:
            raise ServiceStartError(f"the service did not answer /healthz in {timeout_s} s")
        time.sleep(0.1)
