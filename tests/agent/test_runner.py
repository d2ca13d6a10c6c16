"""The runner with real processes: exit codes, group-wide cancel, streaming logs, restart re-adoption."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupool.agent import podstate
from gpupool.agent.runner import Runner
from gpupool.errors import InvalidInput, NotFound
from gpupool.pods import PodPhase

ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}


@pytest.fixture
def runner(tmp_path: Path) -> Iterator[Runner]:
    r = Runner(tmp_path)
    yield r
    r.close(stop_pods=True, grace_s=0.5)


def wait_for(predicate, timeout_s: float = 30.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError("condition not met in time")


def alive(pid: int) -> bool:
    return podstate.process_alive(pid, None)


def test_exit_code_and_logs(runner: Runner) -> None:
    runner.start("p", ["sh", "-c", "echo out; echo err >&2; exit 7"], env=ENV)
    record = runner.wait("p", 10)
    assert (record.phase, record.exit_code) == (PodPhase.FAILED, 7)
    assert runner.read_log("p").text == "out\n"
    assert runner.read_log("p", "stderr").text == "err\n"


def test_an_offset_past_the_end_of_the_log_is_answered_at_its_end(runner: Runner) -> None:
    # 2**44 is past what ext4 lets a file seek to: that was a 500 with a traceback through the API
    runner.start("p", ["sh", "-c", "echo hello"], env=ENV)
    runner.wait("p", 10)
    for offset in (2**44, 2**62, 7, -5):
        chunk = runner.read_log("p", offset=offset)
        assert (chunk.text, chunk.next_offset, chunk.finished) == ("", 6, True), offset
    assert runner.read_log("p", offset=4).text == "o\n"


def test_forgotten_pods_leave_poll_but_their_records_and_logs_stay(tmp_path: Path) -> None:
    runner = Runner(tmp_path)
    try:
        runner.start("done", ["sh", "-c", "echo bye"], env=ENV)
        runner.start("busy", ["sleep", "60"], env=ENV)
        runner.wait("done", 10)
        runner.forget(["done", "busy", "unknown"])
        assert [r.pod_id for r in runner.poll()] == ["busy"], "only an ended pod is forgotten"
        assert runner.read_log("done").text == "bye\n" and runner.get("done").finished
        assert runner.start("done", ["false"], env=ENV).exit_code == 0, "still known: not started again"
        assert [r.pod_id for r in runner.poll()] == ["busy"]
    finally:
        runner.close()
    again = Runner(tmp_path)  # kept across a restart (test_runner_reopen.py): still known, not listed
    try:
        assert sorted(r.pod_id for r in again.poll()) == ["busy"] and again.get("done").finished
    finally:
        again.close(stop_pods=True, grace_s=0.5)


def test_workdir_and_env_reach_the_process(runner: Runner, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    runner.start("p", ["sh", "-c", 'pwd; echo "$ONLY"'], env={**ENV, "ONLY": "this"}, workdir=work)
    runner.wait("p", 10)
    assert runner.read_log("p").text == f"{work}\nthis\n"


def test_start_is_idempotent_and_validates(runner: Runner, tmp_path: Path) -> None:
    first = runner.start("p", ["sleep", "30"], env=ENV)
    again = runner.start("p", ["sleep", "30"], env=ENV)
    assert first.pid == again.pid
    with pytest.raises(InvalidInput):
        runner.start("bad id!", ["true"], env=ENV)
    with pytest.raises(InvalidInput):
        runner.start("q", [], env=ENV)
    with pytest.raises(InvalidInput):
        runner.start("r", ["true"], env=ENV, workdir=tmp_path / "missing")
    with pytest.raises(NotFound):
        runner.get("unknown")


def test_missing_program_fails_with_127(runner: Runner) -> None:
    runner.start("p", ["/nonexistent/program"], env=ENV)
    record = runner.wait("p", 10)
    assert (record.phase, record.exit_code) == (PodPhase.FAILED, 127)
    assert "cannot start" in runner.read_log("p", "stderr").text


def test_cancel_kills_the_whole_group_including_grandchildren(runner: Runner, tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    script = f"sleep 300 & echo $! > {pids}; sh -c 'sleep 300' & wait"
    runner.start("p", ["sh", "-c", script], env=ENV)
    grandchild = int(wait_for(lambda: pids.exists() and pids.read_text().strip()))
    assert alive(grandchild)
    runner.stop("p", grace_s=5.0)
    record = runner.wait("p", 10)
    assert record.phase is PodPhase.STOPPED and record.exit_code == 143
    wait_for(lambda: not alive(grandchild))


def test_term_ignoring_pod_is_killed_after_grace(runner: Runner) -> None:
    code = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('ready', flush=True); time.sleep(300)")
    runner.start("p", [sys.executable, "-c", code], env=ENV)
    wait_for(lambda: "ready" in runner.read_log("p").text)
    runner.stop("p", grace_s=0.2)
    record = runner.wait("p", 10)
    assert (record.phase, record.exit_code, record.signal) == (PodPhase.STOPPED, 137, signal.SIGKILL)


def test_stragglers_die_when_the_main_process_exits(runner: Runner, tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    runner.start("p", ["sh", "-c", f"sleep 300 & echo $! > {pids}"], env=ENV)
    record = runner.wait("p", 10)
    assert record.phase is PodPhase.SUCCEEDED
    wait_for(lambda: not alive(int(pids.read_text())))


def test_logs_stream_while_the_pod_runs(runner: Runner, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    script = f"echo first; while [ ! -e {gate} ]; do sleep 0.02; done; echo second"
    runner.start("p", ["sh", "-c", script], env=ENV)
    chunk = wait_for(lambda: (c := runner.read_log("p")).text and c)
    assert chunk.text == "first\n" and not chunk.finished
    assert runner.get("p").phase is PodPhase.RUNNING
    gate.touch()
    rest = "".join(runner.follow_log("p", offset=chunk.next_offset, timeout_s=10))
    assert rest == "second\n"
    assert runner.read_log("p", offset=chunk.next_offset).finished


def test_restart_readopts_running_pods_and_keeps_finished_ones(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    first = Runner(tmp_path)
    first.start("done", ["sh", "-c", "exit 4"], env=ENV)
    first.wait("done", 10)
    first.start("running", ["sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.02; done; exit 5"], env=ENV)
    first.close()  # the agent goes away; its pods do not

    second = Runner(tmp_path)
    try:
        records = {r.pod_id: r for r in second.poll()}
        assert set(records) == {"done", "running"}
        assert (records["done"].phase, records["done"].exit_code) == (PodPhase.FAILED, 4)
        assert records["running"].phase is PodPhase.RUNNING and records["running"].adopted
        gate.touch()
        record = second.wait("running", 10)
        assert (record.phase, record.exit_code) == (PodPhase.FAILED, 5)
    finally:
        second.close(stop_pods=True, grace_s=0.5)


def test_restart_can_stop_an_adopted_pod(tmp_path: Path) -> None:
    first = Runner(tmp_path)
    first.start("p", ["sleep", "300"], env=ENV)
    first.close()
    second = Runner(tmp_path)
    second.stop("p", grace_s=5)
    record = second.wait("p", 10)
    assert (record.phase, record.exit_code) == (PodPhase.STOPPED, 143)


def test_restart_reports_reused_pid_and_vanished_process_as_lost(tmp_path: Path) -> None:
    first = Runner(tmp_path)
    first.start("reused", ["sleep", "300"], env=ENV)
    first.start("gone", ["sleep", "300"], env=ENV)
    first.close()
    reused = podstate.load_record(tmp_path / "pods" / "reused" / "state.json")
    assert isinstance(reused, podstate.PodRecord) and reused.start_ticks is not None
    reused.start_ticks += 1  # as if the pid now belonged to a process started later
    podstate.save_record(tmp_path / "pods" / "reused" / "state.json", reused)
    gone = podstate.load_record(tmp_path / "pods" / "gone" / "state.json")
    assert isinstance(gone, podstate.PodRecord) and gone.pid is not None
    os.killpg(gone.pid, signal.SIGKILL)
    wait_for(lambda: not alive(gone.pid))  # type: ignore[arg-type]
    (tmp_path / "pods" / "broken").mkdir()
    (tmp_path / "pods" / "broken" / "state.json").write_text("{not json")

    second = Runner(tmp_path)
    try:
        records = {r.pod_id: r for r in second.poll()}
        assert records["reused"].phase is PodPhase.LOST and "another process" in records["reused"].message
        assert records["gone"].phase is PodPhase.LOST and "left no exit status" in records["gone"].message
        assert records["broken"].phase is PodPhase.LOST and "corrupt" in records["broken"].message
    finally:
        os.killpg(reused.pid, signal.SIGKILL)  # type: ignore[arg-type]
        second.close()


def test_state_file_is_valid_json_after_every_step(runner: Runner, tmp_path: Path) -> None:
    runner.start("p", ["true"], env=ENV)
    runner.wait("p", 10)
    loaded = podstate.load_record(tmp_path / "pods" / "p" / "state.json")
    assert isinstance(loaded, podstate.PodRecord) and loaded.phase is PodPhase.SUCCEEDED
    assert not list((tmp_path / "pods" / "p").glob("*.tmp"))


def test_a_process_that_left_the_group_with_setsid_dies_with_the_pod(runner: Runner) -> None:
    runner.start("esc", ["sh", "-c", "setsid sh -c 'echo $$; exec sleep 60' & sleep 60"], env=ENV)
    escaped = int(wait_for(lambda: runner.read_log("esc").text.strip()))
    assert os.getsid(escaped) == escaped != os.getsid(runner.get("esc").pid or 0)  # its own session
    runner.stop("esc", grace_s=0.5)
    record = runner.wait("esc", 10)
    assert record.phase is PodPhase.STOPPED
    wait_for(lambda: not alive(escaped))


def test_a_daemon_left_behind_by_a_finished_pod_is_killed(runner: Runner, tmp_path: Path) -> None:
    # the pod ends once its daemon has left the group and said its pid (a pause of 0.3 s was not
    # always enough on a loaded machine: the pod's end then took the daemon along before it escaped)
    daemon = "setsid sh -c 'echo $$; touch \"$READY\"; exec sleep 60' & "
    runner.start("daemon", ["sh", "-c", daemon + 'while [ ! -e "$READY" ]; do sleep 0.01; done'],
                 env={**ENV, "READY": str(tmp_path / "daemon-ready")})
    escaped = int(wait_for(lambda: runner.read_log("daemon").text.strip()))
    assert runner.wait("daemon", 10).phase is PodPhase.SUCCEEDED
    def gone() -> bool:
        # polled, as the agent's loop polls: a pod reaped within SWEEP_INTERVAL_S of the last sweep
        # has its leftovers killed by the next poll (a loaded run that never polled again failed)
        runner.poll()
        return not alive(escaped)

    wait_for(gone)


def test_combined_output_keeps_the_order_written(runner: Runner) -> None:
    script = "for i in 1 2 3; do echo out$i; echo err$i >&2; done"
    runner.start("both", ["sh", "-c", script], env=ENV, combined_output=True)
    assert runner.wait("both", 10).phase is PodPhase.SUCCEEDED
    assert runner.read_log("both").text == "out1\nerr1\nout2\nerr2\nout3\nerr3\n"
    with pytest.raises(InvalidInput, match="separate-stderr"):
        runner.read_log("both", "stderr")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


TERM_LOGGER = """
import signal, sys, time
name, seen = sys.argv[1], sys.argv[2]
def on_term(*_):
    with open(seen, 'a') as out:
        out.write(name + '\\n')
