"""The SQL side of durability: snapshots, the label archive and the project catalogue.

``SnapshotDB`` writes what the engine's ``Snapshotter`` hands it (the snapshot blob with the
log entries it covers, in one transaction) and reads it back; ``rebuild_store`` brings an
emptied store (a wiped Redis) back from it. Snapshot blobs are opaque here: encoding and
restoring them is ``app.engine.snapshots``'s job.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Sized
from dataclasses import dataclass
from typing import Any, Protocol, cast

import orjson
from sqlalchemy import delete, func, select
from sqlalchemy.engine import Engine
from sqlalchemy.exc import (
    DBAPIError,
    IntegrityError,
    InterfaceError,
    OperationalError,
    SQLAlchemyError,
)
from sqlalchemy.orm import Session

from app.settings import Settings
from app.store.base import EntryKind, KeyRecord, LogEntry, ProjectRecord, Scope, Store
from app.store.sql import (
    HEAD,
    ApiKeyRow,
    LabelIdRow,
    LogRow,
    ProjectRow,
    SnapshotRow,
    refuse_newer,
    schema_revision,
    sql_engine,
    upgrade,
)

log = logging.getLogger("crowdtally.snapshots")


class SnapshotMeta(Protocol):
    """What ``SnapshotDB.write`` reads of a capture (``app.engine.snapshots.Capture``)."""

    project: str
    position: int
    token: int

    @property
    def item_names(self) -> Sized: ...

    @property
    def worker_names(self) -> Sized: ...

    @property
    def n_labels(self) -> int: ...


@dataclass(frozen=True)
class SnapshotInfo:
    id: int
    project: str
    position: int
    created_at: float
    n_items: int
    n_workers: int
    n_labels: int
    size_bytes: int

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _info(row: SnapshotRow) -> SnapshotInfo:
    return SnapshotInfo(
        row.id, row.project, row.position, row.created_at, row.n_items, row.n_workers,
        row.n_labels, row.size_bytes,
    )  # fmt: skip


class SnapshotDB:
    """Snapshots, the label archive and the project catalogue in the SQL database."""

    def __init__(self, engine: Engine, deployment: str = "") -> None:
        self.engine = engine
        self.deployment = deployment
        """Every row read or written is this deployment's (its Redis key prefix; empty for
        the embedded store): deployments sharing one database do not see each other's."""

    def close(self) -> None:
        self.engine.dispose()

    def write(
        self, cap: SnapshotMeta, blob: bytes, archive: list[LogEntry], keep: int
    ) -> SnapshotInfo:
        """Archive the log entries, write the snapshot, apply retention: one transaction."""
        with Session(self.engine) as s, s.begin():
            self._archive(s, cap.project, archive)
            row = SnapshotRow(
                deployment=self.deployment,
                project=cap.project,
                position=cap.position,
                created_at=time.time(),
                n_items=len(cap.item_names),
                n_workers=len(cap.worker_names),
                n_labels=cap.n_labels,
                size_bytes=len(blob),
                state=blob,
                token=cap.token,
            )
            s.add(row)
            s.flush()
            info = _info(row)
            old = s.scalars(
                select(SnapshotRow.id)
                .where(
                    SnapshotRow.deployment == self.deployment, SnapshotRow.project == cap.project
                )
                .order_by(SnapshotRow.position.desc(), SnapshotRow.id.desc())
                .offset(keep)
            ).all()
            if old:
                s.execute(delete(SnapshotRow).where(SnapshotRow.id.in_(old)))
        return info

    def archive(self, project: str, entries: list[LogEntry]) -> None:
        """Archive log entries without a snapshot (those archived already are kept): one
        transaction."""
        with Session(self.engine) as s, s.begin():
            self._archive(s, project, entries)

    def _archive(self, s: Session, project: str, archive: list[LogEntry]) -> None:
        if not archive:
            return
        have = set(
            s.scalars(
                select(LogRow.position).where(
                    LogRow.deployment == self.deployment,
                    LogRow.project == project,
                    LogRow.position.between(archive[0].position, archive[-1].position),
                )
            )
        )
        s.add_all(
            LogRow(
                deployment=self.deployment,
                project=project,
                position=e.position,
                kind=e.kind,
                payload=e.payload,
                keep=e.keep,
                token=e.token,
                joins=e.joins,
            )
            for e in archive
            if e.position not in have
        )

    def infos(self, project: str | None = None) -> list[SnapshotInfo]:
        cols = [
            c for c in SnapshotRow.__table__.c if c.name not in ("state", "token", "deployment")
        ]
        q = (
            select(*cols)
            .where(SnapshotRow.deployment == self.deployment)
            .order_by(SnapshotRow.project, SnapshotRow.position)
        )
        if project is not None:
            q = q.where(SnapshotRow.project == project)
        with self.engine.connect() as c:
            return [SnapshotInfo(**r._mapping) for r in c.execute(q)]

    @staticmethod
    def is_down(exc: BaseException) -> bool:
        """Whether ``exc`` is this database not answering, or refusing writes (a standby: its
        connections dropped): what waits for it comes back once it answers."""
        return isinstance(exc, OperationalError | InterfaceError) or (
            isinstance(exc, DBAPIError) and exc.connection_invalidated
        )

    def infos_if_reachable(self) -> list[SnapshotInfo] | None:
        """``infos()``, or None while the database cannot be used (down, or failing): what
        the service's probes (``/readyz``, ``/metrics``) report instead of failing with it."""
        try:
            return self.infos()
        except SQLAlchemyError:
            return None

    def latest(self, project: str) -> tuple[SnapshotInfo, bytes] | None:
        with Session(self.engine) as s:
            row = s.scalars(
                select(SnapshotRow)
                .where(SnapshotRow.deployment == self.deployment, SnapshotRow.project == project)
                .order_by(SnapshotRow.position.desc(), SnapshotRow.id.desc())
                .limit(1)
            ).first()
            return (_info(row), row.state) if row else None

    def get(self, snapshot_id: int) -> tuple[SnapshotInfo, bytes] | None:
        with Session(self.engine) as s:
            row = s.get(SnapshotRow, snapshot_id)
            mine = row is not None and row.deployment == self.deployment
            return (_info(row), row.state) if row is not None and mine else None

    def delete(self, snapshot_id: int) -> bool:
        with Session(self.engine) as s, s.begin():
            result: Any = s.execute(
                delete(SnapshotRow).where(
                    SnapshotRow.deployment == self.deployment, SnapshotRow.id == snapshot_id
                )
            )
            return bool(result.rowcount)

    def archived_position(self, project: str) -> int:
        with self.engine.connect() as c:
            v = c.execute(
                select(func.max(LogRow.position)).where(
                    LogRow.deployment == self.deployment, LogRow.project == project
                )
            ).scalar()
            return int(v or 0)

    def read_archive(self, project: str, after: int, limit: int) -> list[LogEntry]:
        with self.engine.connect() as c:
            rows = c.execute(
                select(
                    LogRow.position,
                    LogRow.kind,
                    LogRow.payload,
                    LogRow.keep,
                    LogRow.token,
                    LogRow.joins,
                )
                .where(
                    LogRow.deployment == self.deployment,
                    LogRow.project == project,
                    LogRow.position > after,
                )
                .order_by(LogRow.position)
                .limit(limit)
            )
            return [
                LogEntry(p, cast(EntryKind, k), bytes(b), bytes(m), int(t), bool(j))
                for p, k, b, m, t, j in rows
            ]

    def anchors(self, project: str) -> list[tuple[int, int, int]]:
        """(id, position, token) of the project's snapshots, newest first."""
        with self.engine.connect() as c:
            rows = c.execute(
                select(SnapshotRow.id, SnapshotRow.position, SnapshotRow.token)
                .where(SnapshotRow.deployment == self.deployment, SnapshotRow.project == project)
                .order_by(SnapshotRow.position.desc(), SnapshotRow.id.desc())
            )
            return [(int(i), int(p), int(t)) for i, p, t in rows]

    def rewind(self, project: str, position: int, snapshot_ids: list[int]) -> None:
        """Forget what SQL holds past ``position`` of a log gone back in time: the snapshots
        given and the archived entries after ``position`` (the live log holds them, or lost
        them), in one transaction."""
        with Session(self.engine) as s, s.begin():
            if snapshot_ids:
                s.execute(
                    delete(SnapshotRow).where(
                        SnapshotRow.deployment == self.deployment, SnapshotRow.id.in_(snapshot_ids)
                    )
                )
            s.execute(
                delete(LogRow).where(
                    LogRow.deployment == self.deployment,
                    LogRow.project == project,
                    LogRow.position > position,
                )
            )

    # the catalogue (kept here so a wiped Redis can be rebuilt) ---------------------------
    def save_project(self, record: ProjectRecord) -> None:
        with Session(self.engine) as s, s.begin():
            s.merge(
                ProjectRow(
                    deployment=self.deployment,
                    name=record.name,
                    labels=list(record.labels),
                    config=record.config,
                    created_at=record.created_at,
                )
            )

    def save_keys(self, project: str, keys: dict[str, KeyRecord]) -> None:
        """Make the archived keys of ``project`` and the admin keys exactly ``keys`` (a key
        revoked since the last snapshot goes: a rebuilt store must not bring it back)."""

        def save(s: Session) -> None:
            s.execute(
                delete(ApiKeyRow).where(
                    ApiKeyRow.deployment == self.deployment,
                    (ApiKeyRow.project == project) | ApiKeyRow.project.is_(None),
                    ApiKeyRow.key_hash.not_in(list(keys)),
                )
            )
            for h, k in keys.items():
                s.merge(_key_row(self.deployment, h, k))

        self._merging(save)

    def put_keys(self, keys: dict[str, KeyRecord]) -> None:
        """Archive keys at once (a rotated admin key: not only at the next snapshot)."""

        def put(s: Session) -> None:
            for h, k in keys.items():
                s.merge(_key_row(self.deployment, h, k))

        self._merging(put)

    def _merging(self, work: Callable[[Session], None], attempts: int = 3) -> None:
        """``work`` in a transaction, again if another one inserted a row it merges in
        between (engines of a pool snapshot their projects at once, and every project's keys
        include the admin keys: both find a row absent, both insert it, one fails)."""
        for attempt in range(attempts):
            try:
                with Session(self.engine) as s, s.begin():
                    work(s)
                return
            except IntegrityError:
                if attempt == attempts - 1:
                    raise

    def delete_keys(self, key_hashes: list[str]) -> None:
        """Revoked keys leave the archive at once (not only at the next snapshot)."""
        if key_hashes:
            with Session(self.engine) as s, s.begin():
                s.execute(
                    delete(ApiKeyRow).where(
                        ApiKeyRow.deployment == self.deployment, ApiKeyRow.key_hash.in_(key_hashes)
                    )
                )

    def save_ids(self, project: str, ids: list[str]) -> None:
        if not ids:
            return
        with Session(self.engine) as s, s.begin():
            have = set(
                s.scalars(
                    select(LabelIdRow.label_id).where(
                        LabelIdRow.deployment == self.deployment,
                        LabelIdRow.project == project,
                        LabelIdRow.label_id.in_(ids),
                    )
                )
            )
            s.add_all(
                LabelIdRow(deployment=self.deployment, project=project, label_id=i)
                for i in dict.fromkeys(ids)
                if i not in have
            )

    def projects(self) -> list[ProjectRecord]:
        with Session(self.engine) as s:
            return [
                ProjectRecord(r.name, tuple(r.labels), dict(r.config), r.created_at)
                for r in s.scalars(
                    select(ProjectRow)
                    .where(ProjectRow.deployment == self.deployment)
                    .order_by(ProjectRow.name)
                )
            ]

    def other_deployments(self) -> dict[str, list[str]]:
        """The projects the database holds for deployments other than this one, by
        deployment (a Redis key prefix; empty for the embedded store)."""
        with Session(self.engine) as s:
            rows = s.execute(
                select(ProjectRow.deployment, ProjectRow.name)
                .where(ProjectRow.deployment != self.deployment)
                .order_by(ProjectRow.deployment, ProjectRow.name)
            )
            out: dict[str, list[str]] = {}
            for deployment, name in rows:
                out.setdefault(deployment, []).append(name)
            return out

    def project(self, name: str) -> ProjectRecord | None:
        """The catalogue's record of a project (as of its latest snapshot)."""
        with Session(self.engine) as s:
            r = s.get(ProjectRow, (self.deployment, name))
            return (
                ProjectRecord(r.name, tuple(r.labels), dict(r.config), r.created_at) if r else None
            )

    def keys(self) -> dict[str, KeyRecord]:
        with Session(self.engine) as s:
            rows = s.scalars(select(ApiKeyRow).where(ApiKeyRow.deployment == self.deployment))
            return {
                r.key_hash: KeyRecord(r.key_id, cast(Scope, r.scope), r.project, r.created_at)
                for r in rows
            }

    def ids(self, project: str) -> list[str]:
        with self.engine.connect() as c:
            return list(
                c.execute(
                    select(LabelIdRow.label_id).where(
                        LabelIdRow.deployment == self.deployment, LabelIdRow.project == project
                    )
                ).scalars()
            )

    def forget_snapshots(self, project: str) -> None:
        with Session(self.engine) as s, s.begin():
            s.execute(
                delete(SnapshotRow).where(
                    SnapshotRow.deployment == self.deployment, SnapshotRow.project == project
                )
            )

    def forget_project(self, project: str, unless_created_at: float | None = None) -> None:
        """Drop everything SQL holds of ``project``; with ``unless_created_at``, nothing when
        its record has that creation time (archived meanwhile by the API that made it). That
        condition is part of every delete, not read before them: an API that archives the
        project between a read and the deletes (the engine loads a project as it is made)
        would else lose its record and key to them."""
        of_project = (ProjectRow.deployment == self.deployment, ProjectRow.name == project)
        deletes = [
            delete(table).where(table.deployment == self.deployment, table.project == project)
            for table in (SnapshotRow, LogRow, LabelIdRow, ApiKeyRow)
        ] + [delete(ProjectRow).where(*of_project)]
        if unless_created_at is not None:
            archived = select(ProjectRow.name).where(
                *of_project, ProjectRow.created_at == unless_created_at
            )
            deletes = [rows.where(~archived.exists()) for rows in deletes]
        with Session(self.engine) as s, s.begin():
            for rows in deletes:
                s.execute(rows)


