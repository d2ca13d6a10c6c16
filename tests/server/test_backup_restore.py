"""`gpupool backup` / `gpupool restore`: round trips into fresh pools (SQLite while the server runs and
writes; PostgreSQL through pg_dump/pg_restore), the refusal of a running or non-empty pool, and
damaged, absent or wrongly opened backup files."""

from __future__ import annotations

import io
import json
import os
import sqlite3
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from upproc import UpProcess, cli

from factories import node
from gpupool.client import Client
from gpupool.errors import GpupoolError, InvalidInput, NotFound, Unavailable
from gpupool.server import pgtemp
from gpupool.server.backup import backup, find_pg_tool, read_passphrase, restore
from gpupool.server.datadir import pool_id
from gpupool.server.db import Store, make_engine
from gpupool.server.orm import Base, SecretRow, UsageDailyRow
from gpupool.server.schema import SchemaTooNew
from gpupool.server.secretbox import SecretBox
from live import LiveServer, live_server
from ports import free_port
from server.fakes import ManualProvider

PASSPHRASE = "correct horse battery staple"
SECRETS = {"team-a": {"db": {"password": "pw-a-0451"}}, "team-b": {"s3": {"key": "AKIA-b", "secret": "sb"}}}


def _passphrase(tmp: Path) -> Path:
    path = tmp / "passphrase"
    path.write_text(PASSPHRASE + "\n")
    path.chmod(0o600)
    return path


def populate(srv: LiveServer) -> dict[str, str]:
    """Two tenants with a token, a secret and workloads each, and usage rows; returns the tokens."""
    tokens: dict[str, str] = {}
    with Client(srv.url, srv.admin_token) as admin:
        for tenant, secrets in SECRETS.items():
            admin.create_tenant(tenant)
            tokens[tenant] = admin.create_token(tenant).token
            with Client(srv.url, tokens[tenant]) as api:
                for name, data in secrets.items():
                    api.create_secret(name, data)
                for i in range(6):
                    api.submit(command=["sleep", "600"], gpus=1, name=f"{tenant}-{i}")
    with srv.rt.store.write() as session:
        for day in range(3):
            for tenant in SECRETS:
                session.add(UsageDailyRow(day_s=86400.0 * (20000 + day), tenant=tenant, queue="default",
                                          priority_class="", node="n0", model="H100", simulated=False,
                                          compute_milli_s=1000.0 * day, memory_mib_s=1.5, cost=0.25 * day,
                                          dedicated_cost=0.5, unpriced=0, pods=day, pods_carried=0,
                                          pods_first_model=0, pods_carried_first_model=0, pods_first=day,
                                          pods_carried_first=0))
    return tokens


