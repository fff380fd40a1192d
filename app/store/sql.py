"""The SQL side (SQLAlchemy 2): project catalogue, label archive, snapshots.

PostgreSQL in production, a SQLite file in the embedded mode; the schema is managed by
Alembic (``migrations/``). In the embedded mode ``label_log`` *is* the label log; with Redis
it is the archive of every label, written before the Redis log is trimmed.
"""

from __future__ import annotations

import time
from pathlib import Path

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    Index,
    Integer,
    LargeBinary,
    String,
    create_engine,
    event,
    false,
    text,
)
from sqlalchemy.engine import Engine, ExceptionContext
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

REPO = Path(__file__).resolve().parents[2]


class Base(DeclarativeBase):
    pass


class ProjectRow(Base):
    __tablename__ = "projects"
    deployment: Mapped[str] = mapped_column(String(64), primary_key=True, server_default="")
    """The deployment's Redis key prefix (``CROWDTALLY_REDIS_PREFIX``; empty for the embedded
    store): deployments sharing one database never see each other's rows."""
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    labels: Mapped[list[str]] = mapped_column(JSON)
    config: Mapped[dict[str, object]] = mapped_column(JSON)
    created_at: Mapped[float] = mapped_column(Float)


class ApiKeyRow(Base):
    __tablename__ = "api_keys"
    deployment: Mapped[str] = mapped_column(String(64), primary_key=True, server_default="")
    """The deployment's Redis key prefix (``CROWDTALLY_REDIS_PREFIX``; empty for the embedded
    store): deployments sharing one database never see each other's rows."""
    key_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    key_id: Mapped[str] = mapped_column(String(16))
    scope: Mapped[str] = mapped_column(String(8))
    project: Mapped[str | None] = mapped_column(String(64), index=True)
    created_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class LogRow(Base):
    __tablename__ = "label_log"
    deployment: Mapped[str] = mapped_column(String(64), primary_key=True, server_default="")
    """The deployment's Redis key prefix (``CROWDTALLY_REDIS_PREFIX``; empty for the embedded
    store): deployments sharing one database never see each other's rows."""
    project: Mapped[str] = mapped_column(String(64), primary_key=True)
    position: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    kind: Mapped[str] = mapped_column(String(8))
    payload: Mapped[bytes] = mapped_column(LargeBinary)
    keep: Mapped[bytes] = mapped_column(LargeBinary)
    token: Mapped[int] = mapped_column(BigInteger, default=1, server_default="1")
    """The entry's token in the Redis log (``LogEntry.token``)."""
    joins: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    """``LogEntry.joins``: appended while the entry before it was unread by the engine."""
    ids: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    """The block's label ids, newline-joined (an empty line: a label without one); the
    embedded store's, from which it rebuilds the set of ids seen (``core.idset``)."""


class LabelIdRow(Base):
    """The embedded store's seen label ids as files before revision 0005 kept them, one row
    per id: read once at start, no longer written (each log entry keeps its ids)."""

    __tablename__ = "label_ids"
    deployment: Mapped[str] = mapped_column(String(64), primary_key=True, server_default="")
    """The deployment's Redis key prefix (``CROWDTALLY_REDIS_PREFIX``; empty for the embedded
    store): deployments sharing one database never see each other's rows."""
    project: Mapped[str] = mapped_column(String(64), primary_key=True)
    label_id: Mapped[str] = mapped_column(String(512), primary_key=True)


class SnapshotRow(Base):
    __tablename__ = "snapshots"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    deployment: Mapped[str] = mapped_column(String(64), server_default="")
    project: Mapped[str] = mapped_column(String(64))
    position: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[float] = mapped_column(Float)
    n_items: Mapped[int] = mapped_column(BigInteger)
    n_workers: Mapped[int] = mapped_column(BigInteger)
    n_labels: Mapped[int] = mapped_column(BigInteger)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    state: Mapped[bytes] = mapped_column(LargeBinary)
    token: Mapped[int] = mapped_column(BigInteger, default=1, server_default="1")
    """Token of the log entry at ``position``: the snapshot belongs to the log that still holds
    that entry (a Redis gone back in time may hold another one there, or none)."""

    __table_args__ = (
        Index("ix_snapshots_project_position", "project", "position"),
        {"sqlite_autoincrement": True},  # (an id is never given again: migration 0007)
    )


