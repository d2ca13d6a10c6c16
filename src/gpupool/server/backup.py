"""`gpupool backup` / `gpupool restore`: the pool's store and the data directory's keys in one file.

A backup is a tar archive (mode 0600) of:

- `manifest.json`: the format, the store's kind and schema revision, when, the rows per table, and
  the SHA-256 of every other member (a damaged or truncated file is refused at restore);
- the store: SQLite copied through its online backup API in one step (one read transaction: a
  consistent snapshot while the server runs and writes, never blocking it in WAL mode), or
  PostgreSQL dumped by `pg_dump -Fc` (one snapshot transaction);
- `pool-id` (it names the pods' accounts), in the clear;
- with a passphrase, `keys.sealed`: `secrets.key` (it opens every tenant's secret) and `admin-token`,
  encrypted with AES-256-GCM under a key derived from the passphrase by scrypt. Without one they
  are left out and the command says which file to copy and keep safe.

Not in a backup: pods' logs and the agents' state (DATA_DIR/agents or --agent-dir), container
images (DATA_DIR/images: import them again), the configuration file (--config), TLS files, and
anything pods wrote to their own directories (checkpoints are the job's own files).

Restore goes only into a stopped pool with an empty store: `gpupool up` holds DATA_DIR/server.lock
(shared, so several servers may share one data directory) while it runs, and restore takes it
exclusively or refuses.
"""

from __future__ import annotations

import base64
import fcntl
import glob
import hashlib
import io
import json
import os
import shutil
import sqlite3
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from gpupool.errors import InvalidInput, NotFound, Unavailable

FORMAT = 1
MANIFEST = "manifest.json"
SQLITE_MEMBER = "store.sqlite"
PG_MEMBER = "store.pgdump"
SEALED_MEMBER = "keys.sealed"
CLEAR_FILES = ("pool-id",)
SEALED_FILES = ("secrets.key", "admin-token")
LOCK_FILE = "server.lock"
NOT_INCLUDED = ("pods' logs and the agents' state, container images (import them again), the "
                "configuration file, TLS files, and files pods wrote themselves (checkpoints)")
_SCRYPT = {"n": 2**15, "r": 8, "p": 1}
_CHUNK = 1 << 20

Progress = Callable[[str], None]


# --- the running server's lock ---------------------------------------------------------------

