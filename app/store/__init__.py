"""State and durability: the store contract (``base``) and its backends, ``EmbeddedStore``
(in-process + SQLite) and ``RedisStore``; the SQL side: its schema and migrations (``sql``) and
the snapshots, label archive and catalogue (``archive``)."""

from __future__ import annotations

import gc
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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

    def attempt() -> tuple[Store, T]:
        st = open_store(settings)
        try:
            return st, first_use(st)
        except BaseException:
            st.close()
            raise

    unreachable = (ConnectionError, TimeoutError, RedisClusterException)
    return when_reachable(attempt, lambda exc: isinstance(exc, unreachable), who, "the store")


def when_reachable(
    attempt: Callable[[], T], unreachable: Callable[[Exception], bool], who: str, what: str
) -> T:
    """``attempt()``; while it fails because ``what`` cannot be reached (``unreachable`` says
    which errors are that), said on stderr as ``who`` and tried again every second."""
    with _stopped_by_signals(what):
        while True:
            try:
                return attempt()
            except Exception as exc:
                if not unreachable(exc):
                    raise
                why = (str(exc).splitlines() or [type(exc).__name__])[0]
                print(f"{who}: {what} cannot be reached ({why}); trying again in 1 s",
                      file=sys.stderr, flush=True)  # fmt: skip
                gc.enable()  # (a start paused the cycle collector to load faster; not to wait)
                time.sleep(1)


@contextmanager
def _stopped_by_signals(what: str) -> Iterator[None]:
    """SIGTERM and SIGINT end the process while it waits for its store: the API's server
    only notes them for its running loop, which a wait at start-up blocks (it went on
    waiting until killed)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: object) -> None:
        print(f"{signal.Signals(signum).name}: stopped while waiting for {what}",
              file=sys.stderr, flush=True)  # fmt: skip
        os._exit(128 + signum)  # (nothing is open yet that needs closing)

    before = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
