"""Every SQL row belongs to one deployment (its Redis key prefix, ``CROWDTALLY_REDIS_PREFIX``;
empty for the embedded store): two deployments sharing one database see only their own
projects, keys, archive and snapshots.

Existing rows are given the prefix of the deployment that upgrades (``upgrade(url,
deployment=...)``; from the alembic command line: the settings' prefix with
``CROWDTALLY_STORE=redis``, else empty).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-25
"""

from __future__ import annotations

import warnings

import sqlalchemy as sa
from alembic import context, op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

KEYED = {  # tables whose primary key gains the deployment, with their key's columns
    "projects": ["name"],
    "api_keys": ["key_hash"],
    "label_log": ["project", "position"],
    "label_ids": ["project", "label_id"],
}


def _deployment() -> str:
    given = context.config.attributes.get("deployment")
    if given is not None:
        return str(given)
    from app.settings import Settings

    settings = Settings()
    return settings.redis_prefix if settings.store == "redis" else ""


def upgrade() -> None:
    existing = _deployment()
    sqlite = op.get_bind().dialect.name == "sqlite"
    for table, key in [*KEYED.items(), ("snapshots", None)]:
        column = sa.Column("deployment", sa.String(64), nullable=False, server_default=existing)
        if sqlite:
            with warnings.catch_warnings(), op.batch_alter_table(table, recreate="always") as batch:
                # (SQLAlchemy warns that the copied columns' primary_key flags and the new key
                # differ; the new key is what the table gets)
                warnings.filterwarnings(
                    "ignore", ".*primary_key=True, not matching", sa.exc.SAWarning
                )
                batch.add_column(column)
                if key is not None:
                    batch.create_primary_key(f"pk_{table}", ["deployment", *key])
        else:
            op.add_column(table, column)
            if key is not None:
                op.drop_constraint(f"{table}_pkey", table, type_="primary")
                op.create_primary_key(f"{table}_pkey", table, ["deployment", *key])
        with op.batch_alter_table(table) as batch:
            batch.alter_column("deployment", server_default="")


def downgrade() -> None:
    sqlite = op.get_bind().dialect.name == "sqlite"
    for table, key in [*KEYED.items(), ("snapshots", None)]:
        if sqlite:
            with op.batch_alter_table(table, recreate="always") as batch:
                if key is not None:
                    batch.create_primary_key(f"pk_{table}", key)
                batch.drop_column("deployment")
        else:
            if key is not None:
                op.drop_constraint(f"{table}_pkey", table, type_="primary")
            op.drop_column(table, "deployment")
            if key is not None:
                op.create_primary_key(f"{table}_pkey", table, key)
