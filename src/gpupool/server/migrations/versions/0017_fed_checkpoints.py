"""fed_checkpoints: the last checkpoint a federation hub fetched of each workload that declares one,
so work moved off a silent member resumes from it on the next; fed_sessions: the member that holds
each remote-function session opened through a hub (expand only: the last release's hubs ignore
both tables).

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "fed_checkpoints",
        sa.Column("workload_id", sa.String(64), primary_key=True),
        sa.Column("tenant", sa.String(63), nullable=False),
        sa.Column("member", sa.String(63), nullable=False),
        sa.Column("mark_s", sa.Float(), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.Column("at_s", sa.Float(), nullable=False),
    )
    op.create_table(
        "fed_sessions",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("tenant", sa.String(63), nullable=False),
        sa.Column("member", sa.String(63), nullable=False),
        sa.Column("at_s", sa.Float(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("fed_sessions")
    op.drop_table("fed_checkpoints")
