"""The seam between the hub and the placement policies: which members to offer a workload to, in order.

The ranking itself is core/federation.py's; until a policy is ranked there, a workload is offered to
its tenant's home member first and then to the others in fed.yaml's order (the `home` policy).
Interactive and service work (priority class `interactive` or `service`) is offered only to members
in its home region unless its tenant may leave home (tenants.NAME.may_leave_home).
"""

from __future__ import annotations

from collections.abc import Sequence

from gpupool.api.workloads import WorkloadSpec
from gpupool.federation.config import FederationConfig, TenantPolicy
from gpupool.federation.members import MemberLink

HOME_BOUND_CLASSES = ("interactive", "service")


def candidates(config: FederationConfig, links: Sequence[MemberLink], tenant: str, spec: WorkloadSpec,
               now_s: float) -> list[str]:
    """The members to offer `spec` to, best first; down members left out."""
    del now_s  # the time-of-day prices are the policies' (core/federation.py)
    home = config.home_of(tenant)
    home_region = config.member(home).region
    order = [home] + [m.name for m in config.members if m.name != home]
    bound = (spec.priority_class in HOME_BOUND_CLASSES
             and not config.tenants.get(tenant, TenantPolicy()).may_leave_home)
    up = {link.name for link in links if link.state.up}
    return [name for name in order
            if name in up and (not bound or config.member(name).region == home_region)]
