"""What the commands share: the settings (a bad one is an ``InputError``), the snapshot
database and the store."""

from __future__ import annotations

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


def snapshot_db(create: bool = True) -> SnapshotDB:
    """The snapshot database of the settings; unless ``create``, an InputError when it is a
    SQLite file that does not exist (a listing does not make a data folder where it runs)."""
    from app.store.archive import open_snapshot_db  # imported here: extract stays light

    settings = load_settings()
    url = settings.database_url_resolved()
    if not create and url.startswith("sqlite:///") and not Path(url[len("sqlite:///") :]).exists():
        variable = "CROWDTALLY_DATABASE_URL" if settings.database_url else "CROWDTALLY_DATA_DIR"
        raise InputError(variable, None, f"no snapshot database at {url[len('sqlite:///') :]} "
                         f"(set {variable} as the service has it)")  # fmt: skip
    return open_snapshot_db(settings)


def existing_store(settings: Settings) -> Store:
    """``open_store``, but an InputError where the embedded store's file does not exist (a
    mistyped data folder: opening it would make an empty one)."""
    from app.store import open_store

    if settings.store == "embedded":
        path = settings.data_dir / "crowdtally.sqlite3"
        if not path.exists():
            raise InputError("CROWDTALLY_DATA_DIR", None, f"no store at {path} (set "
                             "CROWDTALLY_DATA_DIR as the service has it)")  # fmt: skip
    return open_store(settings)
