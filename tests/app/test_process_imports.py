"""What the long-running processes load: ``crowdtally serve`` and ``crowdtally engine`` import
no file readers (pyarrow: about 37 MB of memory and 0.08 s a start), which ``extract``,
``import``, a Parquet ``export`` and the benches do; and reading CSV loads no Parquet."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SERVICE_MODULES = (
    "app.cli",
    "app.cli.service",
    "app.api.main",
    "app.engine.runtime",
    "app.store.archive",
    "app.serving.warmup",
)


def test_the_service_and_the_engine_do_not_load_the_file_readers() -> None:
    imports = "; ".join(f"import {m}" for m in SERVICE_MODULES)
    probe = f"import sys; {imports}; print(sorted(m for m in sys.modules if m.split('.')[0] == 'pyarrow')[:3])"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_the_command_line_loads_numba_only_for_what_computes() -> None:
    """``crowdtally`` itself (every command registered: its help, ``import``, ``export``,
    ``calibration``, the snapshot commands) starts without numba (0.3 s of each start);
    ``extract`` loads it when it runs."""
    probe = (
        "import sys; import app.cli, app.io.transfer, app.io.importers, app.io.model_file; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('numba', 'llvmlite'))[:3])"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_a_command_freezes_the_objects_alive_before_the_last_collection_at_exit() -> None:
    """``main`` freezes every object alive at exit (``gc.freeze`` at exit), so the
    interpreter's final collection does not walk numba's registries (0.2 s of every command
    that loaded a kernel). atexit hooks run last registered first: one registered before
    ``main`` runs after the freeze, and sees it."""
    probe = (
        "import atexit, gc, sys\n"
        "atexit.register(lambda: print('frozen', gc.get_freeze_count() > 0))\n"
        "from app.cli import main\n"
        "sys.argv = ['crowdtally', '--help']\n"
        "try:\n"
        "    main()\n"
        "except SystemExit:\n"
        "    pass\n"
        "print('after main', gc.get_freeze_count())\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    lines = out.stdout.strip().splitlines()
    assert lines[-2:] == ["after main 0", "frozen True"], out.stdout


def test_reading_csv_answers_does_not_load_the_parquet_reader(tmp_path: Path) -> None:
    """Parquet's reader and writer (10-20 ms of a start) load when a Parquet file is read or
    written; ``extract`` of a CSV file into CSV predictions spares them."""
    answers, out = tmp_path / "answers.csv", tmp_path / "predictions.csv"
    answers.write_text("item,worker,label\ni1,w1,a\ni1,w2,b\ni2,w1,a\n")
    probe = (
        "import sys\n"
        "from app.cli import main\n"
        f"sys.argv = ['crowdtally', 'extract', {str(answers)!r}, '--predictions', {str(out)!r}]\n"
        "try:\n"
        "    main()\n"
        "except SystemExit as done:\n"
        "    assert not done.code, done.code\n"
        "print('parquet', 'pyarrow.parquet' in sys.modules, file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip().splitlines()[-1] == "parquet False", done.stderr
    assert out.read_text().startswith("item,label,probability")
