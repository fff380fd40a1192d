"""What the routes share, as FastAPI dependencies: the ``Service`` (settings, store, engine,
snapshot database) and the authenticated key (``require(scope)``).

A route loads its project record in its body (``svc.project(name)``, cached for ``CACHE_S``),
after FastAPI has validated the request: an invalid request to an unknown project answers
422, as it always has, not 404.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Depends, Request
from starlette.concurrency import run_in_threadpool

from app.api.auth import allows, key_hash
from app.api.errors import ApiError
from app.api.store_watch import StoreWatch
from app.engine.dyadic import DyadicSettings
from app.engine.loop import EngineLoop
from app.settings import Settings
from app.store.archive import SnapshotDB
from app.store.base import (
    KeyRecord,
    ProjectRecord,
    Scope,
    Store,
    StoreWipedError,
    nominal_config,
)
from core.nominal import NominalConfig

CACHE_S = 1.0
RESTORING_CACHE_S = 0.25
"""How long an API process takes a project's restoring state as read (served reads of a
project whose state was just restored may answer 503 that long)."""


class Service:
    """What the routes share: settings, the store, the in-process engine (if any)."""

    def __init__(
        self,
        settings: Settings,
        store: Store,
        engine: EngineLoop | None,
        db: SnapshotDB,
        watch: StoreWatch | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.engine = engine
        self.db = db
        self.watch = watch
        """What rebuilds a wiped Redis while the API runs (None: the embedded store)."""
        self._configs: dict[tuple[str, float], NominalConfig] = {}
        self._dyadic: dict[tuple[str, float], DyadicSettings | None] = {}
        self._cache: dict[tuple[str, str], tuple[float, Any]] = {}

    def project(self, name: str) -> ProjectRecord:
        record: ProjectRecord | None = self._cached(
            ("project", name), lambda: self.store.get_project(name)
        )
        if record is None:
            raise ApiError(404, "unknown_project", f"no project named {name!r}")
        return record

    def key(self, key_hash: str) -> KeyRecord | None:
        record: KeyRecord | None = self._cached(
            ("key", key_hash), lambda: self.store.get_key(key_hash)
        )
        return record

    def restoring(self, project: str) -> int:
        """The log position the project's served state is being restored to (0: served; -1:
        the store was wiped, and is being rebuilt), looked up at most every
        ``RESTORING_CACHE_S``."""

        def load() -> int:
            return -1 if self.wiped() else self.store.restoring_target(project)

        target: int = self._cached(("restoring", project), load, RESTORING_CACHE_S)
        return target

    def wiped(self) -> bool:
        """The store lost everything while this process ran (a Redis restarted empty: its
        admin key pointer is gone) and is being rebuilt from SQL (``StoreWatch``)."""
        return self.watch is not None and self.store.admin_key_hash() is None

    def forget(self) -> None:
        """Drop the cache (a project deleted through this process is gone at once)."""
        self._cache.clear()

    def _cached(
        self, what: tuple[str, str], load: Callable[[], Any], keep_s: float = CACHE_S
    ) -> Any:
        # Keys and project records change rarely and cost a store round trip each on every
        # request; each API process keeps them for CACHE_S (a deletion made through another
        # process takes effect there within that time).
        now = time.monotonic()
        hit = self._cache.get(what)
        if hit is not None and now - hit[0] < keep_s:
            return hit[1]
        value = load()
        if value is None:  # (a miss is not kept: a key or project made, or put back after
            return None  # a wiped Redis, answers at once)
        if len(self._cache) > 10_000:
            self._cache.clear()
        self._cache[what] = (now, value)
        return value

    def config(self, record: ProjectRecord) -> NominalConfig:
        key = (record.name, record.created_at)
        cfg = self._configs.get(key)
        if cfg is None:
            cfg = self._configs[key] = nominal_config(record)
        return cfg

    def dyadic(self, record: ProjectRecord) -> DyadicSettings:
        """The project's dyadic settings; 409 when the project has no dyadic model."""
        key = (record.name, record.created_at)
        if key not in self._dyadic:
            self._dyadic[key] = DyadicSettings.of(record.config)
        settings = self._dyadic[key]
        if settings is None:
            raise ApiError(409, "dyadic_disabled", f"project {record.name!r} has no dyadic model")
        return settings


