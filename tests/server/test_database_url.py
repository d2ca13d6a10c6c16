"""The store's URL stays off the command line: a password on --database-url is refused in one
sentence; --database-url-file (yours, 0600) and GPUPOOL_DATABASE_URL work against a real
PostgreSQL; the password reaches neither the server's command line, nor any other process's
environment or command line, nor a pod, nor the log."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest
from upproc import UpProcess, cli, until

from gpupool.errors import InvalidInput
from gpupool.server import dburl, pgtemp
from gpupool.server.settings import Settings

PASSWORD = "Pw-never-on-the-cmdline-7f3a"


def test_a_password_is_found_in_the_user_part_and_the_query_and_masked_in_both() -> None:
    assert dburl.has_password(f"postgresql+psycopg://u:{PASSWORD}@h:5432/db")
    assert dburl.has_password(f"postgresql+psycopg://u@h/db?sslmode=require&password={PASSWORD}")
    assert not dburl.has_password("postgresql+psycopg://u@h:5432/db")
    assert not dburl.has_password("sqlite:////var/lib/gpupool/store.sqlite")
    for url in (f"postgresql+psycopg://u:{PASSWORD}@h:5432/db?password={PASSWORD}",
                f"mysql://u:{PASSWORD}@h/db", f"nonsense://u:{PASSWORD}@h:port/db", PASSWORD):
        assert PASSWORD not in dburl.mask(url)
    assert dburl.mask(f"postgresql+psycopg://u:{PASSWORD}@h:5432/db") == "postgresql+psycopg://u:***@h:5432/db"


def test_an_unsupported_url_is_refused_without_its_password() -> None:
    with pytest.raises(InvalidInput) as refused:
        Settings(database_url=f"mysql://u:{PASSWORD}@h/db")
    assert PASSWORD not in refused.value.message and "mysql://u:***@h/db" in refused.value.message


@pytest.mark.parametrize(("url", "words"), [
    (f"postgresql+psycopg://u:{PASSWORD}@h:notaport/db", "cannot be read"),
    (f"postgresql+nosuchdriver://u:{PASSWORD}@h/db", "driver that is not installed"),
    ("sqlite://", "in-memory"), ("sqlite:///:memory:", "in-memory")])
def test_a_url_that_cannot_serve_is_one_sentence_without_its_password(url: str, words: str) -> None:
    with pytest.raises(InvalidInput, match=words) as refused:
        Settings(database_url=url)
    assert PASSWORD not in refused.value.message


def test_settings_never_quote_the_url_in_their_repr(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, database_url=f"postgresql+psycopg://u:{PASSWORD}@h/db")
    assert PASSWORD not in repr(settings) and PASSWORD in settings.resolved_database_url


def test_resolve_order_and_the_environment_variable_is_removed() -> None:
    env = {dburl.URL_ENV: "sqlite:////tmp/from-env.sqlite", "OTHER": "x"}
    assert dburl.resolve("", None, env) == "sqlite:////tmp/from-env.sqlite"
    assert env == {"OTHER": "x"}
    env = {dburl.URL_ENV: "sqlite:////tmp/from-env.sqlite"}
    assert dburl.resolve("sqlite:////tmp/flag.sqlite", None, env) == "sqlite:////tmp/flag.sqlite"
    assert env == {}  # removed even when the flag wins: no child process inherits it
    with pytest.raises(InvalidInput, match="not both"):
        dburl.resolve("sqlite:////tmp/a", Path("/nonexistent"), {})


def _url_file(folder: Path, text: str, mode: int = 0o600) -> Path:
    path = folder / "database-url"
    path.write_text(text + "\n")
    os.chmod(path, mode)
    return path


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o620, 0o644])
def test_a_url_file_others_can_read_or_write_is_refused(tmp_path: Path, mode: int) -> None:
    path = _url_file(tmp_path, f"postgresql+psycopg://u:{PASSWORD}@h/db", mode)
    with pytest.raises(InvalidInput) as refused:
        dburl.read_url_file(path)
    assert f"mode {mode:04o}" in refused.value.message and "chmod 600" in refused.value.message
    assert PASSWORD not in refused.value.message


def test_a_url_file_must_be_one_line_in_a_regular_file_of_this_user(tmp_path: Path) -> None:
    assert dburl.read_url_file(_url_file(tmp_path, "sqlite:////tmp/s.sqlite")) == "sqlite:////tmp/s.sqlite"
    for path, words in ((tmp_path, "not a regular file"), (tmp_path / "missing", "Cannot read"),
                        (_url_file(tmp_path, ""), "exactly one database URL"),
                        (_url_file(tmp_path, "sqlite:///a\nsqlite:///b"), "exactly one database URL")):
        with pytest.raises(InvalidInput, match=words):
            dburl.read_url_file(path)
    if os.geteuid() == 0:
        path = _url_file(tmp_path, "sqlite:////tmp/s.sqlite")
        os.chown(path, 65534, 65534)
        with pytest.raises(InvalidInput, match="belongs to uid 65534"):
            dburl.read_url_file(path)


def test_up_refuses_a_password_on_the_command_line_and_a_loose_file_in_one_sentence(tmp_path: Path) -> None:
    refused = cli(["up", "--data-dir", str(tmp_path / "d"), "--provider", "fake",
                   "--database-url", f"postgresql+psycopg://u:{PASSWORD}@127.0.0.1:1/db"], {})
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert PASSWORD not in refused.stderr + refused.stdout
    assert "--database-url-file" in refused.stderr and dburl.URL_ENV in refused.stderr
    loose = _url_file(tmp_path, f"postgresql+psycopg://u:{PASSWORD}@127.0.0.1:1/db", 0o644)
    refused = cli(["up", "--data-dir", str(tmp_path / "d"), "--provider", "fake",
                   "--database-url-file", str(loose)], {})
    assert refused.returncode == 2 and "Traceback" not in refused.stderr and "chmod 600" in refused.stderr
    assert PASSWORD not in refused.stderr + refused.stdout
    assert len(refused.stderr.strip().splitlines()) == 1


def test_up_takes_a_sqlite_url_from_the_environment(tmp_path: Path) -> None:
    store = tmp_path / "elsewhere.sqlite"
    server = UpProcess(tmp_path / "data", ["--provider", "fake", "--simulate", "1x2xH100"],
                       env={dburl.URL_ENV: f"sqlite:///{store}"}).start()
    try:
        assert store.exists() and not (tmp_path / "data" / "gpupool.sqlite").exists()
    finally:
        server.stop()


def _secret_url(postgres: pgtemp.TempPostgres) -> str:
    """A fresh database's URL with a password (the throwaway server trusts loopback, so any works)."""
    return postgres.create_database().replace("postgres@", f"postgres:{PASSWORD}@", 1)


