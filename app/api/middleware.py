"""Around every request: its id (``X-Request-ID``, in the logs and the answer), its latency in
Prometheus and the access log; ``TimedStore`` times each store call the API makes.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from app import logs
from app.api import metrics
from app.store.base import Store

access = logging.getLogger("crowdtally.access")


def _request_id(scope: Any) -> str:
    """The caller's X-Request-ID (if sane), else a new one."""
    for name, value in scope.get("headers", ()):
        if name == b"x-request-id" and 0 < len(value) <= 128:
            return str(value.decode("latin-1"))
    return uuid.uuid4().hex[:16]


class TimedStore:
    """The store, with each call's latency in ``crowdtally_store_seconds{op}``."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if not callable(attr):
            return attr
        hist = metrics.STORE.labels(name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return attr(*args, **kwargs)
            finally:
                hist.observe(time.perf_counter() - t0)

        return timed


class ObserveRequests:
    """Request latency into Prometheus, as plain ASGI (no extra task per request)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = [500]
        rid = _request_id(scope)
        token = logs.request_id.set(rid)

        async def send_status(message: Any) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                message.setdefault("headers", []).append((b"x-request-id", rid.encode()))
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")
            seconds = time.perf_counter() - t0
            metrics.observe(scope["method"], route, status[0], seconds)
            access.info(
                "request",
                extra={"method": scope["method"], "path": scope["path"], "route": route,
                       "status": status[0], "ms": round(1000 * seconds, 3)},
            )  # fmt: skip
            logs.request_id.reset(token)
