"""Where the shared crowdsourcing datasets are (read-only; never downloaded)."""

from __future__ import annotations

import os
from pathlib import Path

_REPO_ROOT = Path(__file__).resolve().parent.parent


def find_datasets_root() -> Path:
    """``$CROWDTALLY_DATASETS``, else ``<repo>/../shared/datasets``, else the workplace's
    ``/work/shared/datasets`` (a clone made elsewhere, e.g. in a temporary folder)."""
    env = os.environ.get("CROWDTALLY_DATASETS")
    if env:
        return Path(env)
    for candidate in (_REPO_ROOT.parent / "shared" / "datasets", Path("/work/shared/datasets")):
        if (candidate / "INDEX.md").exists():
            return candidate
    return _REPO_ROOT.parent / "shared" / "datasets"


DEFAULT_ROOT: Path = find_datasets_root()


def dataset_names(root: Path = DEFAULT_ROOT) -> list[str]:
    """Sorted names of the sub-folders of ``root`` that hold an ``answers.csv``."""
    return sorted(p.parent.name for p in Path(root).glob("*/answers.csv"))
