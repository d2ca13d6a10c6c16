"""Turn a submitted spec into the core's Workload, refusing at submit what no node could ever hold.

The refusal is checked against capacity (what the largest node has), never against what is free:
a request that fits an idle node of the pool waits for room; one that fits none is refused with a
sentence naming the largest node. The pool is summarised once per change of its node list (the
scheduler loop warms the summary after each refresh), so a submission costs a few comparisons per
distinct node shape, not a walk over the nodes.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from gpupool.api.workloads import ResourcesSpec, WorkloadSpec, parse_constraint
from gpupool.config import PoolConfig, PriorityClassConfig
from gpupool.core.model import Labels, Node, PodRequest, Workload, label_text, labels_match
from gpupool.core.topology_spec import parse_topology_spec
from gpupool.core.units import format_memory_mib, parse_cpu_milli, parse_devices, parse_memory_mib
from gpupool.errors import InvalidInput, PriorityNotAllowed, UnknownName, did_you_mean
from gpupool.profiles.loader import name_key
from gpupool.providers.nodespec import CONTAINERS_LABEL

MAX_SHAPES = 64
"""Distinct node shapes checked exactly; a pool with more is checked against its per-figure maxima."""


def pod_requests(spec: WorkloadSpec) -> tuple[PodRequest, ...]:
    """One PodRequest per replica, named by rank; raises InvalidInput for an impossible ask."""
    res = spec.resources
    count, milli = parse_devices(res.gpus)
    gpu_memory = 0 if res.gpu_memory is None else parse_memory_mib(res.gpu_memory)
    base = {
        "cpu_milli": parse_cpu_milli(res.cpu),
        "memory_mib": parse_memory_mib(res.memory),
        "num_devices": count,
        "device_milli": milli,
        "device_memory_mib": gpu_memory if count else 0,
        "allowed_models": frozenset(res.models),
        "node_labels": node_labels(spec),
    }
    return tuple(PodRequest(name=f"r{rank}", **base) for rank in range(spec.replicas))  # type: ignore[arg-type]


def node_labels(spec: WorkloadSpec) -> Labels:
    """The labels a node must carry to take the spec's pods: its constraints and, for work in an
    image, the containers label (added here, never stored: it follows what the agents report)."""
    labels = frozenset(parse_constraint(text) for text in spec.constraints)
    if spec.image is not None:
        labels |= {(CONTAINERS_LABEL, None)}
    return labels


def check_constraints(spec: WorkloadSpec, nodes: Sequence[Node]) -> None:
    """Refuse (InvalidInput, HTTP 422) work whose node labels (its constraints and the label `image`
    implies) no node carries, naming the labels there are, or that no node carrying them could ever
    hold (as `check_fits`, on those nodes); a pool without nodes yet refuses nothing."""
    wanted = node_labels(spec)
    if not wanted or not nodes:
        return
    matching = [node for node in nodes if labels_match(wanted, node.labels)]
    if not matching:
        if not spec.constraints:
            return  # image work alone: `check_image` says why no node runs containers
        have = sorted({f"{k}={v}" for node in nodes for k, v in node.labels.items()})
        listing = ", ".join(have[:12]) + (f" and {len(have) - 12} more" if len(have) > 12 else "") or "none"
        raise InvalidInput(
            f"No node carries the labels {label_text(wanted)}, so this work would never start; the pool's "
            f"nodes have {listing} (`gpupool node ls -o wide` shows them per node): drop or change "
            "--constraint.", field="constraints")
    if len(matching) < len(nodes):
        try:
            _check_capacity(spec.resources, frozenset(spec.resources.models), PoolCapacity.of(matching))
        except InvalidInput as exc:
            raise InvalidInput(f"Only {len(matching)} node(s) carry the labels {label_text(wanted)}, and "
                               f"they cannot hold it: {exc.message}", field="constraints") from None


def to_workload(
    workload_id: str, spec: WorkloadSpec, tenant: str, priority: int, submit_s: float,
    priority_class: str | None = None,
) -> Workload:
    """The core's Workload; a time limit is what backfill plans with (the pods cannot run longer).
    `priority_class` (the class resolved at submit) wins over the spec's."""
    chosen = priority_class or spec.priority_class
    extra: dict[str, object] = {"priority_class": chosen} if chosen else {}
    if spec.topology is not None:
        extra["topology"] = parse_topology_spec(spec.topology)
    if spec.serve_port is not None:  # a service's replica: its siblings' nodes are avoided where it can
        extra["spread_key"] = f"{tenant}/{spec.name}"
    return Workload(
        id=workload_id,
        pods=pod_requests(spec),
        tenant=tenant,
        queue=spec.queue,
        priority=priority,
        submit_time_s=submit_s,
        name=spec.name,
        runtime_estimate_s=spec.time_limit_s or spec.runtime_estimate_s,
        checkpoint_interval_s=spec.checkpoint_interval_s,
        **extra,  # type: ignore[arg-type]
    )


