"""State and durability: the store contract (``base``) and its backends, ``EmbeddedStore``
(in-process + SQLite) and ``RedisStore``; the SQL side: its schema and migrations (``sql``) and
the snapshots, label archive and catalogue (``archive``)."""

from __future__ import annotations

from app.settings import Settings
from app.store.base import Store


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
        )
    from app.store.embedded import EmbeddedStore

    return EmbeddedStore(settings.data_dir / "crowdtally.sqlite3")
