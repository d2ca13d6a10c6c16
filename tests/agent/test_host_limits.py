"""Host limits on by default: a per-account process limit, a memory bound for every pod, and a pod's
whole process tree ended with it. The attack tests run as a hostile tenant and need root (CI runs
as root); elsewhere they skip with the reason.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from factories import pod_python
from gpupool.agent.identity import account_name
from gpupool.agent.isolation import (
    MIN_POD_PROCESSES,
    PROCESS_SHARE_DIVISOR,
    Layer,
    plan_isolation,
    prepare_cgroup,
    process_limit,
)
from gpupool.agent.leftovers import account_processes
from gpupool.core.model import Slice
from gpupool.errors import InvalidInput
from gpupool.pods import PodLaunch, PodPhase, PodStatus
from gpupool.providers.fake import nodes_from_spec
from gpupool.providers.local import LocalProvider

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="pods of other accounts need root")
H100 = nodes_from_spec("1x4xH100")[0]
T = TypeVar("T")


def wait_for(check: Callable[[], T], timeout_s: float = 20.0) -> T:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError("condition not met in time")


def launch(*slices: Slice, **kw: object) -> PodLaunch:
    return PodLaunch(pod_id="p", workload_id="w", node="n", command=("x",), slices=slices, **kw)  # type: ignore[arg-type]


# ---- planning ---------------------------------------------------------------------------------
def test_the_process_limit_is_a_share_of_the_nodes_pids(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUPOOL_POD_PROCESSES", raising=False)
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    threads = int(Path("/proc/sys/kernel/threads-max").read_text())
    expected = max(MIN_POD_PROCESSES, min(pid_max, threads) // PROCESS_SHARE_DIVISOR)
    import resource
    hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    assert process_limit() == (expected if hard == resource.RLIM_INFINITY else min(expected, hard))
    assert process_limit() < pid_max  # one account can never take every pid
    monkeypatch.setenv("GPUPOOL_POD_PROCESSES", "123")
    assert process_limit() == 123
    for bad in ("0", "-5", "lots"):
        monkeypatch.setenv("GPUPOOL_POD_PROCESSES", bad)
        with pytest.raises(InvalidInput, match="positive whole number"):
            process_limit()


def test_every_pod_gets_a_memory_bound(tmp_path: Path) -> None:
    share = H100.memory_mib // len(H100.devices)
    assert share > 0
    # no cgroup: a CPU pod without --memory gets RLIMIT_DATA of one device's share
    cpu = plan_isolation(launch(), H100, nproc=500)
    assert cpu.host_limits.rlimit_data_bytes == share * 2**20
    assert cpu.host_limits.rlimit_nproc == 500
    # a device pod without a cgroup: RLIMIT_DATA would break GPU drivers, so unenforced and said so
    gpu = plan_isolation(launch(Slice(0, 1000), Slice(1, 1000)), H100, nproc=500)
    assert gpu.host_limits.rlimit_data_bytes is None and gpu.host_limits.rlimit_nproc == 500
    state = {s.layer: s for s in gpu.layers}[Layer.HOST_LIMITS]
    assert not state.active and "memory not capped" in state.detail
    # with a cgroup: two devices' share, and the account's limit as the pod's pids.max
    root = tmp_path / "cg"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpu memory pids\n")
    (root / "pod-p").mkdir()
    (root / "pod-p" / "pids.max").write_text("max")  # the kernel makes it where pids is delegated
    plan = plan_isolation(launch(Slice(0, 1000), Slice(1, 1000)), H100, cgroup_root=root, nproc=500)
    limits = prepare_cgroup(plan.host_limits, plan.cgroup_files)
    assert limits.cgroup_dir == root / "pod-p"
    assert (root / "pod-p" / "memory.max").read_text() == str(2 * share * 2**20)
    assert (root / "pod-p" / "pids.max").read_text() == "500"
    # a request wins over the default share
    asked = plan_isolation(launch(Slice(0, 1000), memory_mib=1024), H100, cgroup_root=root)
    assert asked.cgroup_files["memory.max"] == str(1024 * 2**20)


def test_without_a_pids_controller_the_cgroup_still_holds(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpu memory\n")
    plan = plan_isolation(launch(), H100, cgroup_root=root, nproc=500)
    limits = prepare_cgroup(plan.host_limits, plan.cgroup_files)
    assert limits.cgroup_dir == root / "pod-p" and limits.rlimit_nproc == 500
    assert not (root / "pod-p" / "pids.max").exists()


# ---- attacks (root) ---------------------------------------------------------------------------
@pytest.fixture
def provider(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalProvider]:
    monkeypatch.setenv("GPUPOOL_POD_PROCESSES", "40")
    monkeypatch.delenv("GPUPOOL_CGROUP_ROOT", raising=False)
    p = LocalProvider(tmp_path / "agent", simulate="2xH100", node_name="box")
    yield p
    p.close(stop_pods=True)


def wait_final(provider: LocalProvider, pod_id: str, timeout_s: float = 30.0) -> PodStatus:
    def final() -> PodStatus | None:
        status = {s.pod_id: s for s in provider.poll()}.get(pod_id)
        return status if status is not None and status.phase.is_final else None
    return wait_for(final, timeout_s)


def uid_processes(uid: int) -> list[int]:
    """The account's processes (zombies awaiting their reaper count as gone)."""
    return [pid for pid in account_processes(uid) if _state(pid) not in ("Z", "")]