def hold_server_lock(data_dir: Path, *, shared: bool, flag: str = "--data-dir") -> int:
    """Called by `gpupool up` before it starts anything: a lock on DATA_DIR/server.lock for the life
    of the process (the descriptor is not inherited by pods), which `restore` cannot take while it
    is held. Exclusive, unless `shared` (servers started with --ha share a store, elect one leader,
    and may share one directory): a second server on a directory another one runs on is refused,
    since its node agent would adopt the first's pods and its scheduler place over the first's."""
    fd = os.open(data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise InvalidInput(f"A gpupool server already runs on {str(data_dir)!r} ({flag}); stop it first, or "
                           f"give this one a {flag} of its own. Servers share one only when all of them "
                           "are started with --ha, on one PostgreSQL store (docs/ha.md).") from None
    return fd


@contextmanager
def _stopped_pool(data_dir: Path) -> Iterator[None]:
    """The data directory (made, or checked to be this user's, 0700), with no server running on it for
    as long as the block runs."""
    from gpupool.server.datadir import secure_data_dir

    secure_data_dir(data_dir)
    fd = os.open(data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise InvalidInput(f"A gpupool server is running on {str(data_dir)!r}; stop it (Ctrl-C or "
                               "SIGTERM) before restoring: a backup is restored only into a stopped, "
                               "fresh pool.") from None
        yield
    finally:
        os.close(fd)


# --- PostgreSQL's tools ------------------------------------------------------------------------

def find_pg_tool(name: str) -> str:
    """pg_dump or pg_restore: the newest under /usr/lib/postgresql/*/bin (Debian keeps them there),
    else on PATH; Unavailable with what to install when neither has it."""
    for directory in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True,
                            key=lambda d: int(Path(d).parent.name) if Path(d).parent.name.isdigit() else 0):
        if Path(directory, name).exists():
            return str(Path(directory, name))
    found = shutil.which(name)
    if found:
        return found
    raise Unavailable(f"{name} is not installed here, and a PostgreSQL store is backed up and restored "
                      "with it; install the PostgreSQL client (Debian: apt-get install postgresql-client).")


def _libpq_env(url: str) -> dict[str, str]:
    """The connection as libpq's environment variables, so no password is on a command line."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    for key, value in (("PGHOST", parsed.host), ("PGPORT", parsed.port), ("PGUSER", parsed.username),
                       ("PGPASSWORD", parsed.password), ("PGDATABASE", parsed.database)):
        if value:
            env[key] = str(value)
    for key, given in parsed.query.items():
        if key in ("sslmode", "sslrootcert", "sslcert", "sslkey", "host", "port"):
            env[f"PG{key.upper()}"] = given if isinstance(given, str) else given[0]
    return env


def _run_pg(argv: list[str], url: str, progress: Progress, what: str) -> None:
    """Run pg_dump/pg_restore -v, turning its per-table lines into progress; its error on failure."""
    proc = subprocess.Popen(argv, env=_libpq_env(url), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    tail: list[str] = []
    tables = 0
    for line in proc.stderr:
        line = line.rstrip()
        tail = [*tail, line][-5:]
        if "contents of table" in line or "processing data for table" in line:
            tables += 1
            progress(f"{what}: table {tables}: {line.rsplit(' ', 1)[-1]}")
    if proc.wait() != 0:
        errors = [t for t in tail if "error" in t.lower()] or tail
        raise Unavailable(f"{Path(argv[0]).name} failed: {' '.join(errors)[-400:]}")


# --- what both directions share ----------------------------------------------------------------

@dataclass
class Summary:
    """What a backup holds (or a restore brought back)."""

    backend: str
    revision: str
    rows: dict[str, int]
    sealed: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0
    size_bytes: int = 0


def _sqlite_path(url: str) -> Path:
    from sqlalchemy.engine import make_url

    return Path(str(make_url(url).database))


def _rows(url: str) -> tuple[str, dict[str, int]]:
    """The store's schema revision and rows per table."""
    from sqlalchemy import func, inspect, select, table
    from sqlalchemy.exc import SQLAlchemyError

    from gpupool.server.db import make_engine
    from gpupool.server.schema import current_revision

    engine = make_engine(url)
    try:
        names = sorted(set(inspect(engine).get_table_names()) - {"alembic_version"})
        with engine.connect() as conn:
            rows = {name: int(conn.execute(select(func.count()).select_from(table(name))).scalar() or 0)
                    for name in names}
        return current_revision(engine) or "", rows
    except SQLAlchemyError as exc:
        raise _cannot_open(exc) from None
    finally:
        engine.dispose()


def _cannot_open(exc: Exception) -> Unavailable:
    """One sentence for a store that cannot be reached: the driver's first line, no URL."""
    first = (str(getattr(exc, "orig", None) or exc).strip().splitlines() or [""])[0][:300]
    return Unavailable(f"Cannot open the pool's store ({first}); check --database-url and that the "
                       "database server runs.")


def _copy_sqlite(source: sqlite3.Connection, target: sqlite3.Connection, target_path: Path,
                 progress: Progress, what: str) -> None:
    """Copy the whole database in one step of SQLite's backup API: one read transaction, so one
    consistent snapshot, which in WAL mode never blocks the server's writes (a copy in several steps
    would start over after each write of the server, and might never end on a busy pool). A thread
    reports the pages written so far, once a second."""
    import threading

    page_size = int(source.execute("PRAGMA page_size").fetchone()[0])
    total = int(source.execute("PRAGMA page_count").fetchone()[0])
    done = threading.Event()

    def report() -> None:
        while not done.wait(1.0):
            try:
                copied = min(total, target_path.stat().st_size // page_size)
            except OSError:
                continue
            progress(f"{what}: {100 * copied // max(total, 1)}% ({copied}/{total} pages)")

    watcher = threading.Thread(target=report, daemon=True)
    watcher.start()
    try:
        source.backup(target, pages=-1)
    finally:
        done.set()
        watcher.join()
    progress(f"{what}: 100% ({total}/{total} pages)")


def _derive(passphrase: bytes, salt: bytes) -> bytes:
    from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

    return Scrypt(salt=salt, length=32, **_SCRYPT).derive(passphrase)


def _seal(files: dict[str, bytes], passphrase: bytes) -> bytes:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    salt, nonce = os.urandom(16), os.urandom(12)
    plain = json.dumps({k: base64.b64encode(v).decode() for k, v in files.items()}).encode()
    return salt + nonce + AESGCM(_derive(passphrase, salt)).encrypt(nonce, plain, b"gpupool-backup-keys")


def _unseal(blob: bytes, passphrase: bytes) -> dict[str, bytes]:
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    salt, nonce, body = blob[:16], blob[16:28], blob[28:]
    try:
        plain = AESGCM(_derive(passphrase, salt)).decrypt(nonce, body, b"gpupool-backup-keys")
    except InvalidTag:
        raise InvalidInput("The passphrase does not open this backup's keys; give the passphrase file "
                           "used by `gpupool backup`.") from None
    keys = json.loads(plain)
    unknown = sorted(set(keys) - set(SEALED_FILES)) if isinstance(keys, dict) else ["(not a mapping)"]
    if unknown:  # the names become paths under the data directory: only the pool's own key files
        raise InvalidInput(f"This backup's sealed keys name {', '.join(repr(n[:64]) for n in unknown[:3])}, "
                           f"which no `gpupool backup` writes (only {', '.join(SEALED_FILES)}); it was "
                           "altered after it was made: restore another backup.")
    return {k: base64.b64decode(v) for k, v in keys.items()}


def read_passphrase(path: Path) -> bytes:
    try:
        text = path.read_bytes().strip()
    except OSError as exc:
        raise NotFound(f"Cannot read the passphrase file {str(path)!r} ({exc.strerror}); give a file "
                       "holding the passphrase.") from None
    if len(text) < 8:
        raise InvalidInput(f"The passphrase in {str(path)!r} is shorter than 8 characters; use a longer one.")
    return text


# --- backup ------------------------------------------------------------------------------------

def backup(data_dir: Path, url: str, dest: Path, *, passphrase: bytes | None = None,
           progress: Progress = lambda _line: None) -> Summary:
    """Write the backup of the pool (store `url`, keys in `data_dir`) to `dest`; the server may run."""
    started = time.monotonic()
    if dest.exists():
        raise InvalidInput(f"{str(dest)!r} exists already; give a new file name (a backup never "
                           "overwrites a file).")
    if not dest.parent.is_dir():
        raise NotFound(f"The directory {str(dest.parent)!r} does not exist; create it or give another path.")
    backend = "sqlite" if url.startswith("sqlite") else "postgresql"
    work = Path(tempfile.mkdtemp(prefix=".gpupool-backup-", dir=dest.parent))
    try:
        if backend == "sqlite":
            member = work / SQLITE_MEMBER
            path = _sqlite_path(url)
            if not path.is_file():
                raise NotFound(f"No store at {str(path)!r}; give the pool's --data-dir (or its "
                               "--database-url).")
            with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as source, \
                    closing(sqlite3.connect(member)) as target:
                _copy_sqlite(source, target, member, progress, "backup")
            revision, rows = _rows(f"sqlite:///{member}")
        else:
            member = work / PG_MEMBER
            revision, rows = _rows(url)
            _run_pg([find_pg_tool("pg_dump"), "-Fc", "-v", "--no-owner", "--no-privileges", "-f",
                     str(member)], url, progress, "backup")
        if not revision:
            raise NotFound("The store holds no gpupool pool (no schema revision); give the pool's "
                           "--data-dir or --database-url.")
        members: dict[str, Path] = {member.name: member}
        for name in CLEAR_FILES:
            if (data_dir / name).is_file():
                shutil.copyfile(data_dir / name, work / name)
                members[name] = work / name
        sealed = {name: (data_dir / name).read_bytes() for name in SEALED_FILES
                  if (data_dir / name).is_file()}
        warnings: list[str] = []
        if passphrase is not None and sealed:
            (work / SEALED_MEMBER).write_bytes(_seal(sealed, passphrase))
            members[SEALED_MEMBER] = work / SEALED_MEMBER
        elif "secrets.key" in sealed or rows.get("secrets"):
            warnings.append(
                f"{data_dir / 'secrets.key'} is NOT in this backup (give --passphrase-file to include it "
                f"encrypted): copy that file (mode 0600) and keep it safe, or the {rows.get('secrets', 0)} "
                "tenant secret(s) in the backup can never be opened again.")
        kept = sorted(sealed) if SEALED_MEMBER in members else []
        manifest = {"format": FORMAT, "backend": backend, "revision": revision, "created_s": time.time(),
                    "rows": rows, "sealed": kept,
                    "not_included": NOT_INCLUDED,
                    "sha256": {name: _sha256(path) for name, path in members.items()}}
        fd, partial_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".partial", dir=dest.parent)
        partial = Path(partial_name)  # 0600, made new: nothing another user prepared is written into
        try:
            with os.fdopen(fd, "wb") as raw:
                with tarfile.open(fileobj=raw, mode="w") as archive:
                    _add_bytes(archive, MANIFEST, json.dumps(manifest, indent=1).encode())
                    for name, path in members.items():
                        archive.add(path, arcname=name, recursive=False, filter=_plain)
                raw.flush()
                os.fsync(raw.fileno())
            os.link(partial, dest)  # whole or not at all, and never over a file that appeared meanwhile
        except FileExistsError:
            raise InvalidInput(f"{str(dest)!r} exists already; give a new file name (a backup never "
                               "overwrites a file).") from None
        finally:
            partial.unlink(missing_ok=True)
        return Summary(backend=backend, revision=revision, rows=rows, sealed=kept,
                       warnings=warnings, seconds=time.monotonic() - started,
                       size_bytes=dest.stat().st_size)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _plain(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mode = 0o600
    return info


def _add_bytes(archive: tarfile.TarFile, name: str, data: bytes) -> None:
    info = _plain(tarfile.TarInfo(name))
    info.size, info.mtime = len(data), int(time.time())
    archive.addfile(info, io.BytesIO(data))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


# --- restore -----------------------------------------------------------------------------------

def _damaged(source: Path, why: str) -> InvalidInput:
    return InvalidInput(f"{str(source)!r} is not a usable gpupool backup ({why}); give a file written by "
                        "`gpupool backup`.")


def read_manifest(source: Path) -> dict[str, Any]:
    """The manifest of the backup `source`, every member's checksum verified."""
    if not source.exists():
        raise NotFound(f"No backup file {str(source)!r}; give the path of a file written by "
                       "`gpupool backup`.")
    try:
        with tarfile.open(source, mode="r:") as archive:
            names = archive.getnames()
            if MANIFEST not in names:
                raise _damaged(source, "it holds no manifest")
            manifest: dict[str, Any] = json.loads(_read_member(archive, MANIFEST))
            if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
                found = manifest.get("format") if isinstance(manifest, dict) else None
                raise _damaged(source, f"format {found!r}, this gpupool reads {FORMAT}")
            if manifest.get("backend") not in ("sqlite", "postgresql") or not isinstance(
                    manifest.get("revision"), str) or not isinstance(manifest.get("sealed"), list) or \
                    not isinstance(manifest.get("sha256"), dict):
                raise _damaged(source, "its manifest lacks the store's kind, revision or checksums")
            member = SQLITE_MEMBER if manifest["backend"] == "sqlite" else PG_MEMBER
            needed = {member} | ({SEALED_MEMBER} if manifest["sealed"] else set())
            if not needed <= set(manifest["sha256"]):
                raise _damaged(source, f"its manifest names no checksum for {member}")
            for name, expected in manifest["sha256"].items():
                digest = hashlib.sha256()
                handle = _member(archive, name, source)
                while chunk := handle.read(_CHUNK):
                    digest.update(chunk)
                if digest.hexdigest() != expected:
                    raise _damaged(source, f"its {name} does not match its checksum")
    except (tarfile.TarError, OSError, EOFError, ValueError, KeyError, TypeError) as exc:
        raise _damaged(source, str(exc).strip() or type(exc).__name__) from None
    return manifest


def _member(archive: tarfile.TarFile, name: str, source: Path) -> IO[bytes]:
    try:
        info = archive.getmember(name)
    except KeyError:
        raise _damaged(source, f"its {name} is missing") from None
    handle = archive.extractfile(info) if info.isfile() else None
    if handle is None:
        raise _damaged(source, f"its {name} is not a file")
    return handle


def _read_member(archive: tarfile.TarFile, name: str) -> bytes:
    handle = archive.extractfile(name)
    assert handle is not None
    return handle.read()


def restore(source: Path, data_dir: Path, url: str, *, passphrase: bytes | None = None,
            progress: Progress = lambda _line: None) -> Summary:
    """Restore the backup `source` into the stopped pool of `data_dir` whose store (`url`) is empty."""
    from gpupool.server.schema import SchemaTooNew, script_directory

    started = time.monotonic()
    manifest = read_manifest(source)
    backend = "sqlite" if url.startswith("sqlite") else "postgresql"
    if manifest["backend"] != backend:
        flag = "without --database-url (a SQLite store)" if manifest["backend"] == "sqlite" else \
            "with --database-url (a PostgreSQL store)"
        raise InvalidInput(f"This backup holds a {manifest['backend']} store and the pool's store is "
                           f"{backend}; restore it {flag}.")
    known = {script.revision for script in script_directory().walk_revisions()}
    if manifest["revision"] not in known:
        raise SchemaTooNew(f"This backup's schema is at revision {manifest['revision']}, newer than this "
                           "gpupool knows; restore it with the release that made it (or a newer one).")
    if manifest["sealed"] and passphrase is None:
        raise InvalidInput("This backup holds the pool's keys encrypted; give --passphrase-file with the "
                           "passphrase used by `gpupool backup`.")
    with _stopped_pool(data_dir):
        _refuse_existing_store(url, backend)
        with tarfile.open(source, mode="r:") as archive:
            files = {name: _read_member(archive, name) for name in CLEAR_FILES if name in manifest["sha256"]}
            if manifest["sealed"]:
                assert passphrase is not None
                files.update(_unseal(_read_member(archive, SEALED_MEMBER), passphrase))
            _refuse_other_keys(data_dir, files)
            work = Path(tempfile.mkdtemp(prefix=".restore-", dir=data_dir))
            try:
                member = PG_MEMBER if backend == "postgresql" else SQLITE_MEMBER
                staged = work / member
                with staged.open("wb") as out:
                    shutil.copyfileobj(_member(archive, member, source), out, _CHUNK)
                if backend == "sqlite":
                    target = _sqlite_path(url)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    with closing(sqlite3.connect(staged)) as copy, closing(sqlite3.connect(target)) as store:
                        _copy_sqlite(copy, store, target, progress, "restore")
                    os.chmod(target, 0o600)
                else:
                    _run_pg([find_pg_tool("pg_restore"), "-v", "--no-owner", "--no-privileges",
                             "--exit-on-error", "-d", _libpq_env(url).get("PGDATABASE", "postgres"),
                             str(staged)], url, progress, "restore")
            finally:
                shutil.rmtree(work, ignore_errors=True)
        for name, data in files.items():
            _write_private(data_dir / name, data)
    revision, rows = _rows(url)
    warnings = []
    if not (data_dir / "secrets.key").exists() and rows.get("secrets"):
        warnings.append(f"The backup holds {rows['secrets']} tenant secret(s) but not the key that opens "
                        f"them: copy the pool's saved secrets.key into {data_dir} (mode 0600) before "
                        "`gpupool up`.")
    return Summary(backend=backend, revision=revision, rows=rows, sealed=sorted(files),
                   warnings=warnings, seconds=time.monotonic() - started, size_bytes=source.stat().st_size)


def _refuse_existing_store(url: str, backend: str) -> None:
    from sqlalchemy import inspect

    from gpupool.server.db import make_engine

    if backend == "sqlite" and not _sqlite_path(url).exists():
        return
    engine = make_engine(url)
    try:
        tables = inspect(engine).get_table_names()
    except Exception as exc:  # the driver's words say why the store cannot be reached
        raise _cannot_open(exc) from None
    finally:
        engine.dispose()
    if tables:
        where = str(_sqlite_path(url)) if backend == "sqlite" else "the database"
        raise InvalidInput(f"The store ({where}) already holds a pool ({len(tables)} tables); a backup is "
                           "restored only into a fresh one: give a new --data-dir or an empty database.")


def _refuse_other_keys(data_dir: Path, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        path = data_dir / name
        if path.exists() and path.read_bytes() != data:
            raise InvalidInput(f"{str(path)!r} exists and differs from the backup's; restore into a fresh "
                               "--data-dir (its keys would not open the restored store).")


def _write_private(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.restore")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.replace(tmp, path)
