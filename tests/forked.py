"""``crowdtally`` commands for the tests' process layouts, forked from a warm parent.

A ``python -m app.cli engine`` spends about 1.3 s of CPU before it does anything (its imports
0.9 s, loading the kernels 0.3 s), and the crash and engine-pool tests start some sixty of
them. Here multiprocessing's forkserver (one per test worker, started on first use) imports the
service and loads the kernels once (tests/warm_parent.py), and each command is a fork of it
that runs ``crowdtally``'s ``main`` with its own arguments, environment and folder: a real
process (its own pid, signals, sockets and exit status) running the same code from ``main``
on. What only a fresh interpreter shows (the command's imports, a first start's compile) is
tested by the tests that execute the command itself (tests/app/test_processes.py,
test_redis_restart.py, test_process_imports.py, test_warmup.py, tests/test_readme.py).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

_CONTEXT = multiprocessing.get_context("forkserver")
_CONTEXT.set_forkserver_preload(["tests.warm_parent"])


def _crowdtally(args: list[str], env: dict[str, str], cwd: str) -> None:
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    sys.argv = ["crowdtally", *args]
    from app.cli import main

    main()


class Forked:
    """A started ``crowdtally *args`` with the part of ``subprocess.Popen``'s interface the
    tests use (exit codes as Popen's: minus the signal's number when killed by one)."""

    def __init__(self, args: list[str], env: Mapping[str, str], cwd: Path) -> None:
        self.args = args
        self._process = _CONTEXT.Process(target=_crowdtally, args=(args, dict(env), str(cwd)))
        self._process.start()
        assert self._process.pid is not None
        self.pid: int = self._process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def send_signal(self, sig: int) -> None:
        if self._process.exitcode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(["crowdtally", *self.args], timeout or 0.0)
        return self._process.exitcode


Process = Forked | subprocess.Popen[bytes]
"""A command the tests started: forked here, or executed."""


def crowdtally(*args: str, env: Mapping[str, str], cwd: Path) -> Forked:
    """Start ``crowdtally *args`` with exactly ``env`` as its environment, in ``cwd``."""
    return Forked(list(args), env, cwd)
