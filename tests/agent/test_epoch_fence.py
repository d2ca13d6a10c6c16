"""Epoch fencing at the node agent (agent/fencing.py): a launch decided by a leader that was deposed
since never runs its command on the node, whichever server process delivers it."""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from pathlib import Path

import pytest

from gpupool.agent.fencing import EpochFence
from gpupool.agent.runner import Runner
from gpupool.agent.shim import NEVER_STARTED
from gpupool.errors import ProviderError
from gpupool.pods import PodPhase

ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}


def _marker_command(marker: Path) -> list[str]:
    """A pod whose only effect is its own start marker (then it sleeps, as a workload would)."""
    return ["sh", "-c", f"echo started >> {marker}; sleep 30"]


def _started(marker: Path) -> bool:
    """Whether the pod's line is in its marker: `echo >>` creates the file before it writes, so the
    file's existence alone is not yet its line (a read between the two finds it empty)."""
    return marker.exists() and marker.read_text().endswith("\n")


def _wait_for(predicate, timeout_s: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def test_a_launch_from_a_deposed_leader_reaching_the_node_after_the_takeover_is_refused(
        tmp_path: Path) -> None:
    # Two servers' agents over one node directory: the old leader's (epoch 1) and the new one's.
    old = Runner(tmp_path)
    try:
        kept = tmp_path / "kept.marker"
        old.start("kept", _marker_command(kept), env=ENV, epoch=1)  # let go before the takeover
        _wait_for(lambda: _started(kept))
        assert old.fence.newest() == 0
        old.fence.advance(2)  # what the new leader does first at its takeover (through its own agent)
        new = Runner(tmp_path)  # then it reads the node's records afresh
        try:
            adopted = new.get("kept")
            assert adopted.phase is PodPhase.RUNNING and adopted.adopted and adopted.epoch == 1
            stale = tmp_path / "stale.marker"
            with pytest.raises(ProviderError, match=r"epoch 1.*epoch 2 has taken over"):
                old.start("stale", _marker_command(stale), env=ENV, epoch=1)  # the deposed leader's
            record = old.get("stale")  # never started: a new leader that read it places it again
            assert record.phase is PodPhase.LOST and record.never_started and "refused" in record.message
            fresh = tmp_path / "fresh.marker"
            new.start("fresh", _marker_command(fresh), env=ENV, epoch=2)  # the new leader's own
            _wait_for(lambda: _started(fresh))
            assert not stale.exists()  # its shim ended without running the command
            assert kept.read_text() == "started\n"  # and the adopted pod was never started again
        finally:
            new.close(stop_pods=True, grace_s=0.5)
    finally:
        old.close(stop_pods=True, grace_s=0.5)


def test_a_single_server_launch_carries_no_epoch_and_is_never_fenced(tmp_path: Path) -> None:
    runner = Runner(tmp_path)
    try:
        runner.fence.advance(9)
        marker = tmp_path / "m"
        runner.start("p", _marker_command(marker), env=ENV)
        _wait_for(lambda: _started(marker))
    finally:
        runner.close(stop_pods=True, grace_s=0.5)


_STOPPED_BEFORE_GO = """
import os, signal, sys
from pathlib import Path
from gpupool.agent import runner as runner_module

go = runner_module._go

def stopped(*args):  # the leader is stopped (SIGSTOP) after its check of the epoch, before the go-ahead
    os.kill(os.getpid(), signal.SIGSTOP)
    go(*args)

runner_module._go = stopped
runner = runner_module.Runner(Path(sys.argv[1]))
runner.start("p", ["sh", "-c", "echo started >> " + sys.argv[2] + "; sleep 30"],
             env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, epoch=1)
"""


def test_a_leader_stopped_in_the_middle_of_a_launch_does_not_hold_the_takeover(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys

    marker = tmp_path / "marker"
    state = tmp_path / "state"
    state.mkdir()
    leader = subprocess.Popen([sys.executable, "-c", _STOPPED_BEFORE_GO, str(state), str(marker)])
    try:
        _wait_for(lambda: Path(f"/proc/{leader.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T")
        took = threading.Thread(target=EpochFence(state).advance, args=(2,))
        took.start()
        took.join(10)
        assert not took.is_alive(), "the takeover waited for the stopped leader's launch"
        new = Runner(state)  # the new leader reads the node's records: the launch is on record
        try:
            record = new.get("p")
            assert record.pid is not None and record.adopted and not record.finished
            assert not marker.exists()
            os.kill(leader.pid, signal.SIGCONT)  # resumed: its launch had passed its check, so it runs
            _wait_for(lambda: _started(marker))
            leader.wait(30)
            assert marker.read_text() == "started\n"  # once, and its pod is the adopted one
            assert not new.get("p").finished
        finally:
            new.close(stop_pods=True, grace_s=0.5)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(leader.pid, signal.SIGCONT)
        leader.wait(30)


def test_the_epoch_only_grows_unless_the_store_confirms_a_lower_one(tmp_path: Path) -> None:
    fence = EpochFence(tmp_path)
    assert fence.advance(5) == 5
    assert fence.advance(3) == 5  # an older takeover never lowers it

    def stale() -> None:
        raise RuntimeError("no longer the lease's epoch")

    with pytest.raises(RuntimeError):
        fence.advance(2, confirm=stale)
    assert fence.newest() == 5
    assert fence.advance(2, confirm=lambda: None) == 2  # a store made afresh: its epoch 2 is current
    assert fence.newest() == 2


_KILLED_BEFORE_GO = """
import os, signal, sys
from pathlib import Path
from gpupool.agent import runner as runner_module

def killed(*_args):  # the server's process dies right after the pod's process id was saved
    os.kill(os.getpid(), signal.SIGKILL)

runner_module._go = runner_module._join_cgroup = killed
runner = runner_module.Runner(Path(sys.argv[1]))
runner.start("p", ["sh", "-c", "echo started >> " + sys.argv[2] + "; sleep 30"],
             env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, epoch=1)
"""


def test_a_kill_between_saving_the_pid_and_letting_the_pod_go_reports_it_never_started(
        tmp_path: Path) -> None:
    import subprocess
    import sys

    marker = tmp_path / "marker"
    state = tmp_path / "state"
    state.mkdir()
    killed = subprocess.run([sys.executable, "-c", _KILLED_BEFORE_GO, str(state), str(marker)], timeout=60)
    assert killed.returncode == -9
    runner = Runner(state)  # the next server's agent over the same node directory
    try:
        _wait_for(lambda: runner.poll() and runner.get("p").finished)
        record = runner.get("p")
        assert record.pid is not None  # saved before the kill: the pod was not simply unknown
        assert record.phase is PodPhase.LOST and record.never_started, record
        assert not marker.exists()  # the command never ran
    finally:
        runner.close(stop_pods=True, grace_s=0.5)


def test_a_pod_that_ran_never_reports_never_started(tmp_path: Path) -> None:
    runner = Runner(tmp_path)
    try:
        # the command writes what a shim never let go would, into its shim's exit file, then kills the
        # shim so nothing overwrites it: it ran, so its own word does not get it placed again
        forged = json.dumps({"exit_code": 125, "signal": None, "message": NEVER_STARTED})
        script = (f"for f in /proc/$PPID/fd/*; do case $(readlink $f) in *exit.json) echo '{forged}' > $f;; "
                  "esac; done; kill -9 $PPID; sleep 30")
        runner.start("p", ["sh", "-c", script], env=ENV, epoch=1)
        _wait_for(lambda: runner.poll() and runner.get("p").finished)
        record = runner.get("p")
        assert record.exit_code == 125 and record.message.endswith(NEVER_STARTED), record  # forged
        assert not record.never_started and record.phase is PodPhase.FAILED, record
    finally:
        runner.close(stop_pods=True, grace_s=0.5)


def test_a_reset_lowers_the_epoch_only_from_the_one_the_caller_read(tmp_path: Path) -> None:
    fence = EpochFence(tmp_path)
    fence.advance(9)
    assert fence.reset(3, expected=8) == 9  # a newer leader moved it since the caller read it: kept
    assert fence.reset(3, expected=9) == 3
