"""Placing the serving instances (and the training gangs beside them) with the core scheduler.

An instance is a whole-device gang of `tp` devices of one model on one node (tensor parallelism
stays inside the NVLink domain). Policies for the prefill/decode pools:

- `best-fit` (fabric-blind): every instance on its own, by the core `best-fit` policy with no fabric
  bound, prefill instances first, then decode instances: the pools come out as two blocks of nodes.
- `leaf-paired`: units of one prefill instance and its decode partners (the mode's ratio), each unit
  one gang with `required=leaf` under the bound fabric, so each prefill instance's partners sit in
  its leaf and the pools are sized per leaf; a unit that fits no leaf falls back to `preferred=leaf`.
- `network-aware`: the same units, placed by the core `network-aware` policy with `preferred=leaf`
  and a stated communication ratio (`kv_ratio`, 1.0: a unit counted as communication-heavy), so
  its cost term prices spreading a unit against the links other gangs already load.

Training gangs are placed first with the core `random` policy (seeded): other tenants' work, spread
the way a busy pool spreads it.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import NoReturn

from gpupool.core.model import Node, PodRequest, Workload
from gpupool.core.scheduling.gang import GangPlacement, place_gang
from gpupool.core.scheduling.policies.base import NoFit, make_policy
from gpupool.core.scheduling.topology import FabricView, TopologyContext
from gpupool.core.state import ClusterState
from gpupool.core.topology_spec import Tier, TopologySpec
from gpupool.errors import InvalidInput


class Placement(StrEnum):
    BEST_FIT = "best-fit"
    LEAF_PAIRED = "leaf-paired"
    NETWORK_AWARE = "network-aware"


@dataclass(frozen=True, slots=True)
class InstanceSpec:
    """One instance to place: its role (prefill, decode, both), device model and size."""

    role: str
    device_model: str
    tp: int


@dataclass(frozen=True, slots=True)
class Placed:
    """Where each instance landed (node index, in plan order) and the training gangs' nodes."""

    instance_nodes: tuple[int, ...]
    training_nodes: tuple[tuple[int, ...], ...]


def _pod(name: str, spec: InstanceSpec) -> PodRequest:
    return PodRequest(
        name, num_devices=spec.tp, device_milli=1000, allowed_models=frozenset({spec.device_model})
    )


def _nodes_of(gang: GangPlacement) -> list[int]:
    return list(gang.nodes)


def _units(plan: Sequence[InstanceSpec]) -> list[list[int]]:
    """Plan indices grouped into units of one prefill and its share of the decode instances."""
    prefill = [i for i, s in enumerate(plan) if s.role == "prefill"]
    other = [i for i, s in enumerate(plan) if s.role != "prefill"]
    if not prefill:
        return [[i] for i in other]
    units = [[p] for p in prefill]
    for k, i in enumerate(other):
        units[k % len(units)].append(i)
    return units


def place_instances(
    nodes: Sequence[Node],
    view: FabricView | None,
    plan: Sequence[InstanceSpec],
    policy: Placement,
    seed: int,
    training_gangs: int = 0,
    training_nodes: int = 4,
    kv_ratio: float = 1.0,
) -> Placed:
    """Place the training gangs, then every instance of `plan`; raises InvalidInput when the pool
    cannot hold them (saying how many of which it could not place)."""
    state = ClusterState(nodes)
    rng = random.Random(seed)
    per_node = max((len(n.devices) for n in nodes), default=0)
    trained: list[tuple[int, ...]] = []
    spreader = make_policy("random")
    for g in range(training_gangs):
        pods = tuple(
            PodRequest(f"t{g}-{k}", num_devices=per_node, device_milli=1000) for k in range(training_nodes)
        )
        train = place_gang(Workload(f"train-{g}", pods), state, spreader, rng)
        if isinstance(train, NoFit):
            raise InvalidInput(
                f"The cluster has no room for training gang {g + 1} of {training_gangs} "
                f"({training_nodes} whole nodes each); give fewer or a bigger cluster."
            )
        trained.append(tuple(sorted(set(_nodes_of(train)))))
    where: dict[int, int] = {}
    if policy is Placement.BEST_FIT or view is None:
        fit = make_policy("best-fit")
        order = sorted(range(len(plan)), key=lambda i: (plan[i].role != "prefill", i))
        for i in order:
            one = place_gang(Workload(f"inst-{i}", (_pod(f"i{i}", plan[i]),)), state, fit, rng)
            if isinstance(one, NoFit):
                _too_small(plan, where)
            else:
                where[i] = one.allocs[0][1].node
    else:
        name = "best-fit" if policy is Placement.LEAF_PAIRED else "network-aware"
        chooser = make_policy(name)
        chooser.bind_topology(TopologyContext(view))
        for u, unit in enumerate(_units(plan)):
            pods = tuple(_pod(f"i{i}", plan[i]) for i in unit)
            specs = (
                [TopologySpec(required=Tier.LEAF), TopologySpec(preferred=Tier.LEAF)]
                if policy is Placement.LEAF_PAIRED
                else [TopologySpec(preferred=Tier.LEAF, comm_ratio=kv_ratio)]
            )
            got: GangPlacement | NoFit | None = None
            for spec in specs:
                got = place_gang(
                    Workload(f"unit-{u}", pods, topology=spec, runtime_estimate_s=3600.0), state, chooser, rng
                )
                if not isinstance(got, NoFit):
                    break
            if not isinstance(got, GangPlacement):
                _too_small(plan, where)
            else:
                for i, (_, alloc) in zip(unit, got.allocs, strict=True):
                    where[i] = alloc.node
    return Placed(tuple(where[i] for i in range(len(plan))), tuple(trained))


def _too_small(plan: Sequence[InstanceSpec], where: dict[int, int]) -> NoReturn:
    missing: dict[tuple[str, str, int], int] = {}
    for i, spec in enumerate(plan):
        if i not in where:
            key = (spec.role, spec.device_model, spec.tp)
            missing[key] = missing.get(key, 0) + 1
    text = ", ".join(
        f"{n} {role} instance(s) of {tp} x {model}" for (role, model, tp), n in sorted(missing.items())
    )
    raise InvalidInput(
        f"The cluster cannot hold the serving instances: {text} found no room; "
        "give a bigger --cluster or fewer instances."
    )
