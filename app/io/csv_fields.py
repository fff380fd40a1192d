"""CSV fields as Python's ``csv.writer`` writes them (the excel dialect), for the writers
that format rows themselves (the predictions file, the service's export)."""

from __future__ import annotations

import re

_NEEDS_QUOTES = re.compile(r'[,"\r\n]')


def csv_field(text: str) -> str:
    """``text`` quoted when it holds a comma, a quote or a line break, its quotes doubled."""
    if _NEEDS_QUOTES.search(text) is None:
        return text
    return '"' + text.replace('"', '""') + '"'