def _key_row(deployment: str, key_hash: str, k: KeyRecord) -> ApiKeyRow:
    return ApiKeyRow(
        deployment=deployment,
        key_hash=key_hash,
        key_id=k.key_id,
        scope=k.scope,
        project=k.project,
        created_at=k.created_at,
    )


def open_snapshot_db(settings: Settings, migrate: bool = True) -> SnapshotDB:
    """The snapshot database, migrated to the current schema (``alembic upgrade head``); with
    ``migrate`` False (a command that only reads it, or deletes a snapshot) it is left as it is,
    and a schema other than the current one is a ``SchemaMismatchError``: a newer command
    line's listing must not migrate a database that older services still use."""
    url = settings.database_url_resolved()
    deployment = settings.redis_prefix if settings.store == "redis" else ""
    if migrate:
        upgrade(url, deployment=deployment)
    elif (found := schema_revision(url, reachable=True)) != HEAD:
        refuse_newer(found)
        raise SchemaMismatchError(found)
    return SnapshotDB(sql_engine(url), deployment)


class SchemaMismatchError(RuntimeError):
    """The snapshot database's schema is not the one this crowdtally reads."""

    def __init__(self, found: str | None) -> None:
        self.found = found
        at = f"at schema revision {found}" if found else "without crowdtally's tables"
        super().__init__(
            f"it is {at}, and this crowdtally reads revision {HEAD}: run the crowdtally "
            "the service runs, or start this one's service, which migrates it (this command "
            "changes no schema)"
        )


