"""A runner opened again over a node's directory (a restart, a new leader's takeover) reads back
only what is not settled: finished pods the server acknowledged (`forget`) stay on disk, known by
id, but are not read until asked for, so the cost of opening follows the live pods, not history."""

from __future__ import annotations

import os
import time
from pathlib import Path

from gpupool.agent import podstate
from gpupool.agent.runner import Runner
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
