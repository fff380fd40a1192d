"""Each log entry says whether it was appended while the entry before it was still unread by
the engine (``joins``): consecutive label entries that joined are learned as one block, and a
replay must group them as the live engine did. Entries logged before keep ``false``.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("label_log") as batch:
        batch.add_column(
            sa.Column("joins", sa.Boolean(), nullable=False, server_default=sa.false())
        )


def downgrade() -> None:
    with op.batch_alter_table("label_log") as batch:
        batch.drop_column("joins")
