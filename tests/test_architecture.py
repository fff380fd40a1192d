"""The direction of every import (docs/architecture.md, "Layout").

``lint-imports`` checks the contracts in pyproject.toml: no cycles among the modules of any
package, core and the client standing alone, the service's layers. Imports inside functions
and under ``if TYPE_CHECKING:`` count like any other (grimp reads every import statement);
``test_type_checking_imports_count`` makes sure of it, and ``test_no_module_cycles`` looks for
cycles between single modules too (a package and its own submodule included), which the
package-level contracts could miss.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]
CLIENT_SRC = ROOT / "clients" / "python" / "src"
PACKAGES = ("app", "core", "bench", "crowdtally_client")


def test_import_contracts_are_kept() -> None:
    exe = Path(sys.executable).with_name("lint-imports")
    cmd = str(exe) if exe.exists() else shutil.which("lint-imports")
    assert cmd is not None, "lint-imports is not installed (pip install -e '.[dev]')"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(CLIENT_SRC)])}
    result = subprocess.run(
        [cmd, "--no-cache"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


def test_type_checking_imports_count() -> None:
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    assert str(options.get("exclude_type_checking_imports", False)).lower() != "true"
    assert set(options["root_packages"]) == set(PACKAGES)


def _graph() -> grimp.ImportGraph:
    sys.path[:0] = [str(ROOT), str(CLIENT_SRC)]
    try:
        return grimp.build_graph(*PACKAGES, cache_dir=None)
    finally:
        del sys.path[:2]


def test_no_module_cycles() -> None:
    graph = _graph()
    imports = {m: graph.find_modules_directly_imported_by(m) for m in graph.modules}
    # Tarjan's strongly connected components, iteratively
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for root in sorted(imports):
        if root in index:
            continue
        work = [(root, iter(sorted(imports[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(imports[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    component.append(m)
                    if m == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    assert cycles == []


def test_the_check_sees_imports_in_functions_and_type_checking_blocks() -> None:
    """A layer broken only inside a function or a TYPE_CHECKING block breaks the contract."""
    graph = _graph()
    hidden = {
        ("app.cli.service", "app.engine.runtime"),  # inside a function
        ("app.cli.common", "app.store.archive"),  # under TYPE_CHECKING
    }
    for importer, imported in hidden:
        assert graph.direct_import_exists(importer=importer, imported=imported), (
            importer,
            imported,
        )
