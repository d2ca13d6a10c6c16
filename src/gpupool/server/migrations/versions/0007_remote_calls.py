"""Remote function calls: sessions (one per function workload), their calls with pickled inputs and
results, and the key that signs the pods' call tokens.

Nothing existed before this revision to carry over: the tables start empty.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-20
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "remote_sessions",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("tenant", sa.String(63), nullable=False),
        sa.Column("one_shot", sa.Boolean(), nullable=False),
        sa.Column("closed", sa.Boolean(), nullable=False),
        sa.Column("idle_timeout_s", sa.Float(), nullable=False),
        sa.Column("last_active_s", sa.Float(), nullable=False),
        sa.Column("pod_id", sa.String(64), nullable=False),
        sa.Column("python", sa.String(16), nullable=False),
        sa.Column("created_s", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_table(
        "remote_calls",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("session_id", sa.String(64), nullable=False),
        sa.Column("tenant", sa.String(63), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        sa.Column("result", sa.LargeBinary(), nullable=True),
        sa.Column("error", sa.String(1024), nullable=False),
        sa.Column("traceback", sa.Text(), nullable=False),
        sa.Column("pod_id", sa.String(64), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("submitted_s", sa.Float(), nullable=False),
        sa.Column("started_s", sa.Float(), nullable=True),
        sa.Column("finished_s", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["session_id"], ["remote_sessions.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_remote_calls_session_status", "remote_calls", ["session_id", "status"])
    op.create_index("ix_remote_calls_finished_s", "remote_calls", ["finished_s"])
    op.create_table(
        "remote_keys",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("secret", sa.String(128), nullable=False),
        sa.Column("created_s", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )


def downgrade() -> None:
    op.drop_table("remote_keys")
    op.drop_index("ix_remote_calls_finished_s", table_name="remote_calls")
    op.drop_index("ix_remote_calls_session_status", table_name="remote_calls")
    op.drop_table("remote_calls")
    op.drop_table("remote_sessions")
