"""Request and response bodies of the HTTP API (pydantic; they make the OpenAPI schema)."""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from fastapi import Query
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
)
from pydantic_core import PydanticCustomError

from app.engine.dyadic import DEFAULT_PASSES, ORDINAL_DEFAULTS, SERVICE_DEFAULTS
from app.io.input import MAX_CLASSES, MAX_ID_LENGTH, PROJECT_NAME
from core.dyadic import LOSSES, REDUCTIONS
from core.hashing import DEFAULT_WORKER_SLOTS
from core.nominal import NominalConfig

ProjectName = Annotated[str, StringConstraints(pattern=PROJECT_NAME)]
NO_CONTROL = r"^[^\x00-\x1f\x7f-\x9f]*$"
NO_CONTROL_MESSAGE = (
    "ids and labels hold no control characters (U+0000 to U+001F, U+007F to U+009F)"
)
"""Ids hold no control characters (Unicode Cc): a NUL or a newline would make two ids one in
some stores and paths, or an id that cannot be routed."""
ExternalId = Annotated[
    str, StringConstraints(min_length=1, max_length=MAX_ID_LENGTH, pattern=NO_CONTROL)
]
MAX_LABEL_LENGTH = 128
LabelName = Annotated[
    str, StringConstraints(min_length=1, max_length=MAX_LABEL_LENGTH, pattern=NO_CONTROL)
]
"""A class's name: no control characters either (a newline in one broke exports' rows)."""
IdQuery = Annotated[str | None, Query(min_length=1, max_length=MAX_ID_LENGTH, pattern=NO_CONTROL)]
"""A worker's or an item's id given in the query (None: not given)."""


def _not_nan(value: Any) -> Any:
    """A query's ``nan`` refused as such: read as NaN, it failed ``le=1`` ("should be less
    than or equal to 1")."""
    try:
        nan = math.isnan(float(value))
    except (TypeError, ValueError):
        return value  # pydantic says what is wrong with it
    if nan:
        raise PydanticCustomError("finite_number", "must be a number between 0 and 1, not NaN")
    return value


ProbabilityQuery = Annotated[float, Query(ge=0, le=1), BeforeValidator(_not_nan)]
"""A probability given in the query: 0 to 1, not NaN."""
MAX_COUNT = 2**53 - 1
"""The largest count a setting takes (the largest integer a JSON number holds exactly)."""
_DEFAULTS = NominalConfig(n_classes=2)
_DYADIC = SERVICE_DEFAULTS


def _BY_KIND(name: str) -> str:  # noqa: N802
    nominal, ordinal = getattr(SERVICE_DEFAULTS, name), getattr(ORDINAL_DEFAULTS, name)
    return f"Default {nominal} ({ordinal} for ordinal labels)."


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class Hyperparameters(Strict):
    """The nominal model's settings (docs/model.md); the defaults were chosen by measurement."""

    # The bounds keep the model's arithmetic finite: past them (e.g. tau0 0, n_items 1e-300,
    # class_rate 1e6, a prior of 1e300) its parameters overflowed and every read failed.

    eta0: float = Field(_DEFAULTS.eta0, ge=0, le=1e6)
    tau0: float = Field(_DEFAULTS.tau0, ge=1, le=1e12)
    rho: float = Field(_DEFAULTS.rho, ge=0, le=10)
    n_items: float = Field(_DEFAULTS.n_items, ge=1, le=1e12)
    worker_prior: float = Field(_DEFAULTS.worker_prior, gt=0, le=1e6)
    population_prior: float = Field(_DEFAULTS.population_prior, gt=0, le=1e6)
    population_diagonal: float = Field(_DEFAULTS.population_diagonal, ge=-100, le=100)
    class_prior: list[float] | None = None
    class_prior_strength: float = Field(_DEFAULTS.class_prior_strength, gt=0, le=1e6)
    difficulty: bool = _DEFAULTS.difficulty
    difficulty_prior: float = Field(_DEFAULTS.difficulty_prior, gt=0, le=1e6)
    population_rate: float = Field(_DEFAULTS.population_rate, ge=0, le=1e3)
    class_rate: float = Field(_DEFAULTS.class_rate, ge=0, le=1e3)


