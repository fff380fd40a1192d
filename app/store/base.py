"""The state-store contract: projects, keys, the label log, and the engine's served state.

Two backends implement it: ``EmbeddedStore`` (in-process state, the log in SQLite) and
``RedisStore``. ``tests/app/test_store_contract.py`` runs the same tests against both.

The label log is the source of truth. Every entry has a position (1, 2, ...) in its project's
log; the engine applies entries in that order and records the last position it applied. Item
and worker ids are opaque strings: they are only ever hash fields or SQL parameters, never
part of a key name or a statement.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import orjson

from app.store.item_records import ItemWrites
from core.nominal import NominalConfig

EntryKind = Literal[
    "labels", "gold", "refine", "refit", "snapshot", "items", "settings", "dyadic"
]  # fmt: skip
Scope = Literal["admin", "read", "write"]


class ProjectExistsError(Exception):
    """A project of that name already exists."""


class UnknownProjectError(LookupError):
    """No project of that name (e.g. deleted while a request that had found it went on)."""

    def __init__(self, project: str) -> None:
        super().__init__(f"project {project!r} was deleted")
        self.project = project


class StoreWipedError(Exception):
    """The store lost the project with everything else (a Redis restarted empty): nothing was
    appended; the API puts it back from SQL within seconds, and the same block sent again then
    is counted once."""

    def __init__(self, what: str) -> None:
        super().__init__(f"the store lost {what} (a Redis restarted empty) and is being rebuilt")
        self.what = what


class EngineBehindError(Exception):
    """The project's engine lags more than the bound an append was given: nothing was
    appended (and no id marked seen). ``lag_s``: how long the oldest entry not yet applied has
    waited."""

    def __init__(self, project: str, lag_s: float) -> None:
        super().__init__(f"{project}: the engine is {lag_s:.1f} s behind")
        self.project, self.lag_s = project, lag_s


class LogRewoundError(Exception):
    """The log no longer holds the entry an engine's state ends at: the store went back in
    time (Redis restarted from an AOF that missed its last second, a failover to a replica
    that lagged). The engine must drop what it holds and restore from an earlier snapshot."""


class NodeDownError(Exception):
    """Projects whose Redis Cluster node did not answer (a primary failing over) were left for
    a later step; the others were applied."""


class LeaseLostError(Exception):
    """An engine of a pool wrote with a fencing token that is no longer the project's (its
    lease lapsed and another engine took the project over): the write is refused, and the
    engine must let the project go."""


@dataclass(frozen=True)
class ProjectRecord:
    name: str
    labels: tuple[str, ...]
    config: dict[str, Any]
    """NominalConfig fields (n_classes and n_worker_slots included), and ``dyadic``: the
    dyadic model's settings (``app.engine.dyadic.DyadicSettings``; absent or None: none)."""
    created_at: float

    def to_json(self) -> bytes:
        return orjson.dumps(self.__dict__)

    @classmethod
    def from_json(cls, blob: bytes) -> ProjectRecord:
        d = orjson.loads(blob)
        return cls(d["name"], tuple(d["labels"]), d["config"], d["created_at"])


@dataclass(frozen=True)
class KeyRecord:
    key_id: str
    """Public identifier of the key (its hash prefix), safe to show."""
    scope: Scope
    project: str | None
    """None for the admin key."""
    created_at: float | None = field(default=None, compare=False)
    """When the key was issued (None: issued before keys recorded it)."""


@dataclass(frozen=True)
class AppendResult:
    position: int
    """Log position of the entry (the current end of the log when nothing was new)."""
    accepted: int
    duplicates: int


@dataclass(frozen=True)
class Progress:
    """Where a project's log and served state are (``/readyz``, ``/metrics``)."""

    log_end: int
    applied: int
    lag_s: float
    queue_size: int
    globals: bytes | None
    """The served shared parameters (``get_params``), None before the first write."""


@dataclass(frozen=True)
class QueueHead:
    """The head of a project's queue and what a page of it reports, read together (one
    transaction on Redis): the queue's size and progress are those of the same write."""

    top: list[tuple[str, float]]
    """The highest-scored members, best first (``read_queue``)."""
    size: int
    globals: bytes | None
    """The served shared parameters (``get_params``; their ``queue`` is the progress)."""
    settings: bytes | None
    """The queue's settings (``queue_settings``), None for the defaults."""


@dataclass(frozen=True)
class LogEntry:
    position: int
    kind: EntryKind
    payload: bytes
    """orjson-encoded body; for ``labels`` the columns ``items, workers, labels, weights``."""
    keep: bytes = b""
    """For ``labels``: one byte per label, ``1`` to apply, ``0`` for a duplicate id."""
    token: int = 1
    """Drawn at random when the entry is appended (Redis): two entries at one position are
    the same entry only if their tokens are equal (1: entries logged before tokens were)."""
    joins: bool = False
    """Appended while the entry before it was still unread by the engine (``read_log`` with
    ``seal``): consecutive label entries that joined are learned as one block of labels
    (``app.engine.groups``), live and on every replay alike."""


