"""What the commands share: the settings (a bad one is an ``InputError``), the snapshot database."""

from __future__ import annotations

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


def snapshot_db() -> SnapshotDB:
    from app.store.archive import open_snapshot_db  # imported here: extract stays light

    return open_snapshot_db(load_settings())