READ_ONLY_SQLSTATE = "25006"
"""PostgreSQL's read_only_sql_transaction: a write in a session of a standby or read-only
server."""


def sql_engine(url: str) -> Engine:
    """An engine; SQLite files get WAL and ``synchronous=NORMAL`` (durable across a crash of
    the process, the fsync at checkpoints)."""
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, pool_pre_ping=True)
    if engine.dialect.name == "postgresql":

        @event.listens_for(engine, "handle_error")
        def _standby_drops_the_pool(ctx: ExceptionContext) -> None:
            # A server that a failover made a standby (or one set read-only) refuses writes in
            # every session opened on it, and the pool would keep those sessions once the
            # address names a writable primary again: taken as a disconnect, the pool's
            # connections are dropped and the next ones are new.
            if getattr(ctx.original_exception, "sqlstate", None) == READ_ONLY_SQLSTATE:
                ctx.is_disconnect = True

    if engine.dialect.name == "sqlite":

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn, _record):  # type: ignore[no-untyped-def]
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()

    return engine


HEAD = "0007"
"""The newest migration (``migrations/versions``; a test checks it is Alembic's head)."""


REVISIONS = frozenset(f.name[:4] for f in (REPO / "migrations" / "versions").glob("0*.py"))
"""Every migration this code knows (``migrations/versions``)."""


class NewerSchemaError(SQLAlchemyError):
    """The database's schema was made by a newer crowdtally (a revision this code lacks)."""


def schema_revision(url: str, reachable: bool = False) -> str | None:
    """The database's Alembic revision (None: none recorded, or no database yet). With
    ``reachable``, a database that cannot be connected to raises (SQLAlchemyError) instead."""
    engine = sql_engine(url)
    try:
        with engine.connect() as conn:
            try:
                return conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
            except SQLAlchemyError:
                return None
    except SQLAlchemyError:
        if reachable:
            raise
        return None
    finally:
        engine.dispose()


def refuse_newer(found: str | None) -> None:
    """A ``NewerSchemaError`` for a schema revision this crowdtally does not know."""
    if found is not None and found not in REVISIONS:
        raise NewerSchemaError(
            f"its schema is at revision {found!r}, which this crowdtally does not know (its "
            f"newest is {HEAD!r}): a newer crowdtally wrote it; run that one, or a copy of the "
            "database from before"
        )


def upgrade(
    url: str, revision: str = "head", attempts: int = 3, deployment: str | None = None
) -> None:
    """``alembic upgrade`` programmatically (the service runs it on start). The API and the
    engine may both start on an empty database: the loser of that race retries. A database
    already at the newest revision is left as it is without loading Alembic (about 0.2 s of
    each process's start)."""
    found = schema_revision(url)
    if revision == "head" and found == HEAD:
        return
    refuse_newer(found)
    from alembic import command
    from alembic.config import Config

    cfg = Config(str(REPO / "alembic.ini"))
    cfg.attributes["configure_logger"] = False  # the service's logging stays as configured
    if deployment is not None:  # (whose rows are those already there: migration 0004)
        cfg.attributes["deployment"] = deployment
    cfg.set_main_option("script_location", str(REPO / "migrations"))
    cfg.set_main_option("sqlalchemy.url", url)
    for attempt in range(attempts):
        try:
            command.upgrade(cfg, revision)
            return
        except Exception:
            if attempt == attempts - 1:
                raise
            time.sleep(0.5 * (attempt + 1))


def downgrade(url: str, revision: str) -> None:
    from alembic import command
    from alembic.config import Config

    cfg = Config(str(REPO / "alembic.ini"))
    cfg.set_main_option("script_location", str(REPO / "migrations"))
    cfg.set_main_option("sqlalchemy.url", url)
    command.downgrade(cfg, revision)
