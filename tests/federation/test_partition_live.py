"""A member cut off from its hub (both up, the link between them gone) never runs a copy the hub has
started elsewhere: past its federation.fence without a call from the hub it stops and holds the
hub's work, before the hub's requeue grace ends and the hub places it on another member; when the
link is back the hub cancels the stale copy. The link is cut with a firewall rule on loopback that
rejects the hub's connections to the member (the hub connects from 127.0.0.1, the test from
127.0.0.3), so both stay up."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest

from gpupool.client import Client
from gpupool.federation.loopback import UNCUT, Federation, Proc, copies, cut_link, start_federation, until
from ports import free_port
from server.upproc import spawn_gpupool

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0 or shutil.which("iptables") is None,
                                 reason="cutting the hub's link needs root and iptables")]
LONG = {"GPUPOOL_FAKE_DURATION_S": "3600"}


@pytest.fixture(scope="module")
def fed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Federation]:
    # members fence after 4 s of silence; the hub moves work it last saw pending 4 + 2 s after the last
    # call that may have reached the member, and running work 2 + 5 s after: margins of 2 and 3 s for
    # a member's loop that a loaded machine holds up
    federation = start_federation(tmp_path_factory.mktemp("fedcut"), ("east", "west"), down_after_s=2.0,
                                  grace_s=5.0, poll_s=0.2, fence_s=4.0, free_port=free_port,
                                  spawn=spawn_gpupool)
    yield federation
    federation.stop()


def _copy(proc: Proc, member_id: str) -> dict[str, Any]:
    with proc.admin(UNCUT) as api:  # past the rule that cuts the hub off
        answer = api.get(f"/workloads/{member_id}")
    assert answer.status_code == 200, f"{proc.name}: {answer.status_code} for {member_id}: {answer.text}"
    return dict(answer.json())


def _events(proc: Proc, member_id: str) -> list[dict[str, Any]]:
    with proc.admin(UNCUT) as api:
        return list(api.get(f"/workloads/{member_id}/events").json())


def test_a_member_cut_off_from_its_hub_stops_the_copy_before_it_runs_elsewhere(fed: Federation) -> None:
    assert fed.hub is not None
    east, west = fed.member("east"), fed.member("west")
    with Client(fed.hub.url, fed.alice_token) as pool, fed.hub_api() as api:
        workload_id = pool.submit(command=["train"], gpus=1, env=LONG)
        until(lambda: pool.workload(workload_id).status == "running", 30, "running on east")
        east_id = api.get(f"/federation/workloads/{workload_id}").json()["member_id"]
        cut_link(east.port, True)
        try:
            record = until(lambda: (r := api.get(f"/federation/workloads/{workload_id}").json())["member"]
                           == "west" and r["status"] == "running" and r, 30, "moved to west and running")
            fenced = _copy(east, east_id)
            assert (fenced["status"], fenced["held"]) == ("pending", "user"), fenced  # stopped, held
            stopped_s = min(e["at_s"] for e in _events(east, east_id) if e["reason"] == "federation_fenced")
            started_west = _copy(west, record["member_id"])["started_s"]
            assert stopped_s < started_west  # east had stopped it before west started it
        finally:
            cut_link(east.port, False)
        until(lambda: _copy(east, east_id)["status"] == "cancelled", 30, "the stale copy cancelled on east")
        assert _copy(east, east_id)["attempt"] == 1  # never started again there
        assert pool.workload(workload_id).status == "running"


def test_work_the_hub_last_saw_pending_is_not_moved_before_the_member_fences(fed: Federation) -> None:
    """The hub's record is a poll old: work it saw pending may start on the member just as the link
    goes. It is moved only once the member's fence has held or stopped it. (The member's admin holds
    the copy until the link is cut and releases it after, so it starts there unseen by the hub.)"""
    assert fed.hub is not None
    east, west = fed.member("east"), fed.member("west")
    one_gpu = {"command": ["x"], "resources": {"gpus": 1}, "env": LONG}
    with fed.hub_api() as api, east.admin(UNCUT) as admin:
        big = api.post("/workloads", json={**one_gpu, "resources": {"gpus": 4}}).json()["id"]
        until(lambda: api.get(f"/workloads/{big}").json()["status"] == "running", 30, "a blocker on east")
        small = api.post("/workloads", json=one_gpu).json()["id"]
        member_id = until(lambda: copies(east, source=UNCUT).get(small), 30, "placed on east")[0]["id"]
        admin.post(f"/workloads/{member_id}/hold").raise_for_status()  # the admin's: the hub leaves it
        api.post(f"/workloads/{big}/cancel").raise_for_status()
        until(lambda: big not in copies(east, source=UNCUT), 30, "room on east")
        assert api.get(f"/federation/workloads/{small}").json()["status"] == "pending"
        cut_link(east.port, True)
        try:
            admin.post(f"/workloads/{member_id}/release").raise_for_status()
            until(lambda: _copy(east, member_id)["status"] == "running", 30, "started on east")
            moved = until(lambda: (r := api.get(f"/federation/workloads/{small}").json())["member"] == "west"
                          and r["status"] == "running" and r, 30, "moved to west and running")
            fenced = [e["at_s"] for e in _events(east, member_id) if e["reason"] == "federation_fenced"]
            assert fenced, "moved and running on west while east had not fenced its running copy"
            assert min(fenced) < _copy(west, moved["member_id"])["started_s"]
        finally:
            cut_link(east.port, False)
        api.post(f"/workloads/{small}/cancel")


def test_the_hub_refuses_a_grace_shorter_than_a_members_fence(fed: Federation, tmp_path: Any) -> None:
    from gpupool.federation.config import load_federation
    from gpupool.federation.hub import Hub
    from gpupool.server.db import Store

    text = (fed.root / "fed.yaml").read_text().replace("requeue_grace_s: 5.0", "requeue_grace_s: 1.0")
    (fed.root / "short.yaml").write_text(text)
    store = Store.open(f"sqlite:///{tmp_path / 'hub.sqlite'}")
    try:
        hub = Hub(store, load_federation(fed.root / "short.yaml"))
        with pytest.raises(Exception, match=r"requeue_grace_s \(1 s\) must be longer than each member's "
                                            r"federation.fence.*east fences after 4 s"):
            hub.first_poll()
    finally:
        store.close()
