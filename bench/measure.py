"""Fair wall time and peak-memory measurement of a callable in a fresh forked child, and of a
whole command (``whole_process``).

How the peak is measured (Linux): the child writes ``5`` to ``/proc/self/clear_refs``, which
resets the kernel's resident-set high-water mark (``VmHWM``) to the current RSS, reads the RSS,
runs ``fn``, then reads ``VmHWM`` again; ``peak_mib = max(0, VmHWM_after - RSS_before)``.

Why not ``resource.getrusage(...).ru_maxrss``: it cannot be reset, and it is already inflated
when ``fn`` starts. Checked on this machine's kernel (6.18): a *forked* child's high-water mark
starts at the parent's RSS at fork time (not at the parent's historical peak), and every byte
the multiprocessing bootstrap touches before ``fn`` counts too; a *spawned* child's
``ru_maxrss`` even carries the RSS of the pre-``exec`` fork copy of the parent (828 MiB reported
for a 29 MiB child while the parent held 800 MiB). ``clear_refs`` avoids both. If it cannot
be written (kernel < 4.0, restricted /proc), we fall back to ``ru_maxrss - RSS_before`` and mark
the measurement ``exact_peak=False``.

Because the child is forked, ``fn`` may be a closure over data that already lives in the parent;
that data is shared copy-on-write and counts in ``RSS_before``, not in the peak. Only ``fn``'s
return value is sent back (pickled through a pipe), so keep it small.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import resource
import subprocess
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_PAGE = os.sysconf("SC_PAGE_SIZE")
_MIB = 2**20


@dataclass(frozen=True)
class Measurement:
    """Result of :func:`run_measured`: wall seconds of ``fn``, its peak RSS increase, its value."""

    label: str
    seconds: float
    peak_mib: float
    result: Any
    exact_peak: bool = True


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


def _hwm_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("VmHWM not found in /proc/self/status")


def _reset_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def _child(fn: Callable[[], Any], conn: Any) -> None:
    try:
        exact = _reset_hwm()
        before = _rss_bytes()
        t0 = time.perf_counter()
        result = fn()
        seconds = time.perf_counter() - t0
        peak = _hwm_bytes() if exact else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        conn.send(("ok", seconds, max(0, peak - before) / _MIB, exact, result))
    except BaseException as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
    finally:
        conn.close()


def run_measured(fn: Callable[[], Any], label: str) -> Measurement:
    """Run ``fn()`` in a forked child; return its wall time, peak RSS increase (MiB) and value.

    Raises ``RuntimeError`` if ``fn`` raises or the child dies (e.g. killed by the OOM killer).
    """
    ctx = mp.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(fn, send), name=f"measure:{label}")
    proc.start()
    send.close()
    try:
        msg = recv.recv()
    except EOFError:
        msg = None
    finally:
        recv.close()
        proc.join()
    if msg is None:
        raise RuntimeError(f"{label}: child exited with code {proc.exitcode} and sent nothing")
    if msg[0] == "error":
        raise RuntimeError(f"{label}: child raised {msg[1]}")
    _, seconds, peak_mib, exact, result = msg
    return Measurement(label, seconds, peak_mib, result, exact)


@dataclass(frozen=True)
class ProcessRun:
    """A command run to its end: wall seconds, CPU seconds (user + system), peak RSS."""

    seconds: float
    cpu_s: float
    peak_mib: float


def _hwm_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def whole_process(command: list[str], poll_s: float = 0.005) -> ProcessRun:
    """Run ``command`` to its end; its peak RSS is its own ``VmHWM``, read while it runs (the
    last reading before it exits: the mark only grows). Not ``wait4``'s ``ru_maxrss``: that
    carries the RSS of this process's copy from before the ``exec``, so a command smaller than
    its parent would read as big as the parent (1,253 against 1,066 MiB for one 10M-answer
    ``extract``). ``subprocess.Popen`` returns once the command is exec'd, so every reading is
    the command's. Raises ``RuntimeError`` when it fails, with the end of its stderr."""
    with tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err)
        peak = 0
        while True:
            pid, status, usage = os.wait4(child.pid, os.WNOHANG)
            if pid:
                break
            peak = _hwm_of(child.pid) or peak
            time.sleep(poll_s)
        seconds = time.perf_counter() - t0
        child.returncode = os.waitstatus_to_exitcode(status)
        if child.returncode != 0:
            err.seek(0)
            tail = err.read().decode(errors="replace")[-2000:]
            raise RuntimeError(f"{' '.join(command)} exited {child.returncode}: {tail}")
    return ProcessRun(seconds, usage.ru_utime + usage.ru_stime, peak / _MIB)


def _alloc_500_mib() -> int:
    import numpy as np

    a = np.ones(500 * _MIB // 8)  # np.ones touches every page, so all of it is resident
    return int(a.nbytes)


def _noop() -> None:
    return None


def main() -> None:
    """Self-check: a 500 MiB numpy allocation should report ~500 MiB, an empty fn ~0."""
    import numpy as np

    ballast = np.ones(300 * _MIB // 8)  # parent holds 300 MiB: must not leak into the child's peak
    for fn, label in ((_noop, "empty fn"), (_alloc_500_mib, "np.ones 500 MiB")):
        m = run_measured(fn, label)
        print(
            f"{m.label:>16}: {m.seconds * 1e3:8.1f} ms  peak +{m.peak_mib:7.1f} MiB  "
            f"exact_peak={m.exact_peak}  result={m.result!r}"
        )
    del ballast


if __name__ == "__main__":
    main()
