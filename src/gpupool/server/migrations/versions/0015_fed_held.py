"""fed_workloads.held: a hold asked at a federation hub ("user" or "admin", "" when none), so the
hub neither offers a held workload nor releases the member's copy it holds (expand only: the last
release's hubs ignore the column).

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("fed_workloads", sa.Column("held", sa.String(16), nullable=False, server_default=""))


def downgrade() -> None:
    op.drop_column("fed_workloads", "held")
