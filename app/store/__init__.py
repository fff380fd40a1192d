"""State and durability: the store contract (``base``) and its backends, ``EmbeddedStore``
(in-process + SQLite) and ``RedisStore``; the SQL side: its schema and migrations (``sql``) and
the snapshots, label archive and catalogue (``archive``)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TypeVar

from app.settings import Settings
from app.store.base import Store

T = TypeVar("T")


def open_store(settings: Settings) -> Store:
    if settings.store == "redis":
        from app.store.redis_store import RedisStore

        return RedisStore(
            settings.redis_url,
            settings.redis_prefix,
            settings.redis_timeout_s,
            cluster=settings.redis_cluster,
            wait_replicas=settings.redis_wait_replicas,
            wait_timeout_ms=settings.redis_wait_timeout_ms,
            join_entries=settings.join_queued_labels,
        )
    from app.store.embedded import EmbeddedStore

    return EmbeddedStore(
        settings.data_dir / "crowdtally.sqlite3", join_entries=settings.join_queued_labels
    )


def open_store_when_reachable(
    settings: Settings, first_use: Callable[[Store], T], who: str
) -> tuple[Store, T]:
    """``open_store`` and ``first_use`` of it (its first commands); while Redis cannot be
    reached (down, or every node that REDIS_URL lists), said on stderr as ``who`` and tried
    again every second, so that a process started before its Redis waits for it."""
    from redis.exceptions import ConnectionError, RedisClusterException, TimeoutError

    while True:
        st = None
        try:
            st = open_store(settings)
            return st, first_use(st)
        except (ConnectionError, TimeoutError, RedisClusterException) as exc:
            if st is not None:
                st.close()
            print(f"{who}: the store cannot be reached ({exc}); trying again in 1 s",
                  file=sys.stderr, flush=True)  # fmt: skip
            time.sleep(1)
