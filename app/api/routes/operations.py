"""Liveness, readiness and Prometheus metrics (no key)."""

from __future__ import annotations

import time

from fastapi import APIRouter
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from app.api import metrics
from app.api.deps import ServiceDep

router = APIRouter()


@router.get("/healthz", operation_id="healthz", tags=["operations"])
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.head("/healthz", include_in_schema=False)
def healthz_head() -> Response:
    """What load balancers that check with HEAD ask: 200, no body."""
    return Response(status_code=200)


@router.head("/readyz", include_in_schema=False)
def readyz_head(svc: ServiceDep) -> Response:
    """``/readyz``'s status (200 or 503) without its body, for checks made with HEAD."""
    return Response(status_code=readyz(svc).status_code)


@router.get("/readyz", operation_id="readyz", tags=["operations"])
def readyz(svc: ServiceDep) -> JSONResponse:
    ok = svc.store.ping()
    # A store that lost its admin key while this process ran was wiped (a Redis restarted
    # empty): requests answer 503 store_rebuilding until the store watch rebuilds it.
    wiped = ok and svc.store.admin_key_hash() is None
    names = svc.store.project_names() if ok else []
    lag = {name: end - applied for name, (end, applied) in svc.store.positions(names).items()}
    failed = svc.store.failed_projects() if ok else {}
    # Served state still being rebuilt (a restore from SQL, a restart): items may answer 404.
    restoring = {
        name: {"applied": svc.store.applied_position(name), "target": target}
        for name, target in (svc.store.restoring() if ok else {}).items()
    }
    engine_error = svc.engine.last_error if svc.engine else None
    # (an engine whose writes the store refuses, full or moving a slot, serves its last state)
    refused = svc.engine is not None and svc.engine.store_refused
    snap = svc.engine.snapshotter if svc.engine else None
    snapshot_error = snap.last_error if snap else None
    now = time.time()
    ages: dict[str, float] = {}
    infos = svc.db.infos_if_reachable()  # (None: this process serves on from the store)
    for info in infos or []:
        ages[info.project] = now - info.created_at
    # (a snapshot that failed is reported, not a reason to stop serving: the store holds
    # everything acknowledged, and the snapshot is tried again; docs/deploy.md)
    ready = ok and not wiped and (engine_error is None or refused) and not restoring
    body = {
        "ready": ready,
        "store": "wiped: being rebuilt from SQL" if wiped else "ok" if ok else "unreachable",
        "store_rebuild_error": svc.watch.last_error if svc.watch else None,
        "engine_lag": lag,
        "engine_error": engine_error,
        # projects the engine could not apply (retried after a back-off); the others are served
        "failed_projects": failed,
        # projects whose served state is being restored: not ready until they are served
        "restoring": restoring,
        "snapshot_age_s": ages,
        "snapshot_error": snapshot_error,
        # the snapshot database: while it cannot be read, archives and snapshots wait
        "snapshot_db": "ok" if infos is not None else "unreachable",
    }
    return JSONResponse(body, status_code=200 if ready else 503)


@router.get(
    "/metrics", operation_id="metrics", tags=["operations"], response_class=PlainTextResponse
)
def metrics_endpoint() -> Response:
    data, content_type = metrics.exposition()
    return Response(data, media_type=content_type)
