"""The hub's `GET /pool`: the members' summaries added up. The hub reads them with its federation
token, which sees every tenant, so a tenant's answer must count only its own work."""

from __future__ import annotations

from typing import Any

from gpupool.federation.routes import add_pools
from gpupool.server.auth import Principal


def _member(alice_running: int, bob_pending: int) -> dict[str, Any]:
    return {"nodes": 1, "devices": 4, "capacity_gpus": 4.0, "allocated_gpus": float(alice_running),
            "by_model": [], "workloads": {"running": alice_running, "pending": bob_pending, "succeeded": 7},
            "by_tenant": [{"tenant": "alice", "allocated_gpus": float(alice_running),
                           "running": alice_running, "pending": 0},
                          {"tenant": "bob", "allocated_gpus": 0.0, "running": 0, "pending": bob_pending}]}


def test_a_tenant_at_the_hub_counts_its_own_workloads_only() -> None:
    members = [_member(3, 1), _member(2, 0)]
    bob = add_pools(members, Principal("t", "bob"))
    assert bob.workloads == {"pending": 1}  # not alice's five running, nor anyone's succeeded
    assert [t.tenant for t in bob.by_tenant] == ["bob"]
    carol = add_pools(members, Principal("t", "carol"))
    assert carol.workloads == {} and carol.by_tenant == []
    admin = add_pools(members, Principal("admin", None))
    assert admin.workloads == {"running": 5, "pending": 1, "succeeded": 14}
    assert bob.capacity_gpus == admin.capacity_gpus == 8.0  # the pool's size is no tenant's secret
