"""Debian's ``chromium``, which tests/app/test_dashboard.py drives through Playwright (no browser
download): found on PATH, else installed with apt-get when we are root.

The suite's session start (tests/conftest.py) calls ``ensure_chromium`` once, in the controller
(before xdist starts its workers), when the dashboard test is among the paths to run;
``python3 -m tests.chromium`` (stdlib only: before ``pip install``) does the same by hand.
A lock file serializes concurrent sessions on the machine: one installs, the others then find
it installed.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

INSTALL = ["apt-get", "install", "-y", "-q", "-o", "DPkg::Lock::Timeout=300", "chromium"]
HINT = "install Debian's chromium (apt-get install chromium) for tests/app/test_dashboard.py"
LOCK = Path(tempfile.gettempdir()) / "crowdtally-chromium-install.lock"


class ChromiumMissingError(Exception):
    """chromium is not installed and could not be installed here (the message says why)."""


def find_chromium() -> str | None:
    return shutil.which("chromium")


def _apt(args: list[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    return subprocess.run(args, env=env, capture_output=True, text=True, check=False)


def ensure_chromium(say: Callable[[str], None] = print) -> str:
    """The path of ``chromium``; installs Debian's package first if it is missing (one line
    said through ``say``). Raises ChromiumMissingError, with a one-line reason, if it cannot."""
    found = find_chromium()
    if found:
        return found
    if shutil.which("apt-get") is None:
        raise ChromiumMissingError(f"chromium is not installed and there is no apt-get: {HINT}")
    if os.geteuid() != 0:
        raise ChromiumMissingError(
            f"chromium is not installed (not root, so not installing it): {HINT}"
        )
    with LOCK.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another session may be installing it right now
        found = find_chromium()
        if found:
            return found
        say("chromium is missing: installing Debian's chromium (apt-get install -y -q chromium)")
        done = _apt(INSTALL)
        if done.returncode != 0:  # a fresh machine's package lists may be missing or stale
            _apt(["apt-get", "update", "-q"])
            done = _apt(INSTALL)
        found = find_chromium()
        if found is None:
            output = (done.stderr.strip() or done.stdout.strip()).splitlines()
            why = output[-1] if output else f"exit status {done.returncode}"
            raise ChromiumMissingError(f"chromium is not installed; apt-get failed ({why}): {HINT}")
        return found


if __name__ == "__main__":
    try:
        print(ensure_chromium())
    except ChromiumMissingError as exc:
        sys.exit(f"error: {exc}")
