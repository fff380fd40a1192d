"""What every reader of input shares: the error it reports, the longest id it takes, where
its lines end, what a CSV reader's quoting error means and which files are Parquet; and what
the files the commands write share: no class may take a fixed column's name in Parquet.

Kept apart from the file readers (``app.io.triples``, which load pyarrow) so that the service,
the engine and the command line's start import neither.
"""

from __future__ import annotations

import csv
import hashlib
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

MAX_ID_LENGTH = 512
MAX_CLASSES = 256
"""The most classes a project (or ``crowdtally extract``) has: the model holds K x K numbers
per worker."""
MAX_ANSWER_WEIGHT = 1e6
"""The largest weight one answer of a file may carry (a million answers' worth: the model counts
a weight as that many answers). Far heavier ones (1e17) drowned the priors of batch EM's Newton
steps in rounding, and its posteriors were NaN; from about 1e12 it no longer converged."""
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
"""Control characters (Unicode Cc): no id or label holds one, as the service's API says."""
PROJECT_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$"
"""What a project may be named: a letter or digit, then up to 63 of them or ``_.-``."""
TRUTH_HEADER_HINT = " (a first line of column names must read item,label or task,label)"
"""Added where the only gold label that is not a class is the first row's: a truth file's
header of other names is read as a row of data."""


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


COMPRESSED = {
    b"\x1f\x8b": "gzip",
    b"BZh": "bzip2",
    b"\xfd7zXZ\x00": "xz",
    b"\x28\xb5\x2f\xfd": "zstd",
    b"PK\x03\x04": "zip",
}
"""The first bytes of the compressed files an answers file most often is by mistake."""


def not_utf8(path: str | Path, line: int | None) -> InputError:
    """The error for a file that is not UTF-8 text: a compressed file named as such (it was
    'not UTF-8 text' at line 1, which sent the reader looking for a bad character)."""
    try:
        with Path(path).open("rb") as f:
            head = f.read(6)
    except OSError:
        head = b""
    for magic, kind in COMPRESSED.items():
        if head.startswith(magic):
            return InputError(path, None, f"a {kind}-compressed file: decompress it first")
    if head.startswith(b"PAR1"):  # (where answers can be Parquet, they are read as such)
        return InputError(path, None, "a Parquet file, where CSV text is read")
    return InputError(path, line, "not UTF-8 text")


def label_order(names: Iterable[str]) -> list[str]:
    """Distinct label names in their natural order: numerically when all are integers (-2 < 0
    < 10; names of one number, '01' and '1', in text order), else as text: one order for every
    command, whatever order the names came in."""
    distinct = sorted(set(names))
    try:
        return sorted(distinct, key=int)
    except ValueError:
        return distinct


PARQUET_MAGIC = b"PAR1"


def is_parquet(path: Path) -> bool:
    """An answers file to read as Parquet: named ``.parquet``, or a regular file that starts
    and ends with Parquet's magic bytes whatever its name (a CSV file whose first id starts
    with them is still text; a pipe is not peeked at: its bytes would be gone)."""
    if path.suffix.lower() == ".parquet":
        return True
    try:
        if not path.is_file():
            return False
        with path.open("rb") as f:
            if f.read(4) != PARQUET_MAGIC or f.seek(0, os.SEEK_END) < 12:
                return False
            f.seek(-4, os.SEEK_END)
            return f.read(4) == PARQUET_MAGIC
    except OSError:
        return False  # (reading the file as text says why)


def refuse_duplicate_columns(
    flag: str, classes: Sequence[str], columns: Sequence[str], instead: str
) -> None:
    """A Parquet file with a column per class besides ``columns``: an InputError when a class
    takes one of their names (two columns of one name, which Parquet readers refuse)."""
    clash = sorted(set(classes) & set(columns))
    if clash:
        raise InputError(
            flag, None, f"a class named {clash[0]!r} would give the Parquet file two "
            f"{clash[0]!r} columns, which Parquet readers refuse: {instead}",
        )  # fmt: skip


def checked_id(path: str | Path, line: int | None, what: str, text: str) -> str:
    """An id or label as the service takes it: stripped, 1 to MAX_ID_LENGTH characters, no
    control characters; else an InputError naming the line."""
    text = text.strip()
    if not text:
        raise InputError(path, line, f"empty {what}")
    if len(text) > MAX_ID_LENGTH:
        raise InputError(path, line, f"{what} is longer than {MAX_ID_LENGTH} characters")
    if CONTROL.search(text):
        raise InputError(path, line, f"{what} {text!r}: ids hold no control characters "
                         "(U+0000 to U+001F, U+007F to U+009F)")  # fmt: skip
    return text


def quoting_error(err: csv.Error) -> str:
    """What ``csv.reader(..., strict=True)``'s error means, in words."""
    if "unexpected end of data" in str(err):
        return "a quoted field is not closed"
    return f"malformed quotes ({err})"


_LINE_END = re.compile(r"\r\n|\r|\n")


def first_line(text: str) -> str:
    """``text_lines(text)[0]`` (or "" for no text), without splitting the rest."""
    return _LINE_END.split(text, maxsplit=1)[0]


def text_lines(text: str) -> list[str]:
    """``text``'s lines, split where a line ends in a file (LF, CRLF or CR) and nowhere else:
    str.splitlines also splits on U+2028 and others, which an id may hold (the columnar
    reader keeps them, as the service does)."""
    lines = _LINE_END.split(text)
    return lines[:-1] if lines[-1] == "" else lines
