"""The tests' fork server (tests/zygote.py) makes what `python -m gpupool.cli.main ARGS` with
Popen(start_new_session=True) makes: the exit status, the log, the environment, a session of its
own and no file of the fork server left open."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from ports import free_port
from zygote import Forked, Zygote, usable


def test_a_command_exits_with_its_status_and_writes_its_log(tmp_path: Path) -> None:
    log = tmp_path / "out.log"
    ok = Zygote.shared().spawn(["--help"], dict(os.environ), log)
    assert ok.wait(timeout=60) == 0 and "Usage" in log.read_text()
    bad = Zygote.shared().spawn(["no-such-command"], dict(os.environ), log)
    assert bad.wait(timeout=60) == 2 and bad.poll() == 2
    assert "no-such-command" in log.read_text()


def test_a_server_has_its_own_session_environment_and_files_and_ends_as_popen_reports(tmp_path: Path) -> None:
    port, log = free_port(), tmp_path / "server.log"
    env = {**os.environ, "GPUPOOL_URL_OF_NOTHING": "only-in-the-child"}
    server = Zygote.shared().spawn(["up", "--data-dir", str(tmp_path / "data"), "--port", str(port),
                                    "--simulate", "1x2xH100"], env, log)
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/api/v1/health", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        assert server.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.05)
    assert os.getsid(server.pid) == server.pid  # a session of its own, as start_new_session makes
    targets = _open_files(server.pid)
    assert targets[0] == os.devnull and targets[1] == targets[2] == str(log)
    helpers = set(_open_files(Zygote.shared().proc.pid).values())
    assert {t for t in helpers if t.startswith("pipe:")}, helpers
    assert not helpers & {t for t in targets.values() if t.startswith("pipe:")}, targets  # none of its pipes
    with pytest.raises(subprocess.TimeoutExpired):
        server.wait(timeout=0.2)
    server.send_signal(signal.SIGTERM)
    code = server.wait(timeout=60)
    assert code == 128 + signal.SIGTERM, log.read_text()  # `gpupool up`'s own status for SIGTERM
    assert "Traceback" not in log.read_text() and "RuntimeWarning" not in log.read_text()
    server.send_signal(signal.SIGTERM)  # ended: nothing to signal, no error
    killed = Zygote.shared().spawn(["up", "--data-dir", str(tmp_path / "other"), "--port", str(free_port())],
                                   env, log)
    killed.kill()
    assert killed.wait(timeout=60) == -signal.SIGKILL  # as Popen reports an end by a signal


def _open_files(pid: int) -> dict[int, str]:
    """What each of the process's descriptors is open on. A running server opens and closes files
    all the time: a descriptor listed, then closed before its link is read, is left out."""
    targets = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            targets[int(fd)] = os.readlink(f"/proc/{pid}/fd/{fd}")
        except FileNotFoundError:
            continue
    return targets


def test_an_environment_that_changes_how_python_starts_is_not_forked() -> None:
    assert usable({"GPUPOOL_X": "1"}) and usable({})
    assert not usable({"PYTHONPATH": "/elsewhere/src"})


def test_a_reused_pid_does_not_inherit_the_exit_of_the_child_that_had_it() -> None:
    """Pids are reused once reaped (32,768 of them by default, and a suite starts thousands of
    processes): the exit the helper reported for an earlier child with the same pid is not the new
    child's."""
    zygote = Zygote.shared()
    stale = 2**22 + 7  # no process has it: only the bookkeeping is read
    with zygote._cond:
        zygote._exits[stale] = 0
    assert zygote._forked(stale, ["up"]).poll() is None


def test_no_signal_goes_to_a_pid_whose_child_was_reported_ended() -> None:
    """Once the helper reported a child's exit its pid may belong to any process (here a stand-in):
    signalling the ended child sends nothing, as with Popen."""
    zygote = Zygote.shared()
    bystander = subprocess.Popen(["sleep", "30"])
    try:
        with zygote._cond:
            zygote._exits[bystander.pid] = 0  # reported ended, its pid since taken by the bystander
        ended = Forked(zygote, bystander.pid)
        ended.send_signal(signal.SIGKILL)
        ended.kill()
        assert ended.returncode == 0
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()
