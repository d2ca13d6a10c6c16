"""Faults against real components: kill -9 during a submission flood, the store's disk full, pods
that resist cancel, the agent killed while pods run (scenarios in fault_scenarios.py; bench/faults.py
runs them full size and prints the table of docs/experiments/reliability.md "Faults")."""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from fault_scenarios import (
    agent_killed_while_pods_run,
    cancel_resisting_pod,
    disk_full,
    kill9_during_submissions,
    mount_tmpfs,
    umount,
)
from sqlalchemy import event
from upproc import UpProcess

from conftest import Server
from gpupool.server.db import Store

FORKS = 1000


# ---- the store refuses writes: in process, any user ---------------------------------------------

@pytest.fixture
def read_only_store(server: Server) -> Iterator[list[bool]]:
    """While the flag holds True, every statement that writes fails as SQLite's does on a read-only file."""
    failing = [False]

    def refuse(_conn: object, _cursor: object, statement: str, *_: object) -> None:
        if failing[0] and statement.lstrip().split(None, 1)[0].upper() in ("INSERT", "UPDATE", "DELETE"):
            raise sqlite3.OperationalError("attempt to write a readonly database")

    event.listen(server.rt.store.engine, "before_cursor_execute", refuse)
    yield failing
    event.remove(server.rt.store.engine, "before_cursor_execute", refuse)


def test_a_read_only_store_answers_503_logs_once_and_recovers(server: Server, read_only_store: list[bool],
                                                              caplog: pytest.LogCaptureFixture) -> None:
    spec = {"command": ["true"]}
    first = server.client.post("/api/v1/workloads", json=spec, headers=server.headers())
    assert first.status_code == 201
    read_only_store[0] = True
    with caplog.at_level(logging.INFO):
        answers = [server.client.post("/api/v1/workloads", json=spec, headers=server.headers())
                   for _ in range(5)]
        answers.append(server.client.post("/api/v1/tenants", json={"name": "t1"}, headers=server.headers()))
        assert {a.status_code for a in answers} == {503}
        body = answers[0].json()
        assert body["code"] == "store_unavailable" and set(body) == {"code", "message", "details"}
        assert "read-only" in body["message"] and body["message"].count(". ") == 0
        one = server.client.get(f"/api/v1/workloads/{first.json()['id']}", headers=server.headers())
        assert one.status_code == 200
        assert server.client.get("/api/v1/workloads", headers=server.headers()).json()["total"] == 1
        read_only_store[0] = False
        again = server.client.post("/api/v1/workloads", json=spec, headers=server.headers())
        assert again.status_code == 201
    store_lines = [r for r in caplog.records if r.name == "gpupool.store"]
    assert [r.levelname for r in store_lines] == ["ERROR", "WARNING"]  # failed once, works again
    assert "readonly" in store_lines[0].getMessage()
    # No traceback from the request path (the control loop's own retry log is its owner's: see the docs).
    assert not any(r.exc_info for r in caplog.records if r.name != "gpupool.loop")


def test_store_errors_by_cause(tmp_path: Path) -> None:
    from gpupool.server.db import store_unavailable

    assert "out of disk space" in store_unavailable("database or disk is full").message
    assert "out of disk space" in store_unavailable("could not extend file: No space left on device").message
    assert "read-only" in store_unavailable("attempt to write a readonly database").message
    assert "cannot be used" in store_unavailable("server closed the connection unexpectedly").message
    assert Store  # the class that raises them


# ---- the store's disk full: a real server on a tmpfs ------------------------------------------

@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs for the store needs root")
    where = tmp_path / "disk"
    try:
        mount_tmpfs(where, size_mib=8)
    except Exception as exc:
        pytest.skip(f"cannot mount a tmpfs here ({exc})")
    yield where
    umount(where)


@pytest.mark.slow
def test_disk_full_answers_503_keeps_reads_and_recovers(tmp_path: Path, small_disk: Path) -> None:
    seen = disk_full(tmp_path, small_disk, {"XDG_CONFIG_HOME": str(tmp_path / "no-config")})
    assert seen.submit_status == 503, seen
    assert seen.submit_body["code"] == "store_unavailable"
    assert "out of disk space" in str(seen.submit_body["message"])
    assert seen.route_write_status == 503
    assert seen.cli_exit == 4 and seen.cli_stderr.count("\n") == 1 and "out of disk space" in seen.cli_stderr
    assert seen.read_statuses == [200, 200, 200]
    assert seen.failure_log_lines == 1 and seen.tracebacks == 0
    assert seen.recovered_status == 201 and seen.recovery_log_lines == 1
    assert seen.integrity == "ok"
    assert seen.stored == seen.expected_stored  # every acknowledged submission, nothing else


# ---- kill -9 during a flood of submissions ------------------------------------------------------

@pytest.mark.slow
def test_kill_9_during_1000_submissions_loses_none_acknowledged_and_starts_none_twice(tmp_path: Path) -> None:
    seen = kill9_during_submissions(tmp_path, 1000)
    assert 0 < len(seen.acknowledged) < seen.submitted and seen.cut > 0  # the kill landed mid-flood
    assert seen.refused == 0
    assert seen.missing_after_restart == []
    assert seen.stored_after_restart >= len(seen.acknowledged)
    assert set(seen.statuses) <= {"succeeded", "failed"}
    # no workload's process ran twice, and none was set up twice
    assert seen.most_launches == 1 and seen.most_started_pods == 1 and seen.most_started_lines == 1
    assert seen.most_pod_dirs == 1


# ---- pods that resist cancel -------------------------------------------------------------------

@pytest.fixture(scope="module")
def local_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    server = UpProcess(tmp_path_factory.mktemp("resist") / "data", ["--simulate", "1x2xH100"])
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.mark.slow
def test_cancel_stops_a_pod_that_forks_a_thousand_children_and_ignores_sigterm(local_server: UpProcess
                                                                               ) -> None:
    script = (f"trap '' TERM; i=0; while [ $i -lt {FORKS} ]; do sleep 120 & i=$((i+1)); done; "
              "(sleep 120 &) ; wait")  # and one orphan, re-parented away from the pod
    seen = cancel_resisting_pod(local_server, script, expect_processes=FORKS + 2)
    assert seen.peak_processes >= FORKS + 2
    assert seen.status == "cancelled"
    assert seen.left == []


def test_cancel_stops_a_child_that_left_the_process_group_with_setsid(local_server: UpProcess) -> None:
    if shutil.which("setsid") is None:
        pytest.skip("setsid (util-linux) is not installed")
    seen = cancel_resisting_pod(local_server, "setsid sleep 120 & exec sleep 120", expect_processes=3)
    assert seen.status == "cancelled"
    assert seen.left == []  # the runner kills what left the group too (its cgroup, or its marker)


# ---- the agent killed while pods run -----------------------------------------------------------

@pytest.mark.slow
def test_pods_survive_the_agent_are_re_adopted_and_finish_once(tmp_path: Path) -> None:
    seen = agent_killed_while_pods_run(tmp_path, pods=3)
    assert seen.survived_kill == 3
    assert seen.adopted == 3
    assert seen.same_processes
    assert seen.statuses == ["succeeded"] * 3
    assert seen.most_launches == 1 and seen.most_started_lines == 1
