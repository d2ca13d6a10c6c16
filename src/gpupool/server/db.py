"""The SQL store's plumbing: engines for SQLite (WAL) and PostgreSQL, sessions, and migrations.

Writes on SQLite go through one in-process lock so that a transaction that reads and then writes
never meets SQLITE_BUSY half-way; PostgreSQL relies on row locks instead.

A store that fails (disk full, read-only files, a lost PostgreSQL connection) raises
StoreUnavailable (HTTP 503) from `read()` and `write()`, and the log says so in one line when the
failure starts and one when a write succeeds again, never a traceback per request.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, FromClause, create_engine, event, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import InternalError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from gpupool.errors import InvalidInput, StoreUnavailable, Unavailable

log = logging.getLogger("gpupool.store")

MIGRATIONS_DIR = Path(__file__).parent / "migrations"


def insert_ignoring(conn: Connection, table: FromClause) -> Any:
    """INSERT into `table` that skips a row whose key is there already (ON CONFLICT DO NOTHING, in
    the dialect of the store `conn` is on: the one write both stores agree on)."""
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    return dialect.insert(table).on_conflict_do_nothing()


def make_engine(url: str) -> Engine:
    """An engine for `url`; SQLite gets WAL, a busy timeout and foreign keys."""
    if url.startswith("sqlite"):
        return _sqlite_engine(url)
    if url.startswith("postgresql"):
        if url.startswith("postgresql://"):
            url = "postgresql+psycopg://" + url.removeprefix("postgresql://")
        # pre-ping: a connection the server lost (PostgreSQL restarted) is replaced, not used once
        return create_engine(url, pool_size=8, max_overflow=8, pool_pre_ping=True, pool_recycle=300)
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
        self._failing: str | None = None
        """The driver's message of the failure now in progress (None while the store works)."""
        self._failing_lock = threading.Lock()
        # Fencing (server/leader.py): a thread acting for the leader writes only while its epoch is
        # the lease's; the check is made inside each of its transactions (see _check_fence).
        self._fence = threading.local()
        self.fenced_writes = 0
        """Transactions refused because their epoch was no longer the lease's."""

    @classmethod
    def open(cls, url: str, *, migrate: bool = True) -> Store:
        store = cls(make_engine(url))
        if migrate:
            upgrade(store.engine)
        return store

    @contextmanager
    def read(self) -> Iterator[Session]:
        """A session for queries; raises StoreUnavailable when the store cannot answer."""
        try:
            with self._sessions() as session:
                yield session
        except OperationalError as exc:
            raise self._unavailable(exc) from exc

    @contextmanager
    def write(self) -> Iterator[Session]:
        """One transaction: committed when the block ends, rolled back if it raises.

        Raises StoreUnavailable when the store cannot take it: nothing of it was stored, unless the
        connection to PostgreSQL broke during the commit itself (its `details["outcome_unknown"]` is
        then True: the commit may have landed, so the request must not be sent again blindly).
        """
        committing = False
        try:
            if self.is_sqlite:
                with self._write_lock, self._sessions() as session, session.begin():
                    self._check_fence(session)
                    yield session
                    committing = True
            else:
                with self._sessions() as session, session.begin():
                    self._check_fence(session)
                    yield session
                    committing = True
        except (OperationalError, InternalError) as exc:  # Internal: the session ended by the server
            error = self._unavailable(exc)
            if committing and not self.is_sqlite and exc.connection_invalidated:
                # the connection broke while the commit was on its way: whether it landed is unknown
                # (SQLite's commit is local: when it fails, nothing was stored)
                error = StoreUnavailable(
                    "The pool's store failed while saving this, so it may or may not have been saved; "
                    "check (gpupool ls, gpupool show) before sending it again.", outcome_unknown=True)
            raise error from exc
        if self._failing is not None:
            self._recovered()

    @contextmanager
    def fenced(self, epoch: int | None) -> Iterator[None]:
        """Within the block, every write() of this thread is refused (Fenced) unless `epoch` is the
        leader lease's epoch when the transaction starts; None: no check (a single server)."""
        before = getattr(self._fence, "epoch", None)
        self._fence.epoch = epoch
        try:
            yield
        finally:
            self._fence.epoch = before

    def fence_epoch(self) -> int | None:
        """The epoch this thread writes under (None: unfenced)."""
        return getattr(self._fence, "epoch", None)

    def _check_fence(self, session: Session) -> None:
        """The lease's epoch read in the transaction itself. On PostgreSQL FOR SHARE holds the
        lease row until the commit, so a takeover (which updates that row) waits for this
        transaction, and every transaction after the takeover reads the new epoch: a deposed
        leader's write is either committed before the new epoch exists or not at all. SQLite
        serialises every write, which gives the same order."""
        epoch = getattr(self._fence, "epoch", None)
        if epoch is None:
            return
        lock = "" if self.is_sqlite else " FOR SHARE"
        current = session.execute(text(f"SELECT epoch FROM leader_lease WHERE id = 1{lock}")).scalar()
        if current != epoch:
            self.fenced_writes += 1
            raise Fenced(f"This server no longer leads the pool (its epoch {epoch} is not the lease's "
                         f"{current}); its scheduling write was refused and it follows the new leader.")

    def _unavailable(self, exc: OperationalError | InternalError) -> StoreUnavailable:
        """The error to answer with; logs one line when this failure starts (not one per request)."""
        cause = " ".join(str(exc.orig if exc.orig is not None else exc).split())
        with self._failing_lock:
            first, self._failing = self._failing != cause, cause
        if first:
            log.error("the store failed (%s); answering 503 until a write succeeds again", cause)
        return store_unavailable(cause)

    def _recovered(self) -> None:
        with self._failing_lock:
            was, self._failing = self._failing, None
        if was is not None:
            log.warning("the store works again (it had failed with: %s)", was)

    def close(self) -> None:
        self.engine.dispose()


class Fenced(StoreUnavailable):
    """A write made for a leader whose epoch is no longer the lease's (server/leader.py)."""

    code = "fenced"


def store_unavailable(cause: str) -> StoreUnavailable:
    """The one-sentence 503 for a store failure, by what the database driver said (`cause`)."""
    text = cause.lower()
    if "full" in text or "no space" in text:
        message = ("The pool's store is out of disk space, so nothing can be saved now; retry later "
                   "(the pool's admin must free space on the store's disk).")
    elif "readonly" in text or "read-only" in text or "read only" in text:
        message = ("The pool's store is read-only, so nothing can be saved now; retry later "
                   "(the pool's admin must make the store's files writable).")
    else:
        message = ("The pool's store cannot be used right now; retry later "
                   "(the pool's admin will find the cause in the server's log).")
    return StoreUnavailable(message)


def alembic_config(engine: Engine) -> Any:
    """An alembic Config pointing at the packaged migrations and bound to `engine`."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["engine"] = engine
    return config


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Bring the schema up to `revision` (idempotent); SchemaTooNew when a newer gpupool migrated it."""
    from alembic import command

    from gpupool.server.schema import check_not_newer

    try:
        check_not_newer(engine)
        command.upgrade(alembic_config(engine), revision)
    except Exception as exc:  # the driver's own error says what is wrong with the database
        if isinstance(exc, InvalidInput):
            raise
        raise Unavailable(f"Cannot prepare the database: {exc}") from exc


def downgrade(engine: Engine, revision: str = "base") -> None:
    from alembic import command

    command.downgrade(alembic_config(engine), revision)
