"""A tenant cannot stall or poison the launch path: its pods cannot signal their launcher helper, a
helper that does not answer fails that launch alone within the deadline and is replaced, a NUL in
a launch fails that launch and leaves the helper serving, and a shim whose launch was given up runs
nothing. These need root (pods run as the tenants' accounts), as `make test` runs in CI."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from clocks import HeldClock
from factories import pod_python
from gpupool.agent import launcher as launcher_module
from gpupool.agent.launcher import Launcher, launch_timeout_s
from gpupool.agent.shim import shim_argv
from gpupool.errors import InvalidInput, ProviderError
from gpupool.pods import PodLaunch, PodPhase, PodStatus
from gpupool.providers.local import LocalProvider

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="changing a pod's user needs root")
TIMEOUT_S = 5.0

TRY_TO_STOP_MY_HELPER = (pod_python(), "-c", """
import os, signal
shim = os.getppid()
helper = int(open(f'/proc/{shim}/stat').read().rsplit(')', 1)[1].split()[1])
try:
    os.kill(helper, signal.SIGSTOP)
    print('stopped', helper)
except PermissionError:
    print('refused', helper)
""")


def wait_final(provider: LocalProvider, pod_id: str, timeout_s: float = 30.0) -> PodStatus:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = {s.pod_id: s for s in provider.poll()}.get(pod_id)
        if status is not None and status.phase.is_final:
            return status
        time.sleep(0.02)
    raise AssertionError(f"{pod_id} did not finish")


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:g} s"
        time.sleep(0.01)


def launch(provider: LocalProvider, pod_id: str, tenant: str,
           command: tuple[str, ...] = ("true",)) -> None:
    provider.launch(PodLaunch(pod_id=pod_id, workload_id="w-" + pod_id, node="box", command=command,
                              tenant=tenant))


def helper_of(provider: LocalProvider, tenant: str) -> int:
    launcher = provider.agent.runner._launcher
    assert launcher is not None
    uid = provider.agent.identities.resolve(tenant, "").uid
    [channel] = [c for (u, _), c in launcher._accounts.items() if u == uid]
    assert channel.helper_pid is not None
    return channel.helper_pid


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.fixture
def provider(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalProvider]:
    monkeypatch.setenv("GPUPOOL_LAUNCH_TIMEOUT_S", str(TIMEOUT_S))
    p = LocalProvider(tmp_path / "agent", simulate="2xH100", node_name="box")
    yield p
    launcher = p.agent.runner._launcher
    for channel in list(launcher._accounts.values()) if launcher is not None else []:
        if channel.helper_pid is not None:  # never leave a stopped helper behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(channel.helper_pid, signal.SIGCONT)
    p.close(stop_pods=True)


@needs_root
def test_a_pod_cannot_stop_its_launcher_helper(provider: LocalProvider) -> None:
    """The attack of the issue: a pod SIGSTOPs its helper (its parent's parent), and every later
    launch of that account (and, through the control loop, of everyone) waited for ever."""
    launch(provider, "stopper", "mallory", TRY_TO_STOP_MY_HELPER)
    assert wait_final(provider, "stopper").phase is PodPhase.SUCCEEDED
    said, pid = provider.read_log("stopper").text.split()
    assert int(pid) == helper_of(provider, "mallory")
    assert said == "refused", "the account may not signal the helper that starts its pods"
    assert os.stat(f"/proc/{pid}").st_uid == 0
    launch(provider, "after", "mallory")  # a stopped helper would fail it (ProviderError) at the timeout
    assert wait_final(provider, "after").phase is PodPhase.SUCCEEDED


@needs_root
def test_a_helper_that_does_not_answer_fails_that_launch_alone_and_is_replaced(
        provider: LocalProvider, monkeypatch: pytest.MonkeyPatch) -> None:
    launch(provider, "first", "mallory")
    launch(provider, "other-first", "alice")
    stuck = helper_of(provider, "mallory")
    launcher = provider.agent.runner._launcher
    assert launcher is not None
    [channel] = [c for c in launcher._accounts.values() if c.helper_pid == stuck]
    clock = HeldClock()
    monkeypatch.setattr(launcher_module, "time", clock)
    os.kill(stuck, signal.SIGSTOP)  # however it came to hang: stopped, traced, blocked
    outcome: dict[str, object] = {}

    def mallory() -> None:
        started = time.monotonic()
        try:
            launch(provider, "stalled", "mallory")
        except ProviderError as exc:
            outcome["error"] = exc.message
        outcome["took_s"] = time.monotonic() - started

    def alice() -> None:
        launch(provider, "other", "alice")
        outcome["alice"] = "returned"

    thread = threading.Thread(target=mallory)
    thread.start()
    wait_for(channel._lock.locked, "mallory's launch waiting for its stopped helper")
    # Another account's launch does not wait for it: alice's returns while mallory's, which cannot
    # give up before the held clock passes its deadline, still waits (the order, whatever the load).
    other = threading.Thread(target=alice)
    other.start()
    other.join(timeout=60)
    assert outcome.get("alice") == "returned", "alice's launch waited for mallory's"
    assert thread.is_alive() and "error" not in outcome
    clock.now += TIMEOUT_S  # mallory's deadline passes
    thread.join(timeout=60)
    assert not thread.is_alive()
    monkeypatch.setattr(launcher_module, "time", time)
    assert "did not answer within 5 s; it was replaced" in str(outcome["error"])
    assert float(outcome["took_s"]) >= TIMEOUT_S  # type: ignore[arg-type]
    deadline = time.monotonic() + 10
    while alive(stuck) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not alive(stuck), "the stuck helper was killed"
    record = provider.agent.runner.known("stalled")
    assert record is not None and record.phase is PodPhase.FAILED and "not started" in record.message
    launch(provider, "next", "mallory")  # a fresh helper serves the account again
    assert helper_of(provider, "mallory") != stuck
    assert wait_final(provider, "next").phase is PodPhase.SUCCEEDED
    assert wait_final(provider, "other").phase is PodPhase.SUCCEEDED


@needs_root
def test_a_nul_fails_that_launch_and_the_helper_keeps_serving(tmp_path: Path) -> None:
    from gpupool.agent.identity import Identities

    identity = Identities().resolve("mallory", "")
    launcher = Launcher(timeout_s=5.0)
    exit_file = os.open(tmp_path / "exit", os.O_WRONLY | os.O_CREAT, 0o600)
    null = os.open(os.devnull, os.O_RDWR)
    files = {"stdin": null, "stdout": null, "stderr": null, "exit_fd": exit_file}
    try:
        with pytest.raises(OSError, match="cannot pass that command or environment") as refused:
            launcher.launch(["/bin/echo", "a\x00b"], {}, identity, **files)
        assert "cannot pass" in str(refused.value.strerror), "the sentence the runner records"
        with pytest.raises(OSError, match="cannot pass that command or environment"):
            launcher.launch(["/bin/true"], {"K": "a\x00b"}, identity, **files)
        pid, _ = launcher.launch(["/bin/true"], {}, identity, **files)
        assert pid > 0
    finally:
        launcher.close()
        os.close(exit_file)
        os.close(null)


@needs_root
def test_a_nul_in_a_stored_spec_is_refused_by_the_agent_with_a_sentence(provider: LocalProvider) -> None:
    with pytest.raises(InvalidInput, match="its environment holds a NUL byte"):
        provider.launch(PodLaunch(pod_id="nul", workload_id="w-nul", node="box", command=("true",),
                                  tenant="mallory", env={"GPUPOOL_SUBMIT_DIR": "/tmp/\x00x"}))


def test_a_shim_whose_launch_was_given_up_runs_nothing(tmp_path: Path) -> None:
    """A helper replaced after a timeout may leave a child that execs the shim later: the runner
    never writes its go line, so the shim reads end-of-file and must not run the command."""
    marker = tmp_path / "ran"
    exit_file = os.open(tmp_path / "exit.json", os.O_WRONLY | os.O_CREAT, 0o600)
    go_r, go_w = os.pipe()
    os.close(go_w)
    try:
        argv = shim_argv(exit_file, ["touch", str(marker)], workdir=str(tmp_path), wait_for_go=True)
        done = subprocess.run(argv, stdin=go_r, pass_fds=(exit_file,), timeout=30, check=False)
    finally:
        os.close(go_r)
        os.close(exit_file)
    assert done.returncode == 125
    assert not marker.exists()


def test_the_launch_timeout_comes_from_the_environment_or_says_what_is_wrong(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUPOOL_LAUNCH_TIMEOUT_S", "2.5")
    assert launch_timeout_s() == 2.5
    for bad in ("soon", "0", "-1", "nan", "1e9"):
        monkeypatch.setenv("GPUPOOL_LAUNCH_TIMEOUT_S", bad)
        with pytest.raises(InvalidInput, match="GPUPOOL_LAUNCH_TIMEOUT_S must be a number of seconds"):
            launch_timeout_s()
