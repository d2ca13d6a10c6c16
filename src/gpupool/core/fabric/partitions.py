"""Partitions: one P_Key per tenant (its CAs full members, shared services limited) and an isolation check."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from gpupool.errors import InvalidInput

DEFAULT_PKEY = 0x7FFF
FIRST_TENANT_PKEY = 0x0010


class Membership(StrEnum):
    FULL = "full"
    LIMITED = "limited"


@dataclass(frozen=True)
class Partition:
    name: str
    pkey: int
    members: tuple[tuple[str, Membership], ...]

    def membership(self, ca: str) -> Membership | None:
        return dict(self.members).get(ca)


@dataclass(frozen=True)
class PartitionPlan:
    partitions: tuple[Partition, ...]

    def by_tenant(self, tenant: str) -> Partition:
        for part in self.partitions:
            if part.name == tenant:
                return part
        raise InvalidInput(f"No partition for tenant {tenant!r}.")


def plan_partitions(
    tenants: Mapping[str, Sequence[str]],
    shared: Sequence[str] = (),
    first_pkey: int = FIRST_TENANT_PKEY,
) -> PartitionPlan:
    """One P_Key per tenant: its CAs are full members, `shared` service CAs limited members.

    Two limited members cannot talk to each other, so services reach every tenant while tenants
    stay apart. A CA listed under two tenants is rejected.
    """
    owner: dict[str, str] = {}
    for tenant, cas in tenants.items():
        for ca in cas:
            if ca in owner and owner[ca] != tenant:
                raise InvalidInput(
                    f"{ca} is listed for tenants {owner[ca]} and {tenant}; give it one tenant."
                )
            owner[ca] = tenant
    clash = sorted(set(shared) & set(owner))
    if clash:
        raise InvalidInput(f"{clash[0]} is both a tenant node and a shared service; pick one role.")
    partitions = []
    for i, (tenant, cas) in enumerate(sorted(tenants.items())):
        pkey = first_pkey + i
        if not 0 < pkey < DEFAULT_PKEY:
            raise InvalidInput(
                f"P_Key 0x{pkey:04x} is out of range; use fewer tenants or a lower first P_Key."
            )
        members = [(ca, Membership.FULL) for ca in sorted(set(cas))]
        members += [(ca, Membership.LIMITED) for ca in sorted(set(shared))]
        partitions.append(Partition(tenant, pkey, tuple(members)))
    return PartitionPlan(tuple(partitions))


def can_talk(plan: PartitionPlan, a: str, b: str) -> bool:
    """IB rule: two ports communicate when they share a P_Key and at least one is a full member."""
    for part in plan.partitions:
        ma, mb = part.membership(a), part.membership(b)
        if ma and mb and Membership.FULL in (ma, mb):
            return True
    return False


def isolation_violations(plan: PartitionPlan) -> list[tuple[str, str, str, str]]:
    """(ca_a, tenant_a, ca_b, tenant_b) for every pair of different tenants' CAs that can talk."""
    owner = {
        ca: part.name for part in plan.partitions for ca, m in part.members if m is Membership.FULL
    }
    violations = []
    for (a, ta), (b, tb) in itertools.combinations(sorted(owner.items()), 2):
        if ta != tb and can_talk(plan, a, b):
            violations.append((a, ta, b, tb))
    return violations
