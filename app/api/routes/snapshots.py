"""A project's snapshots: list, take, inspect, delete."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response

from app.api.deps import ServiceDep, require, wait_applied
from app.api.errors import ERRORS, ApiError
from app.api.schemas import Accepted, Snapshot
from app.api.views import snapshot_view

router = APIRouter()


@router.get(
    "/v1/projects/{project}/snapshots",
    operation_id="list_snapshots",
    tags=["snapshots"],
    response_model=list[Snapshot],
    responses=ERRORS,
    dependencies=[require("read")],
)
def list_snapshots(project: str, svc: ServiceDep) -> list[dict[str, Any]]:
    svc.project(project)
    return [snapshot_view(i) for i in svc.db.infos(project)]


@router.post(
    "/v1/projects/{project}/snapshots",
    status_code=202,
    operation_id="take_snapshot",
    tags=["snapshots"],
    response_model=Accepted,
    responses=ERRORS,
    dependencies=[require("write")],
)
def take_snapshot(project: str, svc: ServiceDep, wait: bool = False) -> Accepted:
    """Ask the engine for a snapshot at the current end of the log."""
    svc.project(project)
    result = svc.store.append(project, "snapshot", b"{}", None)
    applied = wait_applied(svc, project, result.position) if wait else False
    if applied:
        deadline = time.monotonic() + svc.settings.wait_timeout_s
        while not any(i.position >= result.position for i in svc.db.infos(project)):
            if time.monotonic() > deadline:
                applied = False
                break
            time.sleep(0.01)
    return Accepted(accepted=0, duplicates=0, position=result.position, applied=applied)


@router.get(
    "/v1/projects/{project}/snapshots/{snapshot_id}",
    operation_id="get_snapshot",
    tags=["snapshots"],
    response_model=Snapshot,
    responses=ERRORS,
    dependencies=[require("read")],
)
def get_snapshot(project: str, snapshot_id: int, svc: ServiceDep) -> dict[str, Any]:
    found = [i for i in svc.db.infos(project) if i.id == snapshot_id]
    if not found:
        raise ApiError(
            404, "unknown_snapshot", f"project {project!r} has no snapshot {snapshot_id}"
        )
    return snapshot_view(found[0])


@router.delete(
    "/v1/projects/{project}/snapshots/{snapshot_id}",
    status_code=204,
    operation_id="delete_snapshot",
    tags=["snapshots"],
    responses=ERRORS,
    dependencies=[require("admin")],
)
def delete_snapshot(project: str, snapshot_id: int, svc: ServiceDep) -> Response:
    if not any(i.id == snapshot_id for i in svc.db.infos(project)) or not svc.db.delete(
        snapshot_id
    ):
        raise ApiError(
            404, "unknown_snapshot", f"project {project!r} has no snapshot {snapshot_id}"
        )
    return Response(status_code=204)
