"""A throwaway PostgreSQL server (initdb in a temp dir, loopback, free port) for tests and benches.

PostgreSQL refuses to run as root, so as root the server runs as the `postgres` user via runuser.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpupool.errors import Unavailable


def find_bindir() -> Path | None:
    """The directory holding initdb and pg_ctl (Debian keeps them off PATH), or None."""
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    for directory in candidates:
        if Path(directory, "initdb").exists() and Path(directory, "pg_ctl").exists():
            return Path(directory)
    initdb = shutil.which("initdb")
    if initdb and shutil.which("pg_ctl"):
        return Path(os.path.realpath(initdb)).parent
    return None


def why_unavailable() -> str:
    """'' when a throwaway server can start here, else the reason it cannot."""
    if find_bindir() is None:
        return "PostgreSQL binaries (initdb, pg_ctl) not found; run scripts/postgres-deps.sh as root"
    if os.geteuid() == 0 and (shutil.which("runuser") is None or not _user_exists("postgres")):
        return "running as root needs runuser and a 'postgres' user to start PostgreSQL"
    return ""


def _user_exists(name: str) -> bool:
    import pwd

    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


START_TRIES = 5
"""How many ports a start tries, each taken by another process between its choice and the bind."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class TempPostgres:
    """A running server; `url(db)` gives a SQLAlchemy URL, `create_database()` a fresh database."""

    root: Path
    port: int
    bindir: Path
    options: str = ""
    """The server's start options, for `restart()`."""

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self) -> str:
        """A new empty database; returns its URL."""
        import psycopg

        name = "t" + uuid.uuid4().hex[:12]
        with psycopg.connect(f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres",
                             autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def halt(self) -> None:
        """Stop the server as a crash would (immediate); `resume()` starts it again."""
        _run_as_pg([str(self.bindir / "pg_ctl"), "-D", str(self.root / "data"), "-m", "immediate",
                    "-w", "stop"])

    def resume(self) -> None:
        """Start the halted server again on the same port and data."""
        _run_as_pg([str(self.bindir / "pg_ctl"), "-D", str(self.root / "data"), "-o", self.options,
                    "-l", str(self.root / "log"), "-w", "-t", "60", "start"])

    def stop(self) -> None:
        _run_as_pg([str(self.bindir / "pg_ctl"), "-D", str(self.root / "data"), "-m", "immediate",
                    "-w", "stop"], check=False)
        shutil.rmtree(self.root, ignore_errors=True)


def _run_as_pg(argv: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    if os.geteuid() == 0:
        argv = ["runuser", "-u", "postgres", "--", *argv]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if check and result.returncode != 0:
        raise Unavailable(f"PostgreSQL command {argv[-1]!r} failed: {result.stderr.strip()[-400:]}")
    return result


def start(*, fsync: bool = False, free_port: Callable[[], int] = free_port) -> TempPostgres:
    """initdb in a temp dir and start the server on a free loopback port; raises Unavailable.
    `free_port` chooses the ports tried (the tests hand one that keeps each worker to its own ports:
    a server halted and resumed binds its port again, which an outbound connection may hold by then
    if it came from the ephemeral range)."""
    reason = why_unavailable()
    if reason:
        raise Unavailable(reason)
    bindir = find_bindir()
    assert bindir is not None
    root = Path(tempfile.mkdtemp(prefix="gpupool-pg-"))
    os.chmod(root, 0o755)
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    data = root / "data"
    _run_as_pg([str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres",
                "--no-sync", "-E", "UTF8"])
    durability = "" if fsync else " -c fsync=off -c synchronous_commit=off"
    log = root / "log"
    taken: list[int] = []
    for _ in range(START_TRIES):
        # the port is free when chosen but closed again before the server binds it: another process
        # (an outbound connection's source port, a server binding port 0) may take it in between,
        # and then the server stops at once saying so in its log; a fresh port is tried then
        port = free_port()
        options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c max_connections=100{durability}"
        logged = log.stat().st_size if log.exists() else 0
        started = _run_as_pg([str(bindir / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(log),
                              "-w", "-t", "60", "start"], check=False)
        if started.returncode == 0:
            return TempPostgres(root=root, port=port, bindir=bindir, options=options)
        with log.open("rb") as out:
            out.seek(logged)
            said = out.read().decode(errors="replace")
        if "Address already in use" not in said:
            shutil.rmtree(root, ignore_errors=True)
            raise Unavailable(f"PostgreSQL command 'start' failed: {(started.stderr + said).strip()[-400:]}")
        taken.append(port)
    shutil.rmtree(root, ignore_errors=True)
    raise Unavailable(f"PostgreSQL could not start: each of the loopback ports {taken} was taken by "
                      "another process before it bound it; free some ports and try again")