def service_of(request: Request) -> Service:
    svc: Service = request.app.state.service
    return svc


async def get_service(request: Request) -> Service:
    """The ``ServiceDep`` dependency (async: no thread hop for an attribute read)."""
    return service_of(request)


ServiceDep = Annotated[Service, Depends(get_service)]


def key_of(request: Request) -> str | None:
    auth = request.headers.get("authorization")
    if auth and auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return request.headers.get("x-api-key")


def missing_key_message(authorization: str | None) -> str:
    """What a request without a key it could read is told: how to send one, and what was
    sent instead (a Basic header or a bare key was answered 'send an API key')."""
    how = "send an API key: 'Authorization: Bearer <key>' (or 'X-API-Key: <key>')"
    if not authorization:
        return how
    words = authorization.split()
    if not words or words[0].lower() == "bearer":
        got = "an empty Bearer key"
    elif len(words) > 1:
        got = f"a {words[0]!r} Authorization header"
    else:
        got = "an Authorization header without 'Bearer '"
    return f"{how}; got {got}"


def authorize(request: Request, scope: Scope, project: str | None) -> KeyRecord:
    key = key_of(request)
    if not key:
        raise ApiError(
            401, "missing_key", missing_key_message(request.headers.get("authorization"))
        )
    svc = service_of(request)
    record = svc.key(key_hash(key))
    if record is None:
        if svc.wiped():
            raise StoreWipedError("the API keys")  # (back from SQL in seconds: 503, not 401)
        raise ApiError(401, "invalid_key", "the API key is not known")
    if not allows(record, scope, project):
        if project is not None and record.scope != "admin" and record.project != project:
            raise ApiError(403, "forbidden", f"this key belongs to project {record.project!r}, "
                           f"not {project!r}")  # fmt: skip
        what = "admin endpoints" if project is None else f"{scope} access to project {project!r}"
        raise ApiError(403, "forbidden", f"this key (scope {record.scope}) does not allow {what}")
    return record


def require(scope: Scope, per_project: bool = True, served: bool = False) -> Any:
    """The key's check; with ``served``, a route that answers from the project's served state
    also answers 503 ``restoring`` (``Retry-After``) while that state is being restored (after
    a restart or a rebuild from SQL), instead of an empty project or 404s."""

    async def dependency(request: Request) -> KeyRecord:
        # async: a key look-up is one fast store read, cheaper inline than a thread hop
        project = request.path_params.get("project") if per_project else None
        record = authorize(request, scope, project)
        if served and project and (target := service_of(request).restoring(project)):
            if target < 0:  # (its key and record still cached here: not an empty project)
                raise StoreWipedError(f"project {project!r}")
            raise ApiError(
                503,
                "restoring",
                f"project {project!r} is being restored (to log position {target}): its "
                f"answers come back when the engine reaches it; try again in 1 s",
                headers={"Retry-After": "1"},
            )
        return record

    return Depends(dependency)


def wait_applied(svc: Service, project: str, position: int) -> bool:
    """Whether the engine applied ``position`` within ``wait_timeout_s``; 404 if the project
    is deleted meanwhile (the wait went on to its end)."""
    start = time.monotonic()
    deadline, looked = start + svc.settings.wait_timeout_s, start
    while svc.store.applied_position(project) < position:
        now = time.monotonic()
        if now > deadline:
            return False
        if now - looked > 0.05:
            looked = now
            if svc.store.get_project(project) is None:
                raise ApiError(404, "unknown_project", f"project {project!r} was deleted")
        time.sleep(0.002)
    return True


async def in_thread(fn: Any, *args: Any) -> Any:
    return await run_in_threadpool(fn, *args)
