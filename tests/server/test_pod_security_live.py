"""The attack the issue names, tried on a real `gpupool up`: a tenant's pod reads the admin token,
the store or the server's environment. It must get none of them; and a limit the node cannot
enforce is said in `gpupool show` and `gpupool nodes ls`."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from upproc import UpProcess, cli, until

pytestmark = pytest.mark.slow
SECRET = "gpupool-live-test-secret-value"


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    base = tmp_path_factory.mktemp("podsec")
    server = UpProcess(base / "data", ["--simulate", "1x4xH100", "--placement", "first-fit"],
                       env={"GPUPOOL_TEST_SERVER_SECRET": SECRET}).start()
    try:
        yield server
    finally:
        server.stop()


def _run(pool: UpProcess, token: str, command: list[str], **extra: object) -> dict[str, object]:
    with httpx.Client(base_url=pool.api, headers={"Authorization": f"Bearer {token}"}, timeout=30) as api:
        answer = api.post("/workloads", json={"command": command, **extra})
        assert answer.status_code == 201, answer.text
        wid = answer.json()["id"]
        until(lambda: api.get(f"/workloads/{wid}").json()["status"] in ("succeeded", "failed"),
              60, f"workload {wid} finishing")
        row = api.get(f"/workloads/{wid}").json()
        out = api.get(f"/workloads/{wid}/logs").json()["text"]  # stdout and stderr, as written
        events = api.get(f"/workloads/{wid}/events").json()
    return {"id": wid, "status": row["status"], "out": out, "events": events}


def _tenant_token(pool: UpProcess, name: str) -> str:
    with pool.client() as api:
        assert api.post("/tenants", json={"name": name}).status_code == 201
        answer = api.post("/tokens", json={"tenant": name, "name": "t"})
        assert answer.status_code == 201, answer.text
        return str(answer.json()["token"])


@pytest.mark.skipif(os.geteuid() != 0, reason="pods run as other accounts only under root")
def test_a_tenant_pod_cannot_read_the_admin_token_store_or_server_env(pool: UpProcess) -> None:
    token = _tenant_token(pool, "mallory")
    data = pool.data_dir
    script = f"cat {data}/admin-token; head -c 16 {data}/gpupool.sqlite; ls {data}; id -un; env"
    stolen = _run(pool, token, ["sh", "-c", script])
    assert pool.token() not in str(stolen["out"])
    assert "SQLite format" not in str(stolen["out"])
    assert "Permission denied" in str(stolen["out"])
    lines = str(stolen["out"]).splitlines()
    pool_id = (data / "pool-id").read_text().strip()
    assert f"gpupool-{pool_id}-mallory" in lines, "its pool account, named for this pool"
    assert SECRET not in str(stolen["out"])
    assert os.stat(data).st_mode & 0o777 == 0o700
    assert os.stat(data / "admin-token").st_mode & 0o777 == 0o600
    assert os.stat(data / "gpupool.sqlite").st_mode & 0o777 == 0o600


def test_a_variable_of_the_server_never_reaches_a_pod(pool: UpProcess) -> None:
    result = _run(pool, pool.token(), ["env"], env={"MINE": "kept"})
    assert result["status"] == "succeeded"
    assert SECRET not in str(result["out"]) and "MINE=kept" in str(result["out"])


def test_unenforced_limits_are_said_in_show_and_nodes_ls(pool: UpProcess, tmp_path: Path) -> None:
    result = _run(pool, pool.token(), ["true"], resources={"gpus": 0.25, "cpu": 1})
    notes = [e["message"] for e in result["events"] if e["reason"] == "limits_unenforced"]  # type: ignore[attr-defined]
    assert notes == []  # a simulated node says it once (node ls), not in every workload's events
    env = {"GPUPOOL_URL": pool.url, "GPUPOOL_TOKEN": pool.token(), "COLUMNS": "250"}
    shown = cli(["show", str(result["id"])], env)
    assert shown.returncode == 0 and "not enforced: device compute and memory limits" in shown.stdout
    listing = cli(["nodes", "ls", "-o", "wide"], env)
    assert listing.returncode == 0, listing.stderr
    for layer in ("accounts", "devices", "device_limits", "host_limits", "proc"):
        assert layer in listing.stdout
