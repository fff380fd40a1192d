"""Wiring shared by ``crowdtally serve`` and ``crowdtally engine``: the engine loop, with its
snapshotter, from the settings."""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable

from app.engine.loop import EngineLoop, Pool
from app.engine.snapshots import Snapshotter
from app.io.input import InputError
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


log = logging.getLogger("crowdtally.engine")

SOLE_ENGINE = "~engine"
"""The lease of the one engine outside a pool that applies a shared store's projects (no
project can take this name: project names start with a letter or a digit)."""


def sole_engine_id() -> str:
    """The holder name of this process's engine outside a pool: host and process id, so that
    ``crowdtally serve`` may claim the lease before the server it runs makes the engine, and a
    container restarted with the same name and process id takes its own lease back at once."""
    return f"{socket.gethostname()}-{os.getpid()}"


class SoleEngine:
    """The lease that makes an engine outside a pool the only engine of a shared store (Redis):
    a second one, or a pool engine beside it, is refused with one error line. Two engines each
    believing it applies every project fenced each other's writes off in turn (the state stayed
    equal to a replay) and restored their projects again and again."""

    def __init__(self, store: Store, holder: str, lease_s: float) -> None:
        self.store, self.holder, self.lease_s = store, holder, lease_s
        self._stop = threading.Event()

    def claim(self, what: str = "crowdtally engine") -> None:
        """Take the lease, waiting up to a lease and a second for one left by an engine that
        died; an InputError naming the holder if it is still held then, or if pool engines run."""
        if engines := self.store.pool_engines(self.lease_s):
            raise InputError(what, None, f"pool engines apply this deployment's projects "
                             f"({', '.join(engines)}): run this engine with --pool too")  # fmt: skip
        deadline = time.monotonic() + self.lease_s + 1.0
        while not self.store.acquire_lease(SOLE_ENGINE, self.holder, self.lease_s):
            if time.monotonic() >= deadline:
                other = self.store.lease_holder(SOLE_ENGINE) or "another process"
                raise InputError(what, None, f"the engine of {other} applies this deployment's "
                                 "projects: stop it first, or run every engine with --pool")  # fmt: skip
            time.sleep(0.25)

    def keep(self, lost: Callable[[str], None]) -> None:
        """Renew the lease every third of it on a thread; ``lost`` (with the reason) if another
        engine took it meanwhile (this one could not renew it for a whole lease)."""
        threading.Thread(
            target=self._renew, args=(lost,), name="crowdtally-sole", daemon=True
        ).start()

    def _renew(self, lost: Callable[[str], None]) -> None:
        while not self._stop.wait(self.lease_s / 3):
            try:
                if not self.store.acquire_lease(SOLE_ENGINE, self.holder, self.lease_s):
                    other = self.store.lease_holder(SOLE_ENGINE) or "another process"
                    lost(f"the engine of {other} took this deployment's projects over: this "
                         "engine stopped")  # fmt: skip
                    return
            except Exception:  # the store unreachable: the next renewal decides
                log.exception("renewing the engine's lease failed")

    def release(self) -> None:
        """Stop renewing and give the lease up (an engine stopping: another may start at once)."""
        self._stop.set()
        self.store.release_lease(SOLE_ENGINE, self.holder)


def refuse_beside_sole_engine(store: Store, lease_s: float) -> None:
    """A pool engine does not start while an engine outside a pool holds the store (it waits
    up to a lease and a second for one that died); an InputError naming it."""
    deadline = time.monotonic() + lease_s + 1.0
    while (other := store.lease_holder(SOLE_ENGINE)) is not None:
        if time.monotonic() >= deadline:
            raise InputError("crowdtally engine --pool", None, f"the engine of {other} (not in "
                             "a pool) applies this deployment's projects: stop it first")  # fmt: skip
        time.sleep(0.25)
