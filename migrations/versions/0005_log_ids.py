"""Each log entry keeps its block's label ids (newline-joined), so the embedded store finds
duplicates in a set it rebuilds from the log instead of an index of every id (label_ids, kept
for files written before and read once at start). A downgrade forgets the ids logged since.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("label_log") as batch:
        batch.add_column(sa.Column("ids", sa.LargeBinary(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("label_log") as batch:
        batch.drop_column("ids")
