"""Issue 13, items 1, 4 and 5 through the real `gpupool` entry point against a real `gpupool up`:
where a pod runs and what `logs`/`wait` say about it, verbs that take many targets, and `wait`
riding out a kill -9 and restart of the server."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli_inproc import run_cli
from ports import free_port
from server.upproc import UpProcess, until

pytestmark = pytest.mark.slow
ACCOUNT_NOTE = "is not open to account"


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    server = UpProcess(tmp_path_factory.mktemp("verbs") / "data", ["--simulate", "1x4xH100"]).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory every account may enter (pytest's own are closed to the pods' accounts)."""
    path = Path(tempfile.mkdtemp(prefix="gpupool-submit-dir-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        (path / "go").unlink(missing_ok=True)
        path.rmdir()


def gp(pool: UpProcess | str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`gpupool ARGS` as a process, run from `cwd`, against `pool` (or a URL nothing answers)."""
    url, token = (pool, "gp_none") if isinstance(pool, str) else (pool.url, pool.token())
    base = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    env = {**base, "GPUPOOL_URL": url, "GPUPOOL_TOKEN": token}
    return run_cli(args, env, cwd=cwd)


def submit(pool: UpProcess, *args: str, cwd: Path | None = None) -> str:
    result = gp(pool, "submit", *args, cwd=cwd)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    return lines[0]


def status(pool: UpProcess, wid: str) -> str:
    with pool.client() as api:
        return str(api.get(f"/workloads/{wid}").json()["status"])


# ---- 1. where and what a job runs ---------------------------------------------------------------

def test_a_pod_runs_where_submit_ran_when_its_account_may_enter(pool: UpProcess, open_dir: Path) -> None:
    wid = submit(pool, "--", "pwd", cwd=open_dir)
    waited = gp(pool, "wait", wid)
    assert (waited.returncode, waited.stdout) == (0, f"{wid} succeeded: completed: Every pod exited 0\n")
    assert gp(pool, "logs", wid).stdout == f"{open_dir}\n"
    shown = gp(pool, "show", wid)
    assert shown.returncode == 0 and f"workdir: {open_dir} (where submit ran)" in shown.stdout


def test_a_closed_submit_directory_falls_back_to_the_private_one(pool: UpProcess, open_dir: Path) -> None:
    closed = open_dir / "closed"
    closed.mkdir(mode=0o000)
    try:
        wid = submit(pool, "--", "pwd", cwd=closed)
        assert gp(pool, "wait", wid).returncode == 0
        ran_in = gp(pool, "logs", wid).stdout.strip()
        assert ran_in != str(closed) and ran_in.startswith(os.environ["GPUPOOL_SCRATCH_DIR"])
        shown = gp(pool, "show", wid).stdout
        assert f"workdir: private directory ({closed} {ACCOUNT_NOTE} " in shown
        explicit = submit(pool, "--workdir", str(closed), "--", "pwd")
        waited = gp(pool, "wait", explicit)
        assert waited.returncode == 1
        assert waited.stdout.startswith(f"{explicit} failed: pod_failed: cannot enter the working directory")
        assert f"workdir: {closed} (--workdir)" in gp(pool, "show", explicit).stdout
    finally:
        closed.chmod(0o755)
        closed.rmdir()


def test_logs_show_stderr_as_written_and_wait_says_why_it_failed(pool: UpProcess) -> None:
    script = "echo out1; echo err1 >&2; echo out2; echo err2 >&2; exit 3"
    wid = submit(pool, "--", "sh", "-c", script)
    waited = gp(pool, "wait", wid)
    assert (waited.returncode, waited.stdout) == (1, f"{wid} failed: pod_failed: exited with code 3\n")
    assert gp(pool, "logs", wid).stdout == "out1\nerr1\nout2\nerr2\n"  # one log, in the order written
    for flag in ("--stdout", "--stderr"):
        refused = gp(pool, "logs", wid, flag)
        assert refused.returncode == 2 and "--separate-stderr" in one_error_line(refused)
    apart = submit(pool, "--separate-stderr", "--", "sh", "-c", script)
    assert gp(pool, "wait", apart).returncode == 1
    assert gp(pool, "logs", apart).stdout == "out1\nout2\nerr1\nerr2\n"
    assert gp(pool, "logs", apart, "--stdout").stdout == "out1\nout2\n"
    assert gp(pool, "logs", apart, "--stderr").stdout == "err1\nerr2\n"
    both = gp(pool, "logs", apart, "--stdout", "--stderr")
    assert both.returncode == 2 and "exclude each other" in one_error_line(both)


def test_logs_of_each_gang_member(pool: UpProcess) -> None:
    wid = submit(pool, "--replicas", "2", "--", "sh", "-c", 'echo "rank $RANK"')
    assert gp(pool, "wait", wid).returncode == 0
    assert gp(pool, "logs", wid, "--rank", "1").stdout == "rank 1\n"
    assert gp(pool, "logs", wid, "--rank", "0").stdout == "rank 0\n"
    missing = gp(pool, "logs", wid, "--rank", "2")
    assert missing.returncode == 3 and "no replica 2" in one_error_line(missing)


# ---- 4. verbs that take many targets ------------------------------------------------------------

def test_show_and_wait_take_several_ids_and_unique_prefixes(pool: UpProcess) -> None:
    ok = submit(pool, "--", "true")
    bad = submit(pool, "--", "false")
    waited = gp(pool, "wait", ok[:10], bad[2:10])  # `w-` may be left out
    assert waited.returncode == 1
    # one line for each, printed as it is seen ending: `false` may end first on a loaded machine
    lines = waited.stdout.splitlines()
    assert len(lines) == 2 and set(lines) == {f"{ok} succeeded: completed: Every pod exited 0",
                                              f"{bad} failed: pod_failed: exited with code 1"}
    shown = gp(pool, "show", ok[:10], bad)
    assert shown.returncode == 0 and ok in shown.stdout and bad in shown.stdout
    ambiguous = gp(pool, "show", "w-")
    assert ambiguous.returncode == 2 and "matches" in one_error_line(ambiguous)
    assert ok in ambiguous.stderr or bad in ambiguous.stderr or "more" in ambiguous.stderr
    unknown = gp(pool, "wait", ok, "w-zzzz")
    assert unknown.returncode == 3 and "w-zzzz" in one_error_line(unknown)


def test_wait_any_returns_with_the_first_to_end(pool: UpProcess) -> None:
    sleeper = submit(pool, "--", "sleep", "300")
    quick = submit(pool, "--", "true")
    waited = gp(pool, "wait", "--any", sleeper, quick)
    assert (waited.returncode, waited.stdout) == (0, f"{quick} succeeded: completed: Every pod exited 0\n")
    assert status(pool, sleeper) in ("pending", "admitted", "running")
    assert gp(pool, "cancel", sleeper).stdout == f"{sleeper} cancelled\n"


def test_cancel_by_ids_by_name_and_all(pool: UpProcess) -> None:
    first, second = (submit(pool, "--", "sleep", "300") for _ in range(2))
    cancelled = gp(pool, "cancel", first[:10], second)
    assert (cancelled.returncode, cancelled.stdout) == (0, f"{first} cancelled\n{second} cancelled\n")
    again = gp(pool, "cancel", first)
    assert again.returncode == 2 and "already cancelled" in one_error_line(again)
    for _ in range(3):
        submit(pool, "--name", "nap", "--", "sleep", "300")
    named = gp(pool, "cancel", "--name", "nap")
    assert (named.returncode, named.stdout) == (0, "cancelled 3 workloads\n")
    nobody = gp(pool, "cancel", "--name", "no-such-name")
    assert nobody.returncode == 3 and "no-such-name" in one_error_line(nobody)
    assert gp(pool, "tenant", "create", "batchy").returncode == 0
    for _ in range(2):
        submit(pool, "--tenant", "batchy", "--", "sleep", "300")
    everything = gp(pool, "cancel", "--all", "--tenant", "batchy")
    assert (everything.returncode, everything.stdout) == (0, "cancelled 2 workloads\n")
    assert gp(pool, "cancel", "--all", "--tenant", "batchy").stdout == "cancelled 0 workloads\n"
    neither = gp(pool, "cancel")
    assert neither.returncode == 2 and "exactly one" in one_error_line(neither)


# ---- 5. survive the server's restart ------------------------------------------------------------

def test_wait_gives_up_with_exit_4_only_after_the_reconnect_budget() -> None:
    nowhere = f"http://127.0.0.1:{free_port()}"
    at_once = gp(nowhere, "wait", "w-0123456789ab", "--reconnect", "0")
    assert at_once.returncode == 4 and "Cannot reach" in one_error_line(at_once)
    later = gp(nowhere, "wait", "w-0123456789ab", "--reconnect", "0.5")
    assert later.returncode == 4
    notice, error = later.stderr.splitlines()
    assert notice == "server unreachable, retrying for up to 0.5 s..."
    assert error.startswith("Error: Cannot reach")
    assert error.endswith("gave up after retrying for 0.5 s (--reconnect).")


def _read_line(stream: object, timeout_s: float) -> str:
    assert hasattr(stream, "fileno") and hasattr(stream, "readline")
    ready, _, _ = select.select([stream], [], [], timeout_s)
    assert ready, "no line in time"
    return str(stream.readline())


def test_wait_outlives_a_kill_9_and_restart_of_the_server(pool: UpProcess, open_dir: Path) -> None:
    go = open_dir / "go"
    wid = submit(pool, "--", "sh", "-c", f"while [ ! -e {go} ]; do sleep 0.05; done")
    until(lambda: status(pool, wid) == "running", 60, "the job running")
    base = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    waiter = subprocess.Popen(
        [sys.executable, "-m", "gpupool.cli.main", "wait", wid],
        env={**base, "GPUPOOL_URL": pool.url, "GPUPOOL_TOKEN": pool.token()},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    try:
        until(lambda: status(pool, wid) == "running" and waiter.poll() is None, 10, "wait started")
        pool.kill9()
        assert _read_line(waiter.stderr, 60) == "server unreachable, retrying for up to 60 s...\n"
        pool.start()
        go.touch(mode=0o644)
        out, err = waiter.communicate(timeout=90)
    finally:
        if waiter.poll() is None:
            waiter.kill()
    assert (waiter.returncode, out, err) == (0, f"{wid} succeeded: completed: Every pod exited 0\n", "")
    follow = gp(pool, "logs", "-f", wid)
    assert follow.returncode == 0 and follow.stderr == ""



def test_show_lists_the_request_the_slices_and_the_times(pool: UpProcess) -> None:
    wid = submit(pool, "--gpus", "0.25", "--cpu", "1", "--memory", "1GiB", "--replicas", "2", "--", "true")
    assert gp(pool, "wait", wid).returncode == 0
    shown = gp(pool, "show", wid).stdout
    assert "requested: 2 x (0.25 GPU, cpu 1, memory 1GiB)" in shown
    assert shown.count(":0.25") == 2  # each pod's slice: dev<i>:0.25
    times = next(line for line in shown.splitlines() if line.startswith("submitted "))
    assert "started 20" in times and "ended 20" in times and "elapsed " in times