def _processes_holding(secret: str, skip: int) -> list[str]:
    """'pid file' for every process but `skip` whose command line or environment holds `secret`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) == skip:
            continue
        for name in ("cmdline", "environ"):
            try:
                data = Path("/proc", pid, name).read_bytes()
            except OSError:
                continue
            if secret.encode() in data:
                found.append(f"{pid} {name}")
    return found


def _run_env_pod(server: UpProcess) -> str:
    """What a pod sees: its environment and every command line it can read."""
    script = "env; cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '"
    with server.client() as api:
        answer = api.post("/workloads", json={"command": ["sh", "-c", script]})
        assert answer.status_code == 201, answer.text
        wid = answer.json()["id"]
        until(lambda: api.get(f"/workloads/{wid}").json()["status"] in ("succeeded", "failed"),
              60, f"workload {wid} finishing")
        out = str(api.get(f"/workloads/{wid}/logs").json()["text"])
    assert "PATH=" in out and "gpupool" in out, out  # it ran and read others' command lines
    return out


@pytest.mark.slow
@pytest.mark.parametrize("way", ["file", "environment"])
def test_up_takes_a_password_url_from_a_file_or_the_environment_and_hides_it(
        tmp_path: Path, postgres: pgtemp.TempPostgres, way: str) -> None:
    url = _secret_url(postgres)
    if way == "file":
        # its own process (not forked): the test reads the server's /proc/PID/cmdline and environ
        server = UpProcess(tmp_path / "data", ["--simulate", "1x2xH100", "--database-url-file",
                                               str(_url_file(tmp_path, url))], forked=False)
    else:
        server = UpProcess(tmp_path / "data", ["--simulate", "1x2xH100"], env={dburl.URL_ENV: url},
                           forked=False)
    server.start()
    try:
        assert server.proc is not None
        assert not (tmp_path / "data" / "gpupool.sqlite").exists()  # the store is PostgreSQL
        import psycopg

        with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as db:
            assert db.execute("SELECT count(*) FROM tenants").fetchone() == (1,)
        cmdline = Path(f"/proc/{server.proc.pid}/cmdline").read_bytes()
        assert b"gpupool" in cmdline and PASSWORD.encode() not in cmdline
        assert PASSWORD not in _run_env_pod(server)
        assert _processes_holding(PASSWORD, skip=server.proc.pid) == []
        with httpx.Client(base_url=server.api, timeout=10) as anonymous:
            assert anonymous.get("/health").status_code == 200
    finally:
        server.stop()
    assert PASSWORD not in server.log_text()
