"""The live fabric (`gpupool up --fabric FILE`) on a small generated fat tree: GET /api/v1/fabric, a
gang's path and its placement's domain, link failure and repair (routes recomputed, the scheduler's
view updated, gangs cut off requeued, slowed ones told), telemetry and moving off congestion."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from fabric_pool import CONFIG, Pool
from fakes import ManualProvider
from sqlalchemy.orm import Session

from gpupool.pods import PodLaunch
from gpupool.server.services import fabric_links


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[Pool]:
    made = Pool(tmp_path)
    yield made
    made.close()


def _uplink_ids(fabric: dict[str, Any], leaf_port_of: str) -> list[str]:
    """The ids of the switch-to-switch cables at the leaf of the node's first port."""
    leaf = next(n for n in fabric["nodes"] if n["node"] == leaf_port_of)["ports"][0]["leaf"]
    return [lk["id"] for lk in fabric["links"] if lk["kind"] == "switch" and leaf in (lk["a"], lk["b"])]


def test_every_token_reads_the_fabric_a_tenant_only_its_own_gangs_path(pool: Pool) -> None:
    fabric = pool.call("get", "/fabric", token=pool.tenant).json()
    assert [(lv["tier"], lv["switches"]) for lv in fabric["levels"]] == [("leaf", 4), ("spine", 2)]
    assert len(fabric["links"]) == 16 and {lk["kind"] for lk in fabric["links"]} == {"access", "switch"}
    leaves = [n["leaf"] for n in fabric["nodes"]]
    assert len(set(leaves)) == 4 and leaves[0] == leaves[1] != leaves[2]  # node00001-2 share a leaf
    mine = pool.gang(token=pool.tenant)
    theirs = pool.gang(replicas=2)
    path = pool.call("get", f"/fabric?workload={mine}", token=pool.tenant).json()["gang"]
    assert path["domain"] == "spine" and path["hops"] == 4 and path["connected"]
    assert path["bottleneck"] in path["links"] and path["bottleneck_gbps"] > 0
    assert pool.call("get", f"/fabric?workload={theirs}", token=pool.tenant).status_code == 404
    busy = [lk for lk in pool.call("get", "/fabric").json()["links"] if lk["gangs"]]
    assert {lk["id"] for lk in busy} >= set(path["links"])


def test_show_reports_the_placements_domain_hops_and_bottleneck(pool: Pool) -> None:
    wide, narrow = pool.gang(), pool.gang(replicas=2)
    network = pool.detail(wide)["network"]
    assert network["domain"] == "spine" and network["hops"] == 4 and network["connected"]
    assert pool.detail(narrow)["network"]["domain"] == "leaf"  # two whole nodes fit one leaf
    assert pool.detail(narrow)["network"]["hops"] == 2


def test_a_failed_link_reroutes_and_the_view_the_scheduler_uses_follows(pool: Pool) -> None:
    gang = pool.gang()
    before = pool.call("get", f"/fabric?workload={gang}").json()["gang"]
    uplink = next(lid for lid in before["links"] if lid in _uplink_ids(pool.call("get", "/fabric").json(),
                                                                      before["nodes"][0]))
    answer = pool.call("post", "/fabric/links/fail", {"link": uplink})
    assert answer.status_code == 200, answer.text
    assert answer.json()["changed"] and answer.json()["requeued"] == []  # its leaf has a second uplink
    after = pool.call("get", f"/fabric?workload={gang}").json()
    assert uplink not in after["gang"]["links"] and after["gang"]["connected"]
    assert next(lk for lk in after["links"] if lk["id"] == uplink)["failed"]
    pool.gang(replicas=2)  # the next cycle that places work sees the link down
    view = pool.loop.scheduler.keeper.view
    assert view is not None and view.topology is not None
    fabric = pool.rt.fabric
    assert fabric is not None
    key = fabric.find_link(uplink).key
    state = view.topology.link_state(key)
    assert state is not None and not state[0]
    assert pool.call("post", "/fabric/links/fail", {"link": uplink}).json()["changed"] is False
    healed = pool.call("post", "/fabric/links/heal", {"link": uplink})
    assert healed.json()["changed"]
    pool.gang(replicas=2)
    state = view.topology.link_state(key)
    assert state is not None and state[0]


def test_a_gang_cut_off_by_failed_links_is_requeued_and_placed_where_it_can_talk(tmp_path: Path) -> None:
    pool = Pool(tmp_path, config="scheduling: {placement: network-aware, backfill: false}\n")
    try:
        _cut_off(pool)
    finally:
        pool.close()


