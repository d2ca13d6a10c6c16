"""fed.yaml's validation and the hub's placement seam over core/federation.py (no processes)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from gpupool.api.workloads import WorkloadSpec
from gpupool.errors import InvalidInput
from gpupool.federation.config import FederationConfig, load_federation
from gpupool.federation.members import MemberLink
from gpupool.federation.placement import candidates

GOOD = """
policy: cheapest
members:
  - name: east
    url: http://127.0.0.1:1
    token_file: t
    region: east
    prices: {gpu_hour: 1.0, windows: [{hours: 22-6, multiplier: 0.5}]}
    datasets: [imagenet]
  - name: west
    url: http://127.0.0.1:2
    token_file: t
    region: west
    prices: {gpu_hour: 0.6}
regions:
  east: {west: {bandwidth_gbps: 10, latency_ms: 30}}
datasets:
  imagenet: {size_gb: 150}
tenants:
  alice: {home: east}
  carol: {home: east, policy: data-local}
"""


def _load(tmp_path: Path, text: str, mode: int = 0o600) -> FederationConfig:
    (tmp_path / "t").write_text("gp_x")
    (tmp_path / "t").chmod(mode)
    (tmp_path / "fed.yaml").write_text(text)
    return load_federation(tmp_path / "fed.yaml")


def _links(config: FederationConfig, up: dict[str, bool]) -> list[MemberLink]:
    links = [MemberLink(m) for m in config.members]
    for link in links:
        link.state.up, link.state.capacity_gpus = up[link.name], 8.0
    return links


def test_a_good_file_gives_the_core_members(tmp_path: Path) -> None:
    config = _load(tmp_path, GOOD)
    east = config.member("east")
    assert east.price_now(23 * 3600) == 0.5 and east.price_now(12 * 3600) == 1.0
    members = {m.name: m for m in config.core_members()}
    assert members["east"].links["west"].gbit_s == 10 and members["west"].links["east"].latency_ms == 30
    assert config.policy_of("alice") == "cheapest" and config.policy_of("carol") == "data-local"


@pytest.mark.parametrize(("change", "sentence"), [
    ("policy: cheapest", "there is no policy 'cheapst'; use one of home, cheapest, fastest, balanced, "
                         "data-local. Did you mean 'cheapest'?"),
    ("url: http://127.0.0.1:2", "members.west.url must be http(s)://HOST:PORT"),
    ("west: {bandwidth_gbps: 10",
     "regions.east.wets names 'wets', the region of no member. Did you mean 'west'?"),
    ("imagenet: {size_gb: 150}", "datasets.imagenet.size_gb must be a positive number"),
    ("alice: {home: east}", "tenants.alice.home is 'eats', which is no member"),
])
def test_each_problem_is_one_sentence(tmp_path: Path, change: str, sentence: str) -> None:
    broken = {"policy: cheapest": "policy: cheapst", "url: http://127.0.0.1:2": "url: 127.0.0.1:2",
              "west: {bandwidth_gbps: 10": "wets: {bandwidth_gbps: 10",
              "imagenet: {size_gb: 150}": "imagenet: {size_gb: -1}",
              "alice: {home: east}": "alice: {home: eats}"}[change]
    with pytest.raises(InvalidInput) as caught:
        _load(tmp_path, GOOD.replace(change, broken))
    assert sentence in caught.value.message
    assert len(caught.value.details["problems"]) == 1


def test_a_token_file_others_may_read_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="readable by others; chmod 600 it"):
        _load(tmp_path, GOOD, mode=0o644)


def test_placement_ranks_by_the_tenants_policy_and_leaves_home_when_home_is_down(tmp_path: Path) -> None:
    config = _load(tmp_path, GOOD)
    spec = WorkloadSpec(command=["x"], resources={"gpus": 1})  # type: ignore[arg-type]
    both = _links(config, {"east": True, "west": True})
    cheapest = candidates(config, both, "alice", spec, 12 * 3600)
    assert cheapest.members[0] == "west" and "expected cost 0.6" in cheapest.why["west"]  # cheapest at noon
    reads = WorkloadSpec(command=["x"], env={"GPUPOOL_DATASET": "imagenet"})
    moved = candidates(config, both, "alice", reads, 12 * 3600)  # west lacks it: 150 GB over 10 Gbit/s
    assert "150 GB of imagenet from east in 120 s" in moved.why["west"]
    home = replace(config, policy="home")
    assert candidates(home, both, "alice", spec, 0).members == ["east"]
    east_down = _links(config, {"east": False, "west": True})
    ranked = candidates(home, east_down, "alice", spec, 0)
    assert ranked.members == ["west"] and ranked.policy == "fastest"


def test_interactive_work_stays_home_and_data_local_says_why(tmp_path: Path) -> None:
    config = _load(tmp_path, GOOD)
    both = _links(config, {"east": True, "west": True})
    interactive = WorkloadSpec(command=["x"], priority_class="interactive")
    assert candidates(config, both, "alice", interactive, 12 * 3600).members == ["east"]
    reads = WorkloadSpec(command=["x"], env={"GPUPOOL_DATASET": "imagenet"})
    ranked = candidates(config, _links(config, {"east": False, "west": True}), "carol", reads, 0)
    assert ranked.members == []
    assert any("data-local runs work only where its data set 'imagenet' is held" in r for r in ranked.refused)


def test_the_federation_wide_quota_is_checked_at_the_hub(tmp_path: Path, db_url: str) -> None:
    from gpupool.api.tenants import TenantCreate
    from gpupool.errors import QuotaExceeded
    from gpupool.federation.app import NoNodes
    from gpupool.federation.hub import Hub
    from gpupool.server.auth import Principal
    from gpupool.server.db import Store
    from gpupool.server.runtime import Runtime
    from gpupool.server.services.tenants import create_tenant
    from gpupool.server.settings import Settings

    config = replace(_load(tmp_path, GOOD.replace("alice: {home: east}", "alice: {home: east, max_gpus: 3}")))
    url = db_url
    settings = Settings(data_dir=tmp_path, database_url=url)
    rt = Runtime(settings=settings, store=Store.open(url), provider=NoNodes())
    admin = Principal(token_id="t", tenant=None)
    create_tenant(rt, admin, TenantCreate(name="alice"))
    hub = Hub(rt.store, config)  # no threads: nothing is offered, the record alone counts
    alice = Principal(token_id="a", tenant="alice", max_priority=0)
    two = WorkloadSpec(command=["x"], resources={"gpus": 2})  # type: ignore[arg-type]
    first = hub.submit(alice, two)
    with pytest.raises(QuotaExceeded, match="may hold 3 GPUs across the federation"):
        hub.submit(alice, two)
    hub.cancel(alice, first)  # what is cancelled no longer counts
    hub.submit(alice, two)
    from gpupool.api.tenants import TenantUpdate
    from gpupool.errors import TooManyPending
    from gpupool.server.services.tenants import update_tenant

    with pytest.raises(InvalidInput, match="does not take arrays yet"):  # a member would give its own ids
        hub.submit(alice, WorkloadSpec(command=["x"], array="0-3"))
    with pytest.raises(InvalidInput, match="does not take dependencies yet"):
        hub.submit(alice, WorkloadSpec(command=["x"], dependency=f"afterok:{first}"))
    with pytest.raises(InvalidInput, match="on_behalf is set by a member pool"):  # it runs as the hub's there
        hub.submit(alice, WorkloadSpec(command=["x"], on_behalf="admin"))
    update_tenant(rt, admin, "alice", TenantUpdate(max_pending=1))
    with pytest.raises(TooManyPending, match="already has 1 workloads waiting at the hub"):
        hub.submit(alice, WorkloadSpec(command=["x"]))
    rt.store.close()