class DyadicSettingsBody(Strict):
    """The dyadic model that predicts what a worker would answer on an item (docs/dyadic.md)."""

    enabled: bool = True
    ordinal: bool = Field(False, description="The labels are a scale, listed in order.")
    k: int | None = Field(
        None, ge=0, le=16, description=f"Latent dimension (0: linear). {_BY_KIND('k')}"
    )
    loss: Literal[tuple(LOSSES)] | None = Field(  # type: ignore[valid-type]
        None, description=_BY_KIND("loss")
    )
    reduction: Literal[REDUCTIONS] = _DYADIC.reduction  # type: ignore[valid-type]
    eta: float | None = Field(None, gt=0, le=100, description=_BY_KIND("eta"))
    l2: float | None = Field(None, ge=0, le=0.5, description=_BY_KIND("l2"))
    dyadic_rate: float | None = Field(
        None,
        gt=0,
        le=100,
        description=f"The factors' rate relative to eta. {_BY_KIND('dyadic_rate')}",
    )
    passes: int = Field(
        DEFAULT_PASSES, ge=1, le=100, description="Passes over each label, sweeps included."
    )
    rater_slots: int = Field(_DYADIC.rater_slots, ge=1, le=1 << 22)
    task_slots: int = Field(_DYADIC.task_slots, ge=1, le=1 << 24)