@dataclass
class DyadicUpdate:
    """The dyadic rows one engine step changed (``app.engine.dyadic``): slot -> ``DyadicModel.rows`` bytes."""

    raters: dict[int, bytes]
    tasks: dict[int, bytes]
    shared: bytes
    position: int
    """The log position the model has learned every label up to (behind the applied
    position while it catches up: the posteriors are written first)."""


@dataclass
class StateUpdate:
    """What one engine step changed; written atomically with the position it covers."""

    position: int
    globals: bytes
    """orjson of the shared parameters (class logits, population, scalars) and metadata."""
    rows: dict[int, bytes] = field(default_factory=dict)
    """Worker slots whose stored (scaled) deviation rows changed: slot -> float64 bytes.
    Here, in ``workers`` and in ``DyadicUpdate``'s rows each value is a bytes object of its
    own size, which the embedded store keeps as it is (not an orjson output: orjson writes
    into a buffer of at least 4 KiB)."""
    items: ItemWrites = field(default_factory=ItemWrites)
    """The items whose served state changed (``app.store.item_records``)."""
    workers: dict[str, bytes] = field(default_factory=dict)
    """Workers whose records changed: name -> JSON (``ProjectEngine.workers_json``)."""
    queue: dict[str, float] = field(default_factory=dict)
    """Active-learning scores of items that (still) need labels, by queue member (an item's
    member leads with its arrival number: ``app.engine.queue.member``)."""
    queue_remove: list[str] = field(default_factory=list)
    """Items that left the queue (finished)."""
    queue_settings: bytes | None = None
    dyadic: DyadicUpdate | None = None
    anchor: int | None = None
    """Token of the log entry at ``position``: the write is refused (``LogRewoundError``)
    unless the log still holds that very entry (None: not checked)."""
    served: int | None = None
    """The applied position the writer last wrote (or found): the write is refused unless the
    served state is still there (a Redis gone back in time lost state writes: the changes
    they held must be written again). None: not checked."""
    queue_replace: bool = False
    """``queue`` is the whole queue: members not in it are dropped."""
    fence: int | None = None
    """An engine pool's fencing token for the project (``acquire_lease``): the write is
    refused (``LeaseLostError``) unless it is still the project's. None: not checked."""
    entry_s: float | None = None
    """The engine's recent seconds per log entry applied (push-back projects the wait of the
    entries not applied yet from it). None: unchanged."""
    step_s: float | None = None
    """The engine's recent seconds per step of label entries: an entry appended now is served
    at the end of the step after the one under way, which holds the entries appended meanwhile
    (push-back adds it to the projected wait while entries wait). None: unchanged."""
    advance: bool = True
    """The write moves the applied position to ``position``. False: a write of the dyadic
    model's rows alone, after the posteriors of the same position were written (its own
    position is ``dyadic.position``)."""


