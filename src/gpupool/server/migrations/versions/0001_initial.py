"""The first schema: tenants, queues, tokens, workloads, pods, events, node flags.

Revision ID: 0001
Revises:
Create Date: 2025-01-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

_NAME = 63
_ID = 64


def upgrade() -> None:
    op.create_table(
        "tenants",
        sa.Column("name", sa.String(_NAME), primary_key=True),
        sa.Column("created_s", sa.Float(), nullable=False),
    )
    op.create_table(
        "queues",
        sa.Column("tenant", sa.String(_NAME), sa.ForeignKey("tenants.name", ondelete="CASCADE"),
                  primary_key=True),
        sa.Column("name", sa.String(_NAME), primary_key=True),
        sa.Column("quota_device_milli", sa.BigInteger(), nullable=True),
        sa.Column("created_s", sa.Float(), nullable=False),
    )
    op.create_table(
        "tokens",
        sa.Column("id", sa.String(_ID), primary_key=True),
        sa.Column("token_sha256", sa.String(64), nullable=False, unique=True),
        sa.Column("tenant", sa.String(_NAME), sa.ForeignKey("tenants.name", ondelete="CASCADE"),
                  nullable=True),
        sa.Column("name", sa.String(_NAME), nullable=False),
        sa.Column("created_s", sa.Float(), nullable=False),
    )
    _create_workloads()
    _create_pods_and_events()
    op.create_table(
        "node_flags",
        sa.Column("name", sa.String(255), primary_key=True),
        sa.Column("cordoned", sa.Boolean(), nullable=False),
        sa.Column("draining", sa.Boolean(), nullable=False),
        sa.Column("updated_s", sa.Float(), nullable=False),
    )


def _create_workloads() -> None:
    op.create_table(
        "workloads",
        sa.Column("id", sa.String(_ID), primary_key=True),
        sa.Column("name", sa.String(_NAME), nullable=False),
        sa.Column("tenant", sa.String(_NAME), nullable=False),
        sa.Column("queue", sa.String(_NAME), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("device_milli", sa.BigInteger(), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("reason", sa.String(64), nullable=False),
        sa.Column("message", sa.String(1024), nullable=False),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("submit_s", sa.Float(), nullable=False),
        sa.Column("admitted_s", sa.Float(), nullable=True),
        sa.Column("started_s", sa.Float(), nullable=True),
        sa.Column("finished_s", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["tenant", "queue"], ["queues.tenant", "queues.name"]),
    )
    op.create_index("ix_workloads_status_order", "workloads", ["status", "priority", "submit_s"])
    op.create_index("ix_workloads_tenant_status", "workloads", ["tenant", "status"])


def _create_pods_and_events() -> None:
    op.create_table(
        "pods",
        sa.Column("id", sa.String(_ID), primary_key=True),
        sa.Column("workload_id", sa.String(_ID), sa.ForeignKey("workloads.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(_NAME), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("node", sa.String(255), nullable=False),
        sa.Column("slices", sa.JSON(), nullable=False),
        sa.Column("cpu_milli", sa.BigInteger(), nullable=False),
        sa.Column("memory_mib", sa.BigInteger(), nullable=False),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("message", sa.String(1024), nullable=False),
        sa.Column("created_s", sa.Float(), nullable=False),
        sa.Column("finished_s", sa.Float(), nullable=True),
    )
    op.create_index("ix_pods_workload_id", "pods", ["workload_id"])
    op.create_index("ix_pods_status", "pods", ["status"])
    op.create_table(
        "events",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True,
                  autoincrement=True),
        sa.Column("workload_id", sa.String(_ID), sa.ForeignKey("workloads.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("pod_id", sa.String(_ID), nullable=False),
        sa.Column("from_status", sa.String(16), nullable=False),
        sa.Column("to_status", sa.String(16), nullable=False),
        sa.Column("reason", sa.String(64), nullable=False),
        sa.Column("message", sa.String(1024), nullable=False),
        sa.Column("at_s", sa.Float(), nullable=False),
    )
    op.create_index("ix_events_workload_id", "events", ["workload_id"])


def downgrade() -> None:
    op.drop_index("ix_events_workload_id", table_name="events")
    op.drop_table("events")
    op.drop_index("ix_pods_status", table_name="pods")
    op.drop_index("ix_pods_workload_id", table_name="pods")
    op.drop_table("pods")
    op.drop_index("ix_workloads_tenant_status", table_name="workloads")
    op.drop_index("ix_workloads_status_order", table_name="workloads")
    op.drop_table("workloads")
    op.drop_table("node_flags")
    op.drop_table("tokens")
    op.drop_table("queues")
    op.drop_table("tenants")
