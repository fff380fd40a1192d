"""Wiring shared by ``crowdtally serve`` and ``crowdtally engine``: the engine loop, with its
snapshotter, from the settings."""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Callable

from app.engine.loop import EngineLoop, Pool
from app.engine.snapshots import Snapshotter
from app.settings import Settings
from app.store.archive import SnapshotDB
from app.store.base import Store


def make_engine_loop(
    settings: Settings,
    store: Store,
    db: SnapshotDB,
    dyadic_ready: Callable[[], bool] = lambda: True,
) -> EngineLoop:
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
        pool=Pool(engine_id(), settings.engine_lease_s) if settings.engine_pool else None,
        dyadic_ready=dyadic_ready,
    )


def engine_id() -> str:
    """This process's name in a pool: host, process id and a random part (a restarted engine
    is a new one, with leases of its own)."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