# ----------------------------------------------------------------- priority classes


DEFAULT_CLASS_NAME = "normal"


def default_priority_class(classes: Sequence[PriorityClassConfig]) -> str | None:
    """The class of a submission that names none: the one named `normal`, else the lowest-valued
    non-negative one, else (every class negative) the highest-valued; None when there are none."""
    if not classes:
        return None
    named = [c for c in classes if c.name == DEFAULT_CLASS_NAME]
    if named:
        return named[0].name
    non_negative = [c for c in classes if c.value >= 0]
    if non_negative:
        return min(non_negative, key=lambda c: c.value).name
    return max(classes, key=lambda c: c.value).name


def priority_class(config: PoolConfig, asked: str | None, tenant: str,
                   max_priority: int | None) -> str | None:
    """The class a submission runs in. UnknownName (422) for a class the pool does not define;
    PriorityNotAllowed (403) when a tenant token picks a class whose value exceeds its tenant's
    max_priority (`max_priority` None: the admin, not limited). The default class is never refused."""
    classes = config.priority_classes
    if asked is None:
        return default_priority_class(classes)
    found = next((c for c in classes if c.name == asked), None)
    if found is None:
        names = [c.name for c in classes]
        listing = f"choose one of {', '.join(names)}" if names else "this pool defines none"
        raise UnknownName(f"Unknown priority class {asked!r}; {listing} (`gpupool config show` lists "
                          f"them).{did_you_mean(asked, names)}", name=asked, classes=names)
    if max_priority is not None and found.value > max_priority:
        raise PriorityNotAllowed(
            f"Tenant {tenant} may not use priority class {asked} (value {found.value}): its max priority "
            f"is {max_priority}; pick a lower class or ask the admin (gpupool tenant set {tenant} "
            f"--max-priority {found.value}).", priority_class=asked, value=found.value,
            max_priority=max_priority)
    return found.name


# ----------------------------------------------------------------- the pool's capacity


@dataclass(frozen=True, slots=True)
class Shape:
    """What one node (or several alike) could hold at most: (model, memory MiB, count) per device kind."""

    cpu_milli: int
    memory_mib: int
    devices: tuple[tuple[str, int, int], ...]

    def usable(self, models: frozenset[str], device_memory_mib: int) -> int:
        return sum(n for model, mem, n in self.devices
                   if (not models or model in models) and (mem == 0 or mem >= device_memory_mib))

    def dominates(self, other: Shape) -> bool:
        if self.cpu_milli < other.cpu_milli or self.memory_mib < other.memory_mib:
            return False
        mine = {(m, mem): n for m, mem, n in self.devices}
        return all(mine.get((m, mem), 0) >= n for m, mem, n in other.devices)

    def describe(self) -> str:
        """'8 x H100-SXM-80GB' (or '-' without devices)."""
        by_model: dict[str, int] = defaultdict(int)
        for model, _, n in self.devices:
            by_model[model] += n
        return ", ".join(f"{n} x {m}" for m, n in sorted(by_model.items())) or "no devices"


