"""Workers: one worker's confusion matrix, all workers ranked by quality."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query

from app.api.deps import ServiceDep, require
from app.api.errors import ERRORS, ApiError
from app.api.schemas import Worker, WorkerPage
from app.api.views import workers_view

router = APIRouter()


@router.get(
    "/v1/projects/{project}/workers/{worker:path}",
    operation_id="get_worker",
    tags=["workers"],
    response_model=Worker,
    responses=ERRORS,
    dependencies=[require("read", served=True)],
)
def get_worker(project: str, worker: str, svc: ServiceDep) -> Worker:
    record = svc.project(project)
    blob = svc.store.get_worker(project, worker)
    if blob is None:
        raise ApiError(
            404, "unknown_worker", f"no labels from worker {worker!r} have been applied yet"
        )
    return workers_view(svc, record, [(worker, blob)], with_confusion=True)[0]


@router.get(
    "/v1/projects/{project}/workers",
    operation_id="list_workers",
    tags=["workers"],
    response_model=WorkerPage,
    responses=ERRORS,
    dependencies=[require("read", served=True)],
)
def list_workers(
    project: str,
    svc: ServiceDep,
    order: Annotated[
        Literal["best", "worst", "name"],
        Query(description="name: by worker id, an order that labels arriving do not reshuffle."),
    ] = "best",
    by: Literal["informativeness", "accuracy"] = "informativeness",
    limit: Annotated[int, Query(ge=1, le=10000)] = 100,
    offset: Annotated[int, Query(ge=0)] = 0,
    confusion: Annotated[
        bool, Query(description="Add each listed worker's confusion matrix (dashboard pages).")
    ] = False,
) -> WorkerPage:
    """Workers ranked by estimated quality; ``order=worst`` puts likely spammers first. A
    listing paged while labels arrive sees the ranking move between its pages (a worker
    twice, another missed); ``order=name`` is stable: a new worker only shifts the pages
    after it (one worker seen twice, none missed)."""
    record = svc.project(project)
    entries = svc.store.all_workers(project)
    views = workers_view(svc, record, entries, with_confusion=False)
    if order == "name":
        views.sort(key=lambda w: w.worker)
    else:
        views.sort(key=lambda w: (getattr(w, by), w.n_labels, w.worker), reverse=order == "best")
    page = views[offset : offset + limit]
    if confusion and page:
        blobs = dict(entries)
        page = workers_view(svc, record, [(w.worker, blobs[w.worker]) for w in page], True)
    return WorkerPage(workers=page, total=len(views))
