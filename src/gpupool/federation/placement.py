"""The seam between the hub and the placement policies (core/federation.py): which members to offer
a workload to, in order, and why the others were left out.

The hub only translates: the workload into a FedRequest (its GPUs, run time, latency class, data
set), each member's last summary into a MemberState. Under `home`, a workload whose home member is
down is ranked by `fastest` among the others, so a failed home does not strand its work.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from gpupool.api.workloads import WorkloadSpec
from gpupool.core.federation import FedRequest, LatencyClass, MemberState, Policy, rank, reoffer
from gpupool.federation.config import FederationConfig, TenantPolicy
from gpupool.federation.members import MemberLink

DATASET_ENV = "GPUPOOL_DATASET"
"""A workload names the data set it reads in its environment (fed.yaml's datasets)."""
DEFAULT_RUNTIME_S = 3600.0
"""Its run time when it states neither runtime_estimate_s nor time_limit_s."""
LATENCY_CLASSES = {"interactive": LatencyClass.INTERACTIVE, "service": LatencyClass.SERVICE}
"""Priority classes whose work stays in its home region unless its tenant may leave home."""


@dataclass(frozen=True, slots=True)
class Candidates:
    members: list[str]
    refused: list[str]
    """'member: why' for each member left out."""
    policy: str
    why: dict[str, str]
    """member -> what the ranking expects there: start, cost and the data it moves"""


def request_of(config: FederationConfig, tenant: str, spec: WorkloadSpec) -> FedRequest:
    rules = config.tenants.get(tenant, TenantPolicy())
    dataset = spec.env.get(DATASET_ENV) or None
    return FedRequest(
        tenant=tenant, home=config.home_of(tenant), devices=float(spec.replicas) * float(spec.resources.gpus),
        runtime_s=spec.runtime_estimate_s or spec.time_limit_s or DEFAULT_RUNTIME_S,
        latency=LATENCY_CLASSES.get(spec.priority_class or "", LatencyClass.BATCH),
        dataset=dataset, dataset_gb=config.datasets.get(dataset or "", 0.0),
        wait_price_per_h=rules.wait_price_per_h, allow_remote=rules.may_leave_home)


def state_of(link: MemberLink) -> MemberState:
    """The member's last summary as the ranking reads it: each pending workload counts the default run
    time, and the busy GPUs half of it still to run (the member does not report run times)."""
    s = link.state
    return MemberState(up=s.up, free={"gpu": max(0.0, s.capacity_gpus - s.allocated_gpus)},
                       capacity={"gpu": s.capacity_gpus},
                       queued_device_s=s.pending * DEFAULT_RUNTIME_S,
                       running_device_s=s.allocated_gpus * DEFAULT_RUNTIME_S / 2)


def reoffer_target(config: FederationConfig, links: Sequence[MemberLink], tenant: str, spec: WorkloadSpec,
                   current: str, now_s: float) -> tuple[str, str] | None:
    """(member, why) where work still pending at `current` should move under the tenant's policy, or
    None (core.federation.reoffer: another member starts it now, sooner and ranked better)."""
    request = request_of(config, tenant, spec)
    states = {link.name: state_of(link) for link in links}
    here = states[current]  # its own copy is one of the member's pending ones
    states[current] = replace(here, queued_device_s=max(0.0, here.queued_device_s - DEFAULT_RUNTIME_S))
    policy = config.policy_of(tenant)
    if policy == Policy.HOME.value and not states[request.home].up:
        policy = Policy.FASTEST.value
    found = reoffer(request, current, config.core_members(), states, policy, now_s)
    return None if found is None else (found[0].member, found[1])


def candidates(config: FederationConfig, links: Sequence[MemberLink], tenant: str, spec: WorkloadSpec,
               now_s: float) -> Candidates:
    """The members to offer `spec` to, best first, under the tenant's policy."""
    request = request_of(config, tenant, spec)
    states = {link.name: state_of(link) for link in links}
    policy = config.policy_of(tenant)
    members = config.core_members()
    if policy == Policy.HOME.value and not states[request.home].up:
        policy = Policy.FASTEST.value  # its home is down: the soonest start among the others
    ranking = rank(request, members, states, policy, now_s)
    whole = [c for c in ranking.choices if not c.split]
    return Candidates(members=[c.member for c in whole],
                      refused=[f"{r.member}: {r.reason}" for r in ranking.refused], policy=policy,
                      why={c.member: f"{c.reason}; expected cost {c.cost:.4g}" + (
                          f" (egress {c.egress_cost:.4g})" if c.egress_cost else "") for c in whole})
