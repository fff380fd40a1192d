"""``crowdtally ARGS`` run in the test process: ``app.cli.run`` (what the installed script
runs, without its hard exit on an error status) with that command line, its output and exit status captured. The same parsing,
messages and exit codes as the script, without the interpreter start and imports (about
1-2 s of CPU each)."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import traceback
from pathlib import Path

import pytest

from app.cli import run


def run_cli(
    *args: str | Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``crowdtally ARGS`` with ``env`` added to the environment; an exception that escapes
    ``run`` prints its traceback and exits 1, as the interpreter does."""
    argv = ["crowdtally", *map(str, args)]
    out, err = io.StringIO(), io.StringIO()
    code: int | str | None = 0
    with (
        pytest.MonkeyPatch.context() as mp,
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        mp.setattr(sys, "argv", argv)
        for name, value in (env or {}).items():
            mp.setenv(name, value)
        saved = dict(os.environ)
        try:
            run()
        except SystemExit as exc:
            code = exc.code
        except Exception:
            traceback.print_exc()
            code = 1
        finally:  # (a command sets variables of its own, e.g. --store: not for the next one)
            os.environ.clear()
            os.environ.update(saved)
    if isinstance(code, str):  # SystemExit("message"): printed, status 1
        err.write(code + "\n")
        code = 1
    return subprocess.CompletedProcess(argv, code or 0, out.getvalue(), err.getvalue())
