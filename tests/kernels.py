"""Every numba kernel the suite calls, compiled (or loaded) once before its workers start.

On a fresh clone nothing is cached: without this, both xdist workers and the services the
tests start compile the same kernels side by side, and the crash test's engines, killed
every second, compile them again each time (about 80 s of CPU more than a warm run).

``python -m tests.kernels``: the service's warm-up (two processes, as ``crowdtally serve``
does it), every kernel the service calls, then online and batch EM as ``crowdtally extract``
runs them.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from contextlib import redirect_stdout
from io import StringIO
from pathlib import Path

ANSWERS = "item,worker,label\na,w1,0\na,w2,1\nb,w1,1\nb,w2,1\n"


def compile_all() -> None:
    from app.cli import app
    from app.serving import warmup

    second = subprocess.Popen(warmup.SECOND_PROCESS, stdout=subprocess.PIPE)
    warmup.dyadic_learning()  # while the second process compiles the nominal model's
    second.communicate()
    warmup.everything()  # what is left: predictions, h_min, refits (loaded or compiled)
    with tempfile.TemporaryDirectory() as folder:
        answers = Path(folder) / "answers.csv"
        answers.write_text(ANSWERS)
        for extra in ([], ["--batch"]):
            with redirect_stdout(StringIO()):
                app(["extract", str(answers), *extra], standalone_mode=False)


def compile_before_workers() -> None:
    """Run ``compile_all`` in a process of its own (the xdist controller stays lean)."""
    done = subprocess.run([sys.executable, "-m", "tests.kernels"], capture_output=True, text=True)
    if done.returncode != 0:  # the tests will compile what they need, and fail if they must
        print(f"compiling the kernels beforehand failed:\n{done.stderr}", file=sys.stderr)


if __name__ == "__main__":
    compile_all()
