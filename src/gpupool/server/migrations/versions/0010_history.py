"""The pool's history for the dashboard's charts: allocation, pending demand, per-device
utilisation and per-tenant usage, one row per minute and key (kept a day) and per hour and key.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "history",
        sa.Column("series", sa.String(16), primary_key=True),
        sa.Column("step_s", sa.Integer(), primary_key=True),
        sa.Column("at_s", sa.Float(), primary_key=True),
        sa.Column("key", sa.String(255), primary_key=True),
        sa.Column("value", sa.Float(), nullable=False),
        sa.Column("busy_pct", sa.Float(), nullable=True),
        sa.Column("memory_mib", sa.Float(), nullable=True),
        sqlite_with_rowid=False,  # the key is the row: no second copy of it in an index
    )


def downgrade() -> None:
    op.drop_table("history")
