"""Alembic environment: runs the packaged migrations on the engine the server hands over."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from gpupool.server.orm import Base

config = context.config
target_metadata = Base.metadata


def _run() -> None:
    engine = config.attributes.get("engine")
    if engine is None:
        url = config.get_main_option("sqlalchemy.url")
        if not url:
            raise RuntimeError("set sqlalchemy.url or pass an engine in config.attributes['engine']")
        engine = create_engine(url)
    with engine.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            render_as_batch=connection.dialect.name == "sqlite",
        )
        with context.begin_transaction():
            context.run_migrations()
        connection.commit()


_run()
