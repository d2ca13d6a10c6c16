"""A member cut off from its hub (both up, the link between them gone) never runs a copy the hub has
started elsewhere: past its federation.fence without a call from the hub it stops and holds the
hub's work, before the hub's requeue grace ends and the hub places it on another member; when the
link is back the hub cancels the stale copy. The link is cut with a firewall rule on loopback that
rejects the hub's connections to the member (the hub connects from 127.0.0.1, the test from
127.0.0.3), so both stay up."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gpupool.client import Client
from gpupool.federation.loopback import Federation, Proc, start_federation, until

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0 or shutil.which("iptables") is None,
                                 reason="cutting the hub's link needs root and iptables")]
LONG = {"GPUPOOL_FAKE_DURATION_S": "3600"}


@pytest.fixture(scope="module")
def fed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Federation]:
    federation = start_federation(tmp_path_factory.mktemp("fedcut"), ("east", "west"), down_after_s=1.0,
                                  grace_s=3.0, poll_s=0.2, fence_s=1.5)
    yield federation
    federation.stop()


def _admin(proc: Proc) -> httpx.Client:
    """The member's admin API from 127.0.0.3: past the rule that cuts the hub off."""
    token = (proc.data_dir / "admin-token").read_text().strip()
    return httpx.Client(base_url=proc.url + "/api/v1", headers={"Authorization": f"Bearer {token}"},
                        timeout=10, transport=httpx.HTTPTransport(local_address="127.0.0.3"))


def _copy(proc: Proc, member_id: str) -> dict[str, Any]:
    with _admin(proc) as api:
        return dict(api.get(f"/workloads/{member_id}").json())


def _events(proc: Proc, member_id: str) -> list[dict[str, Any]]:
    with _admin(proc) as api:
        return list(api.get(f"/workloads/{member_id}/events").json())


def _rule(action: str, port: int) -> None:
    subprocess.run(["iptables", action, "INPUT", "-p", "tcp", "-s", "127.0.0.1", "-d", "127.0.0.1",
                    "--dport", str(port), "-j", "REJECT", "--reject-with", "tcp-reset"], check=True)


def test_a_member_cut_off_from_its_hub_stops_the_copy_before_it_runs_elsewhere(fed: Federation) -> None:
    assert fed.hub is not None
    east, west = fed.member("east"), fed.member("west")
    with Client(fed.hub.url, fed.alice_token) as pool, fed.hub_api() as api:
        workload_id = pool.submit(command=["train"], gpus=1, env=LONG)
        until(lambda: pool.workload(workload_id).status == "running", 30, "running on east")
        east_id = api.get(f"/federation/workloads/{workload_id}").json()["member_id"]
        _rule("-I", east.port)
        try:
            record = until(lambda: (r := api.get(f"/federation/workloads/{workload_id}").json())["member"]
                           == "west" and r["status"] == "running" and r, 30, "moved to west and running")
            fenced = _copy(east, east_id)
            assert (fenced["status"], fenced["held"]) == ("pending", "user"), fenced  # stopped, held
            stopped_s = min(e["at_s"] for e in _events(east, east_id) if e["reason"] == "federation_fenced")
            started_west = _copy(west, record["member_id"])["started_s"]
            assert stopped_s < started_west  # east had stopped it before west started it
        finally:
            _rule("-D", east.port)
        until(lambda: _copy(east, east_id)["status"] == "cancelled", 30, "the stale copy cancelled on east")
        assert _copy(east, east_id)["attempt"] == 1  # never started again there
        assert pool.workload(workload_id).status == "running"


def test_the_hub_refuses_a_grace_shorter_than_a_members_fence(fed: Federation, tmp_path: Any) -> None:
    from gpupool.federation.config import load_federation
    from gpupool.federation.hub import Hub
    from gpupool.server.db import Store

    text = (fed.root / "fed.yaml").read_text().replace("requeue_grace_s: 3.0", "requeue_grace_s: 1.0")
    (fed.root / "short.yaml").write_text(text)
    store = Store.open(f"sqlite:///{tmp_path / 'hub.sqlite'}")
    try:
        hub = Hub(store, load_federation(fed.root / "short.yaml"))
        with pytest.raises(Exception, match=r"requeue_grace_s \(1 s\) must be longer than each member's "
                                            r"federation.fence.*east fences after 1.5 s"):
            hub.first_poll()
    finally:
        store.close()
