"""A federation of two members whose pods are real processes (one for the module): remote functions
through the hub run on a member and only their tenant reads their calls; work moved off a dead member
resumes from its last checkpoint on another (the hub fetched it while the member was up, the next copy
starts with its files: 1.5 MB of them, past the pools' 1 MiB bound on other request bodies), and the
dead member's copy never runs again when it returns."""

from __future__ import annotations

import os
import re
import signal
import sys
from collections.abc import Iterator

import pytest

import gpupool
from gpupool.client import Client
from gpupool.errors import NotFound
from gpupool.federation.loopback import Federation, copies, start_federation, until
from ports import free_port
from server.upproc import spawn_gpupool

pytestmark = pytest.mark.slow

WORK = r"""
import os, pathlib, sys, time
d = pathlib.Path(os.environ["GPUPOOL_CHECKPOINT_DIR"])
if (d / "state").exists():
    print("resumed from", (d / "state").read_text(), len((d / "sub" / "weights").read_bytes()), flush=True)
    sys.exit(0)
print("pid", os.getpid(), flush=True)
(d / "sub").mkdir()
(d / "sub" / "weights").write_bytes(b"w" * 1_500_000)
(d / "state").write_text("step-41")
(d / ".checkpoint").touch()
time.sleep(3600)
"""


@pytest.fixture(scope="module")
def fed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Federation]:
    federation = start_federation(tmp_path_factory.mktemp("fedck"), ("east", "west"), provider="local",
                                  simulate="1x2xH100", down_after_s=1.0, grace_s=1.0, poll_s=0.2,
                                  free_port=free_port,
                                  spawn=spawn_gpupool)
    yield federation
    federation.stop()


def _logs(pool: Client, workload_id: str) -> str:
    try:
        return pool.logs(workload_id).text
    except NotFound:  # no pod of it started yet
        return ""


PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"


def square(x: int) -> int:
    return x * x


def test_remote_functions_through_the_hub_run_on_a_member_for_their_tenant_only(fed: Federation) -> None:
    assert fed.hub is not None
    with gpupool.connect(fed.hub.url, fed.alice_token) as pool:
        future = pool.function(square, gpus=1).remote(7)
        assert future.result(timeout=120) == 49
        with pool.session(gpus=1) as session:
            assert session.call(square, 5) == 25
            assert [f.result(timeout=120) for f in [session.submit(square, n) for n in (2, 3)]] == [4, 9]
            opened = session.id
        assert pool.client.request("GET", f"/calls/{future.id}")["status"] == "succeeded"
    with fed.hub.admin() as admin:
        assert admin.post("/tenants", json={"name": "mallory"}).status_code == 201
        mallory = admin.post("/tokens", json={"tenant": "mallory", "name": "m"}).json()["token"]
    for member in fed.members:  # she has no tenant there: the hub must never reach her work there
        with member.admin() as api:
            api.post("/tenants", json={"name": "mallory"})
    with fed.hub_api(mallory) as api:  # alice's call and session read as unknown; nothing forwarded
        assert api.get(f"/calls/{future.id}").status_code == 404
        assert api.post(f"/calls/{future.id}/cancel").status_code == 404
        assert api.get(f"/calls/sessions/{opened}").status_code == 404
        assert api.post(f"/calls/sessions/{opened}/calls", json={"payload": "AA=="}).status_code == 404
        own = api.post("/calls/sessions", json={"python": PYTHON, "resources": {"gpus": 1}}).json()["id"]
        forged = f"{own}.{future.id.split('.', 1)[1]}"  # her session, alice's call id on the member
        assert api.get(f"/calls/{forged}").status_code == 404
        api.post(f"/calls/sessions/{own}/close")


def test_work_moved_off_a_dead_member_resumes_from_its_checkpoint(fed: Federation) -> None:
    assert fed.hub is not None
    east = fed.member("east")
    with Client(fed.hub.url, fed.alice_token) as pool, fed.hub_api() as api:
        workload_id = pool.submit(command=["python3", "-c", WORK], gpus=1, checkpoint_every=60)
        pid = int(until(lambda: re.search(r"pid (\d+)", _logs(pool, workload_id)), 60,
                        "running on east").group(1))
        record = until(lambda: (r := api.get(f"/federation/workloads/{workload_id}").json())["checkpoint_s"]
                       and r, 30, "the hub fetched its checkpoint")
        assert record["member"] == "east"
        east_id = record["member_id"]
        east.kill()  # the machine dies: its server and its pod
        os.kill(pid, signal.SIGKILL)
        until(lambda: pool.workload(workload_id).status == "succeeded", 60, "resumed and done on west")
        assert api.get(f"/federation/workloads/{workload_id}").json()["member"] == "west"
        assert "resumed from step-41 1500000" in _logs(pool, workload_id)
        moved = [e.message for e in pool.events(workload_id) if e.reason == "federation_moved"]
        assert moved and "from its checkpoint of" in moved[0]
        placed = [e.message for e in pool.events(workload_id) if e.reason == "federation_placed"]
        assert "resumes from its checkpoint" in placed[-1]
    east.start()  # it comes back: its copy is the hub's stale one, cancelled before it runs again
    east.wait_up()
    until(lambda: workload_id not in copies(east), 30, "the stale copy cancelled on east")
    with east.admin() as admin:
        copy = admin.get(f"/workloads/{east_id}").json()
    # its pod died with the machine (failed) or it was cancelled as stale: never started again there
    assert copy["status"] in ("failed", "cancelled") and copy["attempt"] == 1, copy
    with fed.hub_api() as api:
        record = api.get(f"/federation/workloads/{workload_id}").json()
    assert (record["member"], record["status"]) == ("west", "succeeded")
