"""A pod cannot fill the agent's disk with its output: each log is held to the pool's cap."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupool.agent.runner import DEFAULT_MAX_LOG_BYTES, Runner, cap_note
from gpupool.pods import PodLaunch, PodPhase
from gpupool.server.provision import provision
from gpupool.server.settings import DEFAULT_MAX_POD_LOG_BYTES, Settings

ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
CAP = 64 * 1024
FLOOD = "head -c 2000000 /dev/zero | tr '\\0' x"
"""2 MB of output, 30 times the cap."""


@pytest.fixture
def runner(tmp_path: Path) -> Iterator[Runner]:
    r = Runner(tmp_path, max_log_bytes=CAP)
    yield r
    r.close(stop_pods=True, grace_s=0.5)


def _held(runner: Runner, pod_id: str, stream: str = "stdout") -> bytes:
    return runner.log_path(pod_id, stream).read_bytes()


def test_a_pod_that_floods_its_log_keeps_the_cap_and_a_line_saying_so(runner: Runner) -> None:
    runner.start("p", ["sh", "-c", f"{FLOOD}; echo done"], env=ENV, combined_output=True)
    assert runner.wait("p", 30).phase is PodPhase.SUCCEEDED
    held = _held(runner, "p")
    assert len(held) == CAP + len(cap_note(CAP))
    assert held == b"x" * CAP + cap_note(CAP)
    last = runner.read_log("p", offset=CAP).text.strip()
    assert last == "gpupool: this log reached its cap of 65536 bytes; the pod's further output here is " \
                   "dropped (the pool's --max-pod-log)."


def test_the_cap_holds_while_the_pod_runs_and_after_it_writes_again(runner: Runner, tmp_path: Path) -> None:
    gate, flooded = tmp_path / "gate", tmp_path / "flooded"
    script = f"{FLOOD}; touch {flooded}; while [ ! -e {gate} ]; do sleep 0.02; done; {FLOOD}; echo tail"
    runner.start("p", ["sh", "-c", script], env=ENV, combined_output=True)
    for _ in range(3000):
        if flooded.exists():
            break
        runner.wait("p", 0.01)
    assert flooded.exists()
    runner.poll()
    assert runner.get("p").phase is PodPhase.RUNNING
    assert _held(runner, "p") == b"x" * CAP + cap_note(CAP)  # cut while it runs
    gate.touch()
    assert runner.wait("p", 30).phase is PodPhase.SUCCEEDED
    assert _held(runner, "p") == b"x" * CAP + cap_note(CAP)  # what it wrote after the cut is dropped


def test_separate_streams_are_each_held_to_the_cap(runner: Runner) -> None:
    runner.start("p", ["sh", "-c", f"{FLOOD}; {FLOOD} >&2"], env=ENV)
    runner.wait("p", 30)
    for stream in ("stdout", "stderr"):
        assert _held(runner, "p", stream) == b"x" * CAP + cap_note(CAP), stream


def test_a_log_under_the_cap_is_left_alone(runner: Runner) -> None:
    runner.start("p", ["sh", "-c", "echo small"], env=ENV)
    runner.wait("p", 10)
    assert _held(runner, "p") == b"small\n"


def test_the_server_settings_reach_the_agents_and_put_logs_where_asked(tmp_path: Path) -> None:
    assert DEFAULT_MAX_POD_LOG_BYTES == DEFAULT_MAX_LOG_BYTES == 2**30
    logs = tmp_path / "other-filesystem" / "agents"
    settings = Settings(data_dir=tmp_path / "data", simulate="1x1xH100", max_pod_log_bytes=CAP,
                        agent_dir=logs).with_env({})
    provider = provision(settings).provider
    try:
        provider.launch(_launch("p1", provider.nodes()[0].name))
        statuses = []
        for _ in range(3000):
            statuses = [s for s in provider.poll() if s.pod_id == "p1" and s.phase.is_final]
            if statuses:
                break
        assert statuses and statuses[0].phase is PodPhase.SUCCEEDED
        held = [p for p in logs.rglob("stdout.log")]
        assert len(held) == 1 and held[0].read_bytes() == b"x" * CAP + cap_note(CAP)
        assert not (tmp_path / "data" / "agents").exists()
    finally:
        provider.close()


def test_bad_values_are_refused_in_a_sentence() -> None:
    for env, said in (({"GPUPOOL_MAX_POD_LOG": "big"}, "GPUPOOL_MAX_POD_LOG must be a size"),
                      ({"GPUPOOL_MAX_POD_LOG": "10"}, "at least 4096 bytes")):
        with pytest.raises(Exception, match=said):
            Settings().with_env(env)
    assert Settings().with_env({"GPUPOOL_MAX_POD_LOG": "2GiB"}).max_pod_log_bytes == 2 * 2**30
    assert Settings().with_env({"GPUPOOL_AGENT_DIR": "/srv/x"}).resolved_agent_dir == Path("/srv/x")


def _launch(pod_id: str, node_name: str) -> PodLaunch:
    return PodLaunch(pod_id=pod_id, workload_id="w", node=node_name, command=("sh", "-c", FLOOD))


def test_a_pod_writing_through_its_shims_exit_descriptor_is_cut_back(runner: Runner, tmp_path: Path) -> None:
    """The shim runs as the pod's account and holds its exit file open, so the pod can write there
    (through /proc/PPID/fd) without the log cap applying: each poll empties a file larger than a
    record, and the shim's record at the end is read as usual."""
    gate, flooded = tmp_path / "gate", tmp_path / "flooded"
    script = ("for f in /proc/$PPID/fd/*; do case $(readlink \"$f\") in */exit.json) out=$f;; esac; done; "
              f"head -c 2000000 /dev/zero > \"$out\"; touch {flooded}; "
              f"while [ ! -e {gate} ]; do sleep 0.02; done")
    runner.start("p", ["sh", "-c", script], env=ENV, combined_output=True)
    for _ in range(3000):  # not runner.wait: its polls would cut the file before it is read here
        if flooded.exists():
            break
        time.sleep(0.01)
    assert flooded.exists()
    exit_file = runner.pod_dir("p") / "exit.json"
    assert exit_file.stat().st_size == 2_000_000  # the pod did write there
    runner.poll()
    assert runner.get("p").phase is PodPhase.RUNNING
    assert exit_file.stat().st_size == 0  # emptied while it runs
    gate.touch()
    done = runner.wait("p", 30)
    assert done.phase is PodPhase.SUCCEEDED and done.exit_code == 0, done
