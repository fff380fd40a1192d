"""Service settings, from the environment (``CROWDTALLY_*``) or a ``.env`` file."""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

STORES = ("embedded", "redis")
"""The stores the service runs on (``CROWDTALLY_STORE``, a command's ``--store``)."""


class Settings(BaseSettings):
    """Each setting is bounded where a value past the bound would break the service quietly
    (e.g. ``engine_batch_entries`` 0 applied nothing, ``snapshot_keep`` 0 deleted every
    snapshot it wrote, ``max_label_weight`` inf took any weight)."""

    model_config = SettingsConfigDict(env_prefix="CROWDTALLY_", env_file=".env", extra="ignore")

    store: str = Field("embedded", pattern=f"^({'|'.join(STORES)})$")
    """``embedded``: in-process state, labels in a SQLite file under ``data_dir``.
    ``redis``: log and state in Redis at ``redis_url`` (several API and engine processes)."""
    data_dir: Path = Path("crowdtally-data")
    redis_url: str = Field(
        "redis://127.0.0.1:6379/0",
        validation_alias=AliasChoices("REDIS_URL", "CROWDTALLY_REDIS_URL"),
    )
    redis_cluster: bool = False
    """``redis_url`` names one node of a Redis Cluster (docs/deploy.md): a project's keys share
    one hash slot, so its scripts and transactions run on the node that holds it."""
    redis_wait_replicas: int = Field(0, ge=0)
    """A 202 for labels waits until this many replicas of the project's Redis primary have
    the block (``WAIT``): acknowledged blocks then survive the failover of that primary."""
    redis_wait_timeout_ms: int = Field(1000, ge=1)
    """... for at most this long: fewer replicas answer 503 (the block is in the log; the
    client posts it again with the same ids)."""
    redis_prefix: str = "ct"
    """Every Redis key starts with ``{prefix}:`` (tests use their own prefix)."""
    redis_timeout_s: float = Field(10.0, ge=0, allow_inf_nan=False)
    """How long one Redis command may wait (connecting included) before the request answers
    503 store_unavailable instead of hanging; 0 waits forever."""
    database_url: str | None = None
    """SQLAlchemy URL of the snapshot database (``postgresql+psycopg://...`` in production);
    default: the SQLite file ``data_dir/crowdtally.sqlite3``, which in the embedded mode also
    holds the label log."""
    snapshot_interval_s: float = Field(60.0, ge=0, allow_inf_nan=False)
    """Snapshot each project at least this often while it receives labels."""
    snapshot_labels: int = Field(100_000, ge=1)
    """... and after this many new labels, or a tenth of the labels the project held at its
    last snapshot when that is more, whichever comes first; and no sooner than ten times the
    last snapshot's own time after it began: a snapshot only saves replay, and costs in
    proportion to the project. With Redis, the log is archived to SQL every this many labels
    all the same (what a lost Redis volume can cost)."""
    snapshot_keep: int = Field(3, ge=1)
    """Snapshots kept per project (older ones are deleted after a new one is written)."""
    admin_key: str | None = None
    """The admin API key; when unset, one is made on first start and kept in
    ``data_dir/admin.key`` (embedded) or in Redis (hashed) with the key printed once."""
    engine_in_process: bool = True
    """Run the engine inside the API process (the embedded default). Production runs
    ``crowdtally engine`` as its own process and sets this to false."""
    engine_pool: bool = False
    """``crowdtally engine`` joins a pool of engines over one Redis (or Redis Cluster): each
    project is applied by one engine at a time, the holder of its lease (docs/deploy.md)."""
    engine_lease_s: float = Field(5.0, gt=0, allow_inf_nan=False)
    """A pool engine's lease on a project: renewed every third of it; a dead engine's projects
    are taken over once it lapses."""
    max_block_labels: int = Field(10_000, ge=1)
    """Largest block of labels one POST may carry."""
    max_label_weight: float = Field(10.0, gt=0, allow_inf_nan=False)
    """Largest ``weight`` one label may carry (422 beyond): a heavier label outweighs the
    worker's other answers and moves every item they labelled (README, "Semantics worth
    knowing")."""
    max_body_bytes: int = Field(20 * 1024 * 1024, ge=1024)
    """Largest request body (bytes), refused with 413 before it is parsed or its key checked:
    10,000 labels of up to 2 KiB each."""
    max_lag_s: float = Field(5.0, ge=0, allow_inf_nan=False)
    """Most seconds the oldest log entry of a project may wait for the engine (or the entries
    waiting and one of its steps would take at its recent pace) before ``POST .../labels`` and ``.../gold``
    answer 429 ``engine_behind`` (appending nothing); 0 disables the check."""
    wait_timeout_s: float = Field(30.0, ge=0, allow_inf_nan=False)
    """How long ``wait=true`` waits for the engine: blocks then answer ``applied: false``,
    queue settings 504 ``not_applied``."""
    refine_passes: int = Field(3, ge=0)
    """Refinement sweeps the engine runs over all stored labels once it is idle."""
    refine_idle_s: float = Field(1.0, ge=0, allow_inf_nan=False)
    """Idle time after the last label before the engine starts refinement sweeps."""
    engine_batch_entries: int = Field(256, ge=1)
    """Log entries the engine applies before writing state."""
    join_queued_labels: bool = True
    """Blocks of labels that queue up while the engine is busy are learned as one block (each
    item's per-item EM runs once over its new labels, not once per block), as the log records
    at append time: a replay groups them alike (docs/architecture.md, "Queued blocks learned
    together"). Off: every block is learned alone, whatever the load."""
    log_format: str = Field("json", pattern="^(json|text)$")
    """``json``: one JSON object per line with the request id; ``text`` for people."""
    log_level: str = Field("INFO", pattern="(?i)^(debug|info|warning|error|critical)$")
    """Level of the service's logs on stderr (``DEBUG``, ``INFO``, ``WARNING``, ...)."""

    # Engine memory (reliability) -------------------------------------------------------------
    project_memory_limit_mb: int = Field(1024, ge=1)
    """Most memory one project's models may need (MiB): a project whose configuration could
    need more (``worker_slots`` x K^2 x 16 bytes, plus the dyadic model's tables) is refused at
    creation (422 ``project_too_large``)."""

    def database_url_resolved(self) -> str:
        return self.database_url or f"sqlite:///{self.data_dir / 'crowdtally.sqlite3'}"
