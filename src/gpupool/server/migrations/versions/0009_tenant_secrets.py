"""Tenants' secrets (`gpupool secret create`): their values sealed with the pool's key
(DATA_DIR/secrets.key), never stored in the clear.

Nothing existed before this revision to carry over: the table starts empty.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "secrets",
        sa.Column("tenant", sa.String(63), nullable=False),
        sa.Column("name", sa.String(63), nullable=False),
        sa.Column("keys", sa.JSON(), nullable=False),
        sa.Column("sealed", sa.LargeBinary(), nullable=False),
        sa.Column("created_s", sa.Float(), nullable=False),
        sa.Column("updated_s", sa.Float(), nullable=False),
        sa.Column("revision", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("tenant", "name"),
    )


def downgrade() -> None:
    op.drop_table("secrets")
