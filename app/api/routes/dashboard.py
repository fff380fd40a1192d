"""What the dashboard shows (its static page is mounted by ``app.api.main``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, FastAPI, Query
from fastapi.staticfiles import StaticFiles

from app.api.deps import ServiceDep, require
from app.api.errors import ERRORS
from app.api.schemas import Summary
from app.api.views import summary

router = APIRouter()


@router.get(
    "/v1/projects/{project}/summary",
    operation_id="project_summary",
    tags=["dashboard"],
    response_model=Summary,
    responses=ERRORS,
    dependencies=[require("read", served=True)],
)
def project_summary(
    project: str, svc: ServiceDep, workers: Annotated[int, Query(ge=0, le=1000)] = 25
) -> dict[str, Any]:
    """Counts, a 20-bin histogram of each item's top probability, items per most likely
    label, and the ``workers`` least informative workers with their confusion matrices."""
    record = svc.project(project)
    return summary(svc, record, workers)


PAGE = Path(__file__).resolve().parents[1] / "dashboard"


def mount_page(app: FastAPI) -> None:
    """The dashboard's static page at /dashboard/ (a mount: routers cannot carry one)."""
    app.mount("/dashboard", StaticFiles(directory=PAGE, html=True), name="dashboard")
