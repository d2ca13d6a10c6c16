"""`gpupool backup FILE` / `gpupool restore FILE` (admin): the pool's store and keys in one file.

Both run on the server's machine as the server's user (they read and write its data directory,
which only that user can open); see gpupool/server/backup.py for what a backup holds.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from gpupool.cli._common import directory, reports_errors

DataDirOption = Annotated[Path | None, typer.Option("--data-dir", parser=directory("--data-dir"), help=(
    "The pool's data directory (default: the user data dir, as for `gpupool up`)."))]
DatabaseUrlOption = Annotated[str, typer.Option("--database-url", help=(
    "The pool's PostgreSQL store, as given to `gpupool up` (default: SQLite in DATA_DIR); a URL with "
    "a password goes in --database-url-file or GPUPOOL_DATABASE_URL."))]
DatabaseUrlFileOption = Annotated[Path | None, typer.Option("--database-url-file", help=(
    "A file (mode 0600) holding the database URL."))]
PassphraseOption = Annotated[Path | None, typer.Option("--passphrase-file", help=(
    "A file holding a passphrase (8 characters or more): the data directory's secrets.key and "
    "admin-token go into the backup encrypted with it (without it they are left out)."))]
RestorePassphraseOption = Annotated[Path | None, typer.Option("--passphrase-file", help=(
    "A file holding the passphrase `gpupool backup` was given: it decrypts the backup's secrets.key "
    "and admin-token into the data directory. Needed when the backup holds them; a backup made "
    "without one holds no keys."))]


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _store(data_dir: Path | None, database_url: str, database_url_file: Path | None) -> tuple[Path, str]:
    from gpupool.server import dburl
    from gpupool.server.settings import Settings, default_data_dir

    url = dburl.resolve(database_url, database_url_file)
    if url:
        dburl.check(url)
    settings = Settings(data_dir=data_dir or default_data_dir(), database_url=url)
    return settings.data_dir, settings.resolved_database_url


@reports_errors
def backup(
    file: Annotated[Path, typer.Argument(help="The backup file to write (it must not exist yet).")],
    data_dir: DataDirOption = None,
    database_url: DatabaseUrlOption = "",
    database_url_file: DatabaseUrlFileOption = None,
    passphrase_file: PassphraseOption = None,
) -> None:
    """Back up the pool (admin): its store (every workload, tenant, token hash, secret, usage row and
    event) and, with --passphrase-file, its keys. The server may keep running: SQLite is copied
    through its online backup API, PostgreSQL dumped by pg_dump, each a consistent snapshot.

    Not in the backup: pods' logs and the agents' state, container images (import them again), the
    configuration file, TLS files, and files pods wrote themselves (checkpoints).

    Example: gpupool backup pool-2026-12-05.tar --passphrase-file ~/.pool-passphrase
    """
    from gpupool.server.backup import backup as run_backup
    from gpupool.server.backup import read_passphrase

    data, url = _store(data_dir, database_url, database_url_file)
    passphrase = read_passphrase(passphrase_file) if passphrase_file is not None else None
    summary = run_backup(data, url, file, passphrase=passphrase, progress=_progress)
    for warning in summary.warnings:
        print(f"WARNING: {warning}", file=sys.stderr)
    keys = ", ".join(summary.sealed) + " (encrypted)" if summary.sealed else "no keys"
    print(f"backed up {_which_store(data_dir, data, url)} at revision {summary.revision}: "
          f"{_rows_text(summary.rows)}, {keys}; {summary.size_bytes / 2**20:.1f} MiB in "
          f"{summary.seconds:.1f} s to {file}")
    from gpupool.server.backup import NOT_INCLUDED

    print(f"not in the backup: {NOT_INCLUDED}")


@reports_errors
def restore(
    file: Annotated[Path, typer.Argument(help="A file written by `gpupool backup`.")],
    data_dir: DataDirOption = None,
    database_url: DatabaseUrlOption = "",
    database_url_file: DatabaseUrlFileOption = None,
    passphrase_file: RestorePassphraseOption = None,
) -> None:
    """Restore a backup into a stopped, fresh pool (admin): refused while a server runs on the data
    directory, or when its store already holds tables. Then start it with `gpupool up` (an older
    backup's schema is migrated then).

    Example: gpupool restore pool-2026-12-05.tar --data-dir /srv/gpupool --passphrase-file KEYFILE
    """
    from gpupool.server.backup import read_passphrase
    from gpupool.server.backup import restore as run_restore

    data, url = _store(data_dir, database_url, database_url_file)
    passphrase = read_passphrase(passphrase_file) if passphrase_file is not None else None
    summary = run_restore(file, data, url, passphrase=passphrase, progress=_progress)
    for warning in summary.warnings:
        print(f"WARNING: {warning}", file=sys.stderr)
    keys = ", ".join(summary.sealed) if summary.sealed else "no keys"
    print(f"restored {summary.backend} store at revision {summary.revision}: {_rows_text(summary.rows)}, "
          f"{keys}, in {summary.seconds:.1f} s; start it with gpupool up --data-dir {data}")


def _which_store(given: Path | None, data: Path, url: str) -> str:
    """The store backed up, named: a pool started with --data-dir or --database-url is backed up with
    the same flag, and the default data directory (where the flags are left out) may hold another."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        where = parsed.render_as_string(hide_password=True)
        return f"the PostgreSQL store {where}"
    if given is not None:
        return f"the SQLite store in {data}"
    return (f"the SQLite store in {data}, the default data directory (a pool started with "
            "--data-dir DIR is backed up with --data-dir DIR)")


def _rows_text(rows: dict[str, int]) -> str:
    shown = ("workloads", "tenants", "tokens", "secrets", "usage_daily")
    return ", ".join(f"{rows.get(name, 0)} {name}" for name in shown)
