"""What changes the model: blocks of labels, gold answers, refits (write)."""

from __future__ import annotations

from typing import Literal

import orjson
from fastapi import APIRouter, Request

from app.api import metrics
from app.api.bodies import GOLD, array_body, label_block, label_codes, parse_block
from app.api.deps import Service, ServiceDep, in_thread, require, wait_applied
from app.api.errors import ENGINE_BEHIND, WRITES, ApiError, engine_behind
from app.api.schemas import Accepted, ErrorResponse, GoldIn
from app.store.base import AppendResult, EngineBehindError

router = APIRouter()


async def append_block(
    svc: Service,
    project: str,
    kind: Literal["labels", "gold"],
    payload: bytes,
    ids: list[str | None] | None,
) -> AppendResult:
    """Append a block unless the project's engine lags more than ``max_lag_s`` (0: never
    refused): then 429 ``engine_behind``, nothing appended (the refused labels count in
    ``crowdtally_labels{outcome="refused"}``)."""
    bound = svc.settings.max_lag_s or None
    try:
        result: AppendResult = await in_thread(svc.store.append, project, kind, payload, ids, bound)
    except EngineBehindError as exc:
        assert bound is not None
        metrics.REFUSED.labels(project, kind).inc()
        if ids is not None:
            metrics.LABELS.labels(project, "refused").inc(len(ids))
        raise engine_behind(project, exc.lag_s, bound) from None
    return result


async def refuse_if_behind(
    svc: Service, project: str, kind: Literal["labels", "gold"], body: bytes
) -> None:
    """429 before the block is even parsed while the engine lags more than ``max_lag_s``:
    refusing costs the API next to nothing, so an overload does not take the CPU the engine
    needs to catch up. (``append_block`` checks again, atomically with the append.)"""
    bound = svc.settings.max_lag_s or None
    if bound is None:
        return
    lag = await in_thread(svc.store.lag_seconds, project)
    if lag > bound:
        metrics.REFUSED.labels(project, kind).inc()
        if kind == "labels":
            metrics.LABELS.labels(project, "refused").inc(body.count(b'"item"'))
        raise engine_behind(project, lag, bound)


@router.post(
    "/v1/projects/{project}/labels",
    status_code=202,
    operation_id="post_labels",
    tags=["labels"],
    response_model=Accepted,
    responses={**WRITES, 413: {"model": ErrorResponse}, **ENGINE_BEHIND},
    dependencies=[require("write")],
    openapi_extra=array_body("LabelIn"),
)
async def post_labels(
    project: str, request: Request, svc: ServiceDep, wait: bool = False
) -> Accepted:
    record = svc.project(project)
    body = await request.body()
    await refuse_if_behind(svc, project, "labels", body)
    block = label_block(body, svc.settings.max_block_labels, svc.settings.max_label_weight)
    payload = orjson.dumps(
        {
            "items": block.items,
            "workers": block.workers,
            "labels": label_codes(record, block.labels),
            "weights": block.weights,
            "ids": block.ids,  # kept in the archive: a wiped Redis gets its seen ids back
        }
    )
    result = await append_block(svc, project, "labels", payload, block.ids)
    metrics.LABELS.labels(project, "accepted").inc(result.accepted)
    metrics.LABELS.labels(project, "duplicate").inc(result.duplicates)
    applied = await in_thread(wait_applied, svc, project, result.position) if wait else False
    return Accepted(
        accepted=result.accepted,
        duplicates=result.duplicates,
        position=result.position,
        applied=applied,
    )


@router.post(
    "/v1/projects/{project}/gold",
    status_code=202,
    operation_id="post_gold",
    tags=["labels"],
    response_model=Accepted,
    responses={**WRITES, **ENGINE_BEHIND},
    dependencies=[require("write")],
    openapi_extra=array_body("GoldIn"),
)
async def post_gold(
    project: str, request: Request, svc: ServiceDep, wait: bool = False
) -> Accepted:
    record = svc.project(project)
    body = await request.body()
    await refuse_if_behind(svc, project, "gold", body)
    gold: list[GoldIn] = parse_block(
        body, GOLD, svc.settings.max_block_labels, "gold answer", code="invalid_label"
    )
    refuse_two_golds(gold)
    codes = label_codes(record, [x.label for x in gold])
    answers = dict(zip((x.item for x in gold), codes, strict=True))  # (given twice: once)
    payload = orjson.dumps({"items": list(answers), "labels": list(answers.values())})
    result = await append_block(svc, project, "gold", payload, None)
    applied = await in_thread(wait_applied, svc, project, result.position) if wait else False
    repeats = len(gold) - len(answers)
    return Accepted(
        accepted=len(answers), duplicates=repeats, position=result.position, applied=applied
    )


def refuse_two_golds(gold: list[GoldIn]) -> None:
    """422 for an item given two different gold labels in one block (the last one won)."""
    first: dict[str, int] = {}
    for n, x in enumerate(gold):
        m = first.setdefault(x.item, n)
        if gold[m].label != x.label:
            raise ApiError(
                422,
                "invalid_label",
                f"entry {n}, field 'label': item {x.item!r} has gold {gold[m].label!r} in entry "
                f"{m} of this block",
                n,
                "label",
            )


@router.post(
    "/v1/projects/{project}/refit",
    status_code=202,
    operation_id="refit",
    tags=["labels"],
    response_model=Accepted,
    responses=WRITES,
    dependencies=[require("write")],
)
def refit(project: str, svc: ServiceDep, wait: bool = False) -> Accepted:
    svc.project(project)
    result = svc.store.append(project, "refit", b"{}", None)
    applied = wait_applied(svc, project, result.position) if wait else False
    return Accepted(accepted=0, duplicates=0, position=result.position, applied=applied)
