"""Initial schema: projects, API keys, the label log/archive, seen label ids, snapshots.

Revision ID: 0001
Revises:
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "projects",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
    )
    op.create_table(
        "api_keys",
        sa.Column("key_hash", sa.String(64), primary_key=True),
        sa.Column("key_id", sa.String(16), nullable=False),
        sa.Column("scope", sa.String(8), nullable=False),
        sa.Column("project", sa.String(64), nullable=True),
    )
    op.create_index("ix_api_keys_project", "api_keys", ["project"])
    op.create_table(
        "label_log",
        sa.Column("project", sa.String(64), primary_key=True),
        sa.Column("position", sa.BigInteger(), primary_key=True),
        sa.Column("kind", sa.String(8), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        sa.Column("keep", sa.LargeBinary(), nullable=False),
    )
    op.create_table(
        "label_ids",
        sa.Column("project", sa.String(64), primary_key=True),
        sa.Column("label_id", sa.String(512), primary_key=True),
    )
    op.create_table(
        "snapshots",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("project", sa.String(64), nullable=False),
        sa.Column("position", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("n_items", sa.BigInteger(), nullable=False),
        sa.Column("n_workers", sa.BigInteger(), nullable=False),
        sa.Column("n_labels", sa.BigInteger(), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("state", sa.LargeBinary(), nullable=False),
    )
    op.create_index("ix_snapshots_project_position", "snapshots", ["project", "position"])


def downgrade() -> None:
    op.drop_index("ix_snapshots_project_position", table_name="snapshots")
    op.drop_table("snapshots")
    op.drop_table("label_ids")
    op.drop_table("label_log")
    op.drop_index("ix_api_keys_project", table_name="api_keys")
    op.drop_table("api_keys")
    op.drop_table("projects")
