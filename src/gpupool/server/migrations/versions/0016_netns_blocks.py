"""net_blocks: each machine's block of the pod network (a /19 slot), handed out when it joins and
given back when it leaves; `slot` and `node` each unique, so concurrent servers never share one.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "net_blocks",
        sa.Column("slot", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("node", sa.String(255), nullable=False, unique=True),
        sa.Column("machine", sa.String(64), nullable=False),
        sa.Column("assigned_s", sa.Float(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("net_blocks")
