"""Log entries and snapshots record the token of their entry (``LogEntry.token``), so that a
Redis log gone back in time (restarted from an AOF that missed its last second) is told from
the log a snapshot covers.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    for table in ("label_log", "snapshots"):
        with op.batch_alter_table(table) as batch:
            batch.add_column(
                sa.Column("token", sa.BigInteger(), nullable=False, server_default="1")
            )


def downgrade() -> None:
    for table in ("label_log", "snapshots"):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("token")
