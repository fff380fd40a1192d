"""Posteriors: one item recomputed now, pages of stored ones, the whole export."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from fastapi.responses import StreamingResponse

from app.api.deps import ServiceDep, require
from app.api.errors import ERRORS, ApiError
from app.api.exports import csv_header, csv_rows, jsonl_lines
from app.api.schemas import Item, ItemPage, ProbabilityQuery
from app.api.views import globals_of, item_view, stored_item_views, within
from app.serving.stored_pages import stored_pages

router = APIRouter()


@router.get(
    "/v1/projects/{project}/items/{item:path}",
    operation_id="get_item",
    tags=["items"],
    response_model=Item,
    responses=ERRORS,
    dependencies=[require("read", served=True)],
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
    dependencies=[require("read", served=True)],
)
def list_items(
    project: str,
    svc: ServiceDep,
    cursor: str | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    max_probability: ProbabilityQuery = 1.0,
    min_probability: ProbabilityQuery = 0.0,
) -> ItemPage:
    record = svc.project(project)
    pos, after = _cursor(cursor)
    g = globals_of(svc, record)
    scanned = 0
    while True:  # scan on while no item passes the filter, up to SCANNED_PER_PAGE items
        nxt, page = svc.store.scan_items(project, pos, limit)
        if after is not None:  # the rest of a scan's page that held more than ``limit``
            page = [entry for entry in page if entry[0] > after]
        scanned += len(page)
        views = stored_item_views(record, page, g)
        items = [x for x in views if within(x, min_probability, max_probability)]
        if len(items) > limit:  # (Redis' HSCAN counts buckets, not fields)
            items = sorted(items, key=lambda x: x.item)[:limit]
            return ItemPage(items=items, next_cursor=f"{pos}:{items[-1].item}")
        if items or not nxt or scanned >= SCANNED_PER_PAGE:
            return ItemPage(items=items, next_cursor=str(nxt) if nxt else None)
        pos, after = nxt, None


def _cursor(cursor: str | None) -> tuple[int, str | None]:
    """A listing's cursor: the store's scan position, and after a page that the scan filled
    past ``limit``, the last item served from it (``position:item``, the rest of that scan's
    page comes next, in item order)."""
    if not cursor:
        return 0, None
    text, colon, after = cursor.partition(":")
    try:
        pos = int(text)
        if pos < 0 or (colon and not after):  # (no next_cursor is: a store slicing from the
            raise ValueError(cursor)  # end would page forever)
    except ValueError:
        raise ApiError(
            422,
            "invalid_cursor",
            "cursor must be a value returned as next_cursor",
            None,
            "cursor",
        ) from None
    return pos, after if colon else None


SCANNED_PER_PAGE = 10_000
"""A filtered page scans on past ``limit`` items while none passes the filter, up to this
many: a page of a filtered listing is empty only at the end or after that many."""


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
EXPORT_PAGE = 2000
"""Items read and written at a time (a page of 2,000 records: about 0.3 MB at 5 classes)."""


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
    dependencies=[require("read", served=True)],
)
def export_items(
    project: str, svc: ServiceDep, format: Literal["jsonl", "csv"] = "jsonl"
) -> StreamingResponse:
    record = svc.project(project)
    pages = stored_pages(svc.store, project, globals_of(svc, record), EXPORT_PAGE)
    classes = record.labels

    def jsonl() -> Iterator[bytes]:
        return (jsonl_lines(page, classes) for page in pages)

    def csv() -> Iterator[str]:
        yield csv_header(classes)
        yield from (csv_rows(page, classes) for page in pages)

    if format == "csv":
        return StreamingResponse(csv(), media_type="text/csv")
    return StreamingResponse(jsonl(), media_type="application/x-ndjson")
