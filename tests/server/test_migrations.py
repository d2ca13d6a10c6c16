"""The migrations build exactly the tables the models describe, and come down cleanly."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect

from gpupool.server.db import downgrade, make_engine, upgrade
from gpupool.server.orm import Base


def test_upgrade_matches_models_then_downgrade(db_url: str) -> None:
    engine = make_engine(db_url)
    try:
        upgrade(engine)
        upgrade(engine)  # idempotent
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"compare_type": True})
            assert compare_metadata(context, Base.metadata) == []
        assert {"workloads", "pods", "events", "tenants", "queues", "tokens", "node_flags"} <= set(
            inspect(engine).get_table_names()
        )
        downgrade(engine)
        assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
    finally:
        engine.dispose()