class Store(Protocol):
    """What the API and the engine need from a backend (all methods are thread-safe)."""

    log_in_sql: bool
    """True when the log itself lives in the SQL database (embedded): nothing to archive."""

    # projects and keys
    def create_project(self, record: ProjectRecord) -> None: ...
    def get_project(self, name: str) -> ProjectRecord | None: ...
    def list_projects(self) -> list[ProjectRecord]: ...
    def project_names(self) -> list[str]:
        """Every project's name, sorted, without reading the records (one cheap read)."""
        ...

    def delete_project(self, name: str) -> bool: ...
    def catalogue_token(self) -> str | None:
        """A value that changes whenever a project is created or deleted, read in one cheap
        call: the engine reads every record (``list_projects``, whose cost grows with the
        number of projects) only when it changed. None: unknown, read the records."""
        ...

    def put_key(self, key_hash: str, record: KeyRecord) -> None: ...
    def get_key(self, key_hash: str) -> KeyRecord | None: ...
    def admin_key_hash(self) -> str | None: ...
    def set_admin_key_hash(self, key_hash: str) -> bool:
        """Set it unless one is set already; True when this call set it."""
        ...

    def list_keys(self, project: str | None) -> dict[str, KeyRecord]:
        """A project's keys by hash (None: the admin keys)."""
        ...

    def delete_key(self, key_hash: str) -> bool:
        """Revoke a key; False when no key has that hash."""
        ...

    def replace_admin_key(self, key_hash: str, record: KeyRecord) -> list[str]:
        """Make this key the only admin key; returns the hashes of the admin keys revoked."""
        ...

    # the label log
    def append(
        self,
        project: str,
        kind: EntryKind,
        payload: bytes,
        ids: list[str | None] | None = None,
        max_lag_s: float | None = None,
    ) -> AppendResult:
        """Append one entry atomically; labels whose id was seen before are marked duplicate.
        With ``max_lag_s``, checked in the same step first: raises ``EngineBehindError`` (and
        appends nothing) when ``lag_seconds`` exceeds it."""
        ...

    def lag_seconds(self, project: str) -> float:
        """How long the oldest log entry past the applied position has waited (0: none). An
        entry put back by a restore (Redis rebuilt from SQL) or found in the log when the
        embedded store started has no append time and counts 0."""
        ...

    def read_log(
        self,
        project: str,
        after: int,
        limit: int,
        anchor: int | None = None,
        served: int | None = None,
        seal: bool = False,
    ) -> list[LogEntry]:
        """Entries after position ``after``. With ``anchor`` (the token of the entry at
        ``after``, which the reader has applied), atomically checked first: raises
        ``LogRewoundError`` when the log no longer holds that entry, or (with ``served``)
        when the served state is no longer at the position the reader last wrote. With
        ``seal`` (the engine's read), in the same step: the entries returned are marked read,
        so an entry appended after them does not join them (``LogEntry.joins``)."""
        ...

    def holds(self, project: str, position: int, token: int) -> bool:
        """The log holds the entry at ``position`` with ``token``, or held it and trimmed it
        (its prefix is archived), and its read by the engine (the seal of ``read_log``) is
        still recorded; position 0 always. A state at that position can then be carried on."""
        ...

    def log_start(self, project: str) -> int:
        """Position of the first entry the live log holds (entries before it were trimmed:
        archived); the log end + 1 when it holds none."""
        ...

    def trim(self, project: str, upto: int, anchor: tuple[int, int] | None = None) -> None:
        """Drop log entries up to ``upto`` (archived in SQL and covered by a snapshot); with
        ``anchor`` (position, token) only while the log holds that entry."""
        ...

    def keys_for(self, project: str) -> dict[str, KeyRecord]:
        """The project's keys and the admin keys, by hash."""
        ...

    def log_end(self, project: str) -> int: ...
    def progress(self, projects: Sequence[str]) -> dict[str, Progress]:
        """``Progress`` of each project (absent ones left out): what ``log_end``,
        ``applied_position``, ``lag_seconds``, ``queue_size`` and ``get_params`` give, for
        all of them in one round trip."""
        ...

    def positions(self, projects: Sequence[str]) -> dict[str, tuple[int, int]]:
        """(``log_end``, ``applied_position``) of each project (absent ones left out), for all
        of them in one round trip: ``progress`` without its costlier reads."""
        ...

    def quiet_logs(self, heads: Mapping[str, tuple[int, int | None, int | None]]) -> set[str]:
        """The projects of ``heads`` (project -> position, its entry's token or None at
        position 0, served position or None) whose log ends at that very entry (or is empty)
        and whose served state is at that position: those where ``read_log(project,
        position, _, token, served)`` would return nothing and raise nothing. In one round
        trip. Those it could not ask (on a Redis Cluster, their node unreachable: a primary
        failing over) are neither, and in ``unreached``."""
        ...

    unreached: frozenset[str]
    """The projects the last ``quiet_logs`` could not ask: the engine leaves them for a later
    step, and goes on with the others."""

    def moved_since(self, cursor: str | None) -> tuple[str | None, set[str] | None]:
        """The projects whose log took an entry after ``cursor`` (what the previous call
        returned; None: from now on), and the cursor for the next call. None instead of the
        set when the store cannot tell (the first call; a store that keeps no record of
        appends; a record that may have lost some): then any project may have moved. In one
        round trip."""
        ...

    # served state
    def write_state(self, project: str, update: StateUpdate) -> None: ...
    def applied_position(self, project: str) -> int: ...
    def get_item(self, project: str, item: str) -> bytes | None: ...
    def get_params(self, project: str, slots: list[int]) -> tuple[bytes | None, list[bytes | None]]:
        """The shared parameters and the given slots' rows, read consistently."""
        ...

    def get_dyadic(
        self, project: str, raters: list[int], tasks: list[int]
    ) -> tuple[int, bytes | None, list[bytes | None], list[bytes | None]]:
        """(the position it has learned up to, shared parameters, rater rows, task rows) of
        the dyadic model, read consistently; None where nothing was written yet."""
        ...

    def scan_items(
        self, project: str, cursor: int, count: int
    ) -> tuple[int, list[tuple[str, bytes]]]:
        """A page of items from ``cursor`` (0 = start); the next cursor is 0 at the end."""
        ...

    def scan_records(
        self, project: str, cursor: int, count: int
    ) -> tuple[int, list[str], list[bytes]]:
        """``scan_items``' page as the items' names and packed records (no label lists:
        ``app.store.item_records.record_table`` reads them in columns)."""
        ...

    def get_worker(self, project: str, worker: str) -> bytes | None: ...
    def read_queue(self, project: str, count: int) -> list[tuple[str, float]]:
        """The ``count`` highest-scored items, best first (ties: by item id)."""
        ...

    def queue_size(self, project: str) -> int: ...
    def queue_head(self, project: str, count: int) -> QueueHead:
        """``read_queue``, ``queue_size``, the shared parameters and the queue's settings, as
        of one write of the engine."""
        ...

    def get_items(self, project: str, items: list[str]) -> list[bytes | None]: ...
    def queue_settings(self, project: str) -> bytes | None: ...

    def all_workers(self, project: str) -> list[tuple[str, bytes]]: ...

    # engine health
    def restoring(self) -> dict[str, int]:
        """Projects whose served state is being rebuilt (the store was restored from SQL, or
        the embedded service restarted), with the log position it must reach: until then
        their served answers are refused (503 ``restoring``), and the service is not ready."""
        ...

    def restoring_target(self, project: str) -> int:
        """``restoring()`` of one project: the position it must reach, 0 when it is served."""
        ...

    def set_project_failed(self, project: str, error: str | None) -> None:
        """The engine could not apply the project's log (None: it can again)."""
        ...

    def failed_projects(self) -> dict[str, str]:
        """Projects the engine could not apply, with the error."""
        ...

    # engine pools: one engine applies a project at a time
    def acquire_lease(self, project: str, holder: str, ttl_s: float) -> int:
        """Take or renew the project's lease for ``ttl_s``: its fencing token (a number that
        grows with every new holder) if ``holder`` holds it now, else 0."""
        ...

    def renew_leases(self, projects: list[str], holder: str, ttl_s: float) -> list[int | None]:
        """``acquire_lease`` of many projects in one round trip: their tokens (0: not held;
        None: on a Redis Cluster, the project's node unreachable or its slot moving,
        ``is_moving``: the lease neither renewed nor known to be lost)."""
        ...

    def release_lease(self, project: str, holder: str) -> None:
        """Give the lease up, if ``holder`` holds it."""
        ...

    def engines_alive(self, holder: str, ttl_s: float) -> list[str]:
        """Note that ``holder`` is alive now; the engines seen within the last ``ttl_s``."""
        ...

    def lease_holder(self, project: str) -> str | None:
        """Who holds the project's lease now (None: nobody)."""
        ...

    def pool_engines(self, ttl_s: float) -> list[str]:
        """The pool engines seen within the last ``ttl_s`` (``engines_alive`` without noting
        one)."""
        ...

    def record_loads(
        self, changes: Mapping[str, tuple[str, float] | None], read: bool = True
    ) -> dict[str, tuple[str, float]]:
        """Record, per project, the pool engine that applies it ("": none) and its labels/s
        (None: forget the project); return every project's record, in one round trip (with
        ``read=False``, write only and return {}: reading every record costs with the pool's
        number of projects)."""
        ...

    def wait_for_append(self, timeout_s: float) -> None:
        """Return once an entry is appended to any project's log (by any process, or one
        appended since the last call), or after ``timeout_s``: the idle engine's wait."""
        ...

    def ping(self) -> bool: ...
    def is_full(self, exc: BaseException) -> bool:
        """Whether ``exc`` is this store refusing a write for want of room (Redis at its
        maxmemory, the disk of the embedded store's folder full): nothing of the write was
        kept, and the same write succeeds once there is room."""
        ...

    def is_moving(self, exc: BaseException) -> bool:
        """Whether ``exc`` is Redis refusing a command while it moves: a Redis Cluster moving
        the command's keys between nodes (a resharding: ``TRYAGAIN``, redirections that
        outlasted the client's retries) or with a slot that has no primary, or a node that a
        failover made a replica (``READONLY``). The command was refused whole, and succeeds
        once the slot or the primary has settled."""
        ...

    def node_down(self, exc: BaseException) -> bool:
        """Whether ``exc`` is one node of a Redis Cluster not answering (the others may): the
        projects it holds wait, the others go on. Not a refusal: a write it cut off may or
        may not have been made."""
        ...

    def recover(self) -> None:
        """After an error reaching the store: what it needs to answer again (a Redis Cluster
        reads its layout anew, after a failover its new primaries); nothing elsewhere."""
        ...

    def close(self) -> None: ...


def nominal_config(record: ProjectRecord) -> NominalConfig:
    """The nominal model's config of a project (its record also holds the dyadic settings)."""
    return NominalConfig.from_dict({k: v for k, v in record.config.items() if k != "dyadic"})
