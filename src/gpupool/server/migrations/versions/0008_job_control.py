"""Job control: a pending workload may be held (by its tenant or the admin) and may wait on a
dependency; the scheduler reads only pending work that is neither. A pending workload's spec may be
updated: its revision counts the updates, and an admission expects the revision it placed.

Rows from before this revision are neither held nor waiting ('' in both columns), revision 0.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("workloads", sa.Column("held", sa.String(8), nullable=False, server_default=""))
    op.add_column("workloads", sa.Column("waiting_on", sa.String(1024), nullable=False, server_default=""))
    op.add_column("workloads", sa.Column("revision", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    op.drop_column("workloads", "revision")
    op.drop_column("workloads", "waiting_on")
    op.drop_column("workloads", "held")
