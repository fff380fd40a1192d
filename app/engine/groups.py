"""Which log entries the engine applies together.

While the engine is busy, blocks of labels queue up in the log. Applied one entry at a time, an
item that receives a label in each of ten waiting entries runs its per-item EM (docs/model.md,
eq. 3-10) ten times, each over all of its labels; applied as one block it runs once, over all of
them, as the seed's algorithm takes an item's labels. So label entries that queued up are
learned as one block, and which ones did is part of the log, not of the engine's timing: an
entry records whether it was appended while the entry before it was still unread by the engine
(``LogEntry.joins``, set by the store against the engine's last read, ``read_log(seal=True)``).
A run of label entries, each joining the one before, is learned as one block, at most
``JOIN_CAP`` entries; every other entry alone. The engine always stops at the end of a run, so
a replay from any snapshot or from the start cuts the log where the live engine did, and its
results are bit-identical to what was served.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from typing import Any

import orjson

from app.store.base import LogEntry

JOIN_CAP = 128
"""At most this many label entries are learned as one block (a fixed part of the log's
meaning: a replay must cut where the live engine did)."""


def runs(entries: Sequence[LogEntry], *, complete: bool) -> list[list[LogEntry]]:
    """``entries`` (consecutive, the first one starting a run) cut into what is applied at
    once, in order. With ``complete=False`` the log may go on past the last entry given, so a
    last run of label entries that still has room is left out (it is read again)."""
    out: list[list[LogEntry]] = []
    for entry in entries:
        run = out[-1] if out else None
        if (
            run is not None
            and entry.joins
            and entry.kind == "labels"
            and run[0].kind == "labels"
            and len(run) < JOIN_CAP
        ):
            run.append(entry)
        else:
            out.append([entry])
    if not complete and out and out[-1][0].kind == "labels" and len(out[-1]) < JOIN_CAP:
        out.pop()
    return out


def joined_labels(run: Sequence[LogEntry]) -> tuple[dict[str, Any], bytes]:
    """The body (``items, workers, labels, weights``) and keep mask of a run of label entries
    as one block, in log order; a lone entry's own."""
    if len(run) == 1:
        return orjson.loads(run[0].payload), run[0].keep
    if any(e.kind != "labels" for e in run):
        raise ValueError("only label entries join")
    bodies = [orjson.loads(e.payload) for e in run]
    body: dict[str, Any] = {
        key: list(chain.from_iterable(b[key] for b in bodies))
        for key in ("items", "workers", "labels")
    }
    body["weights"] = (
        list(chain.from_iterable(b["weights"] or [1.0] * len(b["labels"]) for b in bodies))
        if any(b["weights"] is not None for b in bodies)
        else None
    )
    keep = b"".join(e.keep or b"1" * len(b["labels"]) for e, b in zip(run, bodies, strict=True))
    return body, keep
