"""SQLite's write-ahead log checkpointed beside the writer, not inside its commits.

By default SQLite checkpoints in the commit that takes the log past 1,000 pages: that commit
copies the log into the database file and waits for the disk (fsync). The embedded store
appends under its lock, so every request and the engine waited with it: 20-55 ms about once a
second at 100,000 labels/s (docs/benchmarks.md). The appending connection turns that off
(``PRAGMA wal_autocheckpoint=0``) and this thread checkpoints from a connection of its own
(``PASSIVE``: it copies what no reader still needs, while the writer goes on appending)."""

from __future__ import annotations

import sqlite3
import threading
import weakref
from typing import Any

CHECKPOINT_EVERY_S = 0.5
"""How often the log is checkpointed (a busy writer adds a few MB a second)."""


class WalCheckpointer:
    """A daemon thread checkpointing the SQLite database at ``path`` until ``close``, or until
    ``owner`` (the store, held weakly) is gone: a store dropped unclosed leaves no thread."""

    def __init__(self, path: str, owner: Any, every_s: float = CHECKPOINT_EVERY_S) -> None:
        self.path, self.every_s = path, every_s
        self._owner = weakref.ref(owner)
        self.checkpoints = 0
        self.last_error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="wal-checkpoint", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        try:
            while not self._stop.wait(self.every_s) and self._owner() is not None:
                self.checkpoint(db)
            self.checkpoint(db)  # (what the last appends wrote, before the store closes)
        finally:
            db.close()

    def checkpoint(self, db: sqlite3.Connection) -> None:
        try:
            db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            self.checkpoints += 1
            self.last_error = None
        except sqlite3.Error as err:  # (a busy database: the next turn tries again)
            self.last_error = str(err)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
