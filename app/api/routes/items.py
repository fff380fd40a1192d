"""Posteriors: one item recomputed now, pages of stored ones, the whole export."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from typing import Annotated, Any, Literal

import orjson
from fastapi import APIRouter, Query
from fastapi.responses import StreamingResponse

from app.api.deps import ServiceDep, require
from app.api.errors import ERRORS, ApiError
from app.api.schemas import Item, ItemPage
from app.api.views import export_records, globals_of, item_view, stored_item_views, within

router = APIRouter()


@router.get(
    "/v1/projects/{project}/items/{item:path}",
    operation_id="get_item",
    tags=["items"],
    response_model=Item,
    responses=ERRORS,
    dependencies=[require("read")],
)
async def get_item(project: str, item: str, svc: ServiceDep) -> Item:
    """The item's posterior, recomputed under the current parameters. An item registered
    (``POST .../items``) and not labelled yet has no best label: ``label`` and
    ``probability`` are null, ``n_labels`` is 0 and ``posterior`` is the class prior."""
    record = svc.project(project)
    blob = svc.store.get_item(project, item)
    if blob is None:
        raise ApiError(
            404,
            "unknown_item",
            f"no item {item!r}: neither labelled nor registered (or not applied yet)",
        )
    return item_view(svc, record, item, blob, with_labels=True, fresh=True)


@router.get(
    "/v1/projects/{project}/items",
    operation_id="list_items",
    tags=["items"],
    response_model=ItemPage,
    responses=ERRORS,
    dependencies=[require("read")],
)
def list_items(
    project: str,
    svc: ServiceDep,
    cursor: str | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    max_probability: Annotated[float, Query(ge=0, le=1)] = 1.0,
    min_probability: Annotated[float, Query(ge=0, le=1)] = 0.0,
) -> ItemPage:
    record = svc.project(project)
    try:
        pos = int(cursor) if cursor else 0
    except ValueError:
        raise ApiError(
            422,
            "invalid_cursor",
            "cursor must be a value returned as next_cursor",
            None,
            "cursor",
        ) from None
    nxt, page = svc.store.scan_items(project, pos, limit)
    g = globals_of(svc, record)
    items = stored_item_views(record, page, g)
    items = [x for x in items if within(x, min_probability, max_probability)]
    return ItemPage(items=items, next_cursor=str(nxt) if nxt else None)


EXPORT_CONTENT: dict[str, Any] = {
    "application/x-ndjson": {
        "schema": {
            "type": "string",
            "description": "One JSON object per line: an item as ``GET .../items/{item}`` "
            "returns it (schema ``Item``), without ``labels``.",
        }
    },
    "text/csv": {
        "schema": {
            "type": "string",
            "description": "A header row, then one row per item: item, label, probability, "
            "the posterior of each of the project's labels, n_labels, gold, computed_at.",
        }
    },
}
"""The export's two formats: ``format=jsonl`` streams NDJSON, ``format=csv`` CSV."""


@router.get(
    "/v1/projects/{project}/export",
    operation_id="export_items",
    tags=["items"],
    response_class=StreamingResponse,
    responses={
        **ERRORS,
        200: {
            "description": "Every item's stored posterior, streamed: NDJSON (``format=jsonl``, "
            "the default) or CSV (``format=csv``).",
            "content": EXPORT_CONTENT,
        },
    },
    dependencies=[require("read")],
)
def export_items(
    project: str, svc: ServiceDep, format: Literal["jsonl", "csv"] = "jsonl"
) -> StreamingResponse:
    record = svc.project(project)

    def pages() -> Iterator[list[dict[str, Any]]]:
        cursor = 0
        while True:
            cursor, page = svc.store.scan_items(project, cursor, 1000)
            yield export_records(record, page, globals_of(svc, record))
            if cursor == 0:
                return

    def jsonl() -> Iterator[bytes]:
        for page in pages():
            yield b"".join(orjson.dumps(x) + b"\n" for x in page)

    def csv_rows() -> Iterator[str]:
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(
            ["item", "label", "probability", *record.labels, "n_labels", "gold", "computed_at"]
        )
        for page in pages():
            w.writerows(
                [
                    x["item"],
                    x["label"] or "",
                    "" if x["probability"] is None else f"{x['probability']:.6g}",
                    *(f"{v:.6g}" for v in x["posterior"].values()),
                    x["n_labels"],
                    x["gold"] or "",
                    x["computed_at"],
                ]
                for x in page
            )
            yield buf.getvalue()
            buf.seek(0)
            buf.truncate()

    if format == "csv":
        return StreamingResponse(csv_rows(), media_type="text/csv")
    return StreamingResponse(jsonl(), media_type="application/x-ndjson")
