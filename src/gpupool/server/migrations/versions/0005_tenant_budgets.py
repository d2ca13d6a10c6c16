"""Budgets: what each tenant may spend per period, when it is warned, and whether it may overdraw.

A tenant recorded before this revision has no budget (NULL), so nothing it submits waits for one.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-14
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


_COLUMNS = ("budget", "budget_period", "budget_warn", "budget_overdraft")


def upgrade() -> None:
    op.add_column("tenants", sa.Column("budget", sa.Float(), nullable=True))
    op.add_column("tenants", sa.Column("budget_period", sa.String(8), nullable=False, server_default="month"))
    op.add_column("tenants", sa.Column("budget_warn", sa.Float(), nullable=False, server_default="0.8"))
    op.add_column("tenants", sa.Column("budget_overdraft", sa.Boolean(), nullable=False, server_default="0"))


def downgrade() -> None:
    for column in reversed(_COLUMNS):
        op.drop_column("tenants", column)