def _state(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return raw[raw.rfind(")") + 2]


def kill_all(uid: int) -> None:
    for pid in uid_processes(uid):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


FORK_BOMB = """
import subprocess, sys, time
started = []
for _ in range(200):
    try:
        started.append(subprocess.Popen(['sleep', '300']))
    except OSError as exc:
        print('refused', exc.errno, flush=True)
        break
print('started', len(started), flush=True)
time.sleep(300)
"""


@needs_root
def test_a_tenant_cannot_exhaust_the_nodes_processes(provider: LocalProvider) -> None:
    hog = pwd.getpwnam(account_name("hog")) if _exists(account_name("hog")) else None
    try:
        provider.launch(PodLaunch(pod_id="bomb", workload_id="w-bomb", node="box", tenant="hog",
                                  command=(pod_python(), "-c", FORK_BOMB)))
        text = wait_for(lambda: "started" in (t := provider.read_log("bomb").text) and t)
        hog = pwd.getpwnam(account_name("hog"))
        started = int(text.split("started")[1].split()[0])
        assert "refused 11" in text  # EAGAIN: the fork past the account's limit is refused
        assert 0 < started < 40
        assert len(uid_processes(hog.pw_uid)) <= 40
        shim = next(s for s in provider.poll() if s.pod_id == "bomb")
        assert shim.phase is PodPhase.RUNNING
        limits = Path(f"/proc/{provider.agent.runner.get('bomb').pid}/limits").read_text()
        assert any(line.startswith("Max processes") and line.split()[2:4] == ["40", "40"]
                   for line in limits.splitlines()), limits
        # another tenant, at the same time, is unaffected by the hog's count
        provider.launch(PodLaunch(pod_id="other", workload_id="w-other", node="box", tenant="calm",
                                  command=("sh", "-c", "for i in 1 2 3 4 5 6 7 8 9 10; do sleep 0.1 & done; "
                                           "wait; echo fine")))
        status = wait_final(provider, "other")
        assert status.phase is PodPhase.SUCCEEDED, provider.read_log("other").text
        assert provider.read_log("other").text == "fine\n"
        # and the hog's processes all go with its pod
        provider.stop("bomb", grace_s=0.5)
        assert wait_final(provider, "bomb").phase is PodPhase.STOPPED
        wait_for(lambda: not uid_processes(hog.pw_uid))
    finally:
        if hog is not None:
            kill_all(hog.pw_uid)


def _exists(user: str) -> bool:
    try:
        pwd.getpwnam(user)
        return True
    except KeyError:
        return False


@needs_root
def test_a_pod_without_memory_asked_gets_a_bound(provider: LocalProvider) -> None:
    share = provider.agent.node().memory_mib // len(provider.agent.node().devices)
    provider.launch(PodLaunch(pod_id="mem", workload_id="w-mem", node="box", tenant="calm",
                              command=("cat", "/proc/self/limits")))
    assert wait_final(provider, "mem").phase is PodPhase.SUCCEEDED
    lines = {line[:26].strip(): line[26:].split() for line in provider.read_log("mem").text.splitlines()}
    assert lines["Max data size"][:2] == [str(share * 2**20)] * 2
    assert lines["Max processes"][:2] == ["40", "40"]


ESCAPE = ("sh", "-c", "setsid env -i sleep 1000 & setsid env -i sh -c 'sleep 1000 & exec sleep 1000' & "
          "echo escaped; while [ ! -e \"$HOME/go\" ]; do sleep 0.05; done")
"""Three `sleep 1000` out of the pod's session and group, without its marker once `env -i` has run:
the pod then waits for $HOME/go (to end by itself)."""


def escapees(uid: int) -> list[int]:
    def cmdline(pid: int) -> bytes:
        with contextlib.suppress(OSError):
            return Path(f"/proc/{pid}/cmdline").read_bytes()
        return b""
    return [pid for pid in uid_processes(uid) if cmdline(pid) == b"sleep\x001000\x00"]


@needs_root
@pytest.mark.parametrize("cancel", [False, True], ids=["ends", "cancelled"])
def test_escaped_processes_die_with_their_workload(provider: LocalProvider, cancel: bool) -> None:
    uid, pod = 0, f"esc-{uuid.uuid4().hex[:8]}"  # pods' homes live in a scratch root shared by runs
    try:
        provider.launch(PodLaunch(pod_id=pod, workload_id="w-" + pod, node="box", tenant="sly",
                                  command=ESCAPE))
        wait_for(lambda: "escaped" in provider.read_log(pod).text)
        uid = pwd.getpwnam(account_name("sly")).pw_uid
        shim = provider.agent.runner.get(pod).pid
        # the three have escaped once each is `sleep 1000` (setsid and env -i have run): waited for,
        # not left to a pause in the pod (a loaded machine had not yet run them all)
        wait_for(lambda: len(escapees(uid)) == 3)
        for pid in escapees(uid):  # out of the pod's session and group, without its marker
            assert os.getsid(pid) != shim and os.getpgid(pid) != shim
            assert b"GPUPOOL_POD_ID" not in Path(f"/proc/{pid}/environ").read_bytes()
        if cancel:
            provider.stop(pod, grace_s=0.5)
        else:
            (provider.agent.scratch_root / pod / "go").touch()  # the workload ends by itself
        assert wait_final(provider, pod).phase is (PodPhase.STOPPED if cancel else PodPhase.SUCCEEDED)
        wait_for(lambda: not uid_processes(uid))
        # the sweep left the account usable: the tenant's next pod starts
        provider.launch(PodLaunch(pod_id="next", workload_id="w-next", node="box", tenant="sly",
                                  command=("echo", "next")))
        assert wait_final(provider, "next").phase is PodPhase.SUCCEEDED
        assert provider.read_log("next").text == "next\n"
    finally:
        (provider.agent.scratch_root / pod / "go").unlink(missing_ok=True)
        if uid:
            kill_all(uid)


@needs_root
def test_a_live_pod_of_the_same_account_is_never_swept(provider: LocalProvider) -> None:
    uid = 0
    try:
        provider.launch(PodLaunch(pod_id="keep", workload_id="w-keep", node="box", tenant="sly",
                                  command=("sh", "-c", "setsid env -i sleep 1000 & echo up; exec sleep 300")))
        provider.launch(PodLaunch(pod_id="esc", workload_id="w-esc", node="box", tenant="sly",
                                  command=("sh", "-c", "setsid env -i sleep 1000 & echo up; "
                                           "while [ ! -e \"$HOME/go\" ]; do sleep 0.05; done")))
        wait_for(lambda: "up" in provider.read_log("keep").text and "up" in provider.read_log("esc").text)
        uid = pwd.getpwnam(account_name("sly")).pw_uid
        # esc ends only once both sleeps have escaped (else its end takes its own along, by group or
        # marker, and nothing is left to tell a sweep that spares the live pod's from one that does not)
        wait_for(lambda: len(escapees(uid)) == 2)
        (provider.agent.scratch_root / "esc" / "go").touch()
        assert wait_final(provider, "esc").phase is PodPhase.SUCCEEDED
        for _ in range(20):  # sweeps run at every poll: the live pod and both sleeps stay
            provider.poll()
            time.sleep(0.05)
        keep = provider.agent.runner.get("keep")
        assert keep.phase is PodPhase.RUNNING and keep.pid in uid_processes(uid)
        assert len(escapees(uid)) == 2  # which one was whose cannot be told: both wait for the last pod
        provider.stop("keep", grace_s=0.5)
        assert wait_final(provider, "keep").phase is PodPhase.STOPPED
        wait_for(lambda: not uid_processes(uid))
    finally:
        (provider.agent.scratch_root / "esc" / "go").unlink(missing_ok=True)
        if uid:
            kill_all(uid)


@needs_root
def test_an_account_mapped_with_unix_user_is_never_swept_by_uid(provider: LocalProvider) -> None:
    name = "gptest-mapped"
    if not _exists(name):
        subprocess.run(["useradd", "--system", "--no-create-home", name], check=True)
    # the account's own process, outside the pool (a person's shell, say)
    own = subprocess.Popen(["sleep", "1000"], user=name, env={}, start_new_session=True)
    try:
        provider.launch(PodLaunch(pod_id="mapped", workload_id="w-mapped", node="box", tenant="mapped",
                                  unix_user=name, command=("sh", "-c", "echo ran")))
        assert wait_final(provider, "mapped").phase is PodPhase.SUCCEEDED
        for _ in range(20):
            provider.poll()
            time.sleep(0.05)
        assert own.poll() is None  # still running
    finally:
        own.kill()
        own.wait()


@needs_root
def test_a_pod_of_the_account_under_another_agent_is_never_swept(provider: LocalProvider,
                                                                tmp_path: Path) -> None:
    other = LocalProvider(tmp_path / "agent-b", simulate="2xH100", node_name="box-b")
    uid = 0
    try:
        other.launch(PodLaunch(pod_id="b-keep", workload_id="w-b", node="box-b", tenant="sly",
                               command=("sh", "-c", "echo up; exec sleep 300")))
        wait_for(lambda: "up" in other.read_log("b-keep").text)
        provider.launch(PodLaunch(pod_id="a-end", workload_id="w-a", node="box", tenant="sly",
                                  command=("true",)))
        assert wait_final(provider, "a-end").phase is PodPhase.SUCCEEDED
        uid = pwd.getpwnam(account_name("sly")).pw_uid
        for _ in range(20):  # this agent's sweeps run at every poll; the other agent's pod stays
            provider.poll()
            time.sleep(0.05)
        keep = other.agent.runner.get("b-keep")
        assert keep.phase is PodPhase.RUNNING and keep.pid in uid_processes(uid)
        other.stop("b-keep", grace_s=0.5)
        assert wait_final(other, "b-keep").phase is PodPhase.STOPPED
    finally:
        other.close(stop_pods=True)
        if uid:
            kill_all(uid)


@needs_root
def test_the_pods_of_an_agent_that_went_away_are_never_swept(provider: LocalProvider, tmp_path: Path) -> None:
    """An agent killed with -9 lets go of its account locks, but its pods run on until the next agent
    adopts them: another agent's sweep of the account must leave them alone."""
    other = LocalProvider(tmp_path / "agent-b", simulate="2xH100", node_name="box-b")
    uid = 0
    try:
        other.launch(PodLaunch(pod_id="b-orphan", workload_id="w-b", node="box-b", tenant="sly",
                               command=("sh", "-c", "echo up; exec sleep 300")))
        wait_for(lambda: "up" in other.read_log("b-orphan").text)
        orphan = other.agent.runner.get("b-orphan").pid
        other.close(stop_pods=False)  # what its end leaves: the pod runs, the agent's locks are gone
        provider.launch(PodLaunch(pod_id="a-end", workload_id="w-a", node="box", tenant="sly",
                                  command=("true",)))
        assert wait_final(provider, "a-end").phase is PodPhase.SUCCEEDED
        uid = pwd.getpwnam(account_name("sly")).pw_uid
        for _ in range(20):  # this agent's sweeps run at every poll
            provider.poll()
            time.sleep(0.05)
        assert orphan in uid_processes(uid)
        back = LocalProvider(tmp_path / "agent-b", simulate="2xH100", node_name="box-b")
        try:
            assert back.agent.runner.get("b-orphan").adopted
            back.stop("b-orphan", grace_s=0.5)
            assert wait_final(back, "b-orphan").phase is PodPhase.STOPPED
        finally:
            back.close(stop_pods=True)
        wait_for(lambda: orphan not in uid_processes(uid))
    finally:
        if uid:
            kill_all(uid)
