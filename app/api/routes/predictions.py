"""The dyadic model: what a worker would answer on an item, and the pairs nearest its boundary."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

from app.api.bodies import PAIRS, array_body, parse_block
from app.api.deps import ServiceDep, in_thread, require
from app.api.errors import ERRORS, ApiError
from app.api.schemas import BoundaryPage, ErrorResponse, IdQuery, PairIn, Predictions
from app.api.views import (
    boundary_workers,
    nearest_first,
    prediction_rows,
    queue_for,
)
from app.serving.predictions import MAX_PAIRS, predict_pairs

router = APIRouter()


@router.post(
    "/v1/projects/{project}/predictions",
    operation_id="predict",
    tags=["predictions"],
    response_model=Predictions,
    responses={**ERRORS, 413: {"model": ErrorResponse}},
    dependencies=[require("read", served=True)],
    openapi_extra=array_body("PairIn"),
)
async def predict(project: str, request: Request, svc: ServiceDep) -> dict[str, Any]:
    """The label each worker would give each item (the dyadic model), with per-label
    scores and h_min, for a JSON array of ``{worker, item}`` (at most 10,000)."""
    record = svc.project(project)
    settings = svc.dyadic(record)
    pairs: list[PairIn] = parse_block(await request.body(), PAIRS, MAX_PAIRS, "pair")
    workers, items = [x.worker for x in pairs], [x.item for x in pairs]
    p = await in_thread(predict_pairs, svc.store, project, settings, workers, items)
    return {"predictions": prediction_rows(record, workers, items, p), "position": p.position}


@router.get(
    "/v1/projects/{project}/boundary",
    operation_id="nearest_boundary",
    tags=["predictions"],
    response_model=BoundaryPage,
    responses=ERRORS,
    dependencies=[require("read", served=True)],
)
def nearest_boundary(
    project: str,
    svc: ServiceDep,
    worker: IdQuery = None,
    item: IdQuery = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 10,
    candidates: Annotated[int, Query(ge=1, le=MAX_PAIRS)] = 200,
) -> dict[str, Any]:
    """The (worker, item) pairs nearest the dyadic model's decision boundary (smallest
    h_min first). With ``worker``: among the items in the active-learning queue this worker
    has not labelled (the first ``candidates``). With ``item``: among the project's
    workers who have not labelled it (the ``candidates`` with the most labels)."""
    record = svc.project(project)
    settings = svc.dyadic(record)
    if (worker is None) == (item is None):
        raise ApiError(422, "invalid_query", "give exactly one of worker and item")
    if worker is not None:
        items = [q.item for q in queue_for(svc, record, candidates, worker).items]
        workers = [worker] * len(items)
    else:
        assert item is not None
        items, workers = boundary_workers(svc, project, item, candidates)
    p = predict_pairs(svc.store, project, settings, workers, items)
    nearest = nearest_first(workers, items, p, limit)
    pairs = prediction_rows(record, workers, items, p, nearest)
    return {
        "pairs": pairs, "worker": worker, "item": item, "candidates": len(items),
        "position": p.position,
    }  # fmt: skip