class ProjectCreate(Strict):
    name: ProjectName
    labels: list[LabelName] = Field(min_length=2, max_length=MAX_CLASSES)
    hyperparameters: Hyperparameters = Field(default_factory=Hyperparameters)
    worker_slots: int = Field(DEFAULT_WORKER_SLOTS, ge=1, le=1 << 22)
    dyadic: DyadicSettingsBody = Field(default_factory=DyadicSettingsBody)

    @field_validator("labels")
    @classmethod
    def _distinct(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("label names must be distinct")
        return v


class RefitReport(BaseModel):
    position: int = Field(description="The log position of the refit.")
    adopted: bool = Field(
        description="Whether batch EM's fit replaced the served model. A refit whose labels "
        "agree with the served ones on fewer than 85% of the items is declined and the served "
        "model kept: the two part ways where answers are too few for batch EM's optimum, as "
        "with one or two answers an item."
    )
    agreement: float = Field(
        description="The share of the answered items on which the refit's label is the served one."
    )


class ProjectStats(BaseModel):
    log_end: int
    applied: int
    lag: int
    n_items: int
    n_workers: int
    n_labels: int
    dyadic_passes: float | None = Field(
        None, description="Passes the dyadic model made over each label, on average."
    )
    dyadic_position: int | None = Field(
        None,
        description="The log position the dyadic model (predictions) has learned up to: "
        "posteriors come first, so it may be behind `applied` for a moment, or longer under "
        "heavy load.",
    )
    last_refit: RefitReport | None = Field(None, description="The last refit, if any.")


class Project(BaseModel):
    name: str
    labels: list[str]
    hyperparameters: Hyperparameters
    worker_slots: int
    dyadic: DyadicSettingsBody
    created_at: str
    stats: ProjectStats


class ProjectCreated(Project):
    api_key: str = Field(description="A read-write key for this project; shown only once.")


class KeyCreate(Strict):
    scope: Literal["read", "write"] = "read"


class KeyCreated(BaseModel):
    api_key: str
    key_id: str
    scope: str
    project: str


class LabelIn(Strict):
    item: ExternalId
    worker: ExternalId
    label: LabelName
    id: ExternalId | None = None
    weight: float = Field(
        1.0,
        ge=0,
        allow_inf_nan=False,
        description="At most the service's CROWDTALLY_MAX_LABEL_WEIGHT (10 by default).",
    )


class GoldIn(Strict):
    item: ExternalId
    label: LabelName


class Accepted(BaseModel):
    accepted: int
    duplicates: int
    position: int = Field(description="Log position of this block (what the engine must reach).")
    applied: bool = Field(description="True when the engine has applied it (wait=true).")


class ItemLabel(BaseModel):
    worker: str
    label: str
    weight: float


class Item(BaseModel):
    item: str
    label: str | None = Field(
        description="The most probable label; null while the item has no labels (nor gold)."
    )
    probability: float | None = Field(
        description="The label's probability; null while the item has no labels (nor gold)."
    )
    posterior: dict[str, float] = Field(
        description="P(true label); an item without labels (nor gold) has the class prior."
    )
    n_labels: int
    gold: str | None
    labels: list[ItemLabel] | None = None
    computed_at: str
    position: int = Field(description="Log position of the parameters it was computed with.")


class ItemPage(BaseModel):
    items: list[Item]
    next_cursor: str | None


class Worker(BaseModel):
    worker: str
    accuracy: float = Field(description="Expected accuracy: sum_z P(z) P(answer z | z).")
    informativeness: float = Field(description="Mutual information of answer and truth / H(truth).")
    confusion: dict[str, dict[str, float]] | None = Field(
        None, description="confusion[true][answer] = P(answer | true)."
    )
    n_labels: int
    gold_labels: int
    gold_accuracy: float | None
    slot: int
    computed_at: str


class WorkerPage(BaseModel):
    workers: list[Worker]
    total: int


class QueueSettingsBody(Strict):
    """Which items the queue puts first, and when an item is finished (docs/active.md)."""

    policy: Literal["voi", "lookahead", "uncertainty", "entropy", "margin", "uniform"] = "lookahead"
    target_confidence: float = Field(0.95, gt=0, le=1)
    max_labels_per_item: int | None = Field(None, ge=1, le=MAX_COUNT)
    budget: int | None = Field(
        None, ge=0, le=MAX_COUNT, description="Labels to spend on the project in all."
    )


class ItemIn(Strict):
    item: ExternalId


class QueueItem(BaseModel):
    item: str
    score: float = Field(description="Higher = label sooner (the policy's score).")
    label: str | None = Field(description="The most probable label; null: no labels yet.")
    probability: float | None
    n_labels: int


class QueueProgress(BaseModel):
    """The stopping rule's account of the campaign (docs/active.md eq. A8); gold items left out."""

    done: int = Field(0, description="Items finished (confident enough, capped, or no budget).")
    expected_accuracy: float | None = Field(
        None,
        description="Mean served confidence of the finished items: the share of them expected "
        "right. Null: none finished yet.",
    )
    open: int = Field(0, description="Items not finished.")
    labels_to_finish: float | None = Field(
        None,
        description="Labels the open items are expected to need to finish (Wald's estimate "
        "under the typical worker). Null: some cannot reach the target under the model.",
    )


NO_PROGRESS = {"done": 0, "expected_accuracy": None, "open": 0, "labels_to_finish": 0.0}
"""A project's ``QueueProgress`` before any item was scored: nothing open, nothing to buy (an
empty report read "some cannot reach the target" with 0 items open)."""


class QueuePage(BaseModel):
    items: list[QueueItem]
    size: int = Field(
        description="Items in the queue (not finished); with worker=, the project's whole "
        "queue, those the worker labelled included."
    )
    policy: str
    worker: str | None
    progress: QueueProgress


class Histogram(BaseModel):
    edges: list[float]
    counts: list[int]


class SummaryWorker(Worker):
    likely_spammer: bool = Field(
        description="Informativeness below 0.1: answers barely depend on the truth."
    )


class Summary(BaseModel):
    """What the dashboard shows: counts, the confidence histogram, the least informative workers."""

    project: str
    labels: list[str]
    stats: ProjectStats
    confidence_histogram: Histogram
    label_counts: dict[str, int]
    workers: list[SummaryWorker]
    queue: list[QueueItem] = Field(description="The first items of the active-learning queue.")
    queue_size: int
    queue_progress: QueueProgress
    computed_at: str


class Snapshot(BaseModel):
    id: int
    project: str
    position: int = Field(description="The log position the snapshot covers.")
    created_at: str
    age_s: float
    n_items: int
    n_workers: int
    n_labels: int
    size_bytes: int


class ErrorBody(BaseModel):
    code: str
    message: str
    entry: int | None = None
    field: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody


class PairIn(Strict):
    worker: ExternalId
    item: ExternalId


class Prediction(BaseModel):
    worker: str
    item: str
    label: str = Field(description="The label this worker is predicted to give this item.")
    scores: dict[str, float] = Field(description="Per-label scores; the label has the highest.")
    h_min: float | None = Field(
        description="Smallest importance weight of one more (worker, item) example with the "
        "runner-up label that would flip the prediction: small = near the boundary. "
        "null: no weight flips it."
    )
    trained: bool = Field(description="Both the worker's and the item's rows have been trained.")


class Predictions(BaseModel):
    predictions: list[Prediction]
    position: int = Field(description="Log position of the model that made them.")


class BoundaryPage(BaseModel):
    pairs: list[Prediction] = Field(description="Smallest h_min first.")
    worker: str | None
    item: str | None
    candidates: int = Field(description="Pairs scored to find these.")
    position: int


class ReliabilityBin(BaseModel):
    lower: float
    upper: float
    n: int = Field(description="Gold items whose top probability falls in [lower, upper).")
    confidence: float | None = Field(None, description="Their mean top probability.")
    accuracy: float | None = Field(None, description="The share of them whose top label is right.")


class CalibrationReportBody(BaseModel):
    """How the served posteriors score on the project's gold items. Each gold item is scored
    from its answers alone, calibrated without its own gold (5-fold cross-fitting)."""

    rho: float = Field(description="The tempering in force: answers' intra-item correlation.")
    eps: float = Field(description="The consensus error in force (learned from gold).")
    n_gold: int = Field(description="Gold items with answers, scored.")
    accuracy: float | None
    ece: float | None = Field(None, description="Expected calibration error, points (10 bins).")
    nll: float | None = Field(None, description="Mean negative log-likelihood of the gold label.")
    brier: float | None
    bins: list[ReliabilityBin]
    position: int
    computed_at: str
