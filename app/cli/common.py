"""What the commands share: the settings (a bad one is an ``InputError``), the snapshot database."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from app.io.input import InputError

if TYPE_CHECKING:  # imported when a command needs them: extract stays light
    from app.settings import Settings
    from app.store.archive import SnapshotDB


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
        raise InputError(
            "CROWDTALLY_DATA_DIR", None, f"no snapshot database at {url[len('sqlite:///') :]}"
        )
    return open_snapshot_db(settings)
