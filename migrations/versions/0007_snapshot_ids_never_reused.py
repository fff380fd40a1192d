"""A snapshot's id is never given again: on SQLite the table is made again with AUTOINCREMENT
(an INTEGER PRIMARY KEY alone hands out the largest id plus one, so deleting the newest
snapshot gave its id to the next one). PostgreSQL's sequence never went back: unchanged.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30
"""

from __future__ import annotations

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def _recreate(autoincrement: bool) -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    with op.batch_alter_table(
        "snapshots", recreate="always", table_kwargs={"sqlite_autoincrement": autoincrement}
    ):
        pass  # (the rows are copied, ids and all; AUTOINCREMENT counts on from the largest)


def upgrade() -> None:
    _recreate(True)


def downgrade() -> None:
    _recreate(False)