def test_a_cut_off_gangs_checkpoint_mark_is_asked_for_before_the_transaction(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The provider may answer over the network (Ray): it is never asked inside a write transaction."""
    pool = Pool(tmp_path, config="scheduling: {placement: network-aware, backfill: false}\n")
    try:
        writing: list[bool] = []
        asked: list[tuple[str, bool]] = []
        write = pool.rt.store.write

        @contextmanager
        def noted() -> Iterator[Session]:
            writing.append(True)
            try:
                with write() as session:
                    yield session
            finally:
                writing.pop()

        monkeypatch.setattr(pool.rt.store, "write", noted)
        monkeypatch.setattr(pool.provider, "checkpoint_s", lambda wid: asked.append((wid, bool(writing))))
        _cut_off(pool)
        assert asked and not [wid for wid, inside in asked if inside]
    finally:
        pool.close()


def _cut_off(pool: Pool) -> None:
    gang = pool.gang()
    first = pool.detail(gang)
    fabric = pool.call("get", "/fabric").json()
    cut = _uplink_ids(fabric, first["pods"][0]["node"])
    assert len(cut) == 2
    answer = pool.call("post", "/fabric/links/fail", {"link": cut[0]}).json()
    assert answer["requeued"] == []
    answer = pool.call("post", "/fabric/links/fail", {"link": cut[1]}).json()
    assert answer["requeued"] == [gang]  # its rank 0's leaf lost both uplinks
    assert set(pool.provider.stopped) == {p["id"] for p in first["pods"]}
    assert tuple(r for r, _ in pool.events(gang)[-1:]) == ("link_lost", )
    for pod in first["pods"]:
        pool.provider.finish(pod["id"], -15)
    pool.loop.step()
    pool.loop.step()
    again = pool.detail(gang)
    assert again["status"] == "running" and again["attempt"] == 2
    cut_leaf = next(n["leaf"] for n in fabric["nodes"] if n["node"] == first["pods"][0]["node"])
    under_cut = {n["node"] for n in fabric["nodes"] if n["leaf"] == cut_leaf}
    assert not {p["node"] for p in again["pods"]} & under_cut  # never across the cut
    assert again["network"]["connected"]


def test_gangs_left_sharing_one_uplink_are_told_their_new_bottleneck(pool: Pool) -> None:
    for name in ("node00002", "node00004", "node00005", "node00008"):  # one free node per leaf
        pool.call("post", f"/nodes/{name}/cordon")
    first = pool.gang(replicas=2)  # no leaf holds it: node00001 (leaf 0) -> node00003 (leaf 1)
    pool.call("post", "/nodes/node00002/uncordon")
    second = pool.gang(replicas=2)  # node00002 (leaf 0) -> node00006 (leaf 2)
    paths = {w: pool.call("get", f"/fabric?workload={w}").json()["gang"] for w in (first, second)}
    assert [paths[first]["nodes"], paths[second]["nodes"]] == [["node00001", "node00003"],
                                                               ["node00002", "node00006"]]
    uplinks = _uplink_ids(pool.call("get", "/fabric").json(), "node00001")
    used = {w: [lid for lid in uplinks if lid in paths[w]["links"]] for w in paths}
    assert len(used[second]) == 1 and used[first] != used[second]  # ECMP spread them over both
    answer = pool.call("post", "/fabric/links/fail", {"link": used[second][0]}).json()
    assert answer["requeued"] == [] and sorted(answer["slowed"]) == sorted([first, second])
    shared = pool.call("get", f"/fabric?workload={first}").json()["gang"]
    assert shared["bottleneck_gbps"] == pytest.approx(paths[first]["bottleneck_gbps"] / 2, abs=0.01)
    reason, message = pool.events(first)[-1]
    assert reason == "link_degraded" and f"its bottleneck is now {used[first][0].split(':')[0]}" in message
    assert "shared by 2 gangs" in message
    healed = pool.call("post", "/fabric/links/heal", {"link": used[second][0]}).json()
    assert healed["slowed"] == {}  # more bandwidth is not news


def test_only_an_admin_changes_links_and_a_bad_link_is_one_sentence(pool: Pool) -> None:
    link = pool.call("get", "/fabric").json()["links"][0]["id"]
    assert pool.call("post", "/fabric/links/fail", {"link": link}, token=pool.tenant).status_code == 403
    bad = pool.call("post", "/fabric/links/fail", {"link": "nosuchswitch:3"})
    assert bad.status_code == 404 and "fabric status" in bad.json()["message"]
    worse = pool.call("post", "/fabric/links/fail", {"link": "leaf"})
    assert worse.status_code == 422 and worse.json()["message"].startswith("Expected NODE:PORT")


def test_without_a_fabric_the_routes_say_how_to_get_one(tmp_path: Path) -> None:
    pool = Pool(tmp_path, fabric=False)
    try:
        answer = pool.call("get", "/fabric")
        assert answer.status_code == 409 and "--fabric" in answer.json()["message"]
        gang = pool.gang()
        assert pool.detail(gang)["network"] is None
    finally:
        pool.close()


MIGRATE = CONFIG + "fabric: {migrate_on_congestion: true, congestion_threshold: 0.8, congestion_for: 60s}\n"


def test_a_gang_whose_bottleneck_stays_congested_is_moved(tmp_path: Path) -> None:
    pool = Pool(tmp_path, config=MIGRATE)
    try:
        gang = pool.gang()
        path = pool.call("get", f"/fabric?workload={gang}").json()["gang"]
        kinds = {lk["id"]: lk["kind"] for lk in pool.call("get", "/fabric").json()["links"]}
        uplink = next(lk for lk in path["links"] if kinds[lk] == "switch")  # moving can cool it
        node, _, port = uplink.rpartition(":")
        hot = {"ports": [{"node": node, "port": int(port), "utilization": 0.95}]}
        first = pool.call("post", "/fabric/telemetry", hot)
        assert first.status_code == 200, first.text
        assert first.json()["congested"] == [gang]  # congested from now: not for long enough yet
        pool.loop.step()  # the cycle judges the sample: not due
        assert pool.detail(gang)["status"] == "running"
        assert "congestion_moved" not in [r for r, _ in pool.events(gang)]
        pool.now += 61
        assert pool.call("post", "/fabric/telemetry", hot).json()["congested"] == [gang]
        pool.loop.step()  # the cycle stops it (kind migrate) and requeues it, its pods with their grace
        moved = [m for r, m in pool.events(gang) if r == "congestion_moved"]
        assert len(moved) == 1
        assert moved[0].startswith("Moved: its bottleneck stayed above 80% load for 60 s.")
        assert {f"{gang}-a1-r{rank}" for rank in range(3)} <= set(pool.provider.stopped)  # its first pods
    finally:
        pool.close()


def test_a_gang_alone_on_its_own_hot_host_cable_is_not_moved(tmp_path: Path) -> None:
    # its own traffic would follow it to any node: moving it would only repeat every congestion_for
    pool = Pool(tmp_path, config=MIGRATE)
    try:
        gang = pool.gang()
        path = pool.call("get", f"/fabric?workload={gang}").json()["gang"]
        node, _, port = path["links"][0].rpartition(":")  # a host's only cable to its leaf
        hot = {"ports": [{"node": node, "port": int(port), "utilization": 0.95}]}
        assert pool.call("post", "/fabric/telemetry", hot).json()["congested"] == []
        pool.loop.step()
        pool.now += 61
        assert pool.call("post", "/fabric/telemetry", hot).json()["congested"] == []
        pool.loop.step()
        assert pool.detail(gang)["status"] == "running"
        assert pool.call("get", f"/fabric?workload={gang}").json()["gang"]["bottleneck"] == path["links"][0]
    finally:
        pool.close()


def test_telemetry_that_sees_a_link_go_down_fails_it(pool: Pool) -> None:
    gang = pool.gang()
    path = pool.call("get", f"/fabric?workload={gang}").json()["gang"]
    node, _, port = path["links"][0].rpartition(":")  # a host's only cable to its leaf
    answer = pool.call("post", "/fabric/telemetry", {"ports": [
        {"node": node, "port": int(port), "utilization": 0.0, "errors": {"link_downed": 1}}]}).json()
    assert answer["links"] == [path["links"][0]] and answer["requeued"] == [gang]


def test_the_sdk_reads_the_fabric_and_fails_and_heals_links(pool: Pool) -> None:
    from gpupool.client import Client
    from gpupool.errors import Forbidden

    sdk = Client("http://testserver", pool.admin, transport=pool.client._transport)
    tenant = Client("http://testserver", pool.tenant, transport=pool.client._transport)
    gang = pool.gang(token=pool.tenant)
    path = tenant.fabric(workload=gang).gang
    assert path is not None and path.connected and path.domain == "spine"
    uplink = _uplink_ids(sdk.fabric().model_dump(mode="json"), path.nodes[0])[0]
    with pytest.raises(Forbidden):
        tenant.fail_link(uplink)
    assert sdk.fail_link(uplink).changed
    assert any(lk.failed for lk in sdk.fabric().links if lk.id == uplink)
    assert sdk.heal_link(uplink).changed and not sdk.heal_link(uplink).changed
    assert sdk.request("GET", "/fabric")["levels"] == sdk.fabric().model_dump(mode="json")["levels"]


def _within_patience(what: str, done: Callable[[], bool]) -> None:
    """Wait for `done()` (checked every 10 ms); fail after 20 s of real time (a loaded machine)."""
    deadline = time.monotonic() + 20.0
    while not done():
        assert time.monotonic() < deadline, f"still waiting for {what}"
        threading.Event().wait(0.01)


class _HungLaunches(ManualProvider):
    """Launches from the server's per-node workers, each blocking until `gate` is set (stuck agents)."""

    concurrent_launch = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.gate = threading.Event()
        self.begun: list[str] = []

    def launch(self, pod: PodLaunch) -> None:
        self.begun.append(pod.pod_id)
        self.gate.wait(30)
        super().launch(pod)


def test_a_cut_off_gangs_pod_whose_launch_was_not_begun_is_taken_back(tmp_path: Path) -> None:
    """A gang across two leaves, two of its pods on each node of one leaf, whose nodes' one launch
    thread hangs on the first: when that leaf's links are lost the pods still queued are ended at
    once and never handed to the provider; the provider is asked to stop the begun ones."""
    pool = Pool(tmp_path, provider=_HungLaunches)
    provider = pool.provider
    assert isinstance(provider, _HungLaunches)
    try:
        pool.loop.scheduler.launches.per_node = 1
        gang = pool.gang(replicas=5, resources={"gpus": 1})  # one leaf holds 4 devices
        pods = pool.detail(gang)["pods"]
        _within_patience("one launch to begin on each of its 3 nodes", lambda: len(provider.begun) == 3)
        queued = {p["id"] for p in pods if p["id"] not in provider.begun}
        assert len(queued) == 2, "two wait behind a begun launch on their node"
        assert queued <= pool.loop.scheduler.launches.in_flight()
        [doubled, *_] = [p["node"] for p in pods if p["id"] in queued]
        for link in _uplink_ids(pool.call("get", "/fabric").json(), doubled):
            pool.call("post", "/fabric/links/fail", {"link": link})
        assert pool.detail(gang)["status"] == "pending"
        assert tuple(r for r, _ in pool.events(gang)[-1:]) == ("link_lost", )
        for pod in pool.detail(gang)["pods"]:
            if pod["id"] in queued:
                assert (pod["status"], pod["message"]) == ("stopped", "Stopped before it started.")
        assert not queued & set(provider.stopped), "nothing to ask the provider: it never had them"
        assert not queued & pool.loop.scheduler.launches.in_flight()
        begun = {p["id"] for p in pods} - queued
        assert begun == set(provider.stopped), "the begun pods are stopped by the provider"
        provider.gate.set()  # the hung launches return; the taken-back ones are never launched

        def recorded() -> bool:
            pool.loop.step()
            return not pool.loop.scheduler.launches.busy

        _within_patience("the begun launches to be recorded", recorded)
        assert not queued & set(provider.launched) and not queued & set(provider.begun)
    finally:
        provider.gate.set()
        pool.close()


def test_a_gang_moved_since_it_was_judged_cut_off_is_not_requeued(tmp_path: Path) -> None:
    """A link change judges the running gangs on the nodes it read, then requeues the cut-off ones in
    a transaction of its own: a gang the scheduler placed elsewhere in between is left to the next
    judgement, not stopped for a cut it no longer crosses."""
    pool = Pool(tmp_path, config="scheduling: {placement: network-aware, backfill: false}\n")
    try:
        gang = pool.gang()
        nodes = tuple(p["node"] for p in sorted(pool.detail(gang)["pods"], key=lambda p: p["rank"]))
        elsewhere = tuple(reversed(nodes)) if len(set(nodes)) > 1 else ("other", *nodes[1:])
        cut, now = fabric_links.Effects(requeued=[gang]), pool.rt.clock()
        fabric_links.carry_out(pool.rt, cut, "a test's cut", now, assessed={gang: ("t", elsewhere)})
        assert pool.detail(gang)["status"] == "running" and not pool.provider.stopped
        fabric_links.carry_out(pool.rt, cut, "a test's cut", now, assessed={gang: ("t", nodes)})
        assert pool.detail(gang)["status"] == "pending" and pool.events(gang)[-1][0] == "link_lost"
    finally:
        pool.close()
