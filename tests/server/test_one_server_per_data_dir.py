"""One `gpupool up` on a data directory, unless every server on it runs with --ha: a second one was
started, its node agent adopted the first's running pods (an 'adopted' event on them) and its
scheduler, placing over the first's, failed every cycle."""

from __future__ import annotations

from pathlib import Path

from upproc import UpProcess, cli, until

from ports import free_port


def test_a_second_server_on_a_running_pools_data_dir_is_refused_before_it_touches_anything(
        tmp_path: Path) -> None:
    server = UpProcess(tmp_path / "pool", ["--simulate", "1x2xH100"]).start()
    try:
        with server.client() as api:
            answer = api.post("/workloads", json={"command": ["sleep", "300"], "resources": {"gpus": 1}})
            assert answer.status_code == 201, answer.text
            workload_id = answer.json()["id"]
            until(lambda: api.get(f"/workloads/{workload_id}").json()["status"] == "running", 60, "running")
            agents = server.data_dir / "agents"
            for data_dir, flags, taken in ((server.data_dir, [], f"'{server.data_dir}' (--data-dir)"),
                                           (tmp_path / "other", ["--agent-dir", str(agents)],
                                            f"'{agents}' (--agent-dir)")):  # its pods' records only
                second = cli(["up", "--data-dir", str(data_dir), "--port", str(free_port()), *flags], {})
                assert second.returncode == 2, second.stdout + second.stderr
                assert f"A gpupool server already runs on {taken}" in second.stderr
                assert "--ha" in second.stderr and "Traceback" not in second.stderr
                assert "re-adopted" not in second.stdout + second.stderr  # refused before its agent opened
            events = api.get(f"/workloads/{workload_id}/events").json()
            assert [e["reason"] for e in events if "adopt" in e["reason"]] == []
            assert api.get(f"/workloads/{workload_id}").json()["status"] == "running"
        server.end_work()  # its pod is a sleep 300
    finally:
        server.stop()  # (started again after it stopped, a server takes the lock: test_crash_restart.py)