@dataclass(frozen=True)
class PoolCapacity:
    """The pool's largest nodes: their distinct undominated shapes, and the names of its models."""

    node_count: int
    shapes: tuple[Shape, ...]
    names: dict[str, frozenset[str]]
    """lookup key (model name or any alias of its profile) -> the pool's device models it names."""

    @classmethod
    def of(cls, nodes: Sequence[Node]) -> PoolCapacity:
        from gpupool.profiles.loader import find_profile

        shapes: set[Shape] = set()
        names: dict[str, set[str]] = defaultdict(set)
        for node in nodes:
            kinds: dict[tuple[str, int], int] = defaultdict(int)
            for device in node.devices:
                kinds[(device.model, device.memory_mib)] += 1
            shapes.add(Shape(node.cpu_milli, node.memory_mib,
                             tuple(sorted((m, mem, n) for (m, mem), n in kinds.items()))))
        for model in {m for s in shapes for m, _, _ in s.devices}:
            profile = find_profile(model)
            for name in (model, *(profile.names() if profile is not None else ())):
                names[name_key(name)].add(model)
        frontier = [s for s in shapes if not any(o != s and o.dominates(s) for o in shapes)]
        frontier.sort(key=lambda s: (-sum(n for _, _, n in s.devices), -s.cpu_milli, -s.memory_mib))
        if len(frontier) > MAX_SHAPES:  # bounded per-submission work: check the maxima instead
            frontier = [_maxima(frontier)]
        return cls(len(nodes), tuple(frontier), {k: frozenset(v) for k, v in names.items()})

    @property
    def models(self) -> list[str]:
        return sorted({m for s in self.shapes for m, _, _ in s.devices})


def _maxima(shapes: Sequence[Shape]) -> Shape:
    most: dict[tuple[str, int], int] = defaultdict(int)
    for s in shapes:
        for m, mem, n in s.devices:
            most[(m, mem)] = max(most[(m, mem)], n)
    return Shape(max(s.cpu_milli for s in shapes), max(s.memory_mib for s in shapes),
                 tuple(sorted((m, mem, n) for (m, mem), n in most.items())))


class CapacityCache:
    """The PoolCapacity of the last node list seen, keyed by that list's identity (then equality)."""

    def __init__(self) -> None:
        self._entry: tuple[tuple[Node, ...], PoolCapacity] | None = None
        self._lock = threading.Lock()

    def get(self, nodes: tuple[Node, ...]) -> PoolCapacity:
        entry = self._entry
        if entry is not None and entry[0] is nodes:
            return entry[1]
        with self._lock:
            entry = self._entry
            capacity = entry[1] if entry is not None and entry[0] == nodes else PoolCapacity.of(nodes)
            self._entry = (nodes, capacity)
        return capacity


CAPACITY = CapacityCache()


# ----------------------------------------------------------------- the submit-time check


def check_fits(spec: WorkloadSpec, pool: PoolCapacity) -> WorkloadSpec:
    """Refuse (InvalidInput, HTTP 422) a replica no node of the pool could ever hold; returns the spec
    with its models named as the pool names them (an alias such as 'h100' becomes the device model)."""
    res = spec.resources
    if res.gpu_memory is not None and float(res.gpus) <= 0:
        raise InvalidInput("Device memory (--gpu-memory) is reserved per device, so it needs devices: "
                           "add --gpus N (or a share such as 0.5).", field="resources.gpu_memory")
    models = _resolve_models(res.models, pool) if res.models else frozenset()
    if models and sorted(models) != res.models:
        spec = spec.model_copy(update={"resources": res.model_copy(update={"models": sorted(models)})})
    if pool.node_count:
        _check_capacity(spec.resources, models, pool)
    return spec