REBUILD_LEASE = "-rebuild"
"""The lease a process holds while it rebuilds a wiped store, so that the API processes and
engines that find it wiped at once rebuild it once (not a project's: their names start with a
letter or a digit)."""
REBUILD_TTL_S = 30.0
"""The rebuild lease's time to live, renewed after every project rebuilt: a process that dies
while it rebuilds leaves the rebuild to another after this long."""


def rebuild_store(store: Store, db: SnapshotDB, poll_s: float = 0.05) -> list[str]:
    """Bring back into an emptied store (a wiped Redis) every project the SQL side knows:
    each project's archived log after the latest snapshot with its seen label ids, then its
    record (``restore_project``: no engine or append finds it without its log), then the keys,
    then the admin key's pointer, whose absence is how a wiped store is seen. The engine then
    restores the snapshot and replays. One process at a time rebuilds (``REBUILD_LEASE``); the
    others wait for it, then find nothing left to do. Returns the projects rebuilt."""
    restore = cast(Callable[..., bool] | None, getattr(store, "restore_project", None))
    if restore is None:
        return []
    holder = secrets.token_hex(8)
    while not store.acquire_lease(REBUILD_LEASE, holder, REBUILD_TTL_S):
        time.sleep(poll_s)
    try:
        return _rebuild(store, db, restore, holder)
    finally:
        store.release_lease(REBUILD_LEASE, holder)


