"""The SQL store's plumbing: engines for SQLite (WAL) and PostgreSQL, sessions, and migrations.

Writes on SQLite go through one in-process lock so that a transaction that reads and then writes
never meets SQLITE_BUSY half-way; PostgreSQL relies on row locks instead.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

from gpupool.errors import InvalidInput, Unavailable

MIGRATIONS_DIR = Path(__file__).parent / "migrations"


def make_engine(url: str) -> Engine:
    """An engine for `url`; SQLite gets WAL, a busy timeout and foreign keys."""
    if url.startswith("sqlite"):
        return _sqlite_engine(url)
    if url.startswith("postgresql"):
        if url.startswith("postgresql://"):
            url = "postgresql+psycopg://" + url.removeprefix("postgresql://")
        return create_engine(url, pool_size=8, max_overflow=8, pool_pre_ping=True)
    raise InvalidInput(f"Unsupported database URL {url!r}; use sqlite:///PATH or postgresql+psycopg://...")


def _sqlite_engine(url: str) -> Engine:
    path = url.split(":///", 1)[1] if ":///" in url else ""
    if path and path != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.close()

    return engine


class Store:
    """Sessions over one engine: `read()` for queries, `write()` for one short transaction."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.is_sqlite = engine.dialect.name == "sqlite"
        self._sessions = sessionmaker(engine, expire_on_commit=False)
        self._write_lock = threading.Lock()

    @classmethod
    def open(cls, url: str, *, migrate: bool = True) -> Store:
        store = cls(make_engine(url))
        if migrate:
            upgrade(store.engine)
        return store

    @contextmanager
    def read(self) -> Iterator[Session]:
        with self._sessions() as session:
            yield session

    @contextmanager
    def write(self) -> Iterator[Session]:
        """One transaction: committed when the block ends, rolled back if it raises."""
        if self.is_sqlite:
            with self._write_lock, self._sessions() as session, session.begin():
                yield session
        else:
            with self._sessions() as session, session.begin():
                yield session

    def close(self) -> None:
        self.engine.dispose()


def alembic_config(engine: Engine) -> Any:
    """An alembic Config pointing at the packaged migrations and bound to `engine`."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["engine"] = engine
    return config


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Bring the schema up to `revision` (idempotent)."""
    from alembic import command

    try:
        command.upgrade(alembic_config(engine), revision)
    except Exception as exc:  # the driver's own error says what is wrong with the database
        if isinstance(exc, InvalidInput):
            raise
        raise Unavailable(f"Cannot prepare the database: {exc}") from exc


def downgrade(engine: Engine, revision: str = "base") -> None:
    from alembic import command

    command.downgrade(alembic_config(engine), revision)