def _resolve_models(asked: Sequence[str], pool: PoolCapacity) -> frozenset[str]:
    from gpupool.profiles.loader import default_profiles

    resolved: set[str] = set()
    for name in asked:
        found = pool.names.get(name_key(name))
        if found:
            resolved |= found
            continue
        profile = default_profiles().find(name)
        if profile is None:
            choices = pool.models + list(default_profiles())
            raise UnknownName(f"Unknown device model {name!r}; this pool has {_listing(pool)} "
                              f"(`gpupool profiles` lists every model).{did_you_mean(name, choices)}",
                              name=name)
        if pool.node_count:
            raise InvalidInput(f"No node has a device of model {profile.model}: this pool has "
                               f"{_listing(pool)}; ask for one of those models or none.", model=profile.model)
        resolved.add(profile.model)
    return frozenset(resolved)


def _listing(pool: PoolCapacity) -> str:
    return ", ".join(pool.models) or "no devices"


def _check_capacity(res: ResourcesSpec, models: frozenset[str], pool: PoolCapacity) -> None:
    count, _ = parse_devices(res.gpus)
    device_mib = 0 if res.gpu_memory is None else parse_memory_mib(res.gpu_memory)
    cpu = parse_cpu_milli(res.cpu)
    memory = parse_memory_mib(res.memory)
    shapes = pool.shapes
    for shape in shapes:  # the common case: the first (largest) shape holds it
        if (shape.cpu_milli >= cpu and shape.memory_mib >= memory
                and (not count or shape.usable(models, device_mib) >= count)):
            return
    if count:
        _check_devices(count, models, device_mib, shapes)
    most_cpu = max(s.cpu_milli for s in shapes)
    if cpu > most_cpu:
        raise InvalidInput(f"No node has {cpu / 1000:g} cpus: the largest has {most_cpu / 1000:g}; "
                           "ask for fewer per replica (--cpu).", largest_cpu_milli=most_cpu)
    most_memory = max(s.memory_mib for s in shapes)
    if memory > most_memory:
        raise InvalidInput(f"No node has {format_memory_mib(memory)} of memory: the largest has "
                           f"{format_memory_mib(most_memory)}; ask for less per replica (--memory).",
                           largest_memory_mib=most_memory)
    largest = " and ".join(f"{s.describe()} with {s.cpu_milli / 1000:g} cpus and "
                        f"{format_memory_mib(s.memory_mib)}" for s in shapes[:3])
    raise InvalidInput(f"No single node has all one replica asks for ({_asked(count, cpu, memory)}): the "
                       f"largest are {largest}; ask for less per replica.")


def _check_devices(count: int, models: frozenset[str], device_mib: int, shapes: Sequence[Shape]) -> None:
    of_models = [(m, mem, n) for s in shapes for m, mem, n in s.devices if not models or m in models]
    if device_mib and of_models and all(0 < mem < device_mib for _, mem, _ in of_models):
        mem, model = max((mem, m) for m, mem, _ in of_models)
        raise InvalidInput(f"No device has {format_memory_mib(device_mib)} of memory: the largest has "
                           f"{format_memory_mib(mem)} ({model}); ask for less (--gpu-memory).",
                           largest_device_memory_mib=mem)
    best = max(shapes, key=lambda s: s.usable(models, device_mib))
    most = best.usable(models, device_mib)
    if most >= count:
        return
    which = f" of model {', '.join(sorted(models))}" if models else ""
    memory = f" with {format_memory_mib(device_mib)}" if device_mib else ""
    has = best.describe() if not models and not device_mib else str(most)
    raise InvalidInput(f"No node has {count} devices{which}{memory}: the largest has {has}; ask for at "
                       "most that many per replica (--gpus) and spread the work over --replicas.",
                       largest_devices=most)


def _asked(count: int, cpu: int, memory: int) -> str:
    parts = [f"{count} devices"] if count else []
    parts += [f"{cpu / 1000:g} cpus"] if cpu else []
    parts += [f"{format_memory_mib(memory)} memory"] if memory else []
    return ", ".join(parts)