def table_rows(url: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table of the models, in primary-key order."""
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return {table.name: [tuple(row) for row in conn.execute(
                select(table).order_by(*table.primary_key.columns))] for table in Base.metadata.sorted_tables}
    finally:
        engine.dispose()


def check_secrets_open(data_dir: Path, url: str) -> None:
    """Every tenant secret of the store opens with the key in `data_dir`, to the values stored."""
    store = Store.open(url, migrate=False)
    box = SecretBox(data_dir)
    try:
        with store.read() as session:
            rows = session.scalars(select(SecretRow)).all()
            opened = {(r.tenant, r.name): box.open(r.tenant, r.name, r.sealed) for r in rows}
    finally:
        store.close()
    assert opened == {(t, n): {k: v.encode() for k, v in d.items()}
                      for t, secrets in SECRETS.items() for n, d in secrets.items()}


def run(*args: str) -> Any:
    return cli(list(args), env={}, timeout_s=120)


def one_error(result: Any, code: int, *words: str) -> str:
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr
    for word in words:
        assert word in errors[0], errors[0]
    return errors[0]


# --- SQLite, while the server runs ---------------------------------------------------------------

def test_sqlite_backup_while_the_server_writes_restores_every_row(tmp_path: Path) -> None:
    source = tmp_path / "source"
    provider = ManualProvider([node("n0", devices=8, model="H100")])
    with live_server(source, provider) as srv:
        pool_id(source)  # as `gpupool up` makes it
        tokens = populate(srv)
        url = srv.rt.settings.resolved_database_url
        acknowledged: list[str] = []
        stop = threading.Event()

        def submit_meanwhile() -> None:
            with Client(srv.url, tokens["team-a"]) as api:
                while not stop.is_set():
                    acknowledged.append(api.submit(command=["true"], gpus=0, name="during"))

        writer = threading.Thread(target=submit_meanwhile)
        writer.start()
        try:
            while len(acknowledged) < 5:  # the writer is under way before the backup starts
                time.sleep(0.01)
            before = len(acknowledged)
            done = run("backup", str(tmp_path / "pool.tar"), "--data-dir", str(source),
                       "--passphrase-file", str(_passphrase(tmp_path)))
        finally:
            stop.set()
            writer.join(timeout=60)
        assert done.returncode == 0, done.stderr
        assert "backup: 100%" in done.stderr and "admin-token, secrets.key (encrypted)" in done.stdout
        static = {name: rows for name, rows in table_rows(url).items()
                  if name in ("tenants", "queues", "secrets", "usage_daily")}
        hashes = {row[1] for row in table_rows(url)["tokens"]}
        live_workloads = {row[0]: row for row in table_rows(url)["workloads"]}

    restored = tmp_path / "restored"
    done = run("restore", str(tmp_path / "pool.tar"), "--data-dir", str(restored),
               "--passphrase-file", str(_passphrase(tmp_path)))
    assert done.returncode == 0, done.stderr
    assert "restore: 100%" in done.stderr and "admin-token, pool-id, secrets.key" in done.stdout
    rurl = f"sqlite:///{restored / 'gpupool.sqlite'}"
    with sqlite3.connect(restored / "gpupool.sqlite") as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    rows = table_rows(rurl)
    assert {name: rows[name] for name in static} == static
    assert len(static["usage_daily"]) == 6 and len(static["secrets"]) == 2
    assert {row[1] for row in rows["tokens"]} == hashes  # every token hash (admin + two tenants)
    restored_workloads = {row[0]: row for row in rows["workloads"]}
    assert set(acknowledged[:before]) <= set(restored_workloads)  # acknowledged before it: all kept
    assert set(restored_workloads) <= set(live_workloads)  # nothing invented
    for wid, row in restored_workloads.items():  # name, tenant, queue and spec as submitted
        assert row[1:4] + row[7:8] == live_workloads[wid][1:4] + live_workloads[wid][7:8]
    for name in ("pool-id", "secrets.key", "admin-token"):
        assert (restored / name).read_bytes() == (source / name).read_bytes()
        assert (restored / name).stat().st_mode & 0o077 == 0
    check_secrets_open(restored, rurl)

    # The restored pool serves: the tenants' old tokens work, their workloads and secrets are there.
    with live_server(restored, ManualProvider([node("n0", devices=8, model="H100")])) as again, \
            Client(again.url, tokens["team-b"]) as api:
        names = sorted(w.name for w in api.workloads().items)
        assert names == [f"team-b-{i}" for i in range(6)]
        assert [s.name for s in api.secrets()] == ["s3"]


# --- PostgreSQL ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def postgres_tools() -> None:
    reason = pgtemp.why_unavailable()
    if reason:
        pytest.skip(f"PostgreSQL tests skipped: {reason}")
    try:
        find_pg_tool("pg_dump")
        find_pg_tool("pg_restore")
    except Exception as exc:
        pytest.skip(f"PostgreSQL backup tests skipped: {exc}")


def test_postgresql_round_trip_restores_every_row_of_every_table(
        tmp_path: Path, postgres: pgtemp.TempPostgres, postgres_tools: None) -> None:
    source_url = postgres.create_database()
    source = tmp_path / "source"
    with live_server(source, ManualProvider([node("n0", devices=8, model="H100")]), source_url) as srv:
        populate(srv)
    before = table_rows(source_url)
    assert len(before["workloads"]) == 12 and len(before["usage_daily"]) == 6

    done = run("backup", str(tmp_path / "pg.tar"), "--data-dir", str(source), "--database-url", source_url,
               "--passphrase-file", str(_passphrase(tmp_path)))
    assert done.returncode == 0, done.stderr
    assert "backup: table" in done.stderr and "backed up the PostgreSQL store postgresql" in done.stdout
    target_url = postgres.create_database()
    restored = tmp_path / "restored"
    done = run("restore", str(tmp_path / "pg.tar"), "--data-dir", str(restored), "--database-url", target_url,
               "--passphrase-file", str(_passphrase(tmp_path)))
    assert done.returncode == 0, done.stderr
    assert table_rows(target_url) == before  # every workload, tenant, token hash, secret, usage row...
    check_secrets_open(restored, target_url)

    again = run("restore", str(tmp_path / "pg.tar"), "--data-dir", str(tmp_path / "third"),
                "--database-url", target_url, "--passphrase-file", str(_passphrase(tmp_path)))
    one_error(again, 2, "already holds a pool", "empty database")
    sqlite_target = run("restore", str(tmp_path / "pg.tar"), "--data-dir", str(tmp_path / "fourth"),
                        "--passphrase-file", str(_passphrase(tmp_path)))
    one_error(sqlite_target, 2, "holds a postgresql store", "with --database-url")


# --- refusals ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def small_backup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """A backup (with its keys sealed) of a freshly made pool, and its passphrase file."""
    root = tmp_path_factory.mktemp("small")
    with live_server(root / "pool", ManualProvider([node("n0", devices=8, model="H100")])) as srv:
        populate(srv)
        done = run("backup", str(root / "pool.tar"), "--data-dir", str(root / "pool"),
                   "--passphrase-file", str(_passphrase(root)))
        assert done.returncode == 0, done.stderr
    yield root / "pool.tar", _passphrase(root)


def test_restore_into_a_running_pool_is_refused(tmp_path: Path, small_backup: tuple[Path, Path]) -> None:
    archive, passphrase = small_backup
    server = UpProcess(tmp_path / "running", ["--simulate", "1x8xH100"]).start()
    try:
        refused = run("restore", str(archive), "--data-dir", str(server.data_dir),
                      "--passphrase-file", str(passphrase))
        one_error(refused, 2, "server is running on", "stop it")
        assert server.proc is not None and server.proc.poll() is None
        done = run("backup", str(tmp_path / "of-running.tar"), "--data-dir", str(server.data_dir))
        assert done.returncode == 0, done.stderr  # a running `gpupool up` is backed up as it serves
    finally:
        server.stop()
    refused = run("restore", str(archive), "--data-dir", str(server.data_dir), "--passphrase-file",
                  str(passphrase))
    one_error(refused, 2, "already holds a pool", "fresh one")


def test_a_backup_names_the_store_it_read_the_default_data_directorys_as_such(tmp_path: Path) -> None:
    """A pool started with --data-dir is backed up with it; without the flag the backup reads the
    default data directory, which may hold another pool: it says which it read."""
    default = tmp_path / "xdg" / "gpupool"
    with live_server(default, ManualProvider([node("n0", devices=8, model="H100")])) as srv:
        populate(srv)
    done = cli(["backup", str(tmp_path / "default.tar")], env={"XDG_DATA_HOME": str(tmp_path / "xdg")},
               timeout_s=120)
    assert done.returncode == 0, done.stderr
    assert (f"backed up the SQLite store in {default}, the default data directory (a pool started with "
            "--data-dir DIR is backed up with --data-dir DIR) at revision ") in done.stdout


def test_a_backup_without_passphrase_says_loudly_what_to_copy(tmp_path: Path) -> None:
    with live_server(tmp_path / "pool", ManualProvider([node("n0", devices=8, model="H100")])) as srv:
        pool_id(tmp_path / "pool")
        populate(srv)
        done = run("backup", str(tmp_path / "bare.tar"), "--data-dir", str(tmp_path / "pool"))
    assert done.returncode == 0, done.stderr
    assert f"backed up the SQLite store in {tmp_path / 'pool'} at revision " in done.stdout
    assert f"WARNING: {tmp_path / 'pool' / 'secrets.key'} is NOT in this backup" in done.stderr
    assert "not in the backup: pods' logs" in done.stdout and "container images" in done.stdout
    with tarfile.open(tmp_path / "bare.tar") as archive:
        assert sorted(archive.getnames()) == ["manifest.json", "pool-id", "store.sqlite"]
    done = run("restore", str(tmp_path / "bare.tar"), "--data-dir", str(tmp_path / "restored"))
    assert done.returncode == 0, done.stderr
    assert "but not the key that opens them" in done.stderr
    assert not (tmp_path / "restored" / "secrets.key").exists()


def _rewritten(archive: Path, dest: Path, change: dict[str, bytes]) -> Path:
    """A copy of `archive` with some members' contents replaced (its manifest kept)."""
    with tarfile.open(archive) as old, tarfile.open(dest, "w") as new:
        for info in old.getmembers():
            handle = old.extractfile(info)
            assert handle is not None
            data = change.get(info.name, handle.read())
            info.size = len(data)
            new.addfile(info, io.BytesIO(data))
    return dest


def test_damaged_absent_or_wrongly_opened_backups_are_refused_with_a_sentence(
        tmp_path: Path, small_backup: tuple[Path, Path]) -> None:
    """Through the CLI for the exit codes; the other refusals in-process (the same errors, faster)."""
    archive, passphrase_file = small_backup
    fresh = tmp_path / "fresh"
    target = ["--data-dir", str(fresh), "--passphrase-file", str(passphrase_file)]
    one_error(run("restore", str(tmp_path / "nothing.tar"), *target), 3, "No backup file")
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"not a backup at all\n" * 100)
    one_error(run("restore", str(junk), *target), 2, "not a usable gpupool backup")

    url = f"sqlite:///{fresh / 'gpupool.sqlite'}"
    passphrase = read_passphrase(passphrase_file)

    def refused(source: Path, error: type[GpupoolError], words: str, key: bytes | None = passphrase) -> None:
        with pytest.raises(error) as caught:
            restore(source, fresh, url, passphrase=key)
        assert words in caught.value.message and "\n" not in caught.value.message, caught.value.message

    truncated = tmp_path / "truncated.tar"
    truncated.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    refused(truncated, InvalidInput, "not a usable gpupool backup")
    with tarfile.open(archive) as old:
        handle = old.extractfile("store.sqlite")
        assert handle is not None
        store = bytearray(handle.read())
    store[len(store) // 2] ^= 0xFF
    flipped = _rewritten(archive, tmp_path / "flipped.tar", {"store.sqlite": bytes(store)})
    refused(flipped, InvalidInput, "store.sqlite does not match its checksum")
    refused(archive, InvalidInput, "passphrase does not open", b"not the passphrase")
    refused(archive, InvalidInput, "give --passphrase-file", None)
    with tarfile.open(archive) as old:
        handle = old.extractfile("manifest.json")
        assert handle is not None
        newer = json.loads(handle.read())
    newer["revision"] = "9999"
    future = _rewritten(archive, tmp_path / "future.tar", {"manifest.json": json.dumps(newer).encode()})
    refused(future, SchemaTooNew, "revision 9999, newer than this gpupool knows")
    del newer["backend"]
    bare = _rewritten(archive, tmp_path / "bare.tar", {"manifest.json": json.dumps(newer).encode()})
    refused(bare, InvalidInput, "manifest lacks the store's kind")
    other = tmp_path / "other-keys"
    other.mkdir(mode=0o700)
    (other / "secrets.key").write_bytes(os.urandom(32))  # another pool's key: it would open nothing here
    with pytest.raises(InvalidInput, match=r"secrets\.key' exists and differs from the backup's"):
        restore(archive, other, f"sqlite:///{other / 'gpupool.sqlite'}", passphrase=passphrase)
    assert not (other / "gpupool.sqlite").exists()
    assert not (fresh / "gpupool.sqlite").exists()  # nothing was restored by any of them
    with pytest.raises(InvalidInput, match="exists already"):
        backup(fresh, url, archive)
    closed = f"postgresql+psycopg://postgres:pw-never-shown@127.0.0.1:{free_port()}/pool"
    with pytest.raises(Unavailable) as unreachable:  # a store that cannot be reached: the driver's words
        backup(fresh, closed, tmp_path / "unreachable.tar")
    assert "Cannot open the pool's store" in unreachable.value.message
    assert "pw-never-shown" not in unreachable.value.message and "\n" not in unreachable.value.message
    with pytest.raises(NotFound, match="No store at"):
        backup(tmp_path / "empty", f"sqlite:///{tmp_path / 'empty' / 'gpupool.sqlite'}", tmp_path / "new.tar")


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user needs root")
def test_restore_refuses_a_data_directory_of_another_user(tmp_path: Path,
                                                          small_backup: tuple[Path, Path]) -> None:
    archive, passphrase = small_backup
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, 65534, 65534)  # nobody's
    refused = run("restore", str(archive), "--data-dir", str(theirs), "--passphrase-file", str(passphrase))
    one_error(refused, 2, "not a directory owned by this user")
    assert list(theirs.iterdir()) == []  # not even the lock file was made there


