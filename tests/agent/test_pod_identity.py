"""Pods never run as the agent's user and never see its secrets: accounts, environment, directories.

The tests that change users need root (as `make test` runs in CI); elsewhere they skip with the
reason, and the one-user mode (an agent that is not root) is tested everywhere.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from factories import pod_python
from gpupool.agent import identity
from gpupool.agent.identity import (
    MAX_ACCOUNT_NAME,
    POD_GROUP,
    Identities,
    account_name,
    mapped_account,
)
from gpupool.errors import InvalidInput, ProviderError
from gpupool.pods import PodLaunch, PodPhase, PodStatus
from gpupool.providers.local import LocalProvider

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="changing a pod's user needs root")

PROBE = (pod_python(), "-c", """
import json, os
status = dict(line.split(':', 1) for line in open('/proc/self/status') if ':' in line)
def can_read(path):
    try:
        open(path).read(1)
        return True
    except OSError:
        return False
home = os.environ.get('HOME', '')
print(json.dumps({'uid': os.getuid(), 'euid': os.geteuid(), 'gid': os.getgid(), 'groups': os.getgroups(),
                  'nnp': status['NoNewPrivs'].strip(), 'env': dict(os.environ), 'cwd': os.getcwd(),
                  'home_mode': oct(os.stat(home).st_mode & 0o777), 'home_uid': os.stat(home).st_uid,
                  'read': {p: can_read(p) for p in os.environ.get('PROBE_PATHS', '').split(':') if p}}))
