"""Store URLs for the federation tests: SQLite, and a real PostgreSQL when one can be started."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupool.server import pgtemp


@pytest.fixture(scope="session")
def fed_postgres() -> Iterator[pgtemp.TempPostgres]:
    reason = pgtemp.why_unavailable()
    if reason:
        pytest.skip(f"PostgreSQL tests skipped: {reason}")
    server = pgtemp.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def hub_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'hub.sqlite'}"
    server: pgtemp.TempPostgres = request.getfixturevalue("fed_postgres")
    return server.create_database()
