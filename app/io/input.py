"""What every reader of input shares: the error it reports and the longest id it takes.

Kept apart from the file readers (``app.io.triples``, which load pyarrow) so that the service,
the engine and the command line's start import neither.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

MAX_ID_LENGTH = 512


def hash_id(kind: str, *parts: str) -> str:
    """``kind:`` and the first 32 hex digits of the SHA-256 of the parts joined by U+001F: the
    id of an answer whose source gives none (an import's, stable across runs and versions)."""
    digest = hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:32]
    return f"{kind}:{digest}"


class InputError(ValueError):
    """A malformed input file: ``path:line: reason``."""

    def __init__(self, path: str | Path, line: int | None, reason: str) -> None:
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {reason}")
        self.path, self.line, self.reason = str(path), line, reason
