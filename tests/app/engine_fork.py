"""``crowdtally engine`` started in about 0.1 s: forked from a server process that has imported the
engine and loaded its kernels once (multiprocessing's forkserver), instead of a new interpreter
that imports and loads them each time (about 1.4 s and 1.6 s of CPU on 2 cores).

The child runs the command's own function (``app.cli.service.engine_command``: settings from
the environment, store, SQL side, warm-up, engine loop) with the given environment and folder.
Killing it with SIGKILL is what killing the command's process does: nothing runs after.
tests/app/test_crash.py restarts its engine 20 times this way, so that the kills land while the
engine works rather than while a new interpreter starts; tests/app/test_processes.py keeps the
real command's process.
"""

from __future__ import annotations

import multiprocessing
import os
from multiprocessing.process import BaseProcess
from pathlib import Path

_CONTEXT = multiprocessing.get_context("forkserver")
# imported once in the server process; importing tests.app.warm_engine loads the kernels
_CONTEXT.set_forkserver_preload(["app.cli.service", "alembic.command", "tests.app.warm_engine"])


def _engine(env: dict[str, str], workdir: str) -> None:
    os.environ.clear()
    os.environ.update(env)
    os.chdir(workdir)
    from app.cli.service import engine_command

    engine_command(store=None)


class ForkedEngine:
    """The part of ``subprocess.Popen`` that tests use on an engine process."""

    def __init__(self, env: dict[str, str], workdir: Path) -> None:
        self._process: BaseProcess = _CONTEXT.Process(
            target=_engine, args=(dict(env), str(workdir)), name="crowdtally-engine", daemon=True
        )
        self._process.start()
        self.pid = self._process.pid

    def poll(self) -> int | None:
        return self._process.exitcode

    def kill(self) -> None:
        self._process.kill()

    def wait(self) -> int | None:
        self._process.join()
        return self._process.exitcode
