"""Calibration: how the served posteriors score on the project's gold items."""

from __future__ import annotations

import math

from fastapi import APIRouter

from app.api.deps import ServiceDep, in_thread, require
from app.api.errors import ERRORS
from app.api.schemas import CalibrationReportBody, ReliabilityBin
from app.serving.calibration import calibration_report
from app.serving.nominal import iso

router = APIRouter()


def _number(x: float) -> float | None:
    return None if math.isnan(x) else float(x)


@router.get(
    "/v1/projects/{project}/calibration",
    operation_id="calibration_report",
    tags=["quality"],
    response_model=CalibrationReportBody,
    responses=ERRORS,
    dependencies=[require("read", served=True)],
)
async def get_calibration(project: str, svc: ServiceDep) -> CalibrationReportBody:
    """Accuracy, expected calibration error, NLL, Brier score and reliability bins of the
    served posteriors on the gold items (docs/model.md, "The calibration report")."""
    record = svc.project(project)
    report = await in_thread(
        calibration_report, svc.store, project, svc.config(record), record.created_at
    )
    s = report.scores
    edges = s.bin_edges.tolist()
    bins = [
        ReliabilityBin(
            lower=edges[b],
            upper=edges[b + 1],
            n=int(s.bin_counts[b]),
            confidence=_number(s.bin_confidence[b]),
            accuracy=_number(s.bin_accuracy[b]),
        )
        for b in range(len(edges) - 1)
    ]
    return CalibrationReportBody(
        rho=report.calibration.rho,
        eps=report.calibration.eps,
        n_gold=s.n,
        accuracy=_number(s.accuracy),
        ece=_number(s.ece),
        nll=_number(s.nll),
        brier=_number(s.brier),
        bins=bins,
        position=report.position,
        computed_at=iso(report.computed_at or record.created_at),  # (nothing applied: made)
    )
