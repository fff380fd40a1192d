"""Wiring shared by ``crowdtally serve`` and ``crowdtally engine``: the engine loop, with its
snapshotter, from the settings."""

from __future__ import annotations

from app.engine.loop import EngineLoop
from app.engine.snapshots import Snapshotter
from app.settings import Settings
from app.store.archive import SnapshotDB
from app.store.base import Store


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
