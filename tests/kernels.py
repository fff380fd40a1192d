"""Every numba kernel the suite calls, compiled (or loaded) once before its workers start.

On a fresh clone nothing is cached: without this, both xdist workers and the services the
tests start compile the same kernels side by side, and the crash test's engines, killed
every second, compile them again each time (about 80 s of CPU more than a warm run).

``python -m tests.kernels``: every kernel the service calls, and online and batch EM (with the
per-item clarity too) as ``crowdtally extract`` runs them, predictions written and the
grouping of long files; in two processes, as ``crowdtally serve`` does it on a first start,
but split for all of them rather than for the first posterior.
"""

from __future__ import annotations

import compileall
import subprocess
import sys
import tempfile
from contextlib import redirect_stdout
from io import StringIO
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pytest

# 12 items: their ids outgrow the id table's first size, so its rehash is compiled too
ANSWERS = "item,worker,label\n" + "".join(f"i{n},w{n % 3},{n % 2}\ni{n},w3,1\n" for n in range(12))
REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("app", "core", "bench", "tests", "clients")


def compile_all() -> None:
    from app.serving import warmup
    from app.serving.predictions import warm_up as warmup_predictions

    # Two halves of about 8 s of CPU each on a fresh clone: here the dyadic model's learning,
    # then its predictions and h_min (which reuse the learning's compiled step), its one-pair
    # kernels, batch EM and the queue's value of information; in a second process the nominal
    # model (learning, refits, reads), the online ``extract`` with Newton's later passes, the
    # calibration's prequential evidence and the grouping of long files.
    second = subprocess.Popen([sys.executable, "-m", "tests.kernels", "nominal"])
    warmup.dyadic_learning()
    warmup_predictions()
    _dyadic_scalars()
    _extract(["--batch"], ["--batch", "--difficulty"])
    _value_of_information()
    second.wait()
    warmup.everything()  # loads what the other process compiled (and compiles what failed there)


def compile_nominal() -> None:
    from app.serving import warmup

    warmup.nominal()
    _extract([], ["--passes", "5", "--later-passes", "newton"])
    _prequential_evidence()
    _grouping()


def _extract(*options: list[str]) -> None:
    from app.cli import app

    with tempfile.TemporaryDirectory() as folder:
        answers = Path(folder) / "answers.csv"
        answers.write_text(ANSWERS)
        written = str(Path(folder) / "predictions.csv")
        for extra in options:
            with redirect_stdout(StringIO()):
                app(
                    ["extract", str(answers), "--predictions", written, *extra],
                    standalone_mode=False,
                )


def _grouping() -> None:
    import numpy as np

    from core.blocks import LARGE, LabelBlocks, canonical_order

    codes = np.zeros(LARGE, dtype=np.int64)  # long files are grouped by a compiled sort
    canonical_order(codes, codes, codes, np.ones(LARGE))  # (one signature, whatever the weights)
    file_codes = codes.astype(np.int32)  # a file's item, worker and label codes
    LabelBlocks.group(file_codes, file_codes, file_codes, np.broadcast_to(1.0, LARGE))


def _dyadic_scalars() -> None:
    """The dyadic model's one-pair step and h_min, which tests call on their own."""
    from core import _dyadic_kernels as kern

    kern.step_sigma(kern.LOGISTIC, 0.1, 1.0, 0.5, 0.3, 1.0, 1.0, 0.0, 0.5, 1.0, 0.0, 1e-9)
    kern.h_min_scalar(kern.LOGISTIC, 0.1, 1.0, 0.5, 0.1, 1.0, 1.0, 0.0, 3.0, 1.0, 0.0, 1e-9)


def _value_of_information() -> None:
    import numpy as np

    from core.acquisition import value_of_information

    value_of_information(np.full((2, 3), 1 / 3), np.full((3, 3), 1 / 3))


def _prequential_evidence() -> None:
    import numpy as np

    from core.calibration import prequential_evidence

    K = 2
    prequential_evidence(
        np.array([0, 2]), np.array([0]), np.zeros(1, dtype=np.int64), np.array([0, 1]),
        np.array([0, 1]), np.ones(2), np.zeros(K), 2 * np.eye(K), np.zeros((2, K, K)),
    )  # fmt: skip


def compile_before_workers(config: pytest.Config) -> None:
    """Run ``compile_all`` in a process of its own (the xdist controller stays lean), and
    meanwhile write the bytecode of the repository's modules and pytest's rewritten test
    modules: where PYTHONDONTWRITEBYTECODE is set (as on the CI machines), every worker and
    every service a test starts would otherwise compile them from source (about 0.2 s of CPU
    a process), and every worker would rewrite every test module (2.4 s each)."""
    kernels = subprocess.Popen(
        [sys.executable, "-m", "tests.kernels"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    for package in PACKAGES:
        compileall.compile_dir(REPO / package, quiet=1)
    _rewrite_test_modules(config)
    _, errors = kernels.communicate()
    if kernels.returncode != 0:  # the tests will compile what they need, and fail if they must
        print(f"compiling the kernels beforehand failed:\n{errors}", file=sys.stderr)


def _rewrite_test_modules(config: pytest.Config) -> None:
    """Write the bytecode of every test module and conftest with pytest's assertions
    rewritten, as its import hook does unless PYTHONDONTWRITEBYTECODE is set; the workers'
    hook reads it either way. pytest has no public API for this: on any surprise the workers
    rewrite the modules themselves, as they would anyway."""
    try:
        from _pytest.assertion import rewrite

        state = config.stash[rewrite.assertstate_key]
        for folder in config.getini("testpaths"):
            for source in (config.rootpath / folder).rglob("*.py"):
                if source.name.startswith("test_") or source.name == "conftest.py":
                    cache = rewrite.get_cache_dir(source)
                    cache.mkdir(exist_ok=True)
                    stat, code = rewrite._rewrite_test(source, config)
                    pyc = cache / (source.name[:-3] + rewrite.PYC_TAIL)
                    rewrite._write_pyc(state, code, stat, pyc)
    except Exception as exc:
        print(f"writing the rewritten test modules failed: {exc!r}", file=sys.stderr)


if __name__ == "__main__":
    compile_nominal() if sys.argv[1:] == ["nominal"] else compile_all()
