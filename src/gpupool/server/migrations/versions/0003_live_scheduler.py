"""The live scheduler: queue cohorts and limits, array jobs, retries, time limits, reservations,
preemption accounting and injected node faults.

Existing queues join no cohort (weight 1); existing workloads are lone tasks with no retries used,
no time limit and nothing lost; existing node flags carry no fault.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_QUEUE_COLUMNS = ("cohort", "borrowing_limit_milli", "lending_limit_milli", "weight")
_WORKLOAD_COLUMNS = ("array_id", "array_index", "array_limit", "retries", "not_before_s", "time_limit_s",
                     "reserved_start_s", "progress_s", "lost_device_s", "run_s")
_FLAG_COLUMNS = ("failed", "failed_devices")


def upgrade() -> None:
    op.add_column("queues", sa.Column("cohort", sa.String(63), nullable=False, server_default=""))
    op.add_column("queues", sa.Column("borrowing_limit_milli", sa.BigInteger(), nullable=True))
    op.add_column("queues", sa.Column("lending_limit_milli", sa.BigInteger(), nullable=True))
    op.add_column("queues", sa.Column("weight", sa.Float(), nullable=False, server_default="1"))
    op.add_column("workloads", sa.Column("array_id", sa.String(64), nullable=True))
    op.add_column("workloads", sa.Column("array_index", sa.Integer(), nullable=True))
    op.add_column("workloads", sa.Column("array_limit", sa.Integer(), nullable=True))
    op.add_column("workloads", sa.Column("retries", sa.Integer(), nullable=False, server_default="0"))
    op.add_column("workloads", sa.Column("not_before_s", sa.Float(), nullable=True))
    op.add_column("workloads", sa.Column("time_limit_s", sa.Float(), nullable=True))
    op.add_column("workloads", sa.Column("reserved_start_s", sa.Float(), nullable=True))
    op.add_column("workloads", sa.Column("progress_s", sa.Float(), nullable=False, server_default="0"))
    op.add_column("workloads", sa.Column("lost_device_s", sa.Float(), nullable=False, server_default="0"))
    op.add_column("workloads", sa.Column("run_s", sa.Float(), nullable=False, server_default="0"))
    op.create_index("ix_workloads_array_id", "workloads", ["array_id"])
    op.add_column("node_flags", sa.Column("failed", sa.Boolean(), nullable=False, server_default="0"))
    op.add_column("node_flags", sa.Column("failed_devices", sa.JSON(), nullable=False, server_default="[]"))


def downgrade() -> None:
    for column in _FLAG_COLUMNS:
        op.drop_column("node_flags", column)
    op.drop_index("ix_workloads_array_id", table_name="workloads")
    for column in _WORKLOAD_COLUMNS:
        op.drop_column("workloads", column)
    for column in _QUEUE_COLUMNS:
        op.drop_column("queues", column)