def _rebuild(store: Store, db: SnapshotDB, restore: Callable[..., bool], holder: str) -> list[str]:
    wiped = store.admin_key_hash() is None
    have = store.project_names()
    open_logs = getattr(store, "open_logs", None)
    if open_logs is not None:
        open_logs(have)  # (projects made before appends needed an open log)
    rebuilt = []
    for record in db.projects():
        if record.name in have:
            continue
        start, after, entries, ids = _archived_log(db, record.name)
        if not restore(record, entries, ids, max(after, start)):
            continue  # (put back by another process whose lease lapsed)
        rebuilt.append(record.name)
        log.warning("%s: rebuilt from SQL (snapshot at %d, log end %d)", record.name, start, after)
        store.acquire_lease(REBUILD_LEASE, holder, REBUILD_TTL_S)  # (renewed)
    keys = db.keys()
    admins = {h: k for h, k in keys.items() if k.scope == "admin"}
    for h, k in keys.items():
        if k.scope != "admin" and (wiped or k.project in rebuilt):
            store.put_key(h, k)
    if wiped and admins:
        for h, k in admins.items():
            store.put_key(h, k)  # every archived admin key, as recorded
        first = next(iter(admins))
        store.set_admin_key_hash(first)  # (last: the store is no longer wiped)
        store.put_key(first, admins[first])  # (its record as archived, not made anew)
    return rebuilt


def _archived_log(db: SnapshotDB, project: str) -> tuple[int, int, list[LogEntry], list[str]]:
    """The project's archive: the latest snapshot's position, the last entry's, the entries
    from the snapshot's own on (its anchor), and every label id kept in the whole archive."""
    latest = db.latest(project)
    start = latest[0].position if latest else 0
    ids: list[str] = []
    entries: list[LogEntry] = []
    after = 0
    while True:
        chunk = db.read_archive(project, after, 10_000)
        if not chunk:
            break
        for e in chunk:
            if e.kind == "labels":
                body_ids = orjson.loads(e.payload).get("ids") or []
                keep = e.keep or b"1" * len(body_ids)
                ids.extend(i for i, k in zip(body_ids, keep, strict=True) if i and k == ord("1"))
            if e.position >= start:  # (the snapshot's own entry too: its anchor)
                entries.append(e)
        after = chunk[-1].position
    return start, after, entries, ids
