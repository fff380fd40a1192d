"""What the commands share: the settings (a bad one is an ``InputError``), the snapshot
database and the store."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING

from app.io.input import InputError

if TYPE_CHECKING:  # imported when a command needs them: extract stays light
    from app.settings import Settings
    from app.store.archive import SnapshotDB
    from app.store.base import Store


def load_settings() -> Settings:
    from pydantic import ValidationError

    from app.settings import Settings

    try:
        return Settings()
    except ValidationError as exc:
        err = exc.errors()[0]
        raise InputError("CROWDTALLY_" + str(err["loc"][0]).upper(), None, err["msg"]) from None


def snapshot_db(create: bool = True, migrate: bool = True) -> SnapshotDB:
    """The snapshot database of the settings; unless ``create``, an InputError when it is a
    SQLite file that does not exist (a listing does not make a data folder where it runs);
    unless ``migrate``, one when its schema is not the current one (``open_snapshot_db``)."""
    settings = load_settings()
    url = settings.database_url_resolved()
    if not create and url.startswith("sqlite:///") and not Path(url[len("sqlite:///") :]).exists():
        variable = "CROWDTALLY_DATABASE_URL" if settings.database_url else "CROWDTALLY_DATA_DIR"
        raise InputError(variable, None, f"no snapshot database at {url[len('sqlite:///') :]} "
                         f"(set {variable} as the service has it)")  # fmt: skip
    return open_database(settings, migrate)


DATABASE_STARTING = (
    "the database system is starting up",
    "the database system is shutting down",
    "the database system is in recovery mode",
)
"""What PostgreSQL answers while it cannot take a connection yet: waited for as silence is."""


def open_database(settings: Settings, migrate: bool = True, who: str | None = None) -> SnapshotDB:
    """The snapshot database (``open_snapshot_db``); one that cannot be opened, or whose
    schema a command that does not ``migrate`` cannot read, is one error line naming the
    setting. With ``who`` (a service starting), a PostgreSQL that does not answer is waited
    for, as Redis is (``app.store.when_reachable``): a service started before its database,
    or restarted while it is down, starts once it is up."""
    from sqlalchemy.exc import OperationalError, SQLAlchemyError

    from app.store import when_reachable
    from app.store.archive import SchemaMismatchError, open_snapshot_db

    def unreachable(exc: Exception) -> bool:
        # a server that answered says why it refused (a role, a password, a database) after
        # "FATAL:", unless it is only starting or stopping; one that did not answer says
        # "Connection refused", "timeout expired", or that the host name is unknown
        text = str(getattr(exc, "orig", None) or exc)
        transient = any(m in text for m in DATABASE_STARTING)
        return isinstance(exc, OperationalError) and ("FATAL:" not in text or transient)

    what = "CROWDTALLY_DATABASE_URL" if settings.database_url else "CROWDTALLY_DATA_DIR"
    try:
        if who is None or settings.database_url_resolved().startswith("sqlite"):
            return open_snapshot_db(settings, migrate)
        attempt = functools.partial(open_snapshot_db, settings, migrate)
        return when_reachable(attempt, unreachable, who, "the snapshot database")
    except (SQLAlchemyError, OSError, ImportError) as err:  # (ImportError: no driver)
        first = str(err).splitlines()[0]
        raise InputError(what, None, f"cannot open the snapshot database: {first}") from None
    except SchemaMismatchError as err:
        raise InputError(what, None, f"the snapshot database: {err}") from None


def existing_store(settings: Settings) -> Store:
    """``open_store``, but an InputError where the embedded store's file does not exist (a
    mistyped data folder: opening it would make an empty one)."""
    from app.store import open_store

    if settings.store == "embedded":
        path = settings.data_dir / "crowdtally.sqlite3"
        if not path.exists():
            raise InputError("CROWDTALLY_DATA_DIR", None, f"no store at {path} (set "
                             "CROWDTALLY_DATA_DIR as the service has it)")  # fmt: skip
        hold_data_dir(settings)
    store = open_store(settings)
    if settings.store == "redis" and not store.ping():
        raise InputError("REDIS_URL", None, f"Redis does not answer at {settings.redis_url}")
    return store


_HELD: dict[Path, int] = {}
"""The data folders' lock files' descriptors, open (so locked) until the process exits."""


def hold_data_dir(settings: Settings) -> None:
    """The embedded store is one process's (its served state and ids live in that process):
    take the data folder's lock, held until exit, or an InputError naming the process that
    holds it (a second service on the folder broke the first: both appended to one log)."""
    import fcntl
    import os

    folder = settings.data_dir
    if settings.store != "embedded" or folder.resolve() in _HELD:
        return
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / "crowdtally.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise InputError("CROWDTALLY_DATA_DIR", None, f"{folder} is in use by another crowdtally "
                         f"process (pid {holder}): one process per embedded store; stop it, or "
                         "give this one its own CROWDTALLY_DATA_DIR") from None  # fmt: skip
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    _HELD[folder.resolve()] = fd


def use_store(flag: str | None, default: str | None = None) -> None:
    """The store a command runs on: its ``--store`` flag, over CROWDTALLY_STORE; without the
    flag, the variable, else ``default`` (None: the settings' own, embedded)."""
    import os

    from app.settings import STORES  # (pydantic-settings: not loaded by every command)

    if flag is not None:
        if flag not in STORES:
            raise InputError("--store", None, f"{flag!r}: one of {', '.join(STORES)}")
        os.environ["CROWDTALLY_STORE"] = flag
    elif default is not None:
        os.environ.setdefault("CROWDTALLY_STORE", default)
