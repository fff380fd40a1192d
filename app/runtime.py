"""Wiring shared by ``crowdtally serve`` and ``crowdtally engine``: the SQL side and the engine."""

from __future__ import annotations

from app.db import sql_engine, upgrade
from app.engine import EngineLoop
from app.settings import Settings
from app.snapshots import SnapshotDB, Snapshotter
from app.store.base import Store


def open_snapshot_db(settings: Settings) -> SnapshotDB:
    """The snapshot database, migrated to the current schema (``alembic upgrade head``)."""
    url = settings.database_url_resolved()
    upgrade(url)
    return SnapshotDB(sql_engine(url))


def make_engine_loop(settings: Settings, store: Store, db: SnapshotDB) -> EngineLoop:
    snapshotter = Snapshotter(
        db,
        store,
        interval_s=settings.snapshot_interval_s,
        every_labels=settings.snapshot_labels,
        keep=settings.snapshot_keep,
    )
    return EngineLoop(
        store,
        batch_entries=settings.engine_batch_entries,
        refine_passes=settings.refine_passes,
        refine_idle_s=settings.refine_idle_s,
        snapshotter=snapshotter,
    )
