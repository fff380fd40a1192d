"""Output files written whole or not at all: to a temporary name beside the target, renamed
over it once complete."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def replaced(path: Path, suffix: str = ".tmp") -> Iterator[Path]:
    """The temporary path to write ``path``'s new content to: renamed over ``path`` when the
    block ends, removed when it fails (no half-written file left beside the output). A write
    that fails without naming a file (a full disk: ENOSPC from the write itself) is raised
    again naming ``path``, so that the command line says which output it could not write
    instead of printing a traceback."""
    tmp = path.with_name(path.name + suffix)
    try:
        yield tmp
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        if isinstance(err, OSError) and err.filename is None:
            raise OSError(err.errno, err.strerror or str(err), str(path)) from err
        raise
    tmp.replace(path)
