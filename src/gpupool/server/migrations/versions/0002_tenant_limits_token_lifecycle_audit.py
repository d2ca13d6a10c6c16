"""Tenant limits and Unix account, the token lifecycle (scope, expiry, last use, revocation), audit.

Existing tenants get max_priority 0 and max_pending 10,000; existing tokens keep full scope and
never expire; an unnamed token is named after its id (names are unique per tenant from now on).

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

_TENANT_COLUMNS = ("max_priority", "max_pending", "unix_user")
_TOKEN_COLUMNS = ("scope", "expires_s", "last_used_s", "revoked_s")


def upgrade() -> None:
    op.add_column("tenants", sa.Column("max_priority", sa.Integer(), nullable=False, server_default="0"))
    op.add_column("tenants", sa.Column("max_pending", sa.Integer(), nullable=False,
                                       server_default="10000"))
    op.add_column("tenants", sa.Column("unix_user", sa.String(32), nullable=True))
    op.add_column("tokens", sa.Column("scope", sa.String(16), nullable=False, server_default="full"))
    op.add_column("tokens", sa.Column("expires_s", sa.Float(), nullable=True))
    op.add_column("tokens", sa.Column("last_used_s", sa.Float(), nullable=True))
    op.add_column("tokens", sa.Column("revoked_s", sa.Float(), nullable=True))
    op.execute("UPDATE tokens SET name = id WHERE name = ''")
    op.create_table(
        "audit",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True,
                  autoincrement=True),
        sa.Column("at_s", sa.Float(), nullable=False),
        sa.Column("actor", sa.String(63), nullable=False),
        sa.Column("token_id", sa.String(64), nullable=False),
        sa.Column("action", sa.String(64), nullable=False),
        sa.Column("target", sa.String(255), nullable=False),
        sa.Column("detail", sa.String(1024), nullable=False),
        sa.Column("remote", sa.String(64), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
    )
    op.create_index("ix_audit_at_s", "audit", ["at_s"])


def downgrade() -> None:
    op.drop_index("ix_audit_at_s", table_name="audit")
    op.drop_table("audit")
    for column in _TOKEN_COLUMNS:
        op.drop_column("tokens", column)
    for column in _TENANT_COLUMNS:
        op.drop_column("tenants", column)
