"""Inference services (`gpupool service create`): the services, their replicas (each one workload,
with its port, endpoint and probe state) and their events.

Nothing existed before this revision to carry over: the tables start empty.

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
        "services",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("tenant", sa.String(63), sa.ForeignKey("tenants.name", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("name", sa.String(63), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("generation", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("desired", sa.Integer(), nullable=False),
        sa.Column("min_replicas", sa.Integer(), nullable=False),
        sa.Column("max_replicas", sa.Integer(), nullable=False),
        sa.Column("target_concurrency", sa.Float(), nullable=True),
        sa.Column("target_rps", sa.Float(), nullable=True),
        sa.Column("public", sa.Boolean(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("last_probe_error", sa.String(1024), nullable=False),
        sa.Column("created_s", sa.Float(), nullable=False),
        sa.Column("updated_s", sa.Float(), nullable=False),
    )
    op.create_index("ux_services_tenant_name", "services", ["tenant", "name"], unique=True)
    op.create_table(
        "service_replicas",
        sa.Column("workload_id", sa.String(64), sa.ForeignKey("workloads.id", ondelete="CASCADE"),
                  primary_key=True),
        sa.Column("service_id", sa.String(64), sa.ForeignKey("services.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("generation", sa.Integer(), nullable=False),
        sa.Column("port", sa.Integer(), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("ready", sa.String(16), nullable=False),
        sa.Column("successes", sa.Integer(), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("last_error", sa.String(1024), nullable=False),
        sa.Column("created_s", sa.Float(), nullable=False),
        sa.Column("ready_s", sa.Float(), nullable=True),
    )
    op.create_index("ix_service_replicas_service_id", "service_replicas", ["service_id"])
    op.create_table(
        "service_events",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True,
                  autoincrement=True),
        sa.Column("service_id", sa.String(64), sa.ForeignKey("services.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("reason", sa.String(64), nullable=False),
        sa.Column("message", sa.String(1024), nullable=False),
        sa.Column("at_s", sa.Float(), nullable=False),
    )
    op.create_index("ix_service_events_service_id", "service_events", ["service_id"])


def downgrade() -> None:
    op.drop_table("service_events")
    op.drop_table("service_replicas")
    op.drop_index("ux_services_tenant_name", table_name="services")
    op.drop_table("services")
