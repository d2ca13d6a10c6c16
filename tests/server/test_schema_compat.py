"""Upgrades: a store newer than the code is refused in one sentence, and the migrations since the last
release only expand the schema, so the last release's servers keep working on the migrated store."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from gpupool.server import pgtemp
from gpupool.server.db import MIGRATIONS_DIR, Store, make_engine, upgrade
from gpupool.server.schema import (
    LAST_RELEASED,
    SchemaTooNew,
    current_revision,
    expand_problems,
    head_revision,
)
from ports import free_port


def _engines(db_url: str, tmp_path: Path, request: pytest.FixtureRequest) -> Callable[[], Engine]:
    """Engines on fresh empty databases of the same kind as `db_url`."""
    count = [0]

    def make() -> Engine:
        count[0] += 1
        if db_url.startswith("sqlite"):
            return make_engine(f"sqlite:///{tmp_path / f'compat{count[0]}.sqlite'}")
        server: pgtemp.TempPostgres = request.getfixturevalue("postgres")
        return make_engine(server.create_database())

    return make


def _bump(engine: Engine, revision: str) -> None:
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = :r"), {"r": revision})


def test_a_store_newer_than_the_code_is_refused_naming_both_revisions(db_url: str) -> None:
    engine = make_engine(db_url)
    try:
        upgrade(engine)
        assert current_revision(engine) == head_revision()
        _bump(engine, "9999")
        with pytest.raises(SchemaTooNew) as refused:
            Store.open(db_url)
        message = refused.value.message
        assert "revision 9999" in message and f"newest is {head_revision()}" in message
        assert "never an older one" in message and "\n" not in message
        assert current_revision(engine) == "9999"  # refused before anything was written
    finally:
        engine.dispose()


def test_gpupool_up_on_a_newer_store_exits_2_with_the_sentence(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    engine = make_engine(f"sqlite:///{data / 'gpupool.sqlite'}")
    upgrade(engine)
    _bump(engine, "9999")
    engine.dispose()
    from upproc import cli

    result = cli(["up", "--data-dir", str(data), "--simulate", "1x8xH100",
                  "--port", str(free_port())], env={})
    assert result.returncode == 2, (result.stdout, result.stderr)
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert errors and "schema is at revision 9999" in errors[0], result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("since", ["0008", LAST_RELEASED])
def test_migrations_since_a_release_only_expand(db_url: str, tmp_path: Path,
                                                request: pytest.FixtureRequest, since: str) -> None:
    """The rolling upgrade on one database: the schema of the release at `since`, migrated to the
    newest, still takes that release's writes (only its columns given) and reads them back."""
    assert expand_problems(_engines(db_url, tmp_path, request), since=since) == []


BAD_MIGRATIONS = {
    "drops a column": ("with op.batch_alter_table('tenants') as b:\n        b.drop_column('budget_warn')",
                       "column tenants.budget_warn is dropped"),
    "adds NOT NULL without a default": (
        "with op.batch_alter_table('workloads') as b:\n"
        "        b.add_column(sa.Column('shard', sa.Integer(), nullable=False))",
        "column workloads.shard is NOT NULL without a server default"),
    "renames a table": ("op.rename_table('node_flags', 'node_marks')",
                        "table node_flags is dropped or renamed"),
    "refuses the old writes": (
        "with op.batch_alter_table('tenants') as b:\n"
        "        b.create_check_constraint('ck_pending', 'max_pending < 0')",
        "cannot write table tenants"),
}
GOOD_MIGRATION = ("op.create_table('notes', sa.Column('id', sa.String(8), primary_key=True))\n"
                  "    with op.batch_alter_table('workloads') as b:\n"
                  "        b.add_column(sa.Column('note', sa.String(40), nullable=True))\n"
                  "        b.add_column(sa.Column('shard', sa.Integer(), nullable=False,\n"
                  "                               server_default='0'))")


def _with_migration(tmp_path: Path, body: str) -> Path:
    """A copy of the packaged migrations with one more revision after the newest, doing `body`."""
    location = tmp_path / "migrations"
    shutil.copytree(MIGRATIONS_DIR, location, ignore=shutil.ignore_patterns("__pycache__"))
    head = head_revision()
    (location / "versions" / "0999_probe.py").write_text(
        "import sqlalchemy as sa\nfrom alembic import op\n\n"
        f"revision = '0999'\ndown_revision = '{head}'\nbranch_labels = None\ndepends_on = None\n\n\n"
        f"def upgrade() -> None:\n    {body}\n\n\ndef downgrade() -> None:\n    pass\n")
    return location


@pytest.mark.parametrize("kind", sorted(BAD_MIGRATIONS))
def test_a_contracting_migration_is_caught(tmp_path: Path, kind: str) -> None:
    body, expected = BAD_MIGRATIONS[kind]
    count = [0]

    def make() -> Engine:
        count[0] += 1
        return make_engine(f"sqlite:///{tmp_path / f's{count[0]}.sqlite'}")

    problems = expand_problems(make, since=head_revision(), location=_with_migration(tmp_path, body))
    assert any(expected in problem for problem in problems), problems


def test_an_expanding_migration_passes(tmp_path: Path) -> None:
    def make() -> Engine:
        return make_engine(f"sqlite:///{tmp_path / 'good.sqlite'}")

    location = _with_migration(tmp_path, GOOD_MIGRATION)
    assert expand_problems(make, since=head_revision(), location=location) == []


def test_models_that_cannot_read_the_last_releases_rows_are_caught(tmp_path: Path) -> None:
    """This code's models expecting a column that no migration adds (the old rows cannot have it)."""
    from sqlalchemy import Column, MetaData, String

    from gpupool.server.orm import Base

    models = MetaData()
    for table in Base.metadata.sorted_tables:
        table.to_metadata(models)
    models.tables["tenants"].append_column(Column("region", String(16), nullable=True))

    def make() -> Engine:
        return make_engine(f"sqlite:///{tmp_path / 'models.sqlite'}")

    problems = expand_problems(make, since=head_revision(), models=models)
    assert problems and "cannot read table tenants" in problems[0] and "region" in problems[0], problems


def test_the_marker_is_a_known_revision() -> None:
    """LAST_RELEASED names a revision of this tree (a typo would make the check above vacuous)."""
    from gpupool.server.schema import script_directory

    assert LAST_RELEASED in {s.revision for s in script_directory().walk_revisions()}
