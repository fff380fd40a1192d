"""A Redis that restarts empty under a running API is put back from SQL by the API itself.

Every second the API process looks for the store's admin key pointer; a store without one was
wiped (a Redis restarted without its data), and ``rebuild_store`` brings back every project's
archived log, its keys and the admin key. Until then an append finds no open log and answers
503 ``store_rebuilding`` (nothing appended), and the keys answer 401.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from app.store.archive import SnapshotDB, rebuild_store
from app.store.base import Store

WATCH_S = 1.0
"""How often the API looks for a wiped store."""

log = logging.getLogger("crowdtally.api")


class StoreWatch:
    """A daemon thread that rebuilds a wiped store from SQL, then calls ``after(store)`` (the
    admin key's announcement: a configured one, or a new one when SQL had none)."""

    def __init__(
        self,
        store: Store,
        db: SnapshotDB,
        after: Callable[[Store], None],
        every_s: float = WATCH_S,
    ) -> None:
        self.store, self.db, self.after, self.every_s = store, db, after, every_s
        self.last_error: str | None = None
        self.rebuilt: list[str] = []
        """The projects the last rebuild put back."""
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="crowdtally-store-watch", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def check(self) -> bool:
        """Rebuild the store if it was wiped; True when it was."""
        if self.store.admin_key_hash() is not None:
            return False
        self.rebuilt = rebuild_store(self.store, self.db)
        self.after(self.store)
        log.warning("the store was wiped: rebuilt %s from the SQL snapshots", self.rebuilt)
        return True

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.check()
                self.last_error = None
            except (RedisConnectionError, RedisTimeoutError):
                pass  # (unreachable: /readyz says so; looked at again in a second)
            except Exception as exc:
                log.exception("rebuilding the wiped store failed; trying again")
                self.last_error = f"{type(exc).__name__}: {exc}"
