"""Several servers on one store: the leader's lease (holder, epoch, expiry), the servers'
heartbeats, and the epoch each pod row was written under (a fenced leader writes none).

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "leader_lease",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("holder", sa.String(64), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("expires_s", sa.Float(), nullable=False),
        sa.Column("renewed_s", sa.Float(), nullable=False),
        sa.Column("acquired_s", sa.Float(), nullable=False),
    )
    op.create_table(
        "servers",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("address", sa.String(255), nullable=False),
        sa.Column("version", sa.String(64), nullable=False),
        sa.Column("started_s", sa.Float(), nullable=False),
        sa.Column("seen_s", sa.Float(), nullable=False),
    )
    with op.batch_alter_table("pods") as batch:
        batch.add_column(sa.Column("epoch", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("pods") as batch:
        batch.drop_column("epoch")
    op.drop_table("servers")
    op.drop_table("leader_lease")
