"""Which schema revision a store is at, the refusal of a store newer than this code, and the
"expand, then contract" check that keeps each release's schema usable by the release before it.

The store records its revision in alembic's own table (`alembic_version`, one row). A server
refuses to start on a store whose revision it does not know: that store was migrated by a newer
release, and this code could misread or damage what it does not know about.

Expand, then contract (docs/upgrades.md): every migration after `LAST_RELEASED` only adds —
tables, nullable columns, columns with a server default, indexes — so the servers of the last
release keep working on the migrated store while the others are upgraded one at a time. Dropping or
renaming a column or table, narrowing a type, or adding a NOT NULL column without a default waits
for the release after (the "contract" step), when no server of the old release is left.
`expand_problems` checks that on a real database: it builds the store at `LAST_RELEASED`, reads its
schema, migrates to the newest revision, and then runs what the old release can run against the
store: an insert into every table of the old schema that gives only the old columns, a select of
those columns back, and a select of the whole row as this code's models read it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, MetaData, Table, insert, inspect, select, text

from gpupool.errors import InvalidInput

LAST_RELEASED = "0010"
"""The newest revision a released gpupool knows; bump it when a release is cut (see
docs/upgrades.md). Migrations after it must only expand the schema."""


class SchemaTooNew(InvalidInput):
    """The store was migrated by a newer gpupool than this one."""

    code = "schema_too_new"


def script_directory(location: Path | None = None) -> Any:
    """alembic's view of the migrations in `location` (default: the packaged ones)."""
    from alembic.script import ScriptDirectory

    from gpupool.server.db import MIGRATIONS_DIR

    return ScriptDirectory(str(location or MIGRATIONS_DIR))


def head_revision(location: Path | None = None) -> str:
    """The newest revision this code knows."""
    return str(script_directory(location).get_current_head())


def current_revision(engine: Engine) -> str | None:
    """The revision the store records, or None for a store never migrated."""
    if "alembic_version" not in inspect(engine).get_table_names():
        return None
    with engine.connect() as conn:
        return conn.execute(text("SELECT version_num FROM alembic_version")).scalar()


def check_not_newer(engine: Engine, location: Path | None = None) -> None:
    """SchemaTooNew, in one sentence naming both revisions, when the store is at a revision this code
    does not know."""
    revision = current_revision(engine)
    if revision is None:
        return
    known = {script.revision for script in script_directory(location).walk_revisions()}
    if revision not in known:
        raise SchemaTooNew(
            f"The store's schema is at revision {revision}, newer than this gpupool knows (its newest is "
            f"{head_revision(location)}): a newer release migrated it; run that release (or a newer one) "
            "of gpupool on this store, never an older one.")


def expand_problems(make_engine: Callable[[], Engine], *, since: str = LAST_RELEASED,
                    location: Path | None = None, models: MetaData | None = None) -> list[str]:
    """One sentence per way in which the migrations after `since` break a server of the release at
    `since`, or this code on that release's rows (empty when they only expand). `make_engine` gives
    an engine on an empty database; `models` are this code's tables (default: the ORM's)."""
    from alembic import command

    from gpupool.server.db import alembic_config

    engine = make_engine()
    try:
        config = alembic_config(engine)
        if location is not None:
            config.set_main_option("script_location", str(location))
        command.upgrade(config, since)
        old = MetaData()
        old.reflect(engine)
        old_tables = {name: table for name, table in old.tables.items() if name != "alembic_version"}
        command.upgrade(config, "head")
        new = inspect(engine)
        problems: list[str] = []
        new_tables = set(new.get_table_names())
        for name, table in sorted(old_tables.items()):
            if name not in new_tables:
                problems.append(f"table {name} is dropped or renamed, which the release at {since} reads")
                continue
            problems.extend(_column_problems(name, table, new.get_columns(name), since))
        if not problems:
            problems.extend(_old_queries_fail(engine, old, since, models))
        return problems
    finally:
        engine.dispose()


def _column_problems(name: str, table: Table, columns: list[Any], since: str) -> list[str]:
    problems: list[str] = []
    new_columns = {column["name"]: column for column in columns}
    for column in table.columns:
        now = new_columns.get(column.name)
        if now is None:
            problems.append(f"column {name}.{column.name} is dropped or renamed, which the release at "
                            f"{since} reads and writes")
        elif type(now["type"]).__name__ != type(column.type).__name__:
            problems.append(f"column {name}.{column.name} changes type from {column.type} to {now['type']}")
        elif column.nullable and not now["nullable"]:
            problems.append(f"column {name}.{column.name} becomes NOT NULL, which the release at {since} "
                            "may leave empty")
    old_names = {column.name for column in table.columns}
    for column_name, column in new_columns.items():
        if column_name not in old_names and not column["nullable"] and column.get("default") is None:
            problems.append(f"column {name}.{column_name} is NOT NULL without a server default, so the "
                            f"release at {since} cannot insert into {name}")
    return problems


def _old_queries_fail(engine: Engine, old: MetaData, since: str, models: MetaData | None) -> list[str]:
    """Insert one row with only the old columns into every old table (parents first, so every
    foreign key finds its row), read each back with the old columns and with this code's models
    (every column, its defaults filled in by the store), and roll it all back."""
    from gpupool.server.orm import Base

    current = models if models is not None else Base.metadata

    with engine.connect() as conn, conn.begin() as transaction:
        try:
            for table in old.sorted_tables:
                if table.name == "alembic_version":
                    continue
                try:
                    conn.execute(insert(table).values({c.name: _sample(c) for c in table.columns}))
                    found = conn.execute(select(*table.columns)).first()
                except Exception as exc:  # the database's own words say what the old code would meet
                    first = (str(getattr(exc, "orig", exc)).strip().splitlines() or [""])[0][:200]
                    return [f"the release at {since} cannot write table {table.name}: {first}"]
                if found is None:
                    return [f"a row the release at {since} writes into {table.name} is not read back"]
                if table.name in current.tables:  # and this code's models load it whole
                    try:
                        conn.execute(select(current.tables[table.name])).all()
                    except Exception as exc:  # the driver's or a type's own words
                        first = (str(getattr(exc, "orig", exc)).strip().splitlines() or [""])[0][:200]
                        return [f"this release cannot read table {table.name} as the release at {since} "
                                f"writes it: {first}"]
        finally:
            transaction.rollback()
    return []


def _sample(column: Any) -> Any:
    """A value the column takes (long enough for none of its checks to refuse it)."""
    from sqlalchemy import JSON, Boolean, Float, Integer, LargeBinary, Numeric

    kind = column.type
    if isinstance(kind, Boolean):
        return False
    if isinstance(kind, Integer):
        return 1
    if isinstance(kind, Float | Numeric):
        return 1.0
    if isinstance(kind, LargeBinary):
        return b"x"
    if isinstance(kind, JSON):
        return {}
    return "x"
