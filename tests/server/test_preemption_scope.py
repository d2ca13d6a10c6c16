"""The live pool carries out how far priority reaches (`preemption.scope`), read back from the store:
every tenant's default queue is a queue of its own, so only `scope: pool` lets a critical gang of
one tenant stop another tenant's best-effort work; under `scope: queue` it waits and says why."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import select
from storereads import StoreReads

from gpupool.api.tenants import TenantCreate
from gpupool.api.workloads import WorkloadSpec
from gpupool.config import parse_config
from gpupool.providers.fake import FakeProvider
from gpupool.server.auth import Principal
from gpupool.server.db import Store
from gpupool.server.loops.control import ControlLoop
from gpupool.server.orm import PodRow
from gpupool.server.runtime import Runtime
from gpupool.server.services import tenants, workloads
from gpupool.server.services.tenants import bootstrap
from gpupool.server.settings import Settings

ADMIN = Principal("admin", None)
CONFIG = """\
scheduling: {placement: first-fit, ordering: priority-fifo, preemption: true, backfill: false}
preemption: {scope: SCOPE}
"""


class _Pool(StoreReads):
    def __init__(self, tmp_path: Path, scope: str, nodes: str = "2x4xH100") -> None:
        self.now = 1_000_000.0
        provider = FakeProvider(nodes, clock=lambda: self.now, duration_s=10_000.0)
        url = f"sqlite:///{tmp_path / 'store.sqlite'}"
        settings = Settings(data_dir=tmp_path, database_url=url, cycle_interval_s=0.05)
        self.rt = Runtime(settings=settings, store=Store.open(url), provider=provider, clock=lambda: self.now,
                          config=parse_config(CONFIG.replace("SCOPE", scope)))
        bootstrap(self.rt)
        for name in ("team-a", "team-b"):
            tenants.create_tenant(self.rt, ADMIN, TenantCreate(name=name))
        self.loop = ControlLoop(self.rt)
        self.loop.recovered = self.loop.reconciler.recover()

    def nodes(self, workload_id: str) -> set[str]:
        with self.rt.store.read() as session:
            return set(session.scalars(select(PodRow.node).where(PodRow.workload_id == workload_id)))

    def submit(self, **fields: Any) -> str:
        spec = WorkloadSpec.model_validate({"command": ["train"], **fields})
        return workloads.submit(self.rt, ADMIN, spec).id

    def step(self, advance_s: float = 0.0) -> None:
        self.now += advance_s
        self.loop.step()


def _full_of_best_effort(tmp_path: Path, scope: str) -> tuple[_Pool, list[str]]:
    pool = _Pool(tmp_path, scope)
    filler = [pool.submit(tenant="team-a", priority_class="best-effort", resources={"gpus": 4})
              for _ in range(2)]
    pool.step()
    assert [pool.row(w).status for w in filler] == ["running", "running"]
    pool.step(60.0)
    return pool, filler


def test_under_queue_scope_the_critical_gang_waits_and_the_store_says_why(tmp_path: Path) -> None:
    pool, filler = _full_of_best_effort(tmp_path, "queue")
    gang = pool.submit(tenant="team-b", priority_class="critical", replicas=2, resources={"gpus": 4})
    pool.step()
    row = pool.row(gang)
    assert row.status == "pending"
    assert ("preemption not possible: the lower-priority work is in queue team-a/default and "
            "preemption.scope is queue") in row.message
    assert [pool.row(w).status for w in filler] == ["running", "running"]


def test_under_pool_scope_the_critical_gang_stops_the_other_tenants_work(tmp_path: Path) -> None:
    pool, filler = _full_of_best_effort(tmp_path, "pool")
    gang = pool.submit(tenant="team-b", priority_class="critical", replicas=2, resources={"gpus": 4})
    pool.step()
    assert [pool.row(w).status for w in filler] == ["pending", "pending"]
    for w in filler:
        to_status, reason, message = pool.last_event(w)
        assert (to_status, reason) == ("pending", "preempted") and gang in message
    assert pool.row(gang).status in ("admitted", "running")


def test_a_preempting_gang_lands_on_one_node_in_the_store(tmp_path: Path) -> None:
    """Two 8-GPU nodes, each with an old and a young 4-GPU job (the young ones cheapest to stop):
    the 2x4-GPU gang stops both jobs of one node and both its pods run there."""
    pool = _Pool(tmp_path, "pool", nodes="2x8xH100")
    best_effort = {"tenant": "team-a", "priority_class": "best-effort", "resources": {"gpus": 4}}
    old = [pool.submit(**best_effort) for _ in range(4)]
    pool.step()
    placed = {w: pool.nodes(w) for w in old}
    by_node = sorted({next(iter(n)) for n in placed.values()})
    assert len(by_node) == 2
    # keep one old job per node, and put a young one beside each
    keep = [next(w for w in old if placed[w] == {node}) for node in by_node]
    for w in old:
        if w not in keep:
            workloads.cancel(pool.rt, ADMIN, w)
    pool.step(1.0)
    pool.step(1.0)
    young = [pool.submit(**best_effort) for _ in range(2)]
    pool.step(100.0)
    assert {next(iter(pool.nodes(w))) for w in young} == set(by_node)
    before = {w: pool.nodes(w) for w in keep + young}
    gang = pool.submit(tenant="team-b", priority_class="critical", replicas=2, resources={"gpus": 4})
    pool.step(100.0)
    stopped = [w for w in keep + young if pool.row(w).status == "pending"]
    assert len(stopped) == 2 and len(set().union(*(before[w] for w in stopped))) == 1
    assert pool.row(gang).status in ("admitted", "running")
    assert pool.nodes(gang) == set().union(*(before[w] for w in stopped))
