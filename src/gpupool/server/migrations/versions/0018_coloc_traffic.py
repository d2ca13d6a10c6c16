"""service_traffic: each server's router's numbers of each service (in flight, requests so far),
written once a second by every server but the leader, so the leader's autoscaler counts the
traffic sent to the others (expand only: the last release's servers ignore the table).

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "service_traffic",
        sa.Column("server_id", sa.String(64), primary_key=True),
        sa.Column("service_id", sa.String(64), sa.ForeignKey("services.id", ondelete="CASCADE"),
                  primary_key=True),
        sa.Column("in_flight", sa.BigInteger(), nullable=False),
        sa.Column("requests_total", sa.BigInteger(), nullable=False),
        sa.Column("at_s", sa.Float(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("service_traffic")
