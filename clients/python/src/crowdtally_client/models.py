"""Typed models of the service's requests and answers (mirrors the service's OpenAPI schema).

Answers are parsed leniently (unknown fields are kept, not rejected) so that a newer server
does not break an older client.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class _Answer(BaseModel):
    model_config = ConfigDict(extra="allow")


class Label(BaseModel):
    """One answer to post: ``weight`` defaults to 1; give ``id`` to make re-sends count once."""

    model_config = ConfigDict(extra="forbid")

    item: str
    worker: str
    label: str
    id: str | None = None
    weight: float = 1.0


class Gold(BaseModel):
    model_config = ConfigDict(extra="forbid")

    item: str
    label: str


class RefitReport(_Answer):
    """The last refit: its log position, whether batch EM's fit replaced the served model
    (declined when the two agree on fewer than 85% of the items), and that agreement."""

    position: int
    adopted: bool
    agreement: float


class ProjectStats(_Answer):
    log_end: int
    applied: int
    lag: int
    n_items: int
    n_workers: int
    n_labels: int
    dyadic_passes: float | None = None
    dyadic_position: int | None = Field(
        None,
        description="The log position the predictions' model has learned up to (it follows "
        "the posteriors: ``applied``).",
    )
    last_refit: RefitReport | None = None


class Project(_Answer):
    name: str
    labels: list[str]
    hyperparameters: dict[str, Any]
    worker_slots: int
    dyadic: dict[str, Any] | None = None
    created_at: str
    stats: ProjectStats


class ProjectCreated(Project):
    api_key: str


class KeyCreated(_Answer):
    api_key: str
    key_id: str
    scope: str
    project: str


class Accepted(_Answer):
    accepted: int
    duplicates: int
    position: int
    applied: bool


class PostResult(_Answer):
    """The sum over the blocks one ``post_labels`` call sent."""

    accepted: int = 0
    duplicates: int = 0
    position: int = Field(0, description="Log position of the last block.")
    applied: bool = Field(True, description="Every block applied (wait=True).")
    blocks: int = 0


class ItemLabel(_Answer):
    worker: str
    label: str
    weight: float


class Item(_Answer):
    item: str
    label: str | None = Field(description="The most probable label; None: no labels yet.")
    probability: float | None = Field(description="Its probability; None: no labels yet.")
    posterior: dict[str, float]
    n_labels: int
    gold: str | None = None
    labels: list[ItemLabel] | None = None
    computed_at: str
    position: int


class ItemPage(_Answer):
    items: list[Item]
    next_cursor: str | None = None


class Worker(_Answer):
    worker: str
    accuracy: float
    informativeness: float
    confusion: dict[str, dict[str, float]] | None = Field(
        None, description="confusion[true][answer] = P(answer | true)."
    )
    n_labels: int
    gold_labels: int
    gold_accuracy: float | None = None
    slot: int
    computed_at: str


class ReliabilityBin(_Answer):
    lower: float
    upper: float
    n: int
    confidence: float | None = None
    accuracy: float | None = None


class CalibrationReport(_Answer):
    """How the served posteriors score on the project's gold items, each calibrated without
    its own gold; ``rho`` and ``eps`` are the calibration in force."""

    rho: float
    eps: float
    n_gold: int
    accuracy: float | None = None
    ece: float | None = None
    nll: float | None = None
    brier: float | None = None
    bins: list[ReliabilityBin]
    position: int
    computed_at: str


class WorkerPage(_Answer):
    workers: list[Worker]
    total: int


class Snapshot(_Answer):
    id: int
    project: str
    position: int
    created_at: str
    age_s: float
    n_items: int
    n_workers: int
    n_labels: int
    size_bytes: int


class Prediction(_Answer):
    """The label a worker would give an item (the dyadic model), and how near the boundary."""

    worker: str
    item: str
    label: str
    scores: dict[str, float]
    h_min: float | None = Field(
        None, description="Importance weight that flips the prediction; None: nothing does."
    )
    trained: bool


class BoundaryPage(_Answer):
    pairs: list[Prediction]
    worker: str | None = None
    item: str | None = None
    candidates: int
    position: int


class QueueItem(_Answer):
    item: str
    score: float = Field(description="Higher: label sooner (the policy's score).")
    label: str | None = Field(description="The most probable label; None: no labels yet.")
    probability: float | None = None
    n_labels: int


class QueueProgress(_Answer):
    """The stopping rule's account of the campaign (gold items left out)."""

    done: int = Field(0, description="Items finished (confident enough, capped, or no budget).")
    expected_accuracy: float | None = Field(
        None, description="Mean served confidence of the finished items; None: none yet."
    )
    open: int = Field(0, description="Items not finished.")
    labels_to_finish: float | None = Field(
        None, description="Labels the open items are expected to need; None: some never finish."
    )


class QueuePage(_Answer):
    items: list[QueueItem]
    size: int = Field(description="Items in the queue (not finished).")
    policy: str
    worker: str | None = None
    progress: QueueProgress = Field(default_factory=QueueProgress)


class QueueSettings(_Answer):
    policy: str
    target_confidence: float
    max_labels_per_item: int | None = None
    budget: int | None = Field(None, description="Labels to spend on the project in all.")
