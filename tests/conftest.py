"""Shared fixtures: the optional shared data directory."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

# A run started in the background (`nohup make test &`, a CI step's shell without job control) gets
# SIGINT ignored, and so would every CLI process a test starts and then interrupts (`events -f`,
# `ls --watch`, `exec`): they never saw the Ctrl-C and the tests waited out their timeouts. Each
# test process takes Python's own handler back, and its children get the default again at exec.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Typer sets PYDANTIC_DISABLE_PLUGINS around every option it builds and then deletes it if it was not
# set: at each in-process CLI call (CliRunner), a variable added to and removed from the C
# environment while a live server's thread may be in getenv, and glibc may move and free the array
# it reads. Set here, before any thread starts, and empty (no plugin is named ""), typer only ever
# overwrites it.
os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "")

from gpupool.server import pgtemp
from gpupool.sim.datadir import data_dir
from ports import free_port
from work_units import longest_first, recorded_durations, xdist_scope


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The shared data directory, or skip the test with the reason."""
    path = data_dir()
    if path is None:
        pytest.skip("shared data directory not found (set GPUPOOL_DATA_DIR to enable dataset tests)")
    return path


@pytest.fixture(scope="session", autouse=True)
def fresh_pools_accounts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Every `gpupool up` on a fresh data directory is a new pool with a new id, so as root it makes
    new pod accounts (`gpupool-<pool id>-<tenant>`): at the end of the run, those of the pools whose
    data directories this run made (a `pool-id` file under its temporary directory) are removed, so
    test runs do not pile up system accounts. A process still running as one is a pod a test left
    behind (a stopped server leaves its pods running, for the next start to adopt): it is killed
    first, and named, rather than waited on."""
    yield
    import pwd
    import warnings

    if os.geteuid() != 0:
        return
    from gpupool.agent.identity import pids_of, remove_account, remove_left_behind
    from gpupool.errors import GpupoolError

    pools = set()
    for found in tmp_path_factory.getbasetemp().rglob("pool-id"):
        try:
            pools.add(found.read_text().strip())
        except OSError:
            continue
    ours = [entry for entry in pwd.getpwall()
            if any(pool and entry.pw_name.startswith(f"gpupool-{pool}-") for pool in pools)]
    for entry in ours:
        left = pids_of(entry.pw_uid)
        if left:
            warnings.warn(f"{len(left)} process(es) a test left running as {entry.pw_name}, killed: "
                          f"{sorted({_command(pid) for pid in left})[:3]}", stacklevel=1)
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
    remove_left_behind({entry.pw_uid for entry in ours})  # what they left in /tmp and the like, in one walk
    for entry in ours:
        try:
            remove_account(entry.pw_name, sweep=False)
        except GpupoolError:
            continue  # still in use: left as it is


def _command(pid: int) -> str:
    """A process's command name ('' once it ended)."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


@pytest.fixture(scope="session", autouse=True)
def pod_scratch_root() -> Iterator[Path]:
    """A scratch root for pods' private directories that every account can enter (pytest's own
    temporary directories are closed to other users, and pods run as other accounts under root)."""
    import os
    import shutil
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="gpupool-test-pods-"))
    os.chmod(root, 0o711)
    previous = os.environ.get("GPUPOOL_SCRATCH_DIR")
    os.environ["GPUPOOL_SCRATCH_DIR"] = str(root)
    try:
        yield root
    finally:
        if previous is None:
            os.environ.pop("GPUPOOL_SCRATCH_DIR", None)
        else:
            os.environ["GPUPOOL_SCRATCH_DIR"] = previous
        shutil.rmtree(root, ignore_errors=True)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Each test process keeps what collection built (every test module, the package, 3,000 items)
    for the whole run, and the collector would walk it at every full collection: it is frozen and
    young collections made rarer, as the server does with its own heap at start (`gc_tuning`)."""
    from gpupool.gc_tuning import tune

    tune()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Schedule by `xdist_scope` (pytest-xdist's own --dist loadgroup marks do not reach its
    scheduler with pytest 9.2, and --dist loadfile would split the Ray tests over workers), the
    longest units first by DURATIONS (xdist's own order, by number of tests, left a 30-second file
    with three tests for the end)."""
    from xdist.scheduler import LoadScopeScheduling

    class ByFile(LoadScopeScheduling):
        ordered = False

        def _split_scope(self, nodeid: str) -> str:
            return xdist_scope(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            if not self.ordered:  # once, when the whole collection is known
                order = longest_first(self.workqueue, recorded_durations())
                units = {unit: self.workqueue[unit] for unit in order}
                self.workqueue.clear()
                self.workqueue.update(units)
                self.ordered = True
            super()._assign_work_unit(node)

    return ByFile(config, log)


# One throwaway PostgreSQL per test process, shared by every test directory that asks for a store URL.
_UMASK = os.umask(0o022)
os.umask(_UMASK)
"""The worker's umask as it started."""


@pytest.fixture(scope="module", autouse=True)
def umask_per_module() -> Iterator[None]:
    """Each test file starts and ends with the worker's own umask: a server run in the test process
    (`secure_data_dir`, as `gpupool up` does) sets 077 for the whole process, and a later file's
    files meant for pods' accounts (a `--workdir`'s contents) were then unreadable to them."""
    os.umask(_UMASK)
    yield
    os.umask(_UMASK)


@pytest.fixture(scope="session", autouse=True)
def migrated_sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A new, empty SQLite store that `Store.open` brings to the head revision starts as a copy of
    one this process migrated once (SQLite's backup API, page by page), instead of running every
    migration again: about 45 ms of CPU each, and a run opens some 500 such stores in its own
    processes. The copy holds exactly what the migrations made (they made it, and they write no
    time or random value); a store at another revision, one that is not empty, PostgreSQL, and every
    direct call of `upgrade` (tests/server/test_migrations.py, test_schema_compat.py) still go
    through alembic, and so does every `gpupool up` a test starts."""
    import sqlite3

    from sqlalchemy.engine import Engine

    from gpupool.server import db

    migrate = db.upgrade
    template: list[Path] = []

    def upgrade(engine: Engine, revision: str = "head") -> None:
        path = engine.url.database if engine.dialect.name == "sqlite" else None
        if revision != "head" or not path or path == ":memory:":
            return migrate(engine, revision)
        try:
            with engine.connect() as conn:
                empty = not conn.exec_driver_sql("SELECT count(*) FROM sqlite_master").scalar()
        except Exception:  # unreadable, not a database: alembic fails as the server would
            empty = False
        if not empty:
            return migrate(engine, revision)  # a store with tables: alembic decides
        if not template:
            made = tmp_path_factory.mktemp("migrated") / "head.sqlite"
            once = db.make_engine(f"sqlite:///{made}")
            migrate(once)
            once.dispose()
            template.append(made)
        source = sqlite3.connect(template[0])
        target = engine.raw_connection()
        try:
            source.backup(target.driver_connection)  # type: ignore[arg-type]
        finally:
            target.close()
            source.close()

    db.upgrade = upgrade
    try:
        yield
    finally:
        db.upgrade = migrate


@pytest.fixture(scope="session")
def postgres() -> Iterator[pgtemp.TempPostgres]:
    reason = pgtemp.why_unavailable()
    if reason:
        pytest.skip(f"PostgreSQL tests skipped: {reason}")
    server = pgtemp.start(free_port=free_port)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.sqlite'}"
    server: pgtemp.TempPostgres = request.getfixturevalue("postgres")
    return server.create_database()
