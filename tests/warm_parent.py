"""Imported once by the forkserver of tests/forked.py: what ``crowdtally serve`` and
``crowdtally engine`` import and load, so that each command forked from it starts warm."""

import importlib

from app.serving import warmup

# with the SQL drivers and dialects the snapshot database is opened with (about 0.1 s of each
# engine's start on PostgreSQL), and Alembic for a database not yet migrated
for module in ("app.cli", "app.cli.service", "app.api.main", "app.engine.runtime",
               "app.store.archive", "uvicorn", "psycopg", "sqlalchemy.dialects.postgresql.psycopg",
               "sqlalchemy.dialects.sqlite.pysqlite", "alembic.command"):  # fmt: skip
    importlib.import_module(module)
warmup.everything()
warmup.freeze_what_is_loaded()  # the forks' own collections need not walk it
