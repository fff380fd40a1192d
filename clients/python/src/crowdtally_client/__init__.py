"""Python client for the crowdtally service: ``Client`` (sync) and ``AsyncClient`` (asyncio).

Retries with exponential back-off on connection errors, 429 and 5xx; large label lists go in
blocks; ``iter_items`` follows the cursor; ``to_pandas`` gives crowd-kit-shaped frames with
crowd-kit's dtypes (int64 ids and labels when they are integers; ``frames`` says how).
"""

from crowdtally_client._core import (
    ApiError,
    CrowdtallyError,
    RetryPolicy,
    TransportError,
    auto_id,
    prepare_labels,
)
from crowdtally_client.client import AsyncClient, Client, parse_jsonl
from crowdtally_client.models import (
    Accepted,
    BoundaryPage,
    CalibrationReport,
    Gold,
    Item,
    ItemLabel,
    ItemPage,
    KeyCreated,
    Label,
    PostResult,
    Prediction,
    Project,
    ProjectCreated,
    ProjectStats,
    QueueItem,
    QueuePage,
    QueueProgress,
    QueueSettings,
    RefitReport,
    Snapshot,
    Worker,
    WorkerPage,
)

__version__ = "0.1.0"
__all__ = [
    "Accepted",
    "ApiError",
    "AsyncClient",
    "BoundaryPage",
    "CalibrationReport",
    "Client",
    "CrowdtallyError",
    "Gold",
    "Item",
    "ItemLabel",
    "ItemPage",
    "KeyCreated",
    "Label",
    "PostResult",
    "Prediction",
    "Project",
    "ProjectCreated",
    "ProjectStats",
    "QueueItem",
    "QueuePage",
    "QueueProgress",
    "QueueSettings",
    "RefitReport",
    "RetryPolicy",
    "Snapshot",
    "TransportError",
    "Worker",
    "WorkerPage",
    "auto_id",
    "parse_jsonl",
    "prepare_labels",
]
