"""Metering: when each pod started running, so its held slices are metered from then.

A pod recorded before this revision that was handed to the provider gets its creation time as
its start (pods were launched right after they were written); one stopped before it started
(it waited for a device, or the server stopped before launching it) gets none.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-10
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("pods", sa.Column("started_s", sa.Float(), nullable=True))
    op.execute("UPDATE pods SET started_s = created_s WHERE status NOT IN ('launching', 'waiting') "
               "AND message NOT LIKE 'Never started%' AND message NOT LIKE 'Waits for%' "
               "AND message <> 'Stopped before it started.'")
    op.create_index("ix_pods_finished_s", "pods", ["finished_s"])


def downgrade() -> None:
    op.drop_index("ix_pods_finished_s", table_name="pods")
    op.drop_column("pods", "started_s")
