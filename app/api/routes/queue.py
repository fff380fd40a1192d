"""Active learning: register items, the queue's settings, the items to label next."""

from __future__ import annotations

from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Query, Request

from app.api.bodies import ITEMS, array_body, parse_block
from app.api.deps import ServiceDep, in_thread, require, wait_applied
from app.api.errors import ERRORS, NOT_APPLIED, WRITES, ApiError
from app.api.schemas import (
    NO_PROGRESS,
    Accepted,
    IdQuery,
    ItemIn,
    QueuePage,
    QueueProgress,
    QueueSettingsBody,
)
from app.api.views import queue_for, queue_settings
from app.engine.queue import QueueSettings

router = APIRouter()


@router.post(
    "/v1/projects/{project}/items",
    status_code=202,
    operation_id="register_items",
    tags=["queue"],
    response_model=Accepted,
    responses=WRITES,
    dependencies=[require("write")],
    openapi_extra=array_body("ItemIn"),
)
async def register_items(
    project: str, request: Request, svc: ServiceDep, wait: bool = False
) -> Accepted:
    """Items with no labels yet: they enter the queue."""
    svc.project(project)
    items: list[ItemIn] = parse_block(
        await request.body(), ITEMS, svc.settings.max_block_labels, "item"
    )  # (a bad entry: 422 invalid_item)
    names = list(dict.fromkeys(x.item for x in items))  # (an item named twice: once)
    payload = orjson.dumps({"items": names})
    result = await in_thread(svc.store.append, project, "items", payload, None)
    applied = await in_thread(wait_applied, svc, project, result.position) if wait else False
    repeats = len(items) - len(names)
    return Accepted(
        accepted=len(names), duplicates=repeats, position=result.position, applied=applied
    )


@router.get(
    "/v1/projects/{project}/queue/settings",
    operation_id="get_queue_settings",
    tags=["queue"],
    response_model=QueueSettingsBody,
    responses=ERRORS,
    dependencies=[require("read", served=True)],
)
def get_queue_settings(project: str, svc: ServiceDep) -> dict[str, Any]:
    svc.project(project)
    return queue_settings(svc, project).to_dict()


@router.put(
    "/v1/projects/{project}/queue/settings",
    status_code=202,
    operation_id="set_queue_settings",
    tags=["queue"],
    response_model=QueueSettingsBody,
    responses={**WRITES, 504: NOT_APPLIED},
    dependencies=[require("write")],
)
def set_queue_settings(
    project: str, body: QueueSettingsBody, svc: ServiceDep, wait: bool = False
) -> dict[str, Any]:
    """Replace the queue's settings (a field left out takes its default). Answers the
    settings asked for, in force once the engine has applied the change; with ``wait=true``,
    read back after the engine applied it, or 504 ``not_applied`` when it has not within
    ``CROWDTALLY_WAIT_TIMEOUT_S`` (it answered 202 with the settings asked for, not in force)."""
    svc.project(project)
    settings = QueueSettings(**body.model_dump())
    payload = orjson.dumps({"queue": settings.to_dict()})
    result = svc.store.append(project, "settings", payload, None)
    if not wait:
        return settings.to_dict()
    if not wait_applied(svc, project, result.position):
        raise ApiError(504, "not_applied", "the engine has not applied the new settings within "
                       f"{svc.settings.wait_timeout_s:g} s (CROWDTALLY_WAIT_TIMEOUT_S); they are "
                       "logged and come into force when it does: GET .../queue/settings tells")  # fmt: skip
    return queue_settings(svc, project).to_dict()


@router.get(
    "/v1/projects/{project}/queue",
    operation_id="get_queue",
    tags=["queue"],
    response_model=QueuePage,
    responses=ERRORS,
    dependencies=[require("read", served=True)],
)
def get_queue(
    project: str,
    svc: ServiceDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 10,
    worker: IdQuery = None,
) -> QueuePage:
    """The items to label next, best first; finished items never appear. With ``worker``:
    not the items this worker labelled, ranked by the worker's own confusion (voi, lookahead)."""
    queue = queue_for(svc, record=svc.project(project), limit=limit, worker=worker)
    return QueuePage(
        items=queue.items,
        size=queue.size,
        policy=queue.settings.policy,
        worker=worker,
        progress=QueueProgress(**(queue.globals.queue or NO_PROGRESS)),
    )
