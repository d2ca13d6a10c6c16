"""Issue 38 item 3 through the real `gpupool` entry point against a real `gpupool up --simulate`:
dependency chains with Slurm's meanings, a never-satisfiable dependency cancelled with its reason,
hold/release, update while pending (refused once admitted), requeue of running work, `gpupool run`
(streams, exits with the job's code, forwards SIGINT), and what another tenant's token gets.

Ordering is made by gates (a file the job waits for), never by sleeping."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli_inproc import run_cli
from server.upproc import UpProcess, until

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    server = UpProcess(tmp_path_factory.mktemp("jobs") / "data", ["--simulate", "1x4xH100"]).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def gate() -> Iterator[Path]:
    """A file a job waits for (in a directory every pod account may read)."""
    folder = Path(tempfile.mkdtemp(prefix="gpupool-gate-"))
    folder.chmod(0o755)
    try:
        yield folder / "open"
    finally:
        (folder / "open").unlink(missing_ok=True)
        folder.rmdir()


def _env(pool: UpProcess, token: str | None = None) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    return {**base, "GPUPOOL_URL": pool.url, "GPUPOOL_TOKEN": token or pool.token()}


def gp(pool: UpProcess, *args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
    return run_cli(args, _env(pool, token), cwd="/")


def submit(pool: UpProcess, *args: str, token: str | None = None) -> str:
    result = gp(pool, "submit", *args, token=token)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def gated(gate: Path) -> list[str]:
    return ["--", "sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done"]


def field(pool: UpProcess, wid: str, name: str) -> object:
    with pool.client() as api:
        return api.get(f"/workloads/{wid}").json()[name]


def wait_for(pool: UpProcess, wid: str, status: str) -> None:
    until(lambda: field(pool, wid, "status") == status, what=f"{wid} {status}")


def finished(pool: UpProcess, wid: str) -> str:
    waited = gp(pool, "wait", wid)
    return waited.stdout.split(":")[0]


def test_afterok_afterany_afternotok_chains(pool: UpProcess, gate: Path) -> None:
    first = submit(pool, "--gpus", "1", *gated(gate))
    ok = submit(pool, "--dependency", f"afterok:{first}", "--gpus", "1", "--", "echo", "after-ok")
    any_ = submit(pool, "--dependency", f"afterany:{first}", "--gpus", "1", "--", "true")
    notok = submit(pool, "--dependency", f"afternotok:{first}", "--gpus", "1", "--", "true")
    wait_for(pool, first, "running")
    shown = gp(pool, "show", ok)
    assert shown.returncode == 0 and "waiting_for_dependency" in shown.stdout, shown.stdout
    assert f"Waits for afterok:{first}" in shown.stdout
    assert f"dependency: afterok:{first}; waits for afterok:{first}\n" in shown.stdout
    assert field(pool, ok, "status") == "pending"  # three free devices, and it waits
    gate.touch()
    assert finished(pool, ok) == f"{ok} succeeded"
    assert gp(pool, "logs", ok).stdout == "after-ok\n"
    assert finished(pool, any_) == f"{any_} succeeded"
    assert finished(pool, notok) == f"{notok} cancelled"
    assert field(pool, notok, "reason") == "dependency_never_satisfied"


def test_a_dependency_that_can_never_hold_is_cancelled_with_the_reason(pool: UpProcess) -> None:
    failing = submit(pool, "--gpus", "1", "--", "sh", "-c", "exit 3")
    then = submit(pool, "--dependency", f"afterok:{failing}", "--gpus", "1", "--", "true")
    kept = submit(pool, "--dependency", f"afterok:{failing}", "--kill-on-invalid-dep", "no", "--", "true")
    cleanup = submit(pool, "--dependency", f"afternotok:{failing}", "--", "echo", "cleaning")
    waited = gp(pool, "wait", then)
    assert waited.returncode != 0 and f"{then} cancelled: dependency_never_satisfied" in waited.stdout
    assert f"({failing} did not succeed)" in waited.stdout
    assert finished(pool, cleanup) == f"{cleanup} succeeded"
    until(lambda: field(pool, kept, "reason") == "dependency_never_satisfied_kept")
    assert field(pool, kept, "status") == "pending"
    assert f"dependency: afterok:{failing} (--kill-on-invalid-dep no); waits for afterok:{failing} (" in gp(
        pool, "show", kept).stdout
    assert gp(pool, "cancel", kept).returncode == 0


def test_singleton_runs_one_of_a_name_at_a_time(pool: UpProcess, gate: Path) -> None:
    first = submit(pool, "--name", "nightly", "--dependency", "singleton", "--gpus", "1", *gated(gate))
    second = submit(pool, "--name", "nightly", "--dependency", "singleton", "--gpus", "1", "--", "true")
    wait_for(pool, first, "running")
    waiting = "singleton (an earlier workload of the same name has not ended)"
    assert field(pool, second, "waiting_on") == waiting
    gate.touch()
    assert finished(pool, second) == f"{second} succeeded"


def test_bad_dependencies_are_one_sentence_and_an_exit_code(pool: UpProcess) -> None:
    bad = gp(pool, "submit", "--dependency", "after:w-1", "--", "true")
    assert bad.returncode == 2 and bad.stdout == ""
    assert "afterok:ID[:ID...], afterany:ID[:ID...], afternotok:ID[:ID...] or singleton" in bad.stderr
    unknown = gp(pool, "submit", "--dependency", "afterok:w-000000000000", "--", "true")
    assert unknown.returncode == 3
    assert unknown.stderr == ("Error: No workload 'w-000000000000' to depend on; list yours with "
                              "`gpupool ls`.\n")


def test_another_tenant_cannot_depend_on_hold_update_or_requeue_my_work(pool: UpProcess,
                                                                         gate: Path) -> None:
    assert gp(pool, "tenant", "create", "rival").returncode == 0
    rival = gp(pool, "token", "create", "--tenant", "rival").stdout.strip()
    mine = submit(pool, *gated(gate))
    wait_for(pool, mine, "running")
    depend = gp(pool, "submit", "--dependency", f"afterok:{mine}", "--", "true", token=rival)
    assert depend.returncode == 3
    assert depend.stderr == f"Error: No workload {mine!r} to depend on; list yours with `gpupool ls`.\n"
    for verb in (["hold"], ["release"], ["requeue"], ["update", "--priority", "1"]):
        refused = gp(pool, verb[0], mine, *verb[1:], token=rival)
        assert refused.returncode == 3, (verb, refused.stderr)
        assert "No workload" in refused.stderr and "rival" not in refused.stderr
    assert field(pool, mine, "status") == "running" and field(pool, mine, "attempt") == 1
    gate.touch()
    assert finished(pool, mine) == f"{mine} succeeded"


def test_hold_release_update_and_refused_once_admitted(pool: UpProcess, gate: Path) -> None:
    first = submit(pool, "--gpus", "1", *gated(gate))
    wid = submit(pool, "--dependency", f"afterok:{first}", "--gpus", "1", "--", "true")
    held = gp(pool, "hold", wid)
    assert held.returncode == 0 and held.stdout == f"{wid} pending held (admin)\n"  # an admin token
    updated = gp(pool, "update", wid, "--gpus", "0.5", "--replicas", "2", "--time-limit", "10m")
    assert updated.returncode == 0, updated.stderr
    gate.touch()
    assert finished(pool, first) == f"{first} succeeded"
    until(lambda: field(pool, wid, "waiting_on") == "")
    assert (field(pool, wid, "status"), field(pool, wid, "held")) == ("pending", "admin")
    assert field(pool, wid, "reason") == "held"  # what keeps it waiting now
    [row] = [line for line in gp(pool, "ls", wid).stdout.splitlines() if wid in line]
    assert "pending" in row and " held " in row, row  # ls's REASON column
    shown = gp(pool, "show", wid).stdout
    assert f"held by the admin: `gpupool release {wid}` lets it be placed\n" in shown
    assert gp(pool, "release", wid).returncode == 0
    assert finished(pool, wid) == f"{wid} succeeded"
    assert field(pool, wid, "pods") and len(field(pool, wid, "pods")) == 2  # type: ignore[arg-type]
    late = gp(pool, "update", wid, "--priority", "1")
    assert late.returncode == 2
    assert late.stderr == (f"Error: Workload {wid} is succeeded; only pending work can be updated "
                           "(`gpupool requeue ID` sends admitted or running work back to pending).\n")


def test_requeue_of_running_work(pool: UpProcess, gate: Path) -> None:
    wid = submit(pool, *gated(gate))
    wait_for(pool, wid, "running")
    requeued = gp(pool, "requeue", wid)
    assert requeued.returncode == 0, requeued.stderr
    until(lambda: field(pool, wid, "attempt") == 2 and field(pool, wid, "status") == "running")
    gate.touch()
    assert finished(pool, wid) == f"{wid} succeeded"
    assert gp(pool, "requeue", wid).returncode == 2  # finished: nothing to requeue


def test_run_streams_the_output_and_exits_with_the_jobs_code(pool: UpProcess) -> None:
    ran = gp(pool, "run", "--gpus", "0.5", "--", "sh", "-c", "echo out; echo err >&2; exit 7")
    assert ran.returncode == 7, ran.stderr
    assert ran.stdout == "out\n"
    assert "err\n" in ran.stderr
    assert gp(pool, "run", "--", "true").returncode == 0
    bad = gp(pool, "run", "--dependency", "nope", "--", "true")
    assert bad.returncode == 2 and "afterok:ID" in bad.stderr


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_run_forwards_a_signal_by_cancelling_the_job(pool: UpProcess, gate: Path, signum: int) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "gpupool.cli.main", "run", "--", "sh", "-c",
                             f"echo started; while [ ! -e {gate} ]; do sleep 0.05; done"],
                            env=_env(pool), cwd="/", stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "started\n"  # placed, running and streamed
        proc.send_signal(signum)
        assert proc.wait(timeout=60) == 128 + signum
        stderr = proc.stderr.read() if proc.stderr else ""
        wid = stderr.split()[1]
        assert field(pool, wid, "status") == "cancelled"
        assert f"gpupool: {wid} cancelled ({signal.Signals(signum).name})" in stderr
    finally:
        if proc.poll() is None:
            proc.kill()


def test_run_says_why_it_waits_then_streams(pool: UpProcess, gate: Path) -> None:
    first = submit(pool, *gated(gate))
    argv = [sys.executable, "-m", "gpupool.cli.main", "run", "--dependency", f"afterok:{first}", "--",
            "echo", "after"]
    proc = subprocess.Popen(argv, env=_env(pool), cwd="/", stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stderr is not None
        wid = proc.stderr.readline().split()[1]
        said = proc.stderr.readline()
        assert said == f"gpupool: {wid} pending: waiting_for_dependency: Waits for afterok:{first}.\n"
        gate.touch()
        out, _ = proc.communicate(timeout=60)
        assert (proc.returncode, out) == (0, "after\n")
    finally:
        if proc.poll() is None:
            proc.kill()