def test_sealed_keys_that_name_other_paths_are_refused(tmp_path: Path) -> None:
    """The sealed part's names become paths under the data directory: a backup altered to name
    `../x` or an absolute path (its checksum rewritten, the passphrase known) wrote files anywhere
    the restoring user can write. Only the pool's own key files are taken."""
    import hashlib

    from gpupool.server.backup import MANIFEST, SEALED_MEMBER, _seal
    from gpupool.server.db import Store

    phrase = b"correct horse battery staple"
    source = tmp_path / "src"
    source.mkdir(mode=0o700)
    url = f"sqlite:///{source / 'gpupool.db'}"
    Store.open(url, migrate=True).close()
    (source / "admin-token").write_text("gp_x\n")
    good, altered = tmp_path / "good.tar", tmp_path / "altered.tar"
    backup(source, url, good, passphrase=phrase)
    outside, absolute = tmp_path / "outside", tmp_path / "absolute.txt"
    outside.mkdir()
    sealed = _seal({"secrets.key": b"k" * 32, "../outside/planted": b"relative", str(absolute): b"absolute"},
                   phrase)
    with tarfile.open(good) as original, tarfile.open(altered, "w") as out:
        manifest = json.loads(original.extractfile(MANIFEST).read())  # type: ignore[union-attr]
        manifest["sha256"][SEALED_MEMBER] = hashlib.sha256(sealed).hexdigest()
        for info in original.getmembers():
            data = original.extractfile(info).read()  # type: ignore[union-attr]
            data = json.dumps(manifest).encode() if info.name == MANIFEST else \
                sealed if info.name == SEALED_MEMBER else data
            info.size = len(data)
            out.addfile(info, io.BytesIO(data))
    target = tmp_path / "dst"
    with pytest.raises(InvalidInput, match="which no `gpupool backup` writes"):
        restore(altered, target, f"sqlite:///{target / 'gpupool.db'}", passphrase=phrase)
    assert not (outside / "planted").exists() and not absolute.exists()
