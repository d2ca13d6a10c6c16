"""Metering by device model: each pod row keeps its slices' device model, memory and simulated mark
as at launch (so usage stays priced by its model after the node leaves), and a daily usage rollup.

A pod recorded before this revision has no models (NULL): it is metered with the devices the pool
lists when its usage is read or rolled up, as before. The rollup starts empty (no pod rolled up);
the server's loop fills it from the ended pods.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-18
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

_COUNTS = ("pods", "pods_carried", "pods_first_model", "pods_carried_first_model", "pods_first",
           "pods_carried_first")


def upgrade() -> None:
    op.add_column("pods", sa.Column("models", sa.JSON(), nullable=True))
    op.add_column("pods", sa.Column("rolled_up", sa.Boolean(), nullable=False, server_default="0"))
    op.create_index("ix_pods_rolled_up", "pods", ["rolled_up"])
    op.create_table(
        "usage_daily",
        sa.Column("day_s", sa.Float(), nullable=False),
        sa.Column("tenant", sa.String(63), nullable=False),
        sa.Column("queue", sa.String(63), nullable=False),
        sa.Column("priority_class", sa.String(63), nullable=False),
        sa.Column("node", sa.String(255), nullable=False),
        sa.Column("model", sa.String(255), nullable=False),
        sa.Column("simulated", sa.Boolean(), nullable=False),
        sa.Column("compute_milli_s", sa.Float(), nullable=False),
        sa.Column("memory_mib_s", sa.Float(), nullable=False),
        sa.Column("cost", sa.Float(), nullable=False),
        sa.Column("dedicated_cost", sa.Float(), nullable=False),
        sa.Column("unpriced", sa.Integer(), nullable=False),
        *(sa.Column(name, sa.Integer(), nullable=False) for name in _COUNTS),
        sa.PrimaryKeyConstraint("day_s", "tenant", "queue", "priority_class", "node", "model", "simulated"),
    )
    op.create_table(
        "usage_rollup_state",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("prices_sha256", sa.String(64), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )


def downgrade() -> None:
    op.drop_table("usage_rollup_state")
    op.drop_table("usage_daily")
    op.drop_index("ix_pods_rolled_up", table_name="pods")
    op.drop_column("pods", "rolled_up")
    op.drop_column("pods", "models")