signal.signal(signal.SIGTERM, on_term)
print(name, 'ready', flush=True)
while True:
    time.sleep(1)
"""


def test_stop_terms_the_whole_group_then_kills_it_only_once_the_grace_is_over(tmp_path: Path) -> None:
    """The grace period is the one stop() was given, on the runner's clock: a pod (and a child in its
    group) that survive SIGTERM are still running until then, and SIGKILLed after."""
    clock = Clock()
    runner = Runner(tmp_path, clock=clock)
    seen = tmp_path / "terms"
    script = '"$PY" -c "$CODE" child "$SEEN" & exec "$PY" -c "$CODE" main "$SEEN"'
    try:
        runner.start("p", ["sh", "-c", script],
                     env={**ENV, "PY": sys.executable, "CODE": TERM_LOGGER, "SEEN": str(seen)})
        wait_for(lambda: {"main ready", "child ready"} <= set(runner.read_log("p").text.splitlines()))
        runner.stop("p", grace_s=60.0)
        wait_for(lambda: seen.exists() and sorted(seen.read_text().split()) == ["child", "main"])
        record = runner.get("p")
        assert record.phase is PodPhase.RUNNING  # it ignored SIGTERM, and the grace is not over
        assert (record.stop_requested_at_s, record.kill_deadline_s) == (1000.0, 1060.0)
        clock.now = 1059.5
        assert runner.get("p").phase is PodPhase.RUNNING
        clock.now = 1060.0
        record = runner.wait("p", 10)
        assert (record.phase, record.exit_code, record.signal) == (PodPhase.STOPPED, 137, signal.SIGKILL)
        assert sorted(seen.read_text().split()) == ["child", "main"]  # one SIGTERM each, nothing more
    finally:
        runner.close(stop_pods=True, grace_s=0.5)


def test_restart_removes_a_pod_directory_whose_start_was_cut_before_its_record(tmp_path: Path) -> None:
    """A crash between `start` making a pod's directory and saving its record leaves a directory
    nobody knows of and where nothing ran: the next agent removes it (its pod is placed again under
    a new attempt, so it would otherwise be a second directory for one workload)."""
    first = Runner(tmp_path)
    first.start("kept", ["sh", "-c", "exit 0"], env=ENV)
    first.wait("kept", 10)
    cut = tmp_path / "pods" / "cut"
    cut.mkdir(mode=0o700)
    (cut / "state.json.tmp").write_text("{")  # an interrupted atomic write
    again = Runner(tmp_path)
    assert not cut.exists()
    assert again.get("kept").phase is PodPhase.SUCCEEDED
    with pytest.raises(NotFound):
        again.get("cut")


def test_two_agents_on_one_host_never_sweep_each_others_pods(tmp_path: Path) -> None:
    """Two agents here (two pools on one machine, or simulated nodes) each run a pod named alike
    as the same account: ending one agent's pod sweeps its leftovers and only its own."""
    first, second = Runner(tmp_path / "first"), Runner(tmp_path / "second")
    assert first.mark != second.mark and Runner(tmp_path / "first").mark == first.mark  # kept across restarts
    go = tmp_path / "go"
    wait_go = f"while [ ! -e {go} ]; do sleep 0.02; done"
    try:
        first.start("twin", ["sh", "-c", "setsid sh -c 'echo $$; exec sleep 60' & sleep 60"], env=ENV)
        second.start("twin", ["sh", "-c", f"setsid sh -c '{wait_go}; echo escaped-alive' & {wait_go}; wait; "
                              "echo main-alive"], env=ENV)
        escaped = int(wait_for(lambda: first.read_log("twin").text.strip()))
        first.stop("twin", grace_s=0.5)
        assert first.wait("twin", 10).phase is PodPhase.STOPPED
        # its sweep has run once its own leftover is gone: one pass over /proc SIGKILLs every
        # process it finds marked, so a wrongly marked process of the second agent's pod is killed
        # before the test can see this one gone and let the second pod go on (an exit listener is
        # no signal here: it fires only when the reaper thread, not `wait`, reaps the pod)
        wait_for(lambda: not alive(escaped))
        go.touch()  # the second agent's pod and its escapee, untouched, go on and end by themselves
        record = second.wait("twin", 10)
        assert (record.phase, record.exit_code) == (PodPhase.SUCCEEDED, 0), record.message
        assert sorted(second.read_log("twin").text.split()) == ["escaped-alive", "main-alive"]
    finally:
        first.close(stop_pods=True, grace_s=0.5)
        second.close(stop_pods=True, grace_s=0.5)


def test_two_writers_of_one_state_file_never_take_each_others_file(tmp_path: Path) -> None:
    # Two agents over one node directory (a deposed leader's and the new one's) may both reap an
    # adopted pod and write its state file at once; here two processes do, 300 times each.
    path = tmp_path / "state.json"
    texts = ['{"writer": "a", "pad": "' + "a" * 4000 + '"}', '{"writer": "b", "pad": "' + "b" * 9000 + '"}']
    children = []
    for text in texts:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 0
            try:
                for _ in range(300):
                    podstate.write_atomic(path, text)
            except BaseException:
                code = 1
            os._exit(code)
        children.append(pid)
    seen: set[str] = set()
    codes: dict[int, int] = {}
    while len(codes) < len(children):
        if path.exists():
            seen.add(path.read_text())  # never torn, never empty: one writer's whole text
        for pid in children:
            if pid not in codes and (done := os.waitpid(pid, os.WNOHANG))[0] == pid:
                codes[pid] = os.waitstatus_to_exitcode(done[1])
    assert list(codes.values()) == [0, 0]
    assert seen <= set(texts)
    assert not [p.name for p in tmp_path.iterdir() if p.name != "state.json"]  # no temporary left
