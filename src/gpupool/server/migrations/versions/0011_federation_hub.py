"""A federation hub's record of the work it placed on member pools (src/gpupool/federation): the
workloads, every copy made on a member, and the hub's events. Only a hub writes them; on a member
pool they stay empty.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "fed_workloads",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("tenant", sa.String(63), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("gpus", sa.Float(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("member", sa.String(63), nullable=True),
        sa.Column("member_id", sa.String(64), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("view", sa.JSON(), nullable=True),
        sa.Column("moves", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("submit_s", sa.Float(), nullable=False),
        sa.Column("updated_s", sa.Float(), nullable=False),
    )
    op.create_index("ix_fed_workloads_tenant", "fed_workloads", ["tenant"])
    op.create_index("ix_fed_workloads_state", "fed_workloads", ["state"])
    op.create_table(
        "fed_placements",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("workload_id", sa.String(64), nullable=False),
        sa.Column("tenant", sa.String(63), nullable=False),
        sa.Column("member", sa.String(63), nullable=False),
        sa.Column("member_id", sa.String(64), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("at_s", sa.Float(), nullable=False),
    )
    op.create_index("ix_fed_placements_workload_id", "fed_placements", ["workload_id"])
    op.create_index("ix_fed_placements_member", "fed_placements", ["member"])
    op.create_table(
        "fed_events",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("workload_id", sa.String(64), nullable=False),
        sa.Column("reason", sa.String(64), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("at_s", sa.Float(), nullable=False),
    )
    op.create_index("ix_fed_events_workload_id", "fed_events", ["workload_id"])


def downgrade() -> None:
    op.drop_table("fed_events")
    op.drop_table("fed_placements")
    op.drop_table("fed_workloads")
