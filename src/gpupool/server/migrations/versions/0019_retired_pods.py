"""retired_pods: the metered intervals of a deleted tenant's pods, kept when their rows go, so its
usage stays whole in the admin's queries and invoices (any window, and after a change of prices
rebuilds the rollup). Expand only: the last release's servers ignore the table.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "retired_pods",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("tenant", sa.String(63), nullable=False),
        sa.Column("queue", sa.String(63), nullable=False),
        sa.Column("priority_class", sa.String(63), nullable=False),
        sa.Column("service", sa.String(63), nullable=False),
        sa.Column("node", sa.String(255), nullable=False),
        sa.Column("slices", sa.JSON(), nullable=False),
        sa.Column("models", sa.JSON(), nullable=True),
        sa.Column("started_s", sa.Float(), nullable=False),
        sa.Column("finished_s", sa.Float(), nullable=False),
        sa.Column("rolled_up", sa.Boolean(), server_default="0", nullable=False),
        sa.Column("retired_s", sa.Float(), nullable=False),
    )
    op.create_index("ix_retired_pods_tenant", "retired_pods", ["tenant"])
    op.create_index("ix_retired_pods_rolled_up", "retired_pods", ["rolled_up"])


def downgrade() -> None:
    op.drop_index("ix_retired_pods_rolled_up", table_name="retired_pods")
    op.drop_index("ix_retired_pods_tenant", table_name="retired_pods")
    op.drop_table("retired_pods")
