"""What the long-running processes load: ``crowdtally serve`` and ``crowdtally engine`` import
no file readers (pyarrow: about 37 MB of memory and 0.08 s a start), which ``extract``,
``import``, a Parquet ``export`` and the benches do."""

from __future__ import annotations

import subprocess
import sys

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
