"""The daily usage rollup keyed by service too (usage_daily_services), so an invoice's line per
service reads summed days like every other line. A new table, not a new key column of usage_daily:
the last release's servers keep reading and writing usage_daily unchanged (expand only).

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None
_COUNTS = ("pods", "pods_carried", "pods_first_model", "pods_carried_first_model", "pods_first",
           "pods_carried_first")


def upgrade() -> None:
    op.create_table(
        "usage_daily_services",
        sa.Column("day_s", sa.Float(), nullable=False),
        sa.Column("tenant", sa.String(63), nullable=False),
        sa.Column("queue", sa.String(63), nullable=False),
        sa.Column("priority_class", sa.String(63), nullable=False),
        sa.Column("node", sa.String(255), nullable=False),
        sa.Column("model", sa.String(255), nullable=False),
        sa.Column("simulated", sa.Boolean(), nullable=False),
        sa.Column("service", sa.String(63), nullable=False),
        sa.Column("compute_milli_s", sa.Float(), nullable=False),
        sa.Column("memory_mib_s", sa.Float(), nullable=False),
        sa.Column("cost", sa.Float(), nullable=False),
        sa.Column("dedicated_cost", sa.Float(), nullable=False),
        sa.Column("unpriced", sa.Integer(), nullable=False),
        *(sa.Column(name, sa.Integer(), nullable=False) for name in _COUNTS),
        sa.PrimaryKeyConstraint("day_s", "tenant", "queue", "priority_class", "node", "model", "simulated",
                                "service"),
    )


def downgrade() -> None:
    op.drop_table("usage_daily_services")
