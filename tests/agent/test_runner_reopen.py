"""A runner opened again over a node's directory (a restart, a new leader's takeover) reads back
only what is not settled: finished pods the server acknowledged (`forget`) stay on disk, known by
id, but are not read until asked for, so the cost of opening follows the live pods, not history."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from gpupool.agent import podstate
from gpupool.agent.podstate import PodRecord
from gpupool.agent.runner import Runner, read_pod_log
from gpupool.errors import NotFound
from gpupool.pods import PodPhase

ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}


def _finished(runner: Runner, pod_id: str) -> None:
    deadline = time.monotonic() + 20
    while not runner.get(pod_id).finished:
        assert time.monotonic() < deadline, f"{pod_id} did not end"
        time.sleep(0.02)


def test_acknowledged_pods_are_not_read_back_but_stay_known(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    marker = tmp_path / "runs"
    first = Runner(tmp_path)
    try:
        first.start("acked", ["sh", "-c", f"echo run >> {marker}; echo out"], env=ENV)
        first.start("unacked", ["true"], env=ENV)
        _finished(first, "acked")
        _finished(first, "unacked")
        first.forget(["acked"])
    finally:
        first.close()

    loads: list[str] = []
    load = podstate.load_record

    def counted(path: Path):  # type: ignore[no-untyped-def]
        loads.append(path.parent.name)
        return load(path)

    monkeypatch.setattr(podstate, "load_record", counted)
    second = Runner(tmp_path)
    try:
        assert loads == ["unacked"]  # the acknowledged pod's record was not read at the opening
        assert [r.pod_id for r in second.poll()] == ["unacked"]
        record = second.known("acked")  # still known by id: read when asked for
        assert record is not None and record.phase is PodPhase.SUCCEEDED
        assert second.read_log("acked").text == "out\n"
        second.start("acked", ["sh", "-c", f"echo run >> {marker}"], env=ENV)  # idempotent: not run again
        second.stop("acked")
        assert marker.read_text() == "run\n"
        assert [r.pod_id for r in second.poll()] == ["unacked"]
    finally:
        second.close()


def test_another_process_reads_a_pods_log_without_taking_the_pod_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`read_pod_log` (a Ray node's agent reading an actor-carried pod's log) asked while the pod's
    runner starts it, its record saved and its process not yet started: the record stays as that
    runner wrote it (a Runner opened there would end it LOST) and the log is not finished; once the
    pod has ended, it is."""
    runner = Runner(tmp_path)
    state = tmp_path / "pods" / "starting" / "state.json"
    seen: list[object] = []
    spawn = runner._spawn

    def read_first(record: PodRecord, *args: object, **kwargs: object) -> None:
        saved = state.read_text()
        seen.append(read_pod_log(tmp_path, record.pod_id).finished)
        seen.append(state.read_text() == saved)
        spawn(record, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(runner, "_spawn", read_first)
    try:
        runner.start("starting", ["sh", "-c", "echo out"], env=ENV)
        assert seen == [False, True]
        _finished(runner, "starting")
        chunk = read_pod_log(tmp_path, "starting")
        assert (chunk.text, chunk.finished) == ("out\n", True)
        with pytest.raises(NotFound):
            read_pod_log(tmp_path, "never-started")
    finally:
        runner.close()
