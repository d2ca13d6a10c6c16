"""What a service's replica is: the workload spec built from the service's spec and its port, and
the priority class a service runs in."""

from __future__ import annotations

from gpupool.api.services import ServiceSpec
from gpupool.api.workloads import STORED, WorkloadSpec
from gpupool.config import PoolConfig
from gpupool.errors import PriorityNotAllowed, UnknownName, did_you_mean
from gpupool.server.auth import Principal

REPLICA_TOKEN_ID = "service-controller"
"""Who submits and cancels replicas (the audit names it); it acts as the service's tenant."""


def service_class(config: PoolConfig, asked: str | None, tenant: str, max_priority: int | None) -> str:
    """The class a service runs in: `asked` (a service class or a batch class), default the pool's
    serving.priority_class (never refused, as the batch default is not). UnknownName for a class the
    pool lacks; PriorityNotAllowed when a tenant names a class above its max_priority."""
    classes = config.all_priority_classes()
    if asked is None:
        return config.serving.priority_class
    found = next((c for c in classes if c.name == asked), None)
    if found is None:
        names = [c.name for c in classes]
        raise UnknownName(
            f"Unknown priority class {asked!r}; choose one of {', '.join(names)} (`gpupool "
            f"config show` lists them).{did_you_mean(asked, names)}",
            name=asked,
        )
    if (
        max_priority is not None
        and found.value > max_priority
        and found.name != config.serving.priority_class
    ):
        raise PriorityNotAllowed(
            f"Tenant {tenant} may not use priority class {asked} (value {found.value}): its max priority is "
            f"{max_priority}; leave the class out (services default to "
            f"{config.serving.priority_class}) or ask the admin (gpupool tenant set {tenant} "
            f"--max-priority {found.value}).",
            priority_class=asked,
        )
    return found.name


def replica_spec(spec: ServiceSpec, tenant: str, port: int) -> WorkloadSpec:
    """One replica's workload (ServiceSpec.replica_fields)."""
    return WorkloadSpec.model_validate(spec.replica_fields(tenant, port), context=STORED)  # checked at create


def acting_for(tenant: str) -> Principal:
    """The controller, submitting and cancelling the tenant's replicas as that tenant would."""
    return Principal(token_id=REPLICA_TOKEN_ID, tenant=tenant, max_priority=None)