""")


def wait_final(provider: LocalProvider, pod_id: str, timeout_s: float = 20.0) -> PodStatus:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = {s.pod_id: s for s in provider.poll()}.get(pod_id)
        if status is not None and status.phase.is_final:
            return status
        time.sleep(0.02)
    raise AssertionError(f"{pod_id} did not finish")


def probe(provider: LocalProvider, pod_id: str, *, tenant: str = "default", unix_user: str = "",
          env: dict[str, str] | None = None, workdir: str = "") -> dict[str, object]:
    provider.launch(PodLaunch(pod_id=pod_id, workload_id="w-" + pod_id, node="box", command=PROBE,
                              tenant=tenant, unix_user=unix_user, env=env or {}, workdir=workdir))
    status = wait_final(provider, pod_id)
    assert status.phase is PodPhase.SUCCEEDED, (status, provider.read_log(pod_id, "stderr").text)
    return dict(json.loads(provider.read_log(pod_id).text))


@pytest.fixture
def secret_env(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("GPUPOOL_TEST_SERVER_SECRET", "s3cret")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "also-secret")
    return "s3cret"


@pytest.fixture
def provider(tmp_path: Path) -> Iterator[LocalProvider]:
    p = LocalProvider(tmp_path / "agent", simulate="2xH100", node_name="box")
    yield p
    p.close(stop_pods=True)


def test_account_names_fit_and_stay_distinct() -> None:
    assert account_name("team-a") == "gpupool-team-a"
    long_a, long_b = "a" * 40 + "-x", "a" * 40 + "-y"
    assert len(account_name(long_a)) <= MAX_ACCOUNT_NAME
    assert account_name(long_a) != account_name(long_b)
    assert account_name(long_a) == account_name(long_a)


def test_account_creation_waits_for_a_held_account_database_lock(monkeypatch: pytest.MonkeyPatch) -> None:
    """useradd refuses at once while another process holds /etc/passwd's lock (parallel agents,
    an administrator): the pool waits for the lock instead of failing the pod."""
    calls: list[list[str]] = []

    def fake_run(argv: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        calls.append(argv)
        if len(calls) < 3:
            said = "useradd: cannot lock /etc/passwd; try again later.\n"
            return subprocess.CompletedProcess(argv, 1, "", said)
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(identity.subprocess, "run", fake_run)
    identity._run(["useradd", "x"])
    assert len(calls) == 3
    calls.clear()
    monkeypatch.setattr(identity, "LOCK_WAIT_S", 0.0)
    with pytest.raises(ProviderError, match="cannot lock"):
        identity._run(["useradd", "x"])


def test_a_mapped_account_must_exist_and_not_be_root() -> None:
    with pytest.raises(InvalidInput, match="no Unix account"):
        mapped_account("no-such-user-gpupool-test")
    with pytest.raises(InvalidInput, match="uid 0"):
        mapped_account(pwd.getpwuid(0).pw_name)


def test_the_environment_is_built_from_scratch(tmp_path: Path, secret_env: str) -> None:
    """Whether or not the agent may change users: only the base, the pool's and the user's variables."""
    provider = LocalProvider(tmp_path / "agent", simulate="2xH100", node_name="box",
                             identities=Identities(switch_users=False))
    try:
        out = probe(provider, "p", env={"MINE": "1"})
    finally:
        provider.close(stop_pods=True)
    env = dict(out["env"])  # type: ignore[call-overload]
    assert "GPUPOOL_TEST_SERVER_SECRET" not in env and "AWS_SECRET_ACCESS_KEY" not in env
    assert secret_env not in json.dumps(env)
    assert env["MINE"] == "1" and env["GPUPOOL_POD_ID"] == "p"
    allowed = {"PATH", "HOME", "TMPDIR", "LANG", "USER", "LOGNAME", "SHELL", "MINE", "PWD", "OLDPWD",
               "LC_CTYPE"}
    pool_prefixes = ("GPUPOOL_", "CUDA_", "NVIDIA_", "HIP_", "ROCR_", "ASCEND_")
    assert {k for k in env if not k.startswith(pool_prefixes)} <= allowed
    assert env["HOME"] == env["TMPDIR"] == out["cwd"]
    assert out["uid"] == os.geteuid() and out["home_mode"] == "0o700"


@needs_root
def test_pods_run_as_the_tenants_account_without_privileges(provider: LocalProvider, tmp_path: Path,
                                                            secret_env: str) -> None:
    token = tmp_path / "admin-token"
    token.write_text("gp_admin\n")
    token.chmod(0o600)
    state = provider.agent.state_dir / "pods"
    out = probe(provider, "p1", tenant="team-a",
                env={"PROBE_PATHS": f"{token}:{state / 'p1' / 'state.json'}:/etc/shadow"})
    account = pwd.getpwnam("gpupool-team-a")
    assert (out["uid"], out["euid"], out["gid"]) == (account.pw_uid, account.pw_uid, account.pw_gid)
    assert out["uid"] != 0 and out["groups"] in ([], [account.pw_gid])
    assert out["nnp"] == "1"
    assert out["read"] == {str(token): False, str(state / "p1" / "state.json"): False, "/etc/shadow": False}
    assert out["home_uid"] == account.pw_uid and out["home_mode"] == "0o700"
    assert "GPUPOOL_TEST_SERVER_SECRET" not in dict(out["env"])  # type: ignore[call-overload]
    assert os.stat(provider.agent.state_dir).st_mode & 0o777 == 0o700
    assert os.stat(state / "p1" / "stdout.log").st_mode & 0o777 == 0o600


@needs_root
def test_two_tenants_cannot_read_each_others_directories(provider: LocalProvider) -> None:
    first = probe(provider, "pa", tenant="iso-a")
    secret = Path(str(first["cwd"])) / "data.txt"
    secret.write_text("tenant a's data")
    os.chown(secret, int(first["uid"]), int(first["gid"]))  # type: ignore[call-overload]
    second = probe(provider, "pb", tenant="iso-b", env={"PROBE_PATHS": str(secret)})
    assert first["uid"] != second["uid"]
    assert second["read"] == {str(secret): False}
    assert pwd.getpwnam("gpupool-iso-b").pw_gid == pwd.getpwnam("gpupool-iso-a").pw_gid
    import grp

    assert grp.getgrgid(pwd.getpwnam("gpupool-iso-a").pw_gid).gr_name == POD_GROUP


@needs_root
def test_a_mapped_account_is_used_and_root_is_refused(provider: LocalProvider) -> None:
    name = "gptest-mapped"
    try:
        pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", name], check=True)
    out = probe(provider, "pm", tenant="mapped", unix_user=name)
    assert out["uid"] == pwd.getpwnam(name).pw_uid
    with pytest.raises(InvalidInput, match="uid 0"):
        provider.launch(PodLaunch(pod_id="proot", workload_id="w", node="box", command=("true",),
                                  tenant="mapped", unix_user=pwd.getpwuid(0).pw_name))


@needs_root
def test_a_workdir_the_account_may_not_enter_fails_the_pod(provider: LocalProvider, tmp_path: Path) -> None:
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    provider.launch(PodLaunch(pod_id="pw", workload_id="w", node="box", command=("true",), tenant="team-a",
                              workdir=str(closed)))
    status = wait_final(provider, "pw")
    assert (status.phase, status.exit_code) == (PodPhase.FAILED, 126)
    assert "working directory" in status.message


@needs_root
def test_an_explicit_workdir_is_no_oracle_for_directories_the_account_cannot_reach(
        provider: LocalProvider, tmp_path: Path) -> None:
    # It was checked as root first: a missing directory failed the launch with "does not exist",
    # a closed existing one failed as the account, so a tenant learned which paths exist anywhere.
    closed = tmp_path / "closed"
    (closed / "exists").mkdir(parents=True)
    closed.chmod(0o700)
    answers = []
    for pod_id, path in (("there", closed / "exists"), ("absent", closed / "absent")):
        provider.launch(PodLaunch(pod_id=pod_id, workload_id="w-" + pod_id, node="box", command=("true",),
                                  tenant="team-a", workdir=str(path)))
        status = wait_final(provider, pod_id)
        said = provider.read_log(pod_id).text.replace(str(path), "PATH")
        answers.append((status.phase, status.exit_code, status.message, said))
    assert answers[0] == answers[1]
    assert answers[0][:2] == (PodPhase.FAILED, 126)


TRICKY = {"QUOTES": "it's \"quoted\"", "NEWLINES": "a\nb\n", "EXPANSIONS": "$HOME `id` $(id) ${X:-y} \\n",
          "EMPTY": "", "PATH": "/usr/bin:/bin"}


@needs_root
def test_the_launcher_delivers_the_exact_environment(provider: LocalProvider) -> None:
    out = probe(provider, "env-exact", tenant="team-a", env=TRICKY)
    env = dict(out["env"])  # type: ignore[call-overload]
    assert {k: env.get(k) for k in TRICKY} == TRICKY
    assert out["uid"] == pwd.getpwnam("gpupool-team-a").pw_uid and out["nnp"] == "1"


@needs_root
def _status(pid: int) -> str:
    """/proc/PID/status, or "" for a process that ended after the listing (other tests' pods come
    and go while this one looks)."""
    try:
        return Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return ""


def test_an_account_helper_holds_nothing_of_the_root_helper(provider: LocalProvider) -> None:
    """An account's launcher must hold no descriptor that leads back to the root helper (nor run as
    the account, whose pods could then stop it: test_launcher.py), and the root helper refuses to
    make a helper for root."""
    probe(provider, "helper-fds", tenant="team-a")
    launcher = provider.agent.runner._launcher
    assert launcher is not None
    helpers = [int(pid) for pid in os.listdir("/proc") if pid.isdigit()
               and f"PPid:\t{launcher._proc.pid}\n" in _status(int(pid))]
    assert len(helpers) == 1
    assert os.stat(f"/proc/{helpers[0]}").st_uid == 0
    sockets = [os.readlink(f"/proc/{helpers[0]}/fd/{fd}") for fd in os.listdir(f"/proc/{helpers[0]}/fd")]
    assert sum(1 for target in sockets if target.startswith("socket:")) == 1, sockets
    answer, fds = launcher._root.ask({"uid": 0, "gid": 0})
    assert answer.get("error") == "pods never run as root" and fds == []


@needs_root
def test_a_removed_accounts_homes_and_checkpoints_go_with_it(tmp_path: Path) -> None:
    """`useradd` gives a freed uid to the next account: whatever the removed account still owned at
    the top of the scratch and checkpoint roots would be the next tenant's to read."""
    scratch, checkpoints = tmp_path / "scratch", tmp_path / "scratch" / ".checkpoints"
    checkpoints.mkdir(parents=True)
    theirs = [scratch / "old-a1-r0", checkpoints / "old"]
    kept = [scratch / "new-a1-r0", checkpoints / "new"]
    for path in theirs + kept:
        (path / "deep" / "er").mkdir(parents=True)
        (path / "deep" / "er" / "secret").write_text("x")
    for path in theirs:
        for sub in (path, path / "deep", path / "deep" / "er", path / "deep" / "er" / "secret"):
            os.chown(sub, 4321, 4321)
    assert identity.remove_owned([scratch, checkpoints], 4321) == 2
    assert not any(p.exists() for p in theirs)
    assert all((p / "deep" / "er" / "secret").exists() for p in kept) and checkpoints.is_dir()


@needs_root
def test_deleting_a_tenant_removes_its_pod_homes_with_its_account(tmp_path: Path) -> None:
    from gpupool.agent.identity import Identities

    provider = LocalProvider(tmp_path / "agent", simulate="1xH100", node_name="box",
                             identities=Identities(pool_id="tgone"))  # the scratch root every account enters
    try:
        seen = probe(provider, "gone-a1-r0", tenant="gone")
        home = Path(str(seen["env"]["HOME"]))  # type: ignore[index]
        assert home.is_dir() and home.stat().st_uid == seen["uid"]
        assert provider.remove_tenant("gone") == ["gpupool-tgone-gone"]
        assert not home.exists()
        with pytest.raises(KeyError):
            pwd.getpwnam("gpupool-tgone-gone")
    finally:
        provider.close(stop_pods=True)
        with contextlib.suppress(ProviderError):
            identity.remove_account("gpupool-tgone-gone")
