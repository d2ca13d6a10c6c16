"""Host limits on by default: a pod's whole process tree ended with it. The attack tests run as a
hostile tenant and need root (CI runs as root); elsewhere they skip with the reason.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from gpupool.agent.identity import account_name
from gpupool.agent.leftovers import account_processes
from gpupool.providers.base import PodLaunch, PodPhase, PodStatus
from gpupool.providers.local import LocalProvider

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="pods of other accounts need root")
T = TypeVar("T")


def wait_for(check: Callable[[], T], timeout_s: float = 20.0) -> T:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError("condition not met in time")


# ---- attacks (root) ---------------------------------------------------------------------------
@pytest.fixture
def provider(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalProvider]:
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
    """The account's processes, less the launcher's helper for it (zombies awaiting their reaper
    count as gone)."""
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


def _exists(user: str) -> bool:
    try:
        pwd.getpwnam(user)
        return True
    except KeyError:
        return False


ESCAPE = ("sh", "-c", "setsid env -i sleep 1000 & setsid env -i sh -c 'sleep 1000 & exec sleep 1000' & "
          "sleep 0.5; echo escaped; exec sleep {}")


def escapees(uid: int) -> list[int]:
    def cmdline(pid: int) -> bytes:
        with contextlib.suppress(OSError):
            return Path(f"/proc/{pid}/cmdline").read_bytes()
        return b""
    return [pid for pid in uid_processes(uid) if cmdline(pid) == b"sleep\x001000\x00"]


@needs_root
@pytest.mark.parametrize("cancel", [False, True], ids=["ends", "cancelled"])
def test_escaped_processes_die_with_their_workload(provider: LocalProvider, cancel: bool) -> None:
    uid = 0
    try:
        provider.launch(PodLaunch(pod_id="esc", workload_id="w-esc", node="box", tenant="sly",
                                  command=(ESCAPE[0], ESCAPE[1], ESCAPE[2].format(300 if cancel else 1))))
        wait_for(lambda: "escaped" in provider.read_log("esc").text)
        uid = pwd.getpwnam(account_name("sly")).pw_uid
        assert len(escapees(uid)) == 3  # no marker (env -i), own sessions: out of the pod's reach
        assert all(os.getsid(pid) == pid or os.getsid(pid) != os.getsid(os.getpid()) for pid in escapees(uid))
        if cancel:
            provider.stop("esc", grace_s=0.5)
        assert wait_final(provider, "esc").phase is (PodPhase.STOPPED if cancel else PodPhase.SUCCEEDED)
        wait_for(lambda: not uid_processes(uid))
        # the sweep spared the launcher's helper for the account: the tenant's next pod starts
        provider.launch(PodLaunch(pod_id="next", workload_id="w-next", node="box", tenant="sly",
                                  command=("echo", "next")))
        assert wait_final(provider, "next").phase is PodPhase.SUCCEEDED
        assert provider.read_log("next").text == "next\n"
    finally:
        if uid:
            kill_all(uid)


@needs_root
def test_a_live_pod_of_the_same_account_is_never_swept(provider: LocalProvider) -> None:
    uid = 0
    try:
        provider.launch(PodLaunch(pod_id="keep", workload_id="w-keep", node="box", tenant="sly",
                                  command=("sh", "-c", "setsid env -i sleep 1000 & echo up; exec sleep 300")))
        provider.launch(PodLaunch(pod_id="esc", workload_id="w-esc", node="box", tenant="sly",
                                  command=("sh", "-c", "setsid env -i sleep 1000 & echo up; sleep 0.5")))
        wait_for(lambda: "up" in provider.read_log("keep").text and "up" in provider.read_log("esc").text)
        uid = pwd.getpwnam(account_name("sly")).pw_uid
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
